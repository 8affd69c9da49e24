"""Fault trial 29 and what trial 28 left: children that outlive a killed command (P-m3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="PR_SET_PDEATHSIG is Linux's")

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
"""A child that names itself in a file, then works for two minutes: a stand-in for a long one."""

LAUNCHERS = {
    # fairseq-preprocess, as binarize starts it
    "binarize": """
        from finetune_lab.data import binarize
        binarize._preprocess_executable = lambda: [sys.executable, "-c", SLEEPER, PIDFILE]
        binarize.run_preprocess([], Path("."))
    """,
    # a --jobs launcher, as run_parallel starts it
    "jobs": """
        from finetune_lab.runs import jobs
        job = jobs.Job("one", [sys.executable, "-c", SLEEPER, PIDFILE], Path(PIDFILE + ".log"))
        jobs.run_parallel([job], 1, say=lambda s: None)
    """,
    # sentencepiece's trainer, in a forked child
    "in_child": """
        from finetune_lab.data import child
        def work():
            open(PIDFILE, "w").write(str(os.getpid()))
            time.sleep(120)
        child.in_child(work)
    """,
}


@linux_only
@pytest.mark.parametrize("how", sorted(LAUNCHERS))
def test_a_child_dies_with_its_killed_command(tmp_path, how):
    """Trial 28's P-m3: a SIGKILLed `binarize-cls` left `fairseq-preprocess` running (a
    trainer already died with its launcher). Every long child of a command now gets the
    parent-death signal: `fairseq-preprocess`, a `--jobs` launcher, sentencepiece's forked
    trainer, a pretraining run's calibration."""
    pidfile = tmp_path / "child.pid"
    script = (f"import os, sys, time\nfrom pathlib import Path\nSLEEPER = {SLEEPER!r}\n"
              f"PIDFILE = {str(pidfile)!r}\n" + textwrap.dedent(LAUNCHERS[how]))
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()):
            assert parent.poll() is None, f"the launcher ended first (exit {parent.returncode})"
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.1)
        child = psutil.Process(int(pidfile.read_text()))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        try:
            child.wait(timeout=10)
        except psutil.TimeoutExpired:
            child.kill()
            pytest.fail(f"{how}: the child outlived its killed command")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()

