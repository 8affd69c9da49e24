"""What only a real Quarto render shows (the Jupyter-based chapter tests cannot): checks over
``_site/`` after ``quarto render`` (``make site``).

Skipped, saying why, when the checkout holds no render. ``scripts/render.sh`` keeps Quarto's own
output in ``_site/render.log``. Only the visible text is read: scripts, styles, code blocks and
the embedded source view (``code-tools``) are removed first. ``FINETUNE_LAB_SITE`` points the
checks at another render (a folder holding ``index.html`` and the PDF).

The PDF checks need poppler's ``pdftotext`` (CI installs poppler-utils) and are skipped without it.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.book.qmd import book_chapters

SITE = Path(os.environ.get("FINETUNE_LAB_SITE") or PROJECT_ROOT / "_site")
LOG = SITE / "render.log"
rendered = pytest.mark.skipif(not (SITE / "index.html").is_file(),
                              reason=f"no render in {SITE} (run `make site` to render the book)")
with_pdftotext = pytest.mark.skipif(
    shutil.which("pdftotext") is None,
    reason="poppler's pdftotext is not installed (apt-get install poppler-utils)")

# An absolute path outside the project: a machine's folder printed into the book (the data
# chapter once showed the checkout's data/work). Relative paths (data/work/...) and URLs do not
# match: the folder must start the path, after a space, a quote or a bracket.
MACHINE_PATH = re.compile(
    r"(?<![\w.~/-])/(?:work|home|tmp|root|Users|mnt|srv|scratch|private|var/folders)/[^\s\"')\]]*"
    r"|(?<![\w])[A-Za-z]:\\[\w.$ -]+")
# "launch(es)", "run(s)": a template's plural, where the sentence should count and inflect
TEMPLATE_PLURAL = re.compile(r"\b[A-Za-z]+\((?:s|es)\)")
# more than 4 decimals: a float printed as computed (28.474833333333333); not a part of a
# URL, an arXiv id or a DOI (preceded by "/", ":" or a letter) nor a version (1.2.34567.8)
LONG_DECIMAL = re.compile(r"(?<![\w./:])[-+−]?\d+\.\d{5,}(?![\d.])")
URL = re.compile(r"\b(?:https?://|doi:|arxiv:)\S+", re.IGNORECASE)


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


def _shown(page: Path):
    """What a reader of the page can see: like :func:`_visible`, but with inline code and the
    cells' printed outputs kept; only the folded source (``.cell-code``), the source view and
    scripts go."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    for tag in soup(["script", "style"]):
        tag.decompose()
    for tag in soup.select("#quarto-embedded-source-code-modal, .cell-code"):
        tag.decompose()
    return soup.find("main") or soup.body or soup


def _pdf() -> Path:
    pdfs = sorted(SITE.glob("*.pdf"))
    if not pdfs:
        pytest.fail(f"no PDF in {SITE}: the typst format did not render")
    return pdfs[0]


def _pdftotext(*args: str) -> str:
    return subprocess.run(["pdftotext", *args, str(_pdf()), "-"], capture_output=True,
                          text=True, check=True).stdout


def _found(pattern: re.Pattern, text: str) -> list[str]:
    return sorted(set(m.group(0) for m in pattern.finditer(text)))


def _machine_paths(text: str) -> list[str]:
    """MACHINE_PATH's hits, and this checkout's own root wherever it is (/builds/..., ...)."""
    paths = _found(MACHINE_PATH, text)
    if str(PROJECT_ROOT) in text and not any(str(PROJECT_ROOT) in p for p in paths):
        paths.append(str(PROJECT_ROOT))
    return paths


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
        # numbered 3.1 in a chapter, A.1 in an appendix
        assert re.match(rf"{want}\s(?:[A-Z]\.)?[\d.]+", got), \
            f"{float_['id']} has no number: {got[:60]!r}"


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
@with_pdftotext
def test_pdf_references_to_a_chapter_read_chapter_n():
    """The Typst book numbers a chapter heading "3."; a reference once copied that dot, so a
    sentence ended "Chapter 3.." and a parenthesis read "(Chapter 2.)"."""
    text = _pdftotext()
    assert re.search(r"\(Chapter \d+\)", text), "no reference to a chapter in parentheses"
    wrong = sorted(set(re.findall(r"Chapter \d+\.[.),:;]", text)))
    assert not wrong, f"chapter references with the heading's dot: {wrong}"


@rendered
@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(SITE).as_posix())
def test_html_shows_no_machine_path_and_no_template_plural(page: Path):
    """A machine's absolute path anywhere a reader can see it (prose, inline code, outputs,
    tables); "(s)"/"(es)" plurals in the prose (code aside: an identifier may end so)."""
    main = _shown(page)
    text = main.get_text(" ")
    paths = _machine_paths(text)
    assert not paths, f"absolute paths on the page: {paths[:10]}"
    for tag in main(["pre", "code"]):
        tag.decompose()
    plurals = _found(TEMPLATE_PLURAL, main.get_text(" "))
    assert not plurals, f'"(s)"/"(es)" plurals on the page: {plurals[:10]}'


@rendered
@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(SITE).as_posix())
def test_html_tables_round_their_numbers(page: Path):
    """No table cell shows a number with more than 4 decimals (URLs, arXiv ids and DOIs aside)."""
    long = []
    for cell in _shown(page).select("table td, table th"):
        long += _found(LONG_DECIMAL, URL.sub(" ", cell.get_text(" ")))
    assert not long, f"table numbers with more than 4 decimals: {sorted(set(long))[:10]}"


@rendered
@with_pdftotext
def test_pdf_shows_no_machine_path_and_no_template_plural():
    text = _pdftotext()
    # a path may break at the end of a line, after its "/": join such lines before reading
    joined = re.sub(r"/\n", "/", text)
    paths = _machine_paths(joined)
    assert not paths, f"absolute paths in the PDF: {paths[:10]}"
    plurals = _found(TEMPLATE_PLURAL, text)
    assert not plurals, f'"(s)"/"(es)" plurals in the PDF: {plurals[:10]}'


@rendered
@with_pdftotext
def test_pdf_tables_round_their_numbers():
    """pdftotext -layout keeps a table's columns apart by runs of spaces: a line with two such
    gaps is read as a table row (prose, set with single spaces, is not: its p = 0.00693 and
    peft's verbatim printout may keep their digits)."""
    rows = [line for line in _pdftotext("-layout").splitlines()
            if len(re.findall(r"\S {3,}(?=\S)", line)) >= 2]
    long = sorted({n for row in rows for n in _found(LONG_DECIMAL, URL.sub(" ", row))})
    assert not long, f"PDF table numbers with more than 4 decimals: {long[:10]}"


MIN_BODY_WORDS = 20
"""A page with fewer body words than this holds only a heading, a caption, the last rows of a
table, or nothing. ("About 15" was asked; 20 also catches a 4-row table left over a page break,
and the book's shortest real page, a page of figures, has about 50 words of captions.)"""


def _pdf_body_words() -> dict[int, list[str]]:
    """Each page's words, its running header (top 8 % of the page) and page number (bottom 7 %)
    aside, from one ``pdftotext -bbox`` run."""
    words: dict[int, list[str]] = {}
    for number, page in enumerate(re.split(r"<page ", _pdftotext("-bbox"))[1:], start=1):
        height = float(re.search(r'height="([\d.]+)"', page).group(1))
        words[number] = [
            html.unescape(word) for y0, y1, word in re.findall(
                r'<word xMin="[\d.]+" yMin="([\d.]+)" xMax="[\d.]+" yMax="([\d.]+)">(.*?)</word>',
                page)
            if float(y0) > 0.08 * height and float(y1) < 0.93 * height]
    return words


@rendered
@with_pdftotext
def test_no_pdf_page_is_near_empty():
    """The cover aside, every page holds at least MIN_BODY_WORDS words of body text: no bare
    heading, orphaned caption, spilled-over table tail or blank page."""
    thin = {n: " ".join(w)[:60] for n, w in _pdf_body_words().items()
            if n > 1 and len(w) < MIN_BODY_WORDS}
    assert not thin, "near-empty PDF pages (page: its body text): " + "; ".join(
        f"{n}: {t!r}" for n, t in thin.items())
