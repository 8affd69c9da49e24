"""Data-aware freeze on a simulated Quarto project (Quarto itself is not installable here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import quarto_hash, write_package
from runfixtures import EXPERIMENT

from finetune_lab._files import sha256_file
from finetune_lab.book import chapter_inputs as ci
from finetune_lab.book import freeze as fz
from finetune_lab.cli import main

CHAPTER_A = """---
title: "Results"
inputs:
  - src/finetune_lab/stats.py
  - data/runs/{exp}/**
---

```{{python}}
1 + 1
```
"""
CHAPTER_B = """---
title: "Architecture"
inputs:
  - src/finetune_lab/params.py
  - data/not-yet-there.csv
---
"""


def _project(root: Path, grid=None) -> Path:
    (root / "chapters").mkdir(parents=True)
    (root / "_quarto.yml").write_text("project:\n  type: book\n")
    (root / "src" / "finetune_lab").mkdir(parents=True)
    (root / "src" / "finetune_lab" / "stats.py").write_text("X = 1\n")
    (root / "src" / "finetune_lab" / "params.py").write_text("Y = 2\n")
    (root / "chapters" / "results.qmd").write_text(CHAPTER_A.format(exp=EXPERIMENT))
    (root / "chapters" / "architecture.qmd").write_text(CHAPTER_B)
    (root / "index.qmd").write_text("---\ntitle: Home\n---\nNo inputs.\n")
    runs = root / "data" / "runs" / EXPERIMENT
    if grid is not None:
        shutil.copytree(grid.experiment_dir / "random-seed1", runs / "random-seed1")
    else:
        (runs / "r1").mkdir(parents=True)
        (runs / "r1" / "manifest.json").write_text("{}")
    return root


FROZEN_RESULT = {"engine": "jupyter", "markdown": "Some text.\n", "supporting": [],
                 "filters": [], "includes": {}}
"""What Quarto's freeze keeps of an executed chapter (its shape, not its text)."""


def _execute(root: Path, chapter: str) -> None:
    """What Quarto does when it executes a chapter with freeze on."""
    out = fz.freeze_entry(root, chapter) / "execute-results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "html.json").write_text(json.dumps({"hash": quarto_hash(root / chapter),
                                               "result": FROZEN_RESULT}))


def _render(root: Path, env: dict[str, str]) -> list[str]:
    """pre-render, execute what is not frozen (as freeze: auto would), post-render."""
    fz.pre_render(root, env, log=lambda *_: None)
    executed = [c for c in fz.rendered_chapters(root, env) if not fz.is_frozen(root, c)]
    for chapter in executed:
        _execute(root, chapter)
    fz.post_render(root, log=lambda *_: None)
    return executed


def test_declared_inputs_and_hashing(tmp_path: Path) -> None:
    root = _project(tmp_path)
    assert ci.chapters(root) == ["chapters/architecture.qmd", "chapters/results.qmd", "index.qmd"]
    assert ci.declared_inputs(root / "index.qmd") is None
    hashes = ci.hash_inputs(root, ci.declared_inputs(root / "chapters" / "results.qmd"))
    assert hashes == {
        f"data/runs/{EXPERIMENT}/r1/manifest.json": sha256_file(
            root / "data" / "runs" / EXPERIMENT / "r1" / "manifest.json"),
        "src/finetune_lab/stats.py": sha256_file(root / "src" / "finetune_lab" / "stats.py"),
    }
    assert ci.hash_inputs(root, ["data/not-yet-there.csv"]) == {"data/not-yet-there.csv": "MISSING"}
    bad = root / "chapters" / "bad.qmd"
    bad.write_text("---\ninputs: {a: 1}\n---\n")
    with pytest.raises(ci.FreezeError, match="bad.qmd: 'inputs:' must be a list"):
        ci.declared_inputs(bad)
    bad.write_text("---\ninputs: [../outside.txt]\n---\n")
    with pytest.raises(ci.FreezeError, match="relative to the project root"):
        ci.declared_inputs(bad)


def test_check_freeze_passes_without_freeze_dir(tmp_path: Path, capsys) -> None:
    root = _project(tmp_path)
    assert main(["check-freeze", "--project", str(root)]) == 0
    assert "nothing frozen" in capsys.readouterr().out


def test_frozen_without_record_is_stale(tmp_path: Path, capsys) -> None:
    root = _project(tmp_path)
    _execute(root, "chapters/results.qmd")  # frozen by a Quarto that never ran pre-render
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert "chapters/results.qmd is stale (frozen without a record" in capsys.readouterr().err


def test_rendered_chapters_from_quarto_env(tmp_path: Path) -> None:
    root = _project(tmp_path)
    env = {"QUARTO_PROJECT_INPUT_FILES": "chapters/results.qmd\nreferences.bib\n"}
    assert fz.rendered_chapters(root, env) == ["chapters/results.qmd"]
    assert fz.rendered_chapters(root, {**env, "QUARTO_PROJECT_RENDER_ALL": "1"}) == ci.chapters(root)
    listing = tmp_path / "list.txt"
    listing.write_text(f"{root / 'index.qmd'}\n")
    assert fz.rendered_chapters(root, {"QUARTO_USE_FILE_FOR_PROJECT_INPUT_FILES": str(listing),
                                       "QUARTO_PROJECT_INPUT_FILES": ""}) == ["index.qmd"]


@pytest.mark.slow
def test_changed_run_file_invalidates_exactly_its_chapter(tiny_grid, tmp_path: Path,
                                                          capsys) -> None:
    root = _project(tmp_path, tiny_grid)
    all_env = {"QUARTO_PROJECT_RENDER_ALL": "1"}
    assert _render(root, all_env) == ["chapters/architecture.qmd", "chapters/results.qmd",
                                      "index.qmd"]
    record = json.loads(fz.record_path(root, "chapters/results.qmd").read_text())
    assert any(k.endswith("/manifest.json") for k in record["files"])
    assert not list((root / "_freeze").rglob("*.pending.json"))
    assert main(["check-freeze", "--project", str(root)]) == 0
    assert _render(root, all_env) == []  # nothing changed: everything thaws

    # the run is re-done: one of its real event files changes
    (event,) = (root / "data" / "runs" / EXPERIMENT / "random-seed1" / "valid").glob("events*")
    (other,) = (tiny_grid.experiment_dir / "random-seed2" / "valid").glob("events*")
    shutil.copyfile(other, event)
    capsys.readouterr()
    assert main(["check-freeze", "--project", str(root)]) == 1
    err = capsys.readouterr().err
    rel = event.relative_to(root).as_posix()
    assert f"stale: chapters/results.qmd is stale (inputs changed since it was executed): {rel} (changed)" in err
    assert "architecture" not in err

    # an incremental render of another chapter leaves it alone
    assert _render(root, {"QUARTO_PROJECT_INPUT_FILES": "chapters/architecture.qmd"}) == []
    assert fz.is_frozen(root, "chapters/results.qmd")
    # the next full render re-executes exactly the stale chapter, then all is fresh again
    assert _render(root, all_env) == ["chapters/results.qmd"]
    assert main(["check-freeze", "--project", str(root)]) == 0

    # an input that appears (the CSV chapter B declared) makes B stale, naming it as new
    (root / "data" / "not-yet-there.csv").write_text("a,b\n")
    stale = fz.check_freeze(root)
    assert [s.describe() for s in stale] == [
        "chapters/architecture.qmd is stale (inputs changed since it was executed): "
        "data/not-yet-there.csv (new)"]
    # a changed src/ module
    (root / "src" / "finetune_lab" / "stats.py").write_text("X = 2\n")
    assert {s.chapter for s in fz.check_freeze(root)} == {"chapters/architecture.qmd",
                                                          "chapters/results.qmd"}
    assert main(["freeze", "pre-render", "--project", str(root)]) == 0
    assert not fz.is_frozen(root, "chapters/results.qmd")
    assert fz.is_frozen(root, "index.qmd")  # declares no inputs: left to Quarto


def test_code_inputs_are_the_import_closure_and_an_indirect_edit_makes_the_chapter_stale(
        tmp_path: Path, capsys) -> None:
    """pretraining.qmd once declared 5 package modules and imported 31: a change to one it
    imported only indirectly left a stale page that check-freeze called current (issue 15)."""
    root = tmp_path
    pkg = write_package(root, {
        "report.py": "from finetune_lab.stats import mean\n\n"
                     "def table():\n    from . import tables\n    return tables.X\n",
        "stats.py": "def mean(x):\n    return sum(x) / len(x)\n",
        "tables.py": "X = 1\n", "unused.py": "Y = 2\n"})
    (root / "chapters").mkdir()
    (root / "_quarto.yml").write_text("project:\n  type: book\n")
    (root / "chapters" / "c.qmd").write_text(
        "---\ninputs:\n  - data/x.csv\n---\n\n```{python}\n#| echo: false\n"
        "from finetune_lab import report\n```\n\nSome `{python} report.table()` text.\n")
    assert ci.chapter_inputs(root, "chapters/c.qmd") == [
        "data/x.csv", "src/finetune_lab/__init__.py", "src/finetune_lab/report.py",
        "src/finetune_lab/stats.py", "src/finetune_lab/tables.py"]
    fz.pre_render(root, {}, log=lambda *_: None)
    _execute(root, "chapters/c.qmd")
    fz.post_render(root, log=lambda *_: None)
    assert fz.check_freeze(root) == []
    (pkg / "unused.py").write_text("Y = 3\n")  # not imported: nothing goes stale
    assert fz.check_freeze(root) == []
    (pkg / "tables.py").write_text("X = 2\n")  # imported lazily, by a module it imports
    (stale,) = fz.check_freeze(root)
    assert stale.chapter == "chapters/c.qmd"
    assert "src/finetune_lab/tables.py (changed)" in stale.describe()
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert "tables.py" in capsys.readouterr().err


def test_hidden_files_are_not_inputs(tmp_path: Path) -> None:
    """A run's lock file (present only while it is written) and .superseded/ are never
    committed: a freeze that hashed them would be stale on every clean clone."""
    runs = tmp_path / "data" / "runs" / "x"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "manifest.json").write_text("{}")
    (runs / ".r2.lock").write_text("")
    (tmp_path / "data" / "runs" / ".superseded" / "x").mkdir(parents=True)
    (tmp_path / "data" / "runs" / ".superseded" / "x" / "old.json").write_text("{}")
    assert list(ci.hash_inputs(tmp_path, ["data/runs/**"])) == ["data/runs/x/r1/manifest.json"]


def test_machine_local_inputs_gone_on_a_clean_clone_are_no_change(tmp_path: Path) -> None:
    """A chapter reads data/work (git-ignored) where it exists: a clean clone lacks it, and
    CI's check-freeze must not call the committed freeze stale for that; an edit still counts."""
    import subprocess

    root = tmp_path
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/data/work\n")
    (root / "chapters").mkdir()
    (root / "chapters" / "d.qmd").write_text("---\ninputs:\n  - data/work/*/manifest.json\n"
                                             "  - data/summary.json\n---\n")
    (root / "data" / "work" / "tok").mkdir(parents=True)
    (root / "data" / "work" / "tok" / "manifest.json").write_text("{}")
    (root / "data" / "summary.json").write_text("{}")
    fz.pre_render(root, {}, log=lambda *_: None)
    _execute(root, "chapters/d.qmd")
    fz.post_render(root, log=lambda *_: None)
    (root / "data" / "work" / "tok" / "manifest.json").write_text('{"a": 1}')
    (stale,) = fz.check_freeze(root)
    assert "data/work/tok/manifest.json (changed)" in stale.describe()
    shutil.rmtree(root / "data" / "work")  # as on a clean clone
    assert fz.check_freeze(root) == []
    (root / "data" / "work" / "tokenizer").mkdir(parents=True)  # made empty: nothing to read
    assert fz.check_freeze(root) == []
    (root / "data" / "summary.json").unlink()  # a tracked-side input gone still counts
    (stale,) = fz.check_freeze(root)
    assert "data/summary.json (removed)" in stale.describe()


# --- issue 35 item 3: inputs the import closure did not see, and damaged frozen results -----


def _frozen_book(root: Path) -> Path:
    """A book whose chapter imports the package (which holds a data file) and reads runs;
    rendered once, so the freeze is current."""
    pkg = root / "src" / "finetune_lab"
    (pkg / "runs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runs" / "__init__.py").write_text("")
    (pkg / "runs" / "registry.py").write_text("SCHEMA = 'manifest.schema.json'\n")
    (pkg / "runs" / "manifest.schema.json").write_text('{"type": "object"}\n')
    (root / "data" / "runs" / "exp" / "r1").mkdir(parents=True)
    (root / "data" / "runs" / "exp" / "r1" / "manifest.json").write_text("{}")
    (root / "chapters").mkdir()
    (root / "_quarto.yml").write_text("project:\n  type: book\n")
    (root / "chapters" / "c.qmd").write_text(
        "---\ninputs:\n  - data/runs/**/manifest.json\n  - data/runs/exp/**\n---\n\n"
        "```{python}\nfrom finetune_lab.runs import registry\n```\n")
    _render(root, {})
    assert fz.check_freeze(root) == []
    return root


def test_package_data_is_a_chapter_input(tmp_path: Path, capsys) -> None:
    """Editing runs/manifest.schema.json made `runs` say "0 valid, 60 excluded" while
    check-freeze said "up to date": the import closure followed only .py files."""
    root = _frozen_book(tmp_path)
    (root / "src" / "finetune_lab" / "runs" / "manifest.schema.json").write_text('{"x": 1}\n')
    (stale,) = fz.check_freeze(root)
    assert "src/finetune_lab/runs/manifest.schema.json (changed)" in stale.describe()
    assert main(["check-freeze", "--project", str(root)]) == 1


@pytest.mark.parametrize("how", ["empty run folder", "symlinked run folder", "broken link"])
def test_run_folders_that_hold_no_file_of_their_own_are_inputs(tmp_path: Path, how: str) -> None:
    """The registry lists an empty run folder (no manifest) and reads a symlinked one; the
    freeze hashed only files it found without following links, so neither made it stale."""
    root = _frozen_book(tmp_path)
    runs = root / "data" / "runs" / "exp"
    if how == "empty run folder":
        (runs / "r2").mkdir()
        want = "data/runs/exp/r2/ (new)"
    elif how == "symlinked run folder":
        elsewhere = tmp_path / "elsewhere" / "r3"
        elsewhere.mkdir(parents=True)
        (elsewhere / "manifest.json").write_text('{"run": "r3"}')
        (runs / "r3").symlink_to(elsewhere, target_is_directory=True)
        want = "data/runs/exp/r3 (new)"  # a link, not entered: the registry reads none
    else:
        (runs / "r4").symlink_to(tmp_path / "nowhere")
        want = "data/runs/exp/r4 (new)"
    (stale,) = fz.check_freeze(root)
    assert want in stale.describe()


def test_a_symlink_loop_is_read_once(tmp_path: Path) -> None:
    work = tmp_path / "data" / "work" / "bin"
    work.mkdir(parents=True)
    (work / "dict.txt").write_text("a 1")
    (work / "loop").symlink_to(work, target_is_directory=True)
    assert list(ci.hash_inputs(tmp_path, ["data/work/**"])) == ["data/work/bin/dict.txt"]
    # in the run store a link to a folder is never entered (the registry reads none)
    runs = tmp_path / "data" / "runs" / "exp" / "r1"
    runs.mkdir(parents=True)
    (runs / "manifest.json").write_text("{}")
    (runs / "loop").symlink_to(runs, target_is_directory=True)
    assert ci.hash_inputs(tmp_path, ["data/runs/**"]) == {
        "data/runs/exp/r1/loop": ci.LINK + str(runs),
        "data/runs/exp/r1/manifest.json": ci.file_hash(runs / "manifest.json")}


@pytest.mark.parametrize("damage", ["truncated", "empty", "not a record", "figure gone"])
def test_damaged_frozen_results_are_stale(tmp_path: Path, damage: str, capsys) -> None:
    """A truncated _freeze/chapters/fairseq/execute-results/html.json passed check-freeze;
    Quarto then re-executes the chapter, which a publish job without torch cannot do."""
    root = _frozen_book(tmp_path)
    results = fz.freeze_entry(root, "chapters/c.qmd") / "execute-results" / "html.json"
    text = results.read_text()
    if damage == "truncated":
        results.write_text(text[: len(text) // 2])
    elif damage == "empty":
        results.write_text("")
    elif damage == "not a record":
        results.write_text('{"hash": "x", "result": []}')
    else:
        record = json.loads(text)
        record["result"]["markdown"] = "![](c_files/figure-html/fig-1.svg)\n"
        results.write_text(json.dumps(record))
    (stale,) = fz.check_freeze(root)
    assert "frozen results are damaged" in stale.describe()
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert "execute-results/html.json" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["missing", "a file"])
def test_check_freeze_on_a_project_that_is_not_there_fails(tmp_path: Path, what: str,
                                                            capsys) -> None:
    """`check-freeze --project <missing folder>` said "nothing frozen" and exited 0."""
    target = tmp_path / "nope"
    if what == "a file":
        target.write_text("")
    assert main(["check-freeze", "--project", str(target)]) == 2
    err = capsys.readouterr().err
    assert str(target.name) in err and ("does not exist" in err or "is a file" in err)


def test_a_git_that_fails_is_an_error_not_nothing_ignored(tmp_path, monkeypatch):
    """Run by a user who does not own the checkout, `git check-ignore` exits 128 ("dubious
    ownership"); check-freeze took that for "nothing is ignored" and called two chapters stale.
    The ignore rules are read whoever owns the checkout, and a git that fails is an error."""
    import subprocess as sp

    from finetune_lab.book import freeze
    from finetune_lab.errors import UserError

    sp.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("data/work/\n")
    assert freeze.git_ignored(tmp_path, ["data/work/x", "book/a.qmd"]) == {"data/work/x"}
    seen = []
    real = sp.run

    def failing(cmd, **kw):
        seen.append(cmd)
        return sp.CompletedProcess(cmd, 128, b"", b"fatal: detected dubious ownership\n")

    monkeypatch.setattr(freeze.subprocess, "run", failing)
    with pytest.raises(UserError, match="dubious ownership"):
        freeze.git_ignored(tmp_path, ["data/work/x"])
    assert "safe.directory=*" in seen[0]
    monkeypatch.setattr(freeze.subprocess, "run", real)
    assert freeze.git_ignored(tmp_path / "no-checkout-here", ["data/work/x"]) == set()


def test_an_edited_chapter_text_makes_it_stale(tmp_path):
    """After an edit of chapters/fairseq.qmd, check-freeze still passed: Quarto keys a frozen
    result on the md5 of the chapter's text and would execute it again in the publish job."""
    root = _project(tmp_path)
    _render(root, {})
    assert fz.check_freeze(root) == []
    chapter = root / "chapters" / "architecture.qmd"
    chapter.write_text(chapter.read_text() + "\nOne more sentence.\n")
    (stale,) = fz.check_freeze(root)
    assert stale.chapter == "chapters/architecture.qmd" and "its text changed" in stale.reason


def test_a_chapter_executed_without_its_prepared_data_is_warned_of(tmp_path: Path) -> None:
    """A fresh clone has no data/work/: a chapter that executes there writes pages that say
    what they could not compute, and the render log says so, naming the commands that fix it."""
    root = _project(tmp_path)
    (root / "chapters" / "tokens.qmd").write_text(
        "---\ninputs:\n  - data/work/cls.books/*\n  - data/work/hf/**\n  - data/work/other/*\n"
        "---\n# Tokens\n")
    said: list[str] = []
    fz.pre_render(root, {"QUARTO_PROJECT_RENDER_ALL": "1"}, log=said.append)
    warned = [line for line in said if "WARNING" in line]
    assert warned == ["finetune-lab freeze: WARNING: chapters/tokens.qmd executes without its "
                      "prepared data (data/work/cls.books/*, data/work/hf/**): its pages will say "
                      "what they could not compute; `finetune-lab prepare-cls`, `finetune-lab "
                      "convert-hf` prepare it, in that order"]
    (root / "data" / "work" / "cls.books").mkdir(parents=True)
    (root / "data" / "work" / "cls.books" / "train.review").write_text("x\n")
    (root / "data" / "work" / "hf").mkdir(parents=True)  # a folder with no file is not data
    fz.post_render(root, log=lambda *_: None)
    said.clear()
    fz.pre_render(root, {"QUARTO_PROJECT_RENDER_ALL": "1"}, log=said.append)
    assert [line for line in said if "WARNING" in line] == [
        line.replace("data/work/cls.books/*, ", "").replace("`finetune-lab prepare-cls`, ", "")
        for line in warned]


def test_a_rebuilt_work_folder_with_the_same_data_leaves_the_freeze_fresh(tmp_path: Path) -> None:
    """data/work/ rebuilt on another machine: the same data, but build records made at another
    moment from another path, laid out otherwise, and another fairseq-preprocess log. The freeze
    stays fresh; a changed output or timing (the data chapter prints the timings), or a record
    damaged, does not."""
    from finetune_lab.book.chapter_inputs import hash_inputs

    work = tmp_path / "data" / "work" / "cls-books-bin"
    (work / "input0").mkdir(parents=True)
    (work / "input0" / "train.bin").write_bytes(b"\x01\x02")
    (work / "input0" / "preprocess.log").write_text("Namespace(destdir='/home/a/input0')\n")
    record = {"outputs": {"input0/train.bin": "ab"}, "step": "binarize-cls", "timings_s": {"total": 3.0},
              "workers": 2, "commands": ["fairseq-preprocess --workers 2"],
              "tool_versions": {"python": "3.11.7"}, "source": "/home/a/tokenizer"}
    (work / "manifest.json").write_text(json.dumps(record))
    patterns = ["data/work/cls-books-bin/**"]
    before = hash_inputs(tmp_path, patterns)
    assert sorted(before) == ["data/work/cls-books-bin/input0/train.bin",
                              "data/work/cls-books-bin/manifest.json"]
    (work / "input0" / "preprocess.log").write_text("Namespace(destdir='/srv/b/input0')\n")
    (work / "manifest.json").write_text(json.dumps(
        {**record, "created": "2026-12-01T00:00:00+00:00", "source": "/srv/b/tokenizer"},
        indent=2))
    assert hash_inputs(tmp_path, patterns) == before
    (work / "manifest.json").write_text(json.dumps({**record, "timings_s": {"total": 9.5}}))
    assert fz.diff_files(before, hash_inputs(tmp_path, patterns)) == [
        "data/work/cls-books-bin/manifest.json (changed)"]
    (work / "manifest.json").write_text(json.dumps({**record, "outputs": {"input0/train.bin": "cd"}}))
    assert fz.diff_files(before, hash_inputs(tmp_path, patterns)) == [
        "data/work/cls-books-bin/manifest.json (changed)"]
    (work / "manifest.json").write_text('{"outputs": ')
    assert hash_inputs(tmp_path, patterns)["data/work/cls-books-bin/manifest.json"] != \
        before["data/work/cls-books-bin/manifest.json"]
    (work / "manifest.json").write_text(json.dumps(record))
    (work / "input0" / "train.bin").write_bytes(b"\x01\x03")
    assert fz.diff_files(before, hash_inputs(tmp_path, patterns)) == [
        "data/work/cls-books-bin/input0/train.bin (changed)"]
