"""Fault trial 30, and what check 29b left: a task-adaptive share against a run of one phase
(F9), a temporary folder's name cut by characters (F13), a second element in a review (F14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_lab.runs.registry import discover_runs


def _edit(manifest: Path, **hyperparameters: object) -> None:
    man = json.loads(manifest.read_text())
    man["hyperparameters"].update(hyperparameters)
    manifest.write_text(json.dumps(man, indent=2))


@pytest.mark.parametrize("key, share", [
    ("pretrain/cpu-clean-general1", 0.3),  # one general phase, said to be 30 % task-adaptive
    ("pretrain/cpu-long4", 1.0),
    ("pretrain/cpu-tapt2", 0.0),  # one task-adaptive phase, said to be none
    ("pretrain/cpu-tapt3", 0.5),
])
def test_a_task_adaptive_share_that_one_phase_does_not_give_is_rejected(cache, key, share):
    """Check 29b's F9: `tapt_fraction` 0.3 on a run of one general phase stayed valid (only a
    share of 1 was held to the phase's name), and the pretraining tables showed 0.3."""
    _edit(cache / key / "manifest.json", tapt_fraction=share)
    rec = {r.key: r for r in discover_runs(cache)}[key]
    assert not rec.valid
    assert any(f"tapt_fraction {share} does not give its phases" in p for p in rec.problems)


def test_every_committed_share_agrees_with_its_phases():
    """The rule holds for every committed pretraining run (the one-phase runs share 0 or 1)."""
    from finetune_lab.config import PROJECT_ROOT

    judged = [r for r in discover_runs(PROJECT_ROOT / "data" / "runs")
              if r.key.startswith("pretrain/cpu-")]
    assert len(judged) >= 10
    assert not [p for r in judged for p in r.problems if "tapt_fraction" in p]


def test_a_long_multibyte_name_gets_a_temporary_folder_that_fits(tmp_path):
    """Check 29b's F13: `--out` named with 80 three-byte characters (240 bytes, a valid name)
    was refused as "cannot write into ...: File name too long", advice to choose another
    location: its temporary folder took 100 characters of the name, 300 bytes."""
    from finetune_lab._files import atomic_dir

    dest = tmp_path / ("€" * 80)
    with atomic_dir(dest, "prepare-cls") as tmp:
        assert len(tmp.name.encode()) <= 255
        (tmp / "train.review").write_text("new\n")
    assert (dest / "train.review").read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == [dest.name]


@pytest.mark.parametrize("tag, second", [
    ("text", "<text>Une seconde critique, perdue.</text>"),
    ("rating", "<rating>1.0</rating>"),
])
def test_a_second_text_or_rating_in_an_item_is_refused(tmp_path, tag, second):
    """Check 29b's F14: an item with two `<text>` elements was prepared from the first alone,
    the second dropped without a word; a second `<rating>` would have been ignored alike."""
    from test_cls_books import BOOKS, _fake_root, _replace_in_item

    from finetune_lab.data.cls_books import ClsDataError, prepare_cls

    root = _fake_root(tmp_path, _replace_in_item(4, "</item>", f"{second}</item>"))
    with pytest.raises(ClsDataError, match=rf"train\.review: item 4.*2 <{tag}> elements"):
        prepare_cls(root, tmp_path / "out")
    assert not (tmp_path / "out").exists() and (root / BOOKS / "train.review").is_file()
