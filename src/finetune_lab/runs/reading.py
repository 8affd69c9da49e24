"""One reading of the run store for a table that looks up many named runs (issue 36).

:func:`~finetune_lab.runs.registry.find_run` judges a run's whole experiment, so a table that
follows every lineage step of every candidate judged the same experiments again and again (one
appendix's tables: 167 lookups, 65 s). Within :func:`one_reading` each experiment is judged
once, the store read as it was when the reading began, as a render's cache does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

READING: ContextVar[dict[tuple[str, str], Any] | None] = ContextVar(
    "registry_reading", default=None)
"""The experiments judged in the current reading, by (runs root, experiment), and the values of
:func:`once_per_reading` functions; None outside one."""


@contextmanager
def one_reading() -> Iterator[None]:
    """Judge each experiment once until the outermost reading ends."""
    token = READING.set({}) if READING.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            READING.reset(token)


F = TypeVar("F", bound=Callable[..., Any])


def reads_once(fn: F) -> F:
    """Run ``fn`` inside :func:`one_reading`."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with one_reading():
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


def once_per_reading(fn: F) -> F:
    """Compute ``fn(*args)`` once within the current reading (every call, outside one): a fact
    of the whole store that each of many records is checked against."""
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        memo = READING.get()
        if memo is None:
            return fn(*args)
        key = (name, repr(args))
        if key not in memo:
            memo[key] = fn(*args)
        return memo[key]
    return wrapper  # type: ignore[return-value]
