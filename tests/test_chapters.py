"""Every chapter of the book executes, as Quarto's Jupyter engine would run it."""

from __future__ import annotations

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.book.qmd import book_chapters, execute_chapter, inline_problems, to_notebook

CHAPTERS = [p for p in book_chapters() if p.suffix == ".qmd"]


@pytest.fixture(scope="module")
def render_cache(tmp_path_factory):
    """One cache for every chapter, as a render opens one: a fact that several chapters compute
    (the registry's judgement of every run, the parsed logs) is computed once (issue 36)."""
    return tmp_path_factory.mktemp("render-cache")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[str(p.relative_to(PROJECT_ROOT)) for p in CHAPTERS])
def test_chapter_executes(chapter, monkeypatch, render_cache):
    from finetune_lab.render_cache import CACHE_ENV

    for var in ("FINETUNE_LAB_RUNS_DIR", "FINETUNE_LAB_WORK_DIR"):
        monkeypatch.delenv(var, raising=False)  # the book reads the real run cache
    # the kernel runs the chapter as a render's document, with the render's cache
    monkeypatch.setenv("QUARTO_DOCUMENT_FILE", str(chapter))
    monkeypatch.setenv(CACHE_ENV, str(render_cache))
    nb = execute_chapter(chapter)  # raises on the first cell that fails
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    unexecuted = [c.source[:60] for c in code if c.get("execution_count") is None]
    assert not unexecuted, f"cells the kernel never ran: {unexecuted}"
    # every inline value reaches the page as plain text: present, non-empty, no Markdown
    assert inline_problems(nb) == []


def test_inline_expressions_become_cells(tmp_path):
    qmd = tmp_path / "x.qmd"
    qmd.write_text("# T\n\n```{python}\nx = 2\n```\n\nTwice is `{python} x * 2` and "
                   "thrice `{python} x * 3` here.\n")
    nb = to_notebook(qmd)
    inline = [c for c in nb.cells if c.metadata.get("inline")]
    assert [c.source for c in inline] == ["str(x * 2)", "str(x * 3)"]


def test_bad_inline_values_are_named(tmp_path):
    qmd = tmp_path / "inline.qmd"
    qmd.write_text("# T\n\n```{python}\nn = 3\nname = '`cpu-long3`'\nempty = ''\n```\n\n"
                   "Fine `{python} n`, code `{python} name`, bold `{python} '**b**'`, "
                   "nothing `{python} empty`, link `{python} '[a](b)'`.\n")
    nb = execute_chapter(qmd)
    assert inline_problems(nb) == [
        "`name` holds Markdown, shown literally: '`cpu-long3`'",
        "`'**b**'` holds Markdown, shown literally: '**b**'",
        "`empty` is an empty string",
        "`'[a](b)'` holds Markdown, shown literally: '[a](b)'",
    ]


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


def test_a_figure_cell_must_show_its_figure(tmp_path):
    """The regression this guards: a module that forces ``matplotlib.use("Agg")`` on import
    switches the kernel off its inline backend, and every figure silently disappears."""
    from finetune_lab.errors import UserError

    draw = ("import matplotlib.pyplot as plt\n"
            "from finetune_lab.book import plots\n"  # the package's plotting module, imported
            "plt.subplots()[1].plot([0, 1]);\n")
    good = tmp_path / "good.qmd"
    good.write_text(f"# Good\n\n```{{python}}\n#| label: fig-line\n{draw}```\n")
    nb = execute_chapter(good)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any("image/png" in o.get("data", {}) for o in outputs)

    silent = tmp_path / "silent.qmd"
    silent.write_text("# Silent\n\n```{python}\n#| label: fig-none\nimport matplotlib\n"
                      f"matplotlib.use('Agg')\n{draw}```\n")
    with pytest.raises(UserError, match="fig-none produced no image"):
        execute_chapter(silent)
