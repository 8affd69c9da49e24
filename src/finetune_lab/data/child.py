"""Child processes that never outlive the command: a long C++ call in a forked child, so that
Ctrl-C and SIGTERM reach the command at once, and the parent-death signal for every child.

Python runs a signal handler only between bytecodes: while sentencepiece's trainer works inside
one C++ call, a SIGTERM waited for the whole training. The parent waits on a pipe in short
polls (its handlers run between them) and kills the child when it is interrupted. A parent
killed outright (SIGKILL) runs no handler: there the kernel's parent-death signal (Linux) ends
the child, a trainer, ``fairseq-preprocess`` or a ``--jobs`` launcher alike (trial 28's P-m3).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TypeVar

from finetune_lab.errors import STOP_SIGNALS

T = TypeVar("T")

POLL_S = 0.2
"""How often the parent looks up from waiting: the longest a signal waits for its handler."""


PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal the kernel sends a process when its parent dies (Linux)."""


def _resolve_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once, here in the parent: after ``fork`` only one thread
    is left in the child, and loading a library there can wait forever on a lock another
    thread (the launcher's progress thread) held at the fork, as the ``subprocess`` docs warn."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes, prctl.restype = [ctypes.c_int, ctypes.c_ulong], ctypes.c_int
    return prctl


_PRCTL = _resolve_prctl()
_DEATH_SIGNAL = int(signal.SIGTERM)


def die_with_parent() -> None:  # pragma: no cover (runs in the child, between fork and exec)
    """Linux: have the kernel send SIGTERM to this child when its parent dies, so that a
    killed command leaves nothing running or writing. One system call through the function
    resolved at import, nothing loaded or looked up here."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, _DEATH_SIGNAL)


PRE_EXEC: Callable[[], None] | None = die_with_parent if _PRCTL is not None else None
"""The ``preexec_fn`` of every long child: the parent-death signal where there is one."""


class ChildFailed(RuntimeError):
    """The child raised (its message) or died (its exit code) before sending a result."""


def _send(fn: Callable[[], T], conn: Connection, parent: int) -> None:
    """The child: the terminal's Ctrl-C is the parent's to handle, SIGTERM just ends it (and
    the other stop signals, which the parent handles as SIGTERM; one ignored stays ignored)."""
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    try:
        result = ("ok", fn())
    except BaseException as exc:  # noqa: BLE001 - the parent raises it with its message
        result = ("error", f"{type(exc).__name__}: {exc}")
    conn.send(result)
    conn.close()


def in_child(fn: Callable[[], T]) -> T:
    """``fn()`` computed in a forked child (its result must pickle); the parent stays
    interruptible, and an interruption or error of the parent kills the child first."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_send, args=(fn, send, os.getpid()),
                        daemon=True)
    child.start()
    send.close()
    try:
        while not receive.poll(POLL_S):  # True once a result came, or the child is gone
            pass
        try:
            kind, value = receive.recv()
        except EOFError:
            child.join()
            raise ChildFailed(f"the child process died (exit code {child.exitcode})") from None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    if kind != "ok":
        raise ChildFailed(value)
    return value
