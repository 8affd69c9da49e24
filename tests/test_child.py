"""A long C++ call runs in a child, so a signal reaches the command at once (issue 35)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from finetune_lab.data.child import ChildFailed, in_child

BUSY = "sum(range(10**12))"
"""One C call that takes minutes and never lets a Python signal handler run."""

SCRIPT = f"""
import signal, sys
from finetune_lab.data.child import in_child
def stop(*_):
    raise SystemExit(143)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
in_child(lambda: {BUSY})
"""


def test_sigterm_ends_the_command_while_the_child_computes() -> None:
    """sentencepiece's trainer held a SIGTERM for its whole training (one C++ call)."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(1.0)
    children = psutil.Process(proc.pid).children()
    assert len(children) == 1, "the busy call runs in one child"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 143
    assert time.monotonic() - started < 3
    assert not children[0].is_running() or children[0].status() == psutil.STATUS_ZOMBIE


def test_the_result_and_the_error_come_back() -> None:
    assert in_child(lambda: os.getpid()) != os.getpid()
    with pytest.raises(ChildFailed, match="ZeroDivisionError"):
        in_child(lambda: 1 / 0)
    with pytest.raises(ChildFailed, match="exit code 3"):
        in_child(lambda: os._exit(3))
