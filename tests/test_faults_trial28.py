"""Fault trial 28's defects fixed in the data summary, the record commands and their messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError

SUMMARY = PROJECT_ROOT / "data" / "summaries" / "data.json"


@pytest.mark.parametrize("split, tokens, mean", [
    ("train", 330_000, 185.33),  # R-m3: the bins allow a mean of at most 154.67
    ("test", 350_000, 177.0),
    ("train", 212_400, 120.0),   # and at least 139.66
])
def test_a_mean_length_its_histogram_cannot_give_is_refused(tmp_path: Path, split: str,
                                                            tokens: int, mean: float) -> None:
    """R-m3: tokens and mean edited to agree with each other (so the tokens-per-word and the
    MFU moved) passed, since nothing held the mean to the length histogram."""
    from finetune_lab.data.cls_splits import read_summary

    record = json.loads(SUMMARY.read_text(encoding="utf-8"))
    n = next(s["reviews"] for s in record["cls"]["splits"] if s["split"] == split)
    special = record["lengths"]["special_tokens"]
    assert abs(tokens / n + special - mean) <= 0.006  # the tokens agree with the mean
    record["cls"]["tokenization"][split]["tokens"] = tokens
    record["lengths"]["stats"][split]["mean"] = mean
    edited = tmp_path / "data.json"
    edited.write_text(json.dumps(record), encoding="utf-8")
    with pytest.raises(UserError, match=rf"lengths\.stats\.{split}\.mean {mean} is not in \[") \
            as err:
        read_summary(edited)
    assert str(edited) in str(err.value) and "\n" not in str(err.value)
    read_summary(SUMMARY)  # the committed one stands


def test_the_current_folder_as_output_is_replaced_by_its_path(tmp_path: Path,
                                                              monkeypatch) -> None:
    """L-m2: `prepare-cls --out . --force` inside a user's folder was refused, after the work,
    as ". is a mount point" (renaming "." fails with EBUSY)."""
    from finetune_lab._files import atomic_dir

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "notes.txt").write_text("notes")
    monkeypatch.chdir(proj)
    with atomic_dir(Path("."), "prepare-cls", force=True) as tmp:
        (tmp / "train.review").write_text("a review\n")
    assert (proj / "train.review").read_text() == "a review\n"
    kept, = tmp_path.glob("proj.replaced-*")  # the user's folder, kept beside it
    assert (kept / "notes.txt").read_text() == "notes"


def test_a_data_summary_among_another_kind_of_record_is_refused(tmp_path: Path,
                                                                monkeypatch) -> None:
    """L-m9: `data-summary --out data/summaries/probes/zz.json` wrote a data summary among the
    probe records, which the probe chapter then listed as a damaged record."""
    from finetune_lab.book.data_summary import check_summary_dest
    from finetune_lab.config import paths

    records = paths().summaries
    for folder in ("probes", "fill-mask"):
        with pytest.raises(UserError, match="the folder of another kind of record"):
            check_summary_dest(records / folder / "zz.json", force=True)
    assert not (records / "probes" / "zz.json").exists()
    assert check_summary_dest(records / "data-other.json") == records / "data-other.json"
    assert check_summary_dest(tmp_path / "probes" / "zz.json") == tmp_path / "probes" / "zz.json"


def test_a_record_name_too_long_for_a_file_is_one_line_naming_the_flag(capsys) -> None:
    """E-m11: `fill-mask --name <300 characters>` failed in the file system, naming a probe
    record's path and advising "a shorter path"."""
    from finetune_lab.cli import main

    for command in (["fill-mask", "--checkpoint", "data/checkpoints/roberta-small-fr"],
                    ["probe", "--checkpoint", "data/checkpoints/roberta-small-fr"]):
        assert main([*command, "--name", "a" * 300]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "--name aaaaaaaaaaaaaaaaaaaa... is 300 characters long" in err
        assert "probes/" not in err


def test_a_pretraining_budget_for_a_plan_that_does_not_pretrain_is_refused(capsys) -> None:
    """P-m2: `reproduce --pretrain-minutes 5` without `--from-scratch` was dropped silently."""
    from finetune_lab.cli import main

    assert main(["reproduce", "--dry-run", "--pretrain-minutes", "5"]) == 2
    err = capsys.readouterr()
    assert "--pretrain-minutes" in err.err and "reproduce: finetune-lab" not in err.out
    assert main(["reproduce", "--dry-run"]) == 0


def test_a_dry_run_names_the_runs_a_step_would_make(cache: Path, capsys) -> None:
    """P-m1: with a committed run rejected (its learning rate edited), `reproduce --dry-run`
    printed the same lines as on a whole store, though the step would run it again (35 min)
    and move the committed one aside."""
    import shutil

    from finetune_lab.cli import main

    manifest = cache / "fairseq" / "random-seed1" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["hyperparameters"]["lr"] = 2e-5
    manifest.write_text(json.dumps(record))
    shutil.rmtree(cache / "lora" / "qlora-qv-seed2")
    assert main(["reproduce", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run fairseq/random-seed1 again, moving the one there aside (rejected: " in out
    assert "would run lora/qlora-qv-seed2 (not there yet)" in out
    assert out.count("every run complete and valid: nothing to run") == 1  # transformers
