"""``finetune-lab reproduce`` on a fresh clone, end to end on a tiny data root (issue 35 item
15): it stopped at data-summary ("prepared data missing: data/work/pretrain-bin") because it
never ran prepare-pretrain, its advice named train-tokenizer (which would replace the adopted
tokenizer), and its dry run printed `finetune-lab adopt-tokenizer`, then no command at all.

The data steps run for real; the fine-tuning steps, which on a clone skip the 15 committed
runs as complete and valid, are only checked to be commands the CLI accepts (they would train
on the tiny data here)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import needs_data_root

from finetune_lab import reproduce
from finetune_lab._files import sha256_tree
from finetune_lab.cli import build_parser, main
from finetune_lab.config import DATA_ROOT_ENV, RUNS_DIR_ENV, WORK_DIR_ENV, default_data_root

ITEM = re.compile(r"<item>.*?</item>", re.S)


def tiny_data_root(dest: Path, reviews: int = 30, other: int = 110, novels: int = 1) -> Path:
    """The first ``reviews`` items of each CLS-Books file, ``other`` of each dvd/music file
    (the pretraining corpus holds 400 of them out) and ``novels`` ELTeC novels of each level:
    the data root's layout, in a few seconds' worth of data."""
    real = default_data_root()
    for path in sorted((real / "webis-cls-10").rglob("*.review")):
        text = path.read_text(encoding="utf-8")
        out = dest / path.relative_to(real)
        out.parent.mkdir(parents=True, exist_ok=True)
        keep = reviews if path.parent.name == "books" else other
        out.write_text('<?xml version="1.0" encoding="utf-8"?>\n<items>'
                       + "".join(ITEM.findall(text)[:keep]) + "</items>\n", encoding="utf-8")
    for level in sorted(p for p in (real / "eltec-fra").iterdir() if p.is_dir()):
        (dest / "eltec-fra" / level.name).mkdir(parents=True)
        for novel in sorted(level.iterdir())[:novels]:
            os.symlink(novel, dest / "eltec-fra" / level.name / novel.name)
    return dest


@needs_data_root
def test_reproduce_completes_on_a_fresh_clone_and_then_reruns_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv(DATA_ROOT_ENV, str(tiny_data_root(tmp_path / "root")))
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    summary = tmp_path / "data.json"
    parser = build_parser()
    done: list[list[str]] = []

    def run_step(step: list[str]) -> int:
        parser.parse_args(step)  # every printed step is a command a user can type
        done.append(step)
        if step[0] == "finetune":
            return 0
        return main([*step, "--out", str(summary)] if step == ["data-summary"] else step)

    monkeypatch.setattr(reproduce, "main", run_step)
    # the tiny data root is another corpus than Webis-CLS-10's files, and says so
    assert reproduce.reproduce(other_corpus=True) == 0
    assert summary.is_file() and ["prepare-pretrain", "--other-corpus"] in done
    printed = [line.removeprefix("reproduce: ") for line in capsys.readouterr().out.splitlines()
               if line.startswith("reproduce: finetune-lab ")]
    assert printed == [f"finetune-lab {' '.join(s)}" for s in done]

    made = sha256_tree(tmp_path / "work", exclude=("manifest.json",))  # data, not its record
    assert reproduce.reproduce(other_corpus=True) == 0
    again = capsys.readouterr().out
    assert sha256_tree(tmp_path / "work", exclude=("manifest.json",)) == made
    for step in ("binarize-cls", "prepare-pretrain"):  # the costly steps are skipped
        assert re.search(rf"^{step}: up to date", again, re.M), again


def test_no_advice_undoes_the_adopted_tokenizer(tmp_path: Path, monkeypatch, capsys) -> None:
    """With the checkpoint's tokenizer adopted, a missing-data message must not send the user
    to train-tokenizer, which would replace it."""
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    assert main(["data-summary", "--out", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err
    assert "prepared data missing" in err and "adopt-tokenizer" in err
    assert "train-tokenizer" not in err
