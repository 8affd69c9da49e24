"""Tasks 3-4: a tiny fairseq grid (2 seeds x 2 inits) through the real recipe and run cache."""

from __future__ import annotations

import json

import pytest
from conftest import CLS_GRID_RECIPE, TINY_ARCH, needs_data_root

from finetune_lab._files import sha256_file
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.runs.registry import validate_run
from finetune_lab.train import finetune_fairseq as ff

pytestmark = needs_data_root
RECIPE = CLS_GRID_RECIPE
NAMES = ["pretrained-seed0", "pretrained-seed1", "random-seed0", "random-seed1"]


@pytest.fixture(scope="module")
def grid(tiny_pipeline, cls_grid):
    """The shared tiny grid (conftest's ``cls_grid``), its run folders in the grid's order."""
    return {**tiny_pipeline, "dirs": [cls_grid / ff.EXPERIMENT / n for n in NAMES],
            "runs": cls_grid}


@pytest.mark.slow
def test_grid_runs_are_complete_and_valid(grid):
    assert sorted(d.name for d in (grid["runs"] / ff.EXPERIMENT).iterdir()) == NAMES
    for d in grid["dirs"]:
        record = validate_run(d)
        assert record.valid, record.problems if hasattr(record, "problems") else record


@pytest.mark.slow
def test_schedule_is_derived_from_the_data(grid):
    m = read_manifest(grid["dirs"][0])
    # 64 training reviews, batch 8, 3 epochs -> 24 updates, int(0.06 * 24) = 1 warm-up.
    assert m["hyperparameters"]["n_train"] == 64
    assert m["hyperparameters"]["total_updates"] == 24
    cmd = m["command"]
    assert cmd[cmd.index("--total-num-update") + 1] == "24"
    assert cmd[cmd.index("--warmup-updates") + 1] == "1"
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
        assert sorted(acc["epoch"].astype(int)) == [1, 2, 3], subset
        assert acc["value"].between(0, 100).all()


@pytest.mark.slow
def test_grid_skips_complete_runs_and_redoes_incomplete_ones(grid, tmp_path):
    import shutil

    runs = tmp_path / "runs"  # a copy: the grid is shared
    shutil.copytree(grid["runs"] / ff.EXPERIMENT, runs / ff.EXPERIMENT)
    done = runs / ff.EXPERIMENT / NAMES[3]
    manifest_path = done / "manifest.json"
    before = json.loads(manifest_path.read_text())
    killed = runs / ff.EXPERIMENT / NAMES[2]
    m = json.loads((killed / "manifest.json").read_text())
    m["status"] = "running"
    (killed / "manifest.json").write_text(json.dumps(m))
    ff.finetune_grid(("random",), (0, 1), bin_dir=grid["cls_bin"], recipe=RECIPE,
                     arch=TINY_ARCH, runs_root=runs, log=False)
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
