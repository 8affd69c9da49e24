"""The ninth fault trial, fixed by class: no reader of a record opens a named pipe (it waited
for ever: the chapters and `finetune-lab runs` hung); a packaged checkpoint's weights without
their manifest are damage, not "no package"; an event file's values agree with the log the run
wrote beside it, and no tag is logged twice at one update."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from finetune_lab.errors import UserError


def _returns(call, seconds: float = 20.0):
    """``call()``'s result, failing (not hanging) if it does not return in ``seconds``."""
    box: dict = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test below
            box["error"] = exc
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the reader blocked on a named pipe"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_a_named_pipe_where_a_record_goes_is_set_aside_without_opening_it(tmp_path):
    """FF1-FF5, CK2: a FIFO among the probe, fill-mask or device-call records, as an
    experiment.json, or as the package's manifest."""
    from finetune_lab.book.summary_files import read_json_files
    from finetune_lab.models.checkpoints import package_manifest
    from finetune_lab.runs.experiments import parse_config
    from finetune_lab.runs.gpu_calls import CALL_RECORDS, call_devices

    probes = tmp_path / "probes"
    probes.mkdir()
    os.mkfifo(probes / "zz.json")
    good, bad = _returns(lambda: read_json_files(probes, lambda record: None))
    assert good == [] and "`zz.json` cannot be read as JSON" in bad[0] and "not a regular" in bad[0]

    calls = tmp_path / CALL_RECORDS
    calls.mkdir(parents=True)
    os.mkfifo(calls / "20261127T000000Z.json")
    assert _returns(lambda: call_devices(tmp_path)) == []

    os.mkfifo(tmp_path / "experiment.json")
    with pytest.raises(UserError, match="cannot be read .*not a regular file"):
        _returns(lambda: parse_config(tmp_path / "experiment.json"))

    package = tmp_path / "package"
    package.mkdir()
    os.mkfifo(package / "manifest.json")
    with pytest.raises(UserError, match="manifest.json is damaged .it is not a regular file"):
        _returns(lambda: package_manifest(package))


def test_weights_without_their_manifest_are_a_damaged_package(tmp_path):
    """CK1: the committed package's manifest deleted: `runs` said 100 valid, the lineage came
    back empty and the pretraining chapter failed with a TypeError."""
    from finetune_lab.models.checkpoints import package_manifest

    package = tmp_path / "roberta-small-fr"
    package.mkdir()
    assert package_manifest(package) is None  # nothing packaged yet
    (package / "model.pt").write_bytes(b"weights")
    with pytest.raises(UserError, match="manifest.json is damaged .it is missing beside model.pt"):
        package_manifest(package)


# --- E1, E4, E5, E6, E9: event values against themselves and the run's own log ---------------


def _events_file(cache: Path, key: str, folder: str = "") -> Path:
    return next(p for p in (cache / key / folder).iterdir() if p.name.startswith("events.out"))


def _record(cache: Path, key: str):
    from finetune_lab.runs.registry import discover_runs

    return {r.key: r for r in discover_runs(cache, [key.split("/")[0]])}[key]


def _scale(tag: str, factor: float, step: int | None = None):
    def change(event):
        for v in event.summary.value:
            if v.tag == tag and (step is None or event.step == step):
                v.simple_value *= factor
    return change


@pytest.mark.parametrize("key, folder, tag, factor, step, said", [
    # E4: the best epoch's test accuracy 67.3 -> 80.0 (the seed table and the gap moved)
    ("fairseq/random-seed0", "test", "accuracy", 80.0 / 67.3, 900,
     "its test accuracy at update 900 is 80 in test/"),
    # E9: every training loss halved (the learning-curve figure's loss panel)
    ("fairseq/random-seed0", "train_inner", "loss", 0.5, None,
     "its train_inner loss at update 10 is 0.4995"),
    # E6: a pretraining run's validation loss 8.844 -> 4.0 (the plateau table's "left at")
    ("pretrain/cpu-long2", "valid", "loss", 4.0 / 8.844, 2442,
     "its valid loss at update 2442 is 4 in valid/"),
])
def test_a_fairseq_value_its_train_log_does_not_print_rejects_the_run(cache, key, folder, tag,
                                                                      factor, step, said):
    from test_faults_trial7 import _rewrite_events

    assert _record(cache, key).valid
    _rewrite_events(_events_file(cache, key, folder), _scale(tag, factor, step))
    rec = _record(cache, key)
    assert not rec.valid and said in rec.reason and "but its train.log prints" in rec.reason, \
        rec.reason


@pytest.mark.parametrize("key, folder, tag, step", [
    ("transformers/pretrained-seed0", "", "test/accuracy", 450),  # E1: 77.20 -> 90.00 won
    ("fairseq/random-seed0", "valid", "accuracy", 450),           # E5: chose another epoch
])
def test_a_metric_logged_twice_at_one_update_rejects_the_run(cache, key, folder, tag, step):
    from test_faults_trial7 import _rewrite_events

    def twice(event):
        extra = [v for v in event.summary.value if v.tag == tag and event.step == step]
        for v in extra:
            copy = event.summary.value.add()
            copy.CopyFrom(v)
            copy.simple_value = 90.0
    _rewrite_events(_events_file(cache, key, folder), twice)
    rec = _record(cache, key)
    assert not rec.valid and f"logs {tag} twice at update {step}" in rec.reason, rec.reason


# --- GU1: a call's record claims a run that did not come back ---------------------------------


def test_a_later_call_counts_only_the_jobs_whose_runs_came_back_valid(cache, tmp_path):
    """GU1: a call record whose one job "exited 0" but whose run came back without a manifest
    was kept, and the fairseq chapter said a later command ran seed 9."""
    import json
    import shutil

    from finetune_lab.book import devices
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.runs.gpu_calls import CALL_RECORDS

    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    os.symlink(cache, root / "data" / "runs")
    shutil.copytree(PROJECT_ROOT / CALL_RECORDS, root / CALL_RECORDS)
    lab = devices.latest_call(root)
    before = devices.seed_calls_sentence(devices.seed_calls(root), lab.seeds)
    assert "ran the fairseq and Transformers grids with seeds 3 to " in before
    meta = json.loads((root / CALL_RECORDS / "20261126T072936Z.json").read_text())
    meta["plan"].update(seeds=[9], lab_parts=["fairseq"])
    meta["jobs"] = [{"job": "fairseq-random-seed9", "exit_code": 0, "seconds": 10.0}]
    meta["products"] = ["data/runs/zzf-gpu", "data/work/gpu-lab-logs/20261127T000000Z"]
    (root / CALL_RECORDS / "20261127T000000Z.json").write_text(json.dumps(meta))
    (cache / "zzf-gpu" / "random-seed9").mkdir(parents=True)
    (cache / "zzf-gpu" / "random-seed9" / "notes.txt").write_text("no manifest came back")
    assert devices.seed_calls_sentence(devices.seed_calls(root), lab.seeds) == before


# --- PR1, FM3: a record given another candidate's weights -------------------------------------


@pytest.mark.parametrize("folder, name, other", [
    ("probes", "cpu-long2", "cpu-long"),             # PR1: took cpu-long's fine-tuned result
    ("fill-mask", "cpu-sinpos1", "cpu-sinpos1-bow"),  # FM3: filed among the committed model's
])
def test_a_record_naming_another_candidates_weights_is_set_aside(tmp_path, folder, name, other):
    import json
    import shutil

    from finetune_lab.book import fill_mask, probe_report
    from finetune_lab.config import PROJECT_ROOT

    records = tmp_path / folder
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / folder, records)
    record = json.loads((records / f"{name}.json").read_text())
    record["checkpoint"] = json.loads((records / f"{other}.json").read_text())["checkpoint"]
    (records / f"{name}.json").write_text(json.dumps(record))
    aside: list[str] = []
    if folder == "probes":
        table = probe_report.probe_table(records, set_aside=aside)
        assert len(table) == len(list(records.glob("*.json"))) - 1
    else:  # the probe record of that name holds other weights: one name, one set of weights
        assert name not in fill_mask.recorded_fill_masks(records, set_aside=aside)
        assert len(aside) == 1 and aside[0].startswith(
            f"`{name}.json` names other weights than probes/{name}.json does"), aside
        return
    assert aside == [f"`{name}.json` names the weights of {other!r} (data/work/candidates/"
                     f"{other}/model.pt): a candidate's record is named after its weights"]


def test_runs_given_a_run_folder_for_the_root_says_what_to_give(cache, capsys):
    """R1: `runs --root data/runs/fairseq/random-seed0` said "no runs" over a valid run."""
    from finetune_lab.cli import main

    assert main(["runs", "--root", str(cache / "fairseq" / "random-seed0"), "--no-inputs"]) == 2
    assert f"is a run folder, not the runs root: give --root {cache} --experiment fairseq" in \
        capsys.readouterr().err


# --- E2, S3: a Transformers run's derived losses and updates ----------------------------------


def test_an_epoch_loss_that_is_not_its_intervals_mean_rejects_the_run(cache):
    """E2: every train/epoch_loss halved (the loss figure halved), its interval losses kept."""
    from test_faults_trial7 import _rewrite_events

    key = "transformers/pretrained-seed0"
    _rewrite_events(_events_file(cache, key), _scale("train/epoch_loss", 0.5))
    rec = _record(cache, key)
    assert not rec.valid and "its train/epoch_loss at update 225 is 0.324085, but the 9 " \
        "train/loss values of that epoch average 0.648169" in rec.reason, rec.reason


def test_total_updates_is_the_epochs_batches_of_the_training_set(cache):
    """S3: batch size 8 -> 16 on all three seeds: held against nothing, though 1,800 reviews
    in batches of 16 make 565 updates in 5 epochs, not 1,125."""
    import json

    for seed in range(3):
        path = cache / "transformers" / f"pretrained-seed{seed}" / "manifest.json"
        man = json.loads(path.read_text())
        man["hyperparameters"]["batch_size"] = 16
        path.write_text(json.dumps(man))
    rec = _record(cache, "transformers/pretrained-seed1")
    assert not rec.valid and "hyperparameters.total_updates 1,125 but 5 epochs of 1,800 " \
        "reviews in batches of 16 are 565 updates" in rec.reason


def test_a_named_pipe_for_a_calls_gpu_samples_is_no_samples(tmp_path):
    """Trial 10's FF8: a pipe at `<stamp>-nvidia-smi.csv` hung the chapters and `runs`."""
    from datetime import datetime, timezone

    from finetune_lab.runs.gpu_calls import gpu_samples

    os.mkfifo(tmp_path / "20261127T000000Z-nvidia-smi.csv")
    start = datetime(2026, 11, 27, tzinfo=timezone.utc)
    assert _returns(lambda: gpu_samples(tmp_path / "20261127T000000Z-nvidia-smi.csv", start,
                                        60.0)) == (None, None)
