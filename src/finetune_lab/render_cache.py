"""One render, one computation: a chapter's costly facts are kept for the render's other formats.

Quarto executes a chapter once per output format (the HTML, then the PDF's Typst) and freezes
each format's results apart. What a chapter computes (a model built to be counted, a checkpoint
converted and compared, logs parsed) does not depend on the format. So ``finetune-lab freeze
pre-render`` opens an empty cache for the render, a function marked :func:`per_render` stores
its result there the first time it is called with given arguments and returns the stored
result on later calls, and ``post-render`` removes the cache. Nothing outlives the render, so a
result can never be older than the data it was computed from. Outside a render (tests, a
notebook, the CLI) nothing is cached and every call computes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from finetune_lab._files import write_bytes_atomic
from finetune_lab.config import PROJECT_ROOT

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


def active_cache(project: Path | None = None) -> Path | None:
    """The cache, when this process runs a chapter for Quarto during a render that opened it."""
    folder = cache_dir(project)
    return folder if os.environ.get("QUARTO_DOCUMENT_FILE") and folder.is_dir() else None


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
        value = fn(*args, **kwargs)
        try:
            data = pickle.dumps(value)
        except (pickle.PicklingError, TypeError, AttributeError):
            return value
        write_bytes_atomic(path, data)  # a chapter run beside this one never reads half a file
        return value

    return wrapper  # type: ignore[return-value]
