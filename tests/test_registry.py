"""The registry on real tiny fairseq runs, and on every kind of broken run."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runfixtures import EXPERIMENT, HYPERPARAMETERS, copy_run, record_tiny_run, tiny_args

from finetune_lab.cli import main
from finetune_lab.runs import manifest as mf
from finetune_lab.runs.eventfiles import read_event_file_strict
from finetune_lab.runs.registry import (
    InvalidRunError,
    discover_runs,
    valid_runs,
    validate_run,
)
from finetune_lab.runs.listing import exclusions_markdown, runs_table
from finetune_lab.runs.tblogs import load_scalars

pytestmark = pytest.mark.slow


def _only(records, name):
    (rec,) = [r for r in records if r.name == name]
    return rec


def test_grid_is_valid(tiny_grid) -> None:
    records = discover_runs(tiny_grid.runs_root)
    assert len(records) == 4 and all(r.valid for r in records), runs_table(records)
    assert all(r.warnings == [] for r in records)
    for f in mf.event_files(records[0].path):
        assert read_event_file_strict(f) >= 2  # file_version event + scalars


def test_truncated_event_file(tiny_grid, tmp_path: Path) -> None:
    run = copy_run(tiny_grid, "random-seed1", tmp_path)
    (event,) = (run / "valid").glob("events.out.tfevents*")
    data = event.read_bytes()
    event.write_bytes(data[:-7])
    records = discover_runs(tmp_path)
    rec = _only(records, "random-seed1")
    assert not rec.valid
    assert f"event file {event} is truncated" in rec.reason
    with pytest.raises(InvalidRunError, match="truncated"):
        load_scalars(records)
    assert valid_runs(records) == []
    assert "random-seed1` excluded: " in exclusions_markdown(records)


def test_missing_manifest(tiny_grid, tmp_path: Path) -> None:
    run = copy_run(tiny_grid, "random-seed2", tmp_path)
    (run / "manifest.json").unlink()
    rec = _only(discover_runs(tmp_path), "random-seed2")
    assert not rec.valid and rec.status == "no manifest"
    assert f"{run / 'manifest.json'} is missing" in rec.reason


def test_hash_mismatch_event_file(tiny_grid, tmp_path: Path) -> None:
    run = copy_run(tiny_grid, "random-seed1", tmp_path)
    (mine,) = (run / "test").glob("events*")
    (other,) = (tiny_grid.experiment_dir / "random-seed2" / "test").glob("events*")
    shutil.copyfile(other, mine)  # a valid event file, but not the one this run wrote
    rec = _only(discover_runs(tmp_path), "random-seed1")
    assert not rec.valid
    assert f"hash mismatch: event file {mine}" in rec.reason


def test_hash_mismatch_data_changed(tiny_grid, tmp_path: Path) -> None:
    data = tmp_path / "data-bin"
    shutil.copytree(tiny_grid.data_bin, data)
    run = copy_run(tiny_grid, "pretrained-seed1", tmp_path / "runs")
    man = mf.read_manifest(run)
    man["inputs"]["data"][0]["path"] = str(data)  # the run's data, moved
    mf.write_manifest(run, man)
    assert _only(discover_runs(tmp_path / "runs"), "pretrained-seed1").valid
    # the folder's build record (timings) is not data: rebuilding identical data keeps the run,
    # also for manifests written when inputs still listed it
    assert mf.BUILD_RECORD not in man["inputs"]["data"][0]["sha256"]
    for record in sorted(mf.BUILD_RECORDS):  # manifest.json, conversion.json
        (data / record).write_text('{"seconds": 12.3}')
        man["inputs"]["data"][0]["sha256"][record] = "0" * 64
    mf.write_manifest(run, man)
    assert _only(discover_runs(tmp_path / "runs"), "pretrained-seed1").valid
    # fairseq-preprocess's logs name the absolute paths of the checkout that built the data:
    # a log written elsewhere, whether the manifest recorded one (as before issue 19) or not
    for sub in ("input0", "label"):
        (data / sub / mf.BUILD_LOG).write_text("srcdict='/another/checkout/tokenizer/dict.txt'\n")
    man["inputs"]["data"][0]["sha256"]["input0/" + mf.BUILD_LOG] = "0" * 64
    mf.write_manifest(run, man)
    assert _only(discover_runs(tmp_path / "runs"), "pretrained-seed1").valid
    (data / "label" / "dict.txt").write_text("1 5\n0 5\n")  # labels swapped
    rec = _only(discover_runs(tmp_path / "runs"), "pretrained-seed1")
    assert not rec.valid
    assert f"hash mismatch: data file {data / 'label' / 'dict.txt'}" in rec.reason
    # data that is simply not on this machine is reported, not silently trusted
    shutil.rmtree(data)
    rec = _only(discover_runs(tmp_path / "runs"), "pretrained-seed1")
    assert rec.valid and "unverified" in rec.warnings[0]
    # a replaced checkpoint (a new pretraining) says so, and what to do
    model = tmp_path / "model.pt"
    model.write_bytes(b"new weights")
    man["inputs"]["checkpoint"] = {"path": str(model), "sha256": {".": "0" * 64}}
    mf.write_manifest(run, man)
    rec = _only(discover_runs(tmp_path / "runs"), "pretrained-seed1")
    assert f"hash mismatch: checkpoint file {model}" in rec.reason
    assert "the checkpoint was replaced after the run" in rec.reason
    assert rec.stale_checkpoint == "0" * 64
    assert exclusions_markdown([rec]) == (
        f"- `{rec.experiment}/pretrained-seed1`: made from an earlier stand-in checkpoint, which a new "
        "pretraining has replaced; excluded until re-run from the current one, never mixed with "
        "its runs.")


def test_empty_log_directory(tiny_grid, tmp_path: Path) -> None:
    (tmp_path / EXPERIMENT / "empty").mkdir(parents=True)
    run = copy_run(tiny_grid, "random-seed2", tmp_path)
    for sub in ("train", "train_inner", "valid", "test"):
        shutil.rmtree(run / sub)
    records = discover_runs(tmp_path)
    empty = _only(records, "empty")
    assert "no TensorBoard event files" in empty.reason and "manifest.json is missing" in empty.reason
    rec = _only(records, "random-seed2")
    assert f"no TensorBoard event files under {run} (empty log directory)" in rec.reason
    assert "listed in the manifest is missing" in rec.reason


def test_run_killed_mid_way(tiny_grid, tmp_path: Path) -> None:
    """A real fairseq run, killed (with its launcher) after its first validation."""
    runs_root = tmp_path / "runs"
    args = tiny_args(tiny_grid.data_bin, seed=7, hp={"max_epoch": 500})
    script = tmp_path / "launch.py"
    script.write_text(
        "import json, sys\n"
        "from finetune_lab.runs.recording import record_run, run_fairseq_train\n"
        f"args = json.loads({json.dumps(json.dumps(args))})\n"
        f"with record_run('{EXPERIMENT}', 'killed', framework='fairseq', init='random', seed=7,\n"
        f"                hyperparameters={{'lr': 1e-3}}, runs_root={str(runs_root)!r}) as h:\n"
        "    run_fairseq_train(h, args)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = runs_root / EXPERIMENT / "killed"
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and not list(run.glob("train/events*")):
            assert proc.poll() is None, "the launcher ended before it could be killed"
            time.sleep(0.2)
        assert list(run.glob("train/events*")), "training never logged an epoch"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    records = discover_runs(runs_root)
    rec = _only(records, "killed")
    assert rec.status == "running"
    assert "status is 'running': the run never finished" in rec.reason
    assert mf.read_manifest(run)["end_time"] is None
    with pytest.raises(InvalidRunError, match="never finished"):
        load_scalars(records)


def test_hyperparameters_differ(tiny_grid, tmp_path: Path) -> None:
    for name in ("random-seed1", "random-seed2"):
        copy_run(tiny_grid, name, tmp_path)
    record_tiny_run(tmp_path, tiny_grid.data_bin, None, init="random", seed=3,
                    run="random-seed3-lr", hp={"lr": 5e-3})
    records = discover_runs(tmp_path)
    odd = _only(records, "random-seed3-lr")
    assert not odd.valid
    assert odd.reason == (f"hyperparameter 'lr' = 0.005 differs from the other runs of "
                          f"experiment '{EXPERIMENT}' (0.001 in 2 of 3 runs)")
    assert [r.name for r in valid_runs(records)] == ["random-seed1", "random-seed2"]

    # with only two runs nothing says which lr is right: both are flagged
    shutil.rmtree(tmp_path / EXPERIMENT / "random-seed2")
    records = discover_runs(tmp_path)
    assert valid_runs(records) == []
    assert all("disagrees across the runs" in r.reason for r in records)

    # an experiment.json settles it
    (tmp_path / EXPERIMENT / "experiment.json").write_text(
        json.dumps({"hyperparameters": HYPERPARAMETERS}))
    records = discover_runs(tmp_path)
    assert [r.name for r in valid_runs(records)] == ["random-seed1"]
    assert "'lr' = 0.005 differs from experiment.json (0.001)" in _only(
        records, "random-seed3-lr").reason


def test_runs_cli(tiny_grid, tmp_path: Path, capsys) -> None:
    run = copy_run(tiny_grid, "random-seed1", tmp_path)
    copy_run(tiny_grid, "random-seed2", tmp_path)
    (run / "manifest.json").unlink()
    assert main(["runs", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "BAD tiny-grid/random-seed1" in out and "manifest.json is missing" in out
    assert "ok  tiny-grid/random-seed2" in out and "1 valid, 1 excluded" in out
    assert main(["runs", "--root", str(tmp_path), "--strict"]) == 1


def test_malformed_manifests_are_excluded_not_fatal(tiny_grid, tmp_path: Path, capsys) -> None:
    """Valid JSON of the wrong shape makes that one run invalid; `runs` and the loaders go on
    (issue 19)."""
    data_list = copy_run(tiny_grid, "random-seed1", tmp_path)
    man = mf.read_manifest(data_list)
    man["inputs"]["data"] = ["data-bin/input0"]  # strings where records belong
    mf.write_manifest(data_list, man)
    outputs_list = copy_run(tiny_grid, "random-seed2", tmp_path)
    man = mf.read_manifest(outputs_list)
    outputs = man["outputs"]
    man["outputs"] = list(outputs)  # a list: the event files' hashes could not be checked
    mf.write_manifest(outputs_list, man)
    (mine,) = (outputs_list / "test").glob("events*")
    shutil.copyfile(next((tiny_grid.experiment_dir / "pretrained-seed1" / "test").glob("events*")),
                    mine)  # and an event file swapped for another run's
    copy_run(tiny_grid, "pretrained-seed1", tmp_path)
    records = discover_runs(tmp_path)
    assert "'inputs.data[0]' is not a {path, sha256} record" in _only(records, "random-seed1").reason
    assert "'outputs' is not a mapping" in _only(records, "random-seed2").reason
    assert _only(records, "pretrained-seed1").valid
    assert len(load_scalars(valid_runs(records))) > 0
    assert main(["runs", "--root", str(tmp_path)]) == 0
    assert "1 valid, 2 excluded" in capsys.readouterr().out


def _alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead but not yet reaped, counts as dead)."""
    try:
        return "\tZ" not in Path(f"/proc/{pid}/status").read_text().split("State:")[1][:4]
    except (FileNotFoundError, IndexError):
        return False


def _launch_sleeping_trainer(tmp_path: Path, runs_root: Path, run: str):
    """A launcher process recording run ``run`` whose trainer sleeps: (launcher, trainer pid)."""
    pid_file = tmp_path / f"{run}.pid"
    trainer = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(120)")
    script = tmp_path / f"launch-{run}.py"
    script.write_text(
        "import sys\n"
        "from finetune_lab.runs.recording import record_run\n"
        f"with record_run('{EXPERIMENT}', '{run}', framework='fairseq', init='random', seed=1,\n"
        f"                hyperparameters={{'lr': 1e-3}}, runs_root={str(runs_root)!r}) as h:\n"
        f"    h.run([sys.executable, '-c', {trainer!r}])\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (pid_file.is_file() and pid_file.read_text()):
        time.sleep(0.1)
    return proc, int(pid_file.read_text())


def test_one_writer_per_run_and_no_orphan_trainer(tmp_path: Path, capsys) -> None:
    """A second launch of a run being written is refused (before it can delete or mix into the
    folder), and killing the launcher kills its trainer (issue 19)."""
    from finetune_lab.runs.recording import record_run
    from finetune_lab.runs.runlock import RunLockedError

    runs_root = tmp_path / "runs"
    proc, trainer_pid = _launch_sleeping_trainer(tmp_path, runs_root, "locked")
    try:
        with pytest.raises(RunLockedError, match=f"pid {proc.pid}"):
            with record_run(EXPERIMENT, "locked", framework="fairseq", init="random", seed=1,
                            hyperparameters={"lr": 1e-3}, runs_root=runs_root, overwrite=True):
                pass
        assert (runs_root / EXPERIMENT / "locked" / "manifest.json").is_file()  # not deleted
    finally:
        proc.kill()  # SIGKILL: the launcher cannot clean up
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _alive(trainer_pid):
            break
        time.sleep(0.1)
    else:
        os.kill(trainer_pid, signal.SIGKILL)
        pytest.fail("the trainer outlived its killed launcher")
    # the lock died with its holder: the run can be launched again, and says it took over
    with record_run(EXPERIMENT, "locked", framework="fairseq", init="random", seed=1,
                    hyperparameters={"lr": 1e-3}, runs_root=runs_root, overwrite=True) as h:
        h.run([sys.executable, "-c", "pass"])
    assert mf.read_manifest(runs_root / EXPERIMENT / "locked")["status"] == "complete"
    assert f"took over the lock of pid {proc.pid}" in capsys.readouterr().out
    assert not list((runs_root / EXPERIMENT).glob(".*.lock"))


def test_sigterm_stops_the_trainer_and_the_manifest_says_so(tmp_path: Path) -> None:
    runs_root = tmp_path / "runs"
    proc, trainer_pid = _launch_sleeping_trainer(tmp_path, runs_root, "termed")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    man = mf.read_manifest(runs_root / EXPERIMENT / "termed")
    assert man["status"] == "failed" and man["error"] == "interrupted (signal 15)"
    assert "interrupted before its training process ended (interrupted (signal 15))" in \
        mf.manifest_problems(man)[0]
    time.sleep(0.5)
    assert not _alive(trainer_pid)


def test_a_trainer_that_logged_done_but_hangs_is_ended_and_the_run_counts(tmp_path: Path) -> None:
    """fairseq on the H100 logged "done training" and then did not exit (issue 18): the launcher
    ends it and its children after a grace period and records that it did."""
    from finetune_lab.runs.recording import FAIRSEQ_DONE, record_run

    runs_root, child_pid = tmp_path / "runs", tmp_path / "child.pid"
    trainer = ("import subprocess, sys, time\n"
               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
               f"open({str(child_pid)!r}, 'w').write(str(c.pid))\n"
               f"print('| INFO | fairseq_cli.train | {FAIRSEQ_DONE} 3.0 seconds', flush=True)\n"
               "time.sleep(120)\n")
    started = time.monotonic()
    with record_run(EXPERIMENT, "hung", framework="fairseq", init="random", seed=1,
                    hyperparameters={"lr": 1e-3}, runs_root=runs_root) as h:
        code = h.run([sys.executable, "-c", trainer], done_marker=FAIRSEQ_DONE, exit_grace_s=2)
    assert code == 0 and time.monotonic() - started < 60
    man = mf.read_manifest(runs_root / EXPERIMENT / "hung")
    assert man["status"] == "complete" and "but had not exited 2 s later" in man["exit_forced"]
    time.sleep(0.5)
    assert not _alive(int(child_pid.read_text()))
    # without the marker nothing is ended early, and no note is written
    with record_run(EXPERIMENT, "quick", framework="fairseq", init="random", seed=1,
                    hyperparameters={"lr": 1e-3}, runs_root=runs_root) as h:
        assert h.run([sys.executable, "-c", "print('working')"], done_marker=FAIRSEQ_DONE) == 0
    assert "exit_forced" not in mf.read_manifest(runs_root / EXPERIMENT / "quick")



def test_a_log_replaced_under_a_running_trainer_does_not_end_it(tmp_path: Path) -> None:
    """A ``git stash`` during a run put an earlier run's complete log (done marker and all) at
    ``train.log``; the launcher read that path, took the marker for its trainer's, and killed it
    mid-run. The watch reads the file the trainer writes to, whatever is at the path since."""
    from finetune_lab.runs.recording import FAIRSEQ_DONE, record_run

    runs_root, finished = tmp_path / "runs", tmp_path / "finished"
    log = runs_root / EXPERIMENT / "replaced" / "train.log"
    trainer = ("import os, time\n"
               "print('epoch 1', flush=True)\n"
               f"os.replace({str(log)!r} + '.old', {str(log)!r})\n"
               "time.sleep(4)\n"
               f"open({str(finished)!r}, 'w').write('yes')\n")
    with record_run(EXPERIMENT, "replaced", framework="fairseq", init="random", seed=1,
                    hyperparameters={"lr": 1e-3}, runs_root=runs_root) as h:
        log.parent.mkdir(parents=True, exist_ok=True)
        (log.parent / "train.log.old").write_text(f"| {FAIRSEQ_DONE} 9.0 seconds\n")
        code = h.run([sys.executable, "-c", trainer], done_marker=FAIRSEQ_DONE,
                     exit_grace_s=0.5)
    assert code == 0 and finished.read_text() == "yes"
    assert "exit_forced" not in mf.read_manifest(runs_root / EXPERIMENT / "replaced")


def test_a_run_killed_as_done_must_have_reached_its_last_update(tmp_path: Path) -> None:
    """``exit_forced`` says the launcher killed a trainer after its done marker; a real fairseq
    run so marked is valid only if its event files reach the recipe's last update."""
    real = Path("data/runs/fairseq/pretrained-seed0")
    run = tmp_path / "runs" / "fairseq" / real.name
    shutil.copytree(real, run)
    man = mf.read_manifest(run)
    total = int(man["hyperparameters"]["total_updates"])
    man["exit_forced"] = "logged 'done training' but had not exited 30 s later: killed"
    mf.write_manifest(run, man)
    assert validate_run(run, check_inputs=False).valid  # its valid and test events at `total`
    man["hyperparameters"]["total_updates"] = total + 225  # an epoch it never ran, and the
    flag = man["command"].index("--total-num-update") + 1  # command that asked for it
    man["command"][flag] = str(total + 225)
    mf.write_manifest(run, man)
    rec = validate_run(run, check_inputs=False)
    killed = (f"{run} was killed as done ({man['exit_forced']}), but its event files stop at "
              f"update {total:,} of {total + 225:,}: the run did not finish; run it again")
    # (its recipe's updates no longer fit its epochs either, nor the configuration its
    # train.log prints, for the command and the recipe: those checks name them too)
    assert killed in rec.problems and len(rec.problems) == 4
    assert sum("configured with total_num_update='1125'" in p for p in rec.problems) == 2
    del man["exit_forced"]  # a trainer that exited on its own is not second-guessed here
    mf.write_manifest(run, man)
    assert killed not in validate_run(run, check_inputs=False).problems


def test_a_run_from_a_converted_model_names_the_checkpoint_behind_it(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """Transformers and LoRA runs read a converted model in the git-ignored work dir, so its
    hashes cannot be checked on a fresh clone: the fairseq checkpoint it was converted from
    decides. Recorded (``extra.converted_from``): compared with that file now; not recorded
    (older runs): a packaged checkpoint created after the run started cannot be its source."""
    from finetune_lab._files import sha256_file
    from finetune_lab.models.conversion_record import CONVERTED_FROM
    from finetune_lab.runs import run_inputs

    real = next(m.parent for m in sorted(Path("data/runs").glob("*/*/manifest.json"))
                if (man := mf.read_manifest(m.parent))["framework"] == "transformers"
                and man["init"] == "pretrained" and man["status"] == mf.STATUS_COMPLETE)
    run = tmp_path / "runs" / real.parent.name / real.name
    shutil.copytree(real, run)
    man = mf.read_manifest(run)
    for item in man["inputs"]["data"]:  # inputs absent here, as on a fresh clone
        item["path"] = str(tmp_path / "absent" / Path(item["path"]).name)
    man["inputs"]["checkpoint"]["path"] = str(tmp_path / "absent" / "hf")
    start = datetime.datetime.fromisoformat(man["start_time"])  # its event files' own time
    before, after = ((start + datetime.timedelta(days=d)).isoformat() for d in (-1, 1))
    man.setdefault("extra", {}).pop(CONVERTED_FROM, None)

    def check(created=None):
        mf.write_manifest(run, man)
        monkeypatch.setattr(run_inputs, "package_manifest", lambda: {"created": created})
        return _only(discover_runs(tmp_path / "runs"), real.name)

    assert check(before).valid  # packaged before the run: may be its source
    rec = check(after)
    assert not rec.valid and rec.stale_checkpoint and "before the packaged checkpoint" in rec.reason
    model = tmp_path / "model.pt"
    model.write_bytes(b"the weights it was converted from")
    man["extra"][CONVERTED_FROM] = {"path": str(model), "sha256": sha256_file(model)}
    assert check(after).valid  # the record decides, not the dates
    model.write_bytes(b"a new pretraining")
    rec = check()
    assert not rec.valid and "the checkpoint was replaced after the run" in rec.reason
    assert rec.stale_checkpoint == man["extra"][CONVERTED_FROM]["sha256"]


def test_a_conversion_by_another_transformers_version_keeps_the_runs(tmp_path: Path,
                                                                     monkeypatch) -> None:
    """``save_pretrained`` stamps ``config.json`` with the Transformers version that wrote it:
    the same checkpoint converted again after an upgrade differs by that stamp only, and the
    runs made from the first conversion stay valid; a change of the model's configuration
    still excludes them."""
    import transformers
    from transformers import RobertaConfig

    from finetune_lab._files import sha256_file
    from finetune_lab.runs import run_inputs

    real = next(m.parent for m in sorted(Path("data/runs").glob("*/*/manifest.json"))
                if (man := mf.read_manifest(m.parent))["framework"] == "transformers"
                and man["init"] == "pretrained" and man["status"] == mf.STATUS_COMPLETE)
    run = tmp_path / "runs" / real.parent.name / real.name
    shutil.copytree(real, run)
    hf = tmp_path / "hf"
    config = RobertaConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=32)
    config.save_pretrained(hf)
    man = mf.read_manifest(run)
    for item in man["inputs"]["data"]:
        item["path"] = str(tmp_path / "absent" / Path(item["path"]).name)
    man["inputs"]["checkpoint"] = {"path": str(hf),
                                   "sha256": {"config.json": sha256_file(hf / "config.json")}}
    man["environment"]["packages"]["transformers"] = transformers.__version__
    man.setdefault("extra", {}).pop("converted_from", None)
    mf.write_manifest(run, man)
    monkeypatch.setattr(run_inputs, "package_manifest", lambda: None)

    def record():
        run_inputs._HASH_CACHE.clear()
        return _only(discover_runs(tmp_path / "runs"), real.name)

    assert record().valid
    # converted again by a newer Transformers: another stamp, another sha256, the same model
    monkeypatch.setattr(transformers.configuration_utils, "__version__", "99.0.0")
    config.save_pretrained(hf)
    assert '"transformers_version": "99.0.0"' in (hf / "config.json").read_text()
    assert sha256_file(hf / "config.json") != man["inputs"]["checkpoint"]["sha256"]["config.json"]
    assert record().valid
    # the run's own version unknown: nothing to restamp with, so the difference counts
    del man["environment"]["packages"]["transformers"]
    mf.write_manifest(run, man)
    assert not record().valid
    man["environment"]["packages"]["transformers"] = transformers.__version__
    mf.write_manifest(run, man)
    # another model: excluded, whatever the stamp
    config.hidden_dropout_prob = 0.3
    config.save_pretrained(hf)
    rec = record()
    assert not rec.valid and f"hash mismatch: checkpoint file {hf / 'config.json'}" in rec.reason
    # a converted model is a run's data as well as its checkpoint: one change, one problem,
    # with the checkpoint's reason
    man["inputs"]["data"].append({"path": str(hf),
                                  "sha256": dict(man["inputs"]["checkpoint"]["sha256"])})
    mf.write_manifest(run, man)
    about = [p for p in record().problems if "config.json" in p]
    assert len(about) == 1 and about[0].startswith("hash mismatch: checkpoint file")
