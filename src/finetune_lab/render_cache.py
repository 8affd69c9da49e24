"""One render, one computation: a chapter's costly facts are kept for the render's other formats.

Quarto executes a chapter once per output format (the HTML, then the PDF's Typst) and freezes
each format's results apart. What a chapter computes (a model built to be counted, a checkpoint
converted and compared, logs parsed) does not depend on the format. So ``finetune-lab freeze
pre-render`` opens an empty cache for the render, a function marked :func:`per_render` stores
its result there the first time it is called with given arguments and returns the stored
result on later calls, and ``post-render`` removes the cache. Nothing outlives the render, so a
result can never be older than the data it was computed from. Outside a render (tests, a
notebook, the CLI) nothing is cached and every call computes.

Two processes may ask for the same fact at once: a chapter's kernel and the worker that
computes the render's facts ahead of Quarto (:mod:`finetune_lab.book.prewarm`). A per-key file
lock makes the second wait for the first one's result instead of computing it again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # Windows: no file locks, see _computing
    fcntl = None  # type: ignore[assignment]

from finetune_lab._files import write_bytes_atomic
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError, open_in_place

CACHE_DIR = ".quarto/finetune-lab-render-cache"
"""Inside Quarto's own scratch folder (git-ignored), relative to the project root."""

F = TypeVar("F", bound=Callable[..., Any])


def cache_dir(project: Path | None = None) -> Path:
    return (project or PROJECT_ROOT) / CACHE_DIR


def open_cache(project: Path | None = None) -> Path:
    """Start a render's cache, empty (a cache left by an interrupted render is dropped)."""
    close_cache(project)
    folder = cache_dir(project)
    folder.mkdir(parents=True)
    return folder


def close_cache(project: Path | None = None) -> None:
    shutil.rmtree(cache_dir(project), ignore_errors=True)


CACHE_ENV = "FINETUNE_LAB_RENDER_CACHE"
"""Names the cache folder for a process that serves a render from outside Quarto (the worker)."""


def active_cache(project: Path | None = None) -> Path | None:
    """The cache, when this process runs a chapter for Quarto during a render that opened it."""
    if not os.environ.get("QUARTO_DOCUMENT_FILE"):
        return None
    named = os.environ.get(CACHE_ENV)
    folder = Path(named) if named and project is None else cache_dir(project)
    return folder if folder.is_dir() else None


def per_render(fn: F) -> F:
    """Compute ``fn(*args, **kwargs)`` once per render (see the module's docstring).

    Arguments and results must pickle; a call whose arguments do not is computed as usual.
    """
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        folder = active_cache()
        if folder is None:
            return fn(*args, **kwargs)
        try:
            key = hashlib.sha256(pickle.dumps((name, args, sorted(kwargs.items())))).hexdigest()
        except (pickle.PicklingError, TypeError, AttributeError):
            return fn(*args, **kwargs)
        path = folder / f"{name}-{key[:20]}.pkl"
        if path.is_file():
            return pickle.loads(path.read_bytes())
        with _computing(path):
            if path.is_file():  # another process computed it while this one waited
                return pickle.loads(path.read_bytes())
            value = fn(*args, **kwargs)
            try:
                data = pickle.dumps(value)
            except (pickle.PicklingError, TypeError, AttributeError):
                return value
            if path.parent.is_dir():  # not if the render ended meanwhile
                write_bytes_atomic(path, data)  # a process beside this one never reads half
        return value

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def _computing(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock while its value is computed: one process computes, others wait.

    The lock is released when the holder ends, even killed. Where file locks do not exist
    (Windows) or the cache is gone, nothing is locked: at worst a value is computed twice.
    """
    with contextlib.ExitStack() as held:
        if fcntl is not None:
            try:
                handle = held.enter_context(open_in_place(path.with_suffix(".lock"), "a"))
                fcntl.flock(handle, fcntl.LOCK_EX)
            except (OSError, UserError):  # a link or pipe there: computed unlocked
                pass
        yield
