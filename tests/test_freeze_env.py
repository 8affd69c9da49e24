"""The environment as a freeze input: a changed locked version makes exactly the chapters that
use the package stale, naming it (book.freeze_env, through book.freeze)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import quarto_hash, write_package

from finetune_lab.book import freeze as fz
from finetune_lab.book import freeze_env as fe
from finetune_lab.cli import main

LOCK = """\
numpy==2.0.0 \\
    --hash=sha256:00
    # via
    #   -r requirements/fairseq-deps.txt
    #   pandas
pandas==2.2.0 \\
    --hash=sha256:11
    # via finetune-lab (pyproject.toml)
pyyaml==6.0.0 \\
    --hash=sha256:22
    # via finetune-lab (pyproject.toml)
filelock==3.0.0 \\
    --hash=sha256:33
    # via torch
"""
TABLES = """---
title: Tables
---

```{python}
#| label: tbl-x
from finetune_lab import tables
tables.show()
```
"""
PLAIN = """---
title: Plain
---

```{python}
import yaml

from finetune_lab import light
print(yaml.safe_dump(light.X))
```
"""


def _project(root: Path) -> Path:
    (root / "requirements").mkdir(parents=True)
    (root / "_quarto.yml").write_text("project:\n  type: book\n")
    (root / "requirements" / "lock.txt").write_text(LOCK)
    (root / "requirements" / "fairseq.txt").write_text("fairseq-fixed==0.12.3.1 \\\n"
                                                       "    --hash=sha256:44\n")
    (root / "pyproject.toml").write_text('dependencies = [\n    "torch==2.13.0",\n]\n')
    write_package(root, {
        # a heavy import inside a function counts as much as one at the top
        "tables.py": "import json\n\n\ndef show():\n    import pandas\n"
                     "    return pandas.DataFrame()\n",
        "light.py": "X = {'a': 1}\n"})
    (root / "chapters").mkdir()
    (root / "chapters" / "tables.qmd").write_text(TABLES)
    (root / "chapters" / "plain.qmd").write_text(PLAIN)
    return root


def _render_all(root: Path) -> None:
    """pre-render, what Quarto writes for each executed chapter, post-render."""
    fz.pre_render(root, {}, log=lambda *_: None)
    for chapter in ("chapters/tables.qmd", "chapters/plain.qmd"):
        out = fz.freeze_entry(root, chapter) / "execute-results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "html.json").write_text(json.dumps({"hash": quarto_hash(root / chapter),
                                                   "result": {"markdown": "x\n"}}))
    fz.post_render(root, log=lambda *_: None)


def test_a_chapter_records_the_locked_versions_of_what_it_imports_and_their_needs(tmp_path):
    root = _project(tmp_path)
    patterns = ["src/finetune_lab/__init__.py", "src/finetune_lab/tables.py"]
    assert fe.chapter_packages(root, "chapters/tables.qmd", patterns) == {
        "package numpy": "2.0.0", "package pandas": "2.2.0"}  # numpy: pandas needs it
    assert fe.chapter_packages(root, "chapters/plain.qmd", ["src/finetune_lab/light.py"]) == {
        "package pyyaml": "6.0.0"}
    versions, requires = fe.locked(root)
    assert versions["torch"] == "2.13.0" and versions["fairseq-fixed"] == "0.12.3.1"
    assert requires["fairseq-fixed"] == {"numpy"} and requires["torch"] == {"filelock"}


def test_a_changed_locked_version_makes_check_freeze_fail_for_the_chapters_using_it(
        tmp_path, capsys):
    root = _project(tmp_path)
    _render_all(root)
    record = fz.read_record(fz.record_path(root, "chapters/tables.qmd"))
    assert record["files"]["package pandas"] == "2.2.0"
    assert main(["check-freeze", "--project", str(root)]) == 0
    capsys.readouterr()

    lock = root / "requirements" / "lock.txt"
    lock.write_text(LOCK.replace("numpy==2.0.0", "numpy==2.1.0"))
    assert main(["check-freeze", "--project", str(root)]) == 1
    err = capsys.readouterr().err
    assert "chapters/tables.qmd is stale" in err and "package numpy (changed)" in err
    assert "plain.qmd" not in err  # it imports no numpy, directly or through a package

    lock.write_text(LOCK.replace("pyyaml==6.0.0", "pyyaml==6.0.2"))
    assert main(["check-freeze", "--project", str(root)]) == 1
    err = capsys.readouterr().err
    assert "chapters/plain.qmd is stale" in err and "package pyyaml (changed)" in err
    assert "tables.qmd" not in err

    _render_all(root)  # the re-render records the new versions
    assert main(["check-freeze", "--project", str(root)]) == 0
