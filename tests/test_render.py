"""What only a real Quarto render shows (the Jupyter-based chapter tests cannot): checks over
``_site/`` after ``quarto render`` (``make site``).

Skipped, saying why, when the checkout holds no render. ``scripts/render.sh`` keeps Quarto's own
output in ``_site/render.log``. Only the visible text is read: scripts, styles, code blocks and
the embedded source view (``code-tools``) are removed first.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.book.qmd import book_chapters

SITE = PROJECT_ROOT / "_site"
LOG = SITE / "render.log"
rendered = pytest.mark.skipif(not (SITE / "index.html").is_file(),
                              reason="no render in _site/ (run `make site` to render the book)")


def _pages() -> list[Path]:
    return sorted(p for p in SITE.rglob("*.html") if "site_libs" not in p.parts) \
        if SITE.is_dir() else []


def _visible(page: Path):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    for tag in soup(["script", "style", "pre", "code"]):
        tag.decompose()
    for tag in soup.select("#quarto-embedded-source-code-modal, .sourceCode, .cell-code"):
        tag.decompose()
    return soup.find("main") or soup.body or soup


@rendered
def test_every_chapter_has_its_page_and_the_pdf_exists():
    missing = [str(c.relative_to(PROJECT_ROOT)) for c in book_chapters()
               if not (SITE / c.relative_to(PROJECT_ROOT)).with_suffix(".html").is_file()]
    assert not missing, f"chapters without a page in _site/: {missing}"
    assert list(SITE.glob("*.pdf")), "no PDF in _site/: the typst format did not render"


@rendered
@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(SITE).as_posix())
def test_no_inline_expression_shows_source_or_markdown(page: Path):
    """An inline ``{python}`` expression that returned "" prints its own source; one that
    returned Markdown prints its backticks: both show as literal text."""
    main = _visible(page)
    text = main.get_text(" ")
    assert "{python}" not in text
    ticks = [s.strip()[:80] for s in main.find_all(string=True) if "`" in s]
    assert not ticks, f"literal backticks on the page: {ticks[:5]}"


@rendered
@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(SITE).as_posix())
def test_cross_references_resolve_and_floats_are_numbered(page: Path):
    main = _visible(page)
    unresolved = [t.get_text() for t in main.select(".quarto-unresolved-ref")]
    assert not unresolved and "?@" not in main.get_text(" "), f"unresolved: {unresolved}"
    for float_ in main.select("div.quarto-float[id], figure[id]"):
        kind = float_["id"].split("-")[0]
        if kind not in ("fig", "tbl"):
            continue
        caption = float_.find(["figcaption", "caption"])
        want = {"fig": "Figure", "tbl": "Table"}[kind]
        got = caption.get_text(" ", strip=True) if caption else ""
        assert re.match(rf"{want}\s[\d.]+", got), f"{float_['id']} has no number: {got[:60]!r}"


@rendered
def test_the_render_log_has_no_warning():
    assert LOG.is_file(), f"{LOG} is missing: render with `make site`, which keeps the log"
    # pandoc's and Quarto's; not the Jupyter kernel's notice about its local TCP transport,
    # which says nothing about the book
    warnings = [line for line in LOG.read_text(encoding="utf-8").splitlines()
                if re.search(r"\bWARN(ING)?\b|\[WARNING\]", line)
                and "[IPKernelApp]" not in line
                # Quarto's notice that this install lacks its typst-gather helper (it then
                # stages every Typst package): about the installation, not the book
                and "typst-gather" not in line]
    assert not warnings, "\n".join(warnings[:10])


@rendered
@pytest.mark.skipif(shutil.which("pdftotext") is None,
                    reason="poppler's pdftotext is not installed (apt-get install poppler-utils)")
def test_pdf_references_to_a_chapter_read_chapter_n():
    """The Typst book numbers a chapter heading "3."; a reference once copied that dot, so a
    sentence ended "Chapter 3.." and a parenthesis read "(Chapter 2.)"."""
    pdf = next(SITE.glob("*.pdf"))
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout
    assert re.search(r"\(Chapter \d+\)", text), "no reference to a chapter in parentheses"
    wrong = sorted(set(re.findall(r"Chapter \d+\.[.),:;]", text)))
    assert not wrong, f"chapter references with the heading's dot: {wrong}"
