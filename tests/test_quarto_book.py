"""The book's structure: _quarto.yml is complete and every cross-reference resolves."""

from __future__ import annotations

import pytest

from finetune_lab.book.chapter_inputs import chapter_inputs
from finetune_lab.book.qmd import (
    FrontMatterError, bib_keys, book_chapters, code_cells, crossrefs, front_matter,
    load_quarto_config,
)
from finetune_lab.config import PROJECT_ROOT

CONFIG = load_quarto_config()
CHAPTERS = book_chapters()


def test_project_is_a_book_rendering_to_site():
    assert CONFIG["project"]["type"] == "book"
    assert CONFIG["project"]["output-dir"] == "_site"
    assert CONFIG["execute"]["freeze"] == "auto"
    assert {"html", "typst"} <= set(CONFIG["format"])
    html = CONFIG["format"]["html"]
    assert html["code-fold"] is True and {"light", "dark"} <= set(html["theme"])
    assert CONFIG["book"]["search"] is True
    assert (PROJECT_ROOT / CONFIG["bibliography"]).is_file()


def test_every_listed_chapter_exists():
    assert CHAPTERS[0].name == "index.qmd"
    missing = [str(p) for p in CHAPTERS if not p.is_file()]
    assert not missing


def test_every_chapter_file_is_listed():
    listed = {p.resolve() for p in CHAPTERS}
    on_disk = {p.resolve() for p in (PROJECT_ROOT / "chapters").glob("*.qmd")}
    assert on_disk <= listed, sorted(str(p) for p in on_disk - listed)


def test_every_crossref_is_defined_somewhere_in_the_book():
    refs = [crossrefs(p) for p in CHAPTERS]
    defined = set().union(*(r.defined for r in refs))
    used = set().union(*(r.used for r in refs))
    assert used, "the book uses no cross-reference at all"
    assert used <= defined, sorted(used - defined)


def test_labels_are_unique_across_the_book():
    seen: dict[str, str] = {}
    for path in CHAPTERS:
        for label in crossrefs(path).defined:
            assert label not in seen, f"{label} defined in {seen.get(label)} and {path}"
            seen[label] = str(path)


def test_every_citation_is_in_the_bibliography():
    keys = bib_keys(PROJECT_ROOT / CONFIG["bibliography"])
    cited = set().union(*(crossrefs(p).citations for p in CHAPTERS))
    assert cited <= keys, sorted(cited - keys)


@pytest.mark.parametrize("chapter", [p for p in CHAPTERS if p.parent.name == "chapters"],
                         ids=lambda p: p.name)
def test_chapters_declare_existing_inputs(chapter):
    rel = chapter.relative_to(PROJECT_ROOT).as_posix()
    inputs = chapter_inputs(PROJECT_ROOT, rel)
    if not code_cells(chapter.read_text(encoding="utf-8")):  # prose alone (the glossary)
        assert inputs is None and not front_matter(chapter).get("inputs")
        return
    assert inputs, f"{chapter} has no inputs for the data-aware freeze"
    assert "src/finetune_lab/__init__.py" in inputs  # its code, from what it imports
    for pattern in front_matter(chapter).get("inputs") or []:
        # Declared inputs are data: code comes from the import closure, never a hand-kept list.
        # data/ may be produced later (runs, the checkpoint), so it only has to be under data/.
        assert pattern.startswith("data/"), f"{chapter}: {pattern} is not data"


def test_crossref_checker_catches_an_undefined_reference(tmp_path):
    qmd = tmp_path / "c.qmd"
    qmd.write_text("See @tbl-nowhere and @fig-here.\n\n```{python}\n#| label: fig-here\npass\n```\n")
    refs = crossrefs(qmd)
    assert refs.used - refs.defined == {"tbl-nowhere"}


def test_front_matter_is_read_or_refused(tmp_path):
    qmd = tmp_path / "c.qmd"
    qmd.write_text("---\ntitle: T\ninputs:\n  - data/x.csv\n---\n\nText.\n")
    assert front_matter(qmd) == {"title": "T", "inputs": ["data/x.csv"]}
    qmd.write_text("# No front matter\n---\n")
    assert front_matter(qmd) == {}
    qmd.write_text("---\ntitle: T\n")
    with pytest.raises(FrontMatterError, match="never ends"):
        front_matter(qmd)
    qmd.write_text("---\n- a list\n---\n")
    with pytest.raises(FrontMatterError, match="must be a YAML mapping"):
        front_matter(qmd)
    qmd.write_text("---\ntitle: [unclosed\n---\n")
    with pytest.raises(FrontMatterError, match="not valid YAML"):
        front_matter(qmd)
