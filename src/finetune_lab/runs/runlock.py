"""One writer per run: an exclusive lock beside the run folder while the run is written."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from finetune_lab.errors import UserError


class RunLockedError(UserError):
    """Another process is writing this run right now."""


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``<experiment>/.<run>.lock`` (an exclusive ``flock``) while a run is written.

    Two launches of one run would mix their event files into one folder, and a second one
    with ``overwrite`` would delete the folder under the first. The lock lies beside the run
    folder, so deleting the folder does not drop it, and the kernel releases it when its holder
    dies, so a killed launch never blocks the next one.
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    path = run_dir.parent / f".{run_dir.name}.lock"
    handle = open(path, "a+")
    locked = False
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise RunLockedError(
                f"{run_dir} is being written by {holder} right now; wait for it to end (or stop "
                "it) before launching this run again") from None
        handle.seek(0)
        stale = handle.read().strip()
        if stale:  # its holder died without removing it (the kernel freed the lock itself)
            print(f"{run_dir}: took over the lock of {stale}, which is no longer running",
                  flush=True)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
        handle.flush()
        locked = True
        yield
    finally:
        if locked:  # no lock file is left beside the committed runs
            path.unlink(missing_ok=True)
        handle.close()
