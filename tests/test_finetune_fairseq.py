"""Tasks 3-4: a tiny fairseq grid (2 seeds x 2 inits) through the real recipe and run cache."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import TINY_ARCH, needs_data_root

from finetune_lab._files import sha256_file
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.runs.registry import validate_run
from finetune_lab.train import finetune_fairseq as ff
from finetune_lab.train.recipe import LAB_RECIPE

pytestmark = needs_data_root
RECIPE = replace(LAB_RECIPE, epochs=2)


@pytest.fixture(scope="module")
def grid(tiny_pipeline):
    runs = tiny_pipeline["runs"] / "grid"
    dirs = ff.finetune_grid(("pretrained", "random"), (0, 1), bin_dir=tiny_pipeline["cls_bin"],
                            checkpoint_dir=tiny_pipeline["packaged"], recipe=RECIPE,
                            arch=TINY_ARCH, runs_root=runs, log=False)
    return {**tiny_pipeline, "dirs": dirs, "runs": runs}


@pytest.mark.slow
def test_grid_runs_are_complete_and_valid(grid):
    assert [d.name for d in grid["dirs"]] == [
        "pretrained-seed0", "pretrained-seed1", "random-seed0", "random-seed1"]
    for d in grid["dirs"]:
        record = validate_run(d)
        assert record.valid, record.problems if hasattr(record, "problems") else record


@pytest.mark.slow
def test_schedule_is_derived_from_the_data(grid):
    m = read_manifest(grid["dirs"][0])
    # 64 training reviews, batch 8, 2 epochs -> 16 updates, int(0.06 * 16) = 0 warm-up.
    assert m["hyperparameters"]["n_train"] == 64
    assert m["hyperparameters"]["total_updates"] == 16
    cmd = m["command"]
    assert cmd[cmd.index("--total-num-update") + 1] == "16"
    assert cmd[cmd.index("--batch-size") + 1] == "8" and "--no-save" in cmd
    assert cmd[cmd.index("--valid-subset") + 1] == "valid,test"


@pytest.mark.slow
def test_pretrained_runs_restore_the_packaged_checkpoint(grid):
    pre, rnd = read_manifest(grid["dirs"][0]), read_manifest(grid["dirs"][2])
    packaged = grid["packaged"] / "model.pt"
    assert pre["inputs"]["checkpoint"]["sha256"] == {".": sha256_file(packaged)}
    assert "--restore-file" in pre["command"] and "--restore-file" not in rnd["command"]
    assert rnd["inputs"]["checkpoint"] is None
    log = (grid["dirs"][0] / "train.log").read_text()
    assert "Loaded checkpoint" in log
    # The same hyperparameters for both inits: only init and seed vary inside the experiment.
    assert pre["hyperparameters"] == rnd["hyperparameters"]


@pytest.mark.slow
def test_every_epoch_logs_valid_and_test_accuracy(grid):
    from finetune_lab.runs.tblogs import run_scalars

    df = run_scalars(validate_run(grid["dirs"][1]))
    for subset in ("valid", "test"):
        acc = df[(df["subset"] == subset) & (df["tag"] == "accuracy")]
        assert sorted(acc["epoch"].astype(int)) == [1, 2], subset
        assert acc["value"].between(0, 100).all()


@pytest.mark.slow
def test_grid_skips_complete_runs_and_redoes_incomplete_ones(grid):
    done = grid["dirs"][3]
    manifest_path = done / "manifest.json"
    before = json.loads(manifest_path.read_text())
    killed = grid["dirs"][2]
    m = json.loads((killed / "manifest.json").read_text())
    m["status"] = "running"
    (killed / "manifest.json").write_text(json.dumps(m))
    ff.finetune_grid(("random",), (0, 1), bin_dir=grid["cls_bin"], recipe=RECIPE,
                     arch=TINY_ARCH, runs_root=grid["runs"], log=False)
    assert json.loads(manifest_path.read_text())["start_time"] == before["start_time"]
    redone = read_manifest(killed)
    assert redone["status"] == "complete" and redone["start_time"] >= m["start_time"]


def test_missing_binarized_data_names_the_commands(tmp_path):
    with pytest.raises(ff.UserError, match="binarize-cls"):
        ff.require_cls_bin(tmp_path)


@needs_data_root
def test_checkpoint_with_another_dictionary_is_refused(tiny_pipeline, tmp_path):
    other = tmp_path / "ckpt"
    other.mkdir()
    (other / "dict.txt").write_text("a 1\nb 1\n")
    with pytest.raises(ff.UserError, match="another tokenizer"):
        ff.check_same_dictionary(tiny_pipeline["cls_bin"], other)


def test_a_complete_run_from_another_checkpoint_is_recognised():
    """The grid's runs started from the committed checkpoint; the candidate's did not, so a
    second candidate cannot silently "skip" into the first one's runs."""
    from finetune_lab.config import paths
    from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
    from finetune_lab.train.finetune_fairseq import (
        CANDIDATE_EXPERIMENT,
        same_checkpoint,
    )

    model = packaged_dir() / MODEL_FILE
    assert same_checkpoint(paths().runs / "fairseq" / "pretrained-seed0", model)
    assert not same_checkpoint(paths().runs / CANDIDATE_EXPERIMENT / "pretrained-seed0", model)
