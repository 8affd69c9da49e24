"""Every chapter of the book executes, as Quarto's Jupyter engine would run it."""

from __future__ import annotations

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.qmd import book_chapters, execute_chapter, to_notebook

CHAPTERS = [p for p in book_chapters() if p.suffix == ".qmd"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[str(p.relative_to(PROJECT_ROOT)) for p in CHAPTERS])
def test_chapter_executes(chapter, monkeypatch):
    for var in ("FINETUNE_LAB_RUNS_DIR", "FINETUNE_LAB_WORK_DIR"):
        monkeypatch.delenv(var, raising=False)  # the book reads the real run cache
    nb = execute_chapter(chapter)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_inline_expressions_become_cells(tmp_path):
    qmd = tmp_path / "x.qmd"
    qmd.write_text("# T\n\n```{python}\nx = 2\n```\n\nTwice is `{python} x * 2` here.\n")
    nb = to_notebook(qmd)
    inline = [c for c in nb.cells if c.metadata.get("inline")]
    assert [c.source for c in inline] == ["str(x * 2)"]


def test_a_failing_cell_fails_the_harness(tmp_path):
    from nbclient.exceptions import CellExecutionError

    qmd = tmp_path / "bad.qmd"
    qmd.write_text("# Bad\n\n```{python}\n1 / 0\n```\n")
    with pytest.raises(CellExecutionError, match="ZeroDivisionError"):
        execute_chapter(qmd)


def test_a_failing_inline_expression_fails_the_harness(tmp_path):
    from nbclient.exceptions import CellExecutionError

    qmd = tmp_path / "bad_inline.qmd"
    qmd.write_text("# Bad\n\nThe value is `{python} undefined_name`.\n")
    with pytest.raises(CellExecutionError, match="NameError"):
        execute_chapter(qmd)


def test_chapters_run_in_their_own_folder(tmp_path):
    sub = tmp_path / "chapters"
    sub.mkdir()
    qmd = sub / "cwd.qmd"
    qmd.write_text("# Cwd\n\n```{python}\nimport os\nprint(os.getcwd())\n```\n")
    nb = execute_chapter(qmd)
    out = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert out[0]["text"].strip() == str(sub)
