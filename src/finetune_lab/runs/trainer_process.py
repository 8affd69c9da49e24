"""The training process of a run: started so that it dies with its launcher, stopped when it
hangs after its work is saved, and a SIGTERM to the launcher turned into an exception so that
the run's manifest can say it was interrupted."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from finetune_lab.errors import Interrupted, stop_signals_raise


class RunInterrupted(Interrupted):
    """SIGTERM reached the launcher: raised so that the trainer is stopped (``subprocess.run``
    kills its child on any exception) and the manifest says so."""


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While a run is written, SIGTERM and SIGHUP raise :class:`RunInterrupted` instead of
    ending the launcher on the spot (which would leave the manifest ``running`` and, without the
    parent-death signal, the trainer alive)."""
    def handler(signum: int, _frame: object) -> None:
        raise RunInterrupted(signum)

    with stop_signals_raise(handler):
        yield


def log_tail(path: Path, lines: int = 20) -> str:
    """The end of a training log, so a failure can be read where it is reported (e.g. in CI)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def wait_or_end_after(proc: subprocess.Popen, log_fd: int, start: int,
                       done_marker: str | None, grace_s: float, poll_s: float = 1.0) -> int | None:
    """``proc``'s exit code; None when it logged ``done_marker`` and was killed ``grace_s``
    later for not exiting (it and its children: data-loading workers). ``log_fd``: a readable
    descriptor of the very file ``proc`` writes to, read from ``start`` on. Not its path: a
    file put there during the run (a ``git stash`` or checkout restoring an earlier run's
    complete log) must not pass for this trainer's output and get it killed mid-run."""
    if done_marker is None:
        return proc.wait()
    marker, seen_at, offset, tail = done_marker.encode(), None, start, b""
    while True:
        try:
            return proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
        if seen_at is None:
            chunk = b""
            while piece := os.pread(log_fd, 1 << 20, offset + len(chunk)):
                chunk += piece
            offset += len(chunk)
            if marker in tail + chunk:
                seen_at = time.monotonic()
            tail = (tail + chunk)[-len(marker):]
        elif time.monotonic() - seen_at > grace_s:
            kill_tree(proc.pid)
            proc.wait()
            return None


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (data-loading workers), found by psutil on every
    platform it supports, not only where /proc can be read. All are listed first, so a child
    the parent's death hands to init is still killed; the parent dies first and starts no more."""
    try:
        parent = psutil.Process(pid)
        family = [parent, *parent.children(recursive=True)]
    except psutil.Error:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.Error:
            pass
