"""Run a long C++ call in a forked child, so that Ctrl-C and SIGTERM reach the command at once.

Python runs a signal handler only between bytecodes: while sentencepiece's trainer works inside
one C++ call, a SIGTERM waited for the whole training. The parent waits on a pipe in short
polls (its handlers run between them) and kills the child when it is interrupted.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TypeVar

from finetune_lab.errors import STOP_SIGNALS

T = TypeVar("T")

POLL_S = 0.2
"""How often the parent looks up from waiting: the longest a signal waits for its handler."""


class ChildFailed(RuntimeError):
    """The child raised (its message) or died (its exit code) before sending a result."""


def _send(fn: Callable[[], T], conn: Connection) -> None:
    """The child: the terminal's Ctrl-C is the parent's to handle, SIGTERM just ends it (and
    the other stop signals, which the parent handles as SIGTERM; one ignored stays ignored)."""
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
    child = ctx.Process(target=_send, args=(fn, send), daemon=True)
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
