"""Runs side by side (``--jobs N``): the pool, its failures and its interruption, then a real
fairseq grid of two runs at once, one made to fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import terminal_signals
from finetune_lab.runs import jobs


def _job(tmp_path: Path, name: str, code: int = 0, sleep: float = 0.5) -> jobs.Job:
    """A job that records when it ran and the threads it was given, then exits with ``code``."""
    script = (f"import os, time, json; t0 = time.time(); time.sleep({sleep}); "
              f"json.dump({{'start': t0, 'end': time.time(), "
              f"'threads': os.environ['OMP_NUM_THREADS']}}, open({str(tmp_path / name)!r}, 'w')); "
              f"raise SystemExit({code})")
    return jobs.Job(name, [sys.executable, "-c", script], tmp_path / "logs" / f"{name}.log")


def test_the_pool_keeps_its_width_splits_threads_and_outlives_a_failure(tmp_path, capsys):
    grid = [_job(tmp_path, "a"), _job(tmp_path, "b", code=3), _job(tmp_path, "c")]
    results = jobs.run_parallel(grid, 2, label="grid", gpus=0)
    assert [(r.name, r.exit_code) for r in results] == [("a", 0), ("b", 3), ("c", 0)]
    spans = [json.loads((tmp_path / n).read_text()) for n in "abc"]
    assert {s["threads"] for s in spans} == {str(max(1, jobs.cpu_threads() // 2))}
    # never three at once: c starts only after a or b has ended
    assert spans[2]["start"] >= min(spans[0]["end"], spans[1]["end"]) - 0.05
    assert jobs.report(results, "grid") == 1
    out = capsys.readouterr().out
    assert "b FAILED (exit 3" in out and "1 of 3 failed: b (exit 3, log" in out
    assert "3 done, 0 running, 0 left" in out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_every_job(tmp_path, sig):
    code = (
        "import sys, time; from pathlib import Path; from finetune_lab.runs import jobs\n"
        f"tmp = Path({str(tmp_path)!r})\n"
        "grid = [jobs.Job(n, [sys.executable, '-c', "
        "f\"import os, time; open({str(tmp)!r} + '/{n}.pid', 'w').write(str(os.getpid())); "
        "time.sleep(120)\"], tmp / f'{n}.log') for n in ('x', 'y')]\n"
        "try:\n    jobs.run_parallel(grid, 2, gpus=0)\nexcept KeyboardInterrupt:\n"
        "    sys.exit(130)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], preexec_fn=terminal_signals)
    pid_files = [tmp_path / "x.pid", tmp_path / "y.pid"]
    deadline = time.monotonic() + 60
    while not all(p.is_file() and p.read_text() for p in pid_files):
        assert time.monotonic() < deadline, "the jobs never started"
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in pid_files]
    parent.send_signal(sig)
    assert parent.wait(timeout=60) == 130
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
def test_a_fairseq_grid_of_two_at_once_reports_the_one_that_failed(tiny_pipeline, tmp_path,
                                                                   monkeypatch, capsys):
    from finetune_lab.cli import main
    from finetune_lab.runs.registry import validate_run

    runs = tmp_path / "runs"
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(runs))
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    code = main(["finetune", "fairseq", "--init", "pretrained", "random", "--seeds", "0",
                 "--epochs", "1", "--data", str(tiny_pipeline["cls_bin"]),
                 "--checkpoint", str(tmp_path / "no-such-checkpoint"), "--jobs", "2",
                 "--experiment", "grid"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "1 of 2 failed: pretrained-seed0" in out
    assert "does not exist" in (tmp_path / "work" / "job-logs" / "grid" /
                                "pretrained-seed0.log").read_text()
    done = runs / "grid" / "random-seed0"
    assert validate_run(done).valid, validate_run(done).reason
    manifest = json.loads((done / "manifest.json").read_text())
    assert manifest["device"]["threads"] == max(1, jobs.cpu_threads() // 2)
    assert not (runs / "grid" / "pretrained-seed0" / "manifest.json").exists()


def test_a_deadline_stops_the_running_and_never_starts_the_waiting(tmp_path):
    grid = [_job(tmp_path, "quick", sleep=0.1), _job(tmp_path, "slow", sleep=30),
            _job(tmp_path, "late")]
    start = time.monotonic()
    results = jobs.run_parallel(grid, 1, gpus=0, deadline=time.monotonic() + 3)
    assert time.monotonic() - start < 20
    assert [(r.name, r.exit_code) for r in results] == [("quick", 0), ("slow", None),
                                                        ("late", None)]
    assert not (tmp_path / "slow").exists()  # stopped before it could record its end
