"""One writer at a time: an exclusive lock beside the run folder while the run is written, and
one beside any shared place a command stages into or clears leftovers from (``gpu-unpack``)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from finetune_lab.errors import UserError, open_in_place


class RunLockedError(UserError):
    """Another process is writing this run right now."""


def _lock_at(path: Path, busy: Callable[[str], str]) -> IO[str]:
    """An open, exclusively locked handle on the file that is at ``path`` now.

    A lock taken on a file that a releasing holder has just unlinked locks nothing anyone else
    will open: so after ``flock`` the handle's inode is compared with the path's, and on a
    mismatch (or a vanished path) the lock is tried again on the file now there.
    """
    while True:
        handle = open_in_place(path, "a+")  # never through a link (trial 29's L-4)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not _same_file(path, handle):  # its holder is letting go of it: try the path
                handle.close()
                continue
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise RunLockedError(busy(holder)) from None
        except BaseException:
            handle.close()
            raise
        if _same_file(path, handle):
            return handle
        handle.close()  # the lock of a file no longer at the path: worth nothing


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``<experiment>/.<run>.lock`` (an exclusive ``flock``) while a run is written.

    Two launches of one run would mix their event files into one folder, and a second one
    with ``overwrite`` would delete the folder under the first. The lock lies beside the run
    folder, so deleting the folder does not drop it (:func:`exclusive_lock` says the rest)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(run_dir.parent / f".{run_dir.name}.lock", run_dir, lambda holder: (
            f"{run_dir} is being written by {holder} right now; wait for it to end (or stop "
            "it) before launching this run again")):
        yield


@contextmanager
def exclusive_lock(path: Path, what: Path, busy: Callable[[str], str]) -> Iterator[None]:
    """Hold the lock file ``path`` (an exclusive ``flock``, holding ``pid N on HOST``) for
    ``what``, or raise :class:`RunLockedError` with ``busy(holder)`` (one line) at once.

    The kernel releases it when its holder dies, so a killed holder never blocks the next one.
    The holder deletes the file while it still holds the lock, and a taker keeps a lock only on
    the file still at the path (:func:`_lock_at`), so one that opened the file before the
    delete cannot hold a lock beside a third taker's: one holder, and no lock file left behind.
    """
    handle = _lock_at(path, busy)
    try:
        handle.seek(0)
        stale = handle.read().strip()
        if stale:  # its holder died without removing it (the kernel freed the lock itself)
            print(f"{what}: took over the lock of {stale}, which is no longer running",
                  flush=True)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {os.uname().nodename}")
        handle.flush()
        yield
    finally:
        if _same_file(path, handle):  # still locked, so no one else holds this file
            path.unlink(missing_ok=True)
        handle.close()


def _same_file(path: Path, handle: IO[str]) -> bool:
    """Whether ``path`` is still the file ``handle`` has open (a hand-deleted lock file may have
    been made anew by another launcher, whose lock must not be deleted)."""
    try:
        now, held = os.stat(path), os.fstat(handle.fileno())
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
