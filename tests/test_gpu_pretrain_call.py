"""What the first pretraining-then-fine-tuning call on an H100 showed (call 20261126T160047Z):
its plan left the pretraining 10 s (gpu_plan's budget, tested in test_gpu_lab), its run was
rejected here by the experiment.json that had let it start, and its corpus slice replaced the
one the earlier GPU runs' hashes check against."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from finetune_lab.errors import UserError
from finetune_lab.runs import experiments, gpu_archive, gpu_bundle
from finetune_lab.runs.gpu_plan import GPU_CORPUS, Plan

OLD = {"hyperparameters": {"mask_prob": 0.15, "lr": 5e-4}, "varying": ["batch_size"]}
"""An experiment.json written before the code recorded ``num_workers``."""
NEW = {"hyperparameters": {"mask_prob": 0.15}, "varying": ["batch_size", "num_workers", "lr"]}
"""What this version pins and lets vary: ``lr`` varies now but the file above pins it."""


def _record(hp):
    class Rec:
        experiment, framework, problems = "pretrain-gpu", "fairseq", []
        manifest = {"hyperparameters": hp}
        valid = True
    rec = Rec()
    rec.problems = []
    return rec


def test_a_recipe_that_records_more_widens_experiment_json_and_keeps_its_pins(tmp_path, capsys):
    exp = tmp_path / "pretrain-gpu"
    exp.mkdir()
    (exp / "experiment.json").write_text(json.dumps(OLD))
    old_run = _record({"mask_prob": 0.15, "lr": 5e-4, "batch_size": 8})
    new_run = _record({"mask_prob": 0.15, "lr": 5e-4, "batch_size": 256, "num_workers": 10})
    experiments.check_hyperparameters([old_run, new_run], OLD)
    assert new_run.problems == ["hyperparameter 'num_workers' = 10 is not in experiment.json"]

    # trial 7's P1: a value the file pins is held against the run's, even where this version
    # lets it vary (lr here); before, the recipe's varying names masked the file's pins
    with pytest.raises(experiments.RecipeConflict, match="differs in lr"):
        experiments.pin_config(exp, NEW, {"mask_prob": 0.15, "lr": 1e-3, "num_workers": 10})
    assert json.loads((exp / "experiment.json").read_text()) == OLD
    experiments.pin_config(exp, NEW, {"mask_prob": 0.15, "lr": 5e-4, "num_workers": 10})
    assert "may now vary in num_workers" in capsys.readouterr().out
    widened = json.loads((exp / "experiment.json").read_text())
    assert widened["hyperparameters"] == OLD["hyperparameters"]  # lr stays pinned
    assert widened["varying"] == ["batch_size", "num_workers"]
    old_run.problems, new_run.problems = [], []
    experiments.check_hyperparameters([old_run, new_run], widened)
    assert old_run.problems == [] and new_run.problems == []
    other_lr = _record({"mask_prob": 0.15, "lr": 1e-3, "num_workers": 2})
    experiments.check_hyperparameters([other_lr], widened)
    assert other_lr.problems == ["hyperparameter 'lr' = 0.001 differs from experiment.json (0.0005)"]

    with pytest.raises(UserError, match="pins another recipe .*mask_prob"):
        experiments.pin_config(exp, {**NEW, "hyperparameters": {"mask_prob": 0.3}})
    assert json.loads((exp / "experiment.json").read_text()) == widened


def test_names_a_run_records_already_are_not_added_since_that_run_would_turn_valid(tmp_path):
    """Trial 7's P3: a run rejected for a name experiment.json does not allow was accepted
    once another launch had added the name."""
    exp = tmp_path / "pretrain-ablation"
    (exp / "bf16").mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps(OLD))
    forged = {"hyperparameters": {"mask_prob": 0.15, "lr": 5e-4, "num_workers": 3}}
    (exp / "bf16" / "manifest.json").write_text(json.dumps(forged))
    with pytest.raises(experiments.RecipeConflict, match="num_workers, which its run bf16"):
        experiments.pin_config(exp, NEW, {"mask_prob": 0.15, "lr": 5e-4, "num_workers": 10})
    assert json.loads((exp / "experiment.json").read_text()) == OLD


def _call_with_config(tmp_path, config):
    there = tmp_path / "device"
    run = there / "data" / "runs" / "pretrain-gpu" / "gpu9"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}\n")
    (run.parent / "experiment.json").write_text(json.dumps(config))
    files = tmp_path / "files"
    gpu_archive.pack([run.parent], files, root=there,
                     extra={"products": ["data/runs/pretrain-gpu"]})
    return files


@pytest.mark.parametrize("theirs, ours, says", [
    ({**OLD, "varying": ["batch_size", "num_workers"]},
     {**OLD, "varying": ["batch_size", "num_workers"]}, None),
    ({**OLD, "hyperparameters": {"mask_prob": 0.3, "lr": 5e-4}}, OLD,
     r"kept as it is: the call's differs from it in mask_prob, so the call's runs are judged"),
    ({**OLD, "varying": ["batch_size", 1, 2]}, OLD, None),  # G1: a traceback, then junk
    ({**OLD, "varying": "lr,batch_size"}, OLD, None),  # G2: 13 one-letter names added
    ("not json", OLD, None),
], ids=["widened", "another-recipe", "names-not-strings", "names-a-string", "damaged"])
def test_unpack_takes_the_names_the_call_let_vary_and_nothing_else(theirs, ours, says, tmp_path,
                                                                   capsys):
    files = _call_with_config(tmp_path, OLD)
    if theirs == "not json":
        files = tmp_path / "files2"
        there = tmp_path / "device2" / "data" / "runs" / "pretrain-gpu"
        (there / "gpu9").mkdir(parents=True)
        (there / "experiment.json").write_text("{\"hyperp")
        gpu_archive.pack([there], files, root=tmp_path / "device2",
                         extra={"products": ["data/runs/pretrain-gpu"]})
    elif theirs != OLD:
        files = _call_with_config(tmp_path / "b", theirs)
    home = tmp_path / "home"
    (home / "data" / "runs" / "pretrain-gpu").mkdir(parents=True)
    (home / "data" / "runs" / "pretrain-gpu" / "experiment.json").write_text(json.dumps(OLD))
    if theirs == "not json" or not isinstance(theirs["varying"], list) \
            or not all(isinstance(v, str) for v in theirs["varying"]):
        with pytest.raises(UserError, match="the call's data/runs/pretrain-gpu/experiment.json "
                                            ".*refused, nothing was unpacked"):
            gpu_archive.unpack(files, root=home)
        assert not (home / "data" / "runs" / "pretrain-gpu" / "gpu9").exists()
        assert json.loads((home / "data/runs/pretrain-gpu/experiment.json").read_text()) == OLD
        return
    placed = gpu_archive.unpack(files, root=home)
    assert home / "data" / "runs" / "pretrain-gpu" / "gpu9" in placed
    kept = json.loads((home / "data" / "runs" / "pretrain-gpu" / "experiment.json").read_text())
    assert kept == ours
    out = capsys.readouterr().out
    if says:
        assert any(re.search(says, line) for line in out.splitlines()), out


def test_each_pretraining_call_carries_its_own_slice_and_a_taken_name_is_refused(
        tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    plan = Plan(steps=["pretrain"], pretrain_run="gpu9")
    assert plan.corpus == f"{GPU_CORPUS}-gpu9" != Plan(steps=["pretrain"]).corpus
    assert Plan(pretrain_run="gpu9", tiny=True).corpus == f"{GPU_CORPUS}-gpu9-smoke"
    # the older runs' slice and this run's are both a bundle's, and only where bundle writes
    for name in (GPU_CORPUS, plan.corpus):
        (tmp_path / "work" / name / "bin").mkdir(parents=True)
        (tmp_path / "work" / name / "bin" / "dict.txt").write_text("d")
        assert gpu_bundle.bundle_output(tmp_path / "work" / name)
    elsewhere = tmp_path / "elsewhere" / plan.corpus
    (elsewhere / "bin").mkdir(parents=True)
    (elsewhere / "bin" / "dict.txt").write_text("d")
    assert not gpu_bundle.bundle_output(elsewhere)

    (tmp_path / "work" / "cls.books").mkdir()
    (tmp_path / "work" / "tokenizer").mkdir()
    (tmp_path / "runs" / "pretrain-gpu" / "gpu9").mkdir(parents=True)
    with pytest.raises(UserError, match="pretrain-gpu/gpu9 exists: choose another --pretrain-run"):
        gpu_bundle.bundle(tmp_path / "out", plan=plan, from_environment=True)
    # trial 7's B1, B2: a name the call's `pretrain --run` refuses, after the call's setup
    for name in ("../pretrain/new1", ""):
        with pytest.raises(UserError, match="must be a plain folder name"):
            gpu_bundle.bundle(tmp_path / "out", plan=Plan(steps=["pretrain"], pretrain_run=name),
                              from_environment=True)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == sorted(
        [GPU_CORPUS, plan.corpus, "cls.books", "tokenizer"])  # no slice written for them


def test_a_calls_experiment_json_where_there_is_none_comes_in_only_if_the_runs_agree(tmp_path,
                                                                                   capsys):
    """Trial 7's G5: a call's experiment.json was moved in unread where the experiment had
    none, and its pins rejected the twelve committed fairseq-gpu runs."""
    home = tmp_path / "home"
    mine = home / "data" / "runs" / "pretrain-gpu" / "gpu"
    mine.mkdir(parents=True)
    (mine / "manifest.json").write_text(json.dumps(
        {"hyperparameters": {"mask_prob": 0.15, "lr": 5e-4, "batch_size": 8}}))
    pins_other = {"hyperparameters": {"mask_prob": 0.15, "lr": 1e-5}, "varying": ["batch_size"]}
    gpu_archive.unpack(_call_with_config(tmp_path / "a", pins_other), root=home)
    assert not (mine.parent / "experiment.json").exists()
    assert "left out: data/runs/pretrain-gpu/gpu differs from it in lr" in capsys.readouterr().out
    assert (mine.parent / "gpu9").is_dir()  # the call's run comes in, judged without it
    agrees = {"hyperparameters": {"mask_prob": 0.15, "lr": 5e-4}, "varying": ["batch_size"]}
    other = tmp_path / "home2"
    shutil.copytree(home, other)
    shutil.rmtree(other / "data" / "runs" / "pretrain-gpu" / "gpu9")
    gpu_archive.unpack(_call_with_config(tmp_path / "b", agrees), root=other)
    assert json.loads((other / "data/runs/pretrain-gpu/experiment.json").read_text()) == agrees


def test_the_tree_is_counted_as_the_device_tool_counts_it_in_whole_blocks(tmp_path):
    # 63.4 MiB of file sizes was refused by the tool as over 64 MiB: 65.0 MiB in 4 KiB blocks
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "one-byte").write_bytes(b"x")
    (tmp_path / "a-block-and-one").write_bytes(b"x" * 4097)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "empty").write_bytes(b"")
    (tmp_path / ".gitignore").write_text("ignored\n")
    (tmp_path / "ignored").write_bytes(b"x" * 10_000)
    assert gpu_bundle.disk_bytes(tmp_path / "a-block-and-one") == 8192
    assert gpu_bundle.tree_bytes(tmp_path) == 4096 + 8192 + 0 + 4096  # .gitignore is a file too
    assert gpu_bundle.tree_bytes(tmp_path, under="sub") == 0
