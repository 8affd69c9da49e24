"""The render's cache: a chapter executed for two formats computes each fact once."""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd
import pytest

from finetune_lab import render_cache
from finetune_lab.book import freeze
from finetune_lab.render_cache import per_render

CALLS: list[tuple] = []


@per_render
def _table(n: int, label: str = "x") -> pd.DataFrame:
    CALLS.append((n, label))
    return pd.DataFrame({"n": range(n), "label": label})


@per_render
def _with_lock(lock) -> int:
    CALLS.append(("lock",))
    return 1


@pytest.fixture()
def project(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(render_cache, "PROJECT_ROOT", tmp_path)
    CALLS.clear()
    return tmp_path


def test_outside_a_render_every_call_computes(project: Path, monkeypatch) -> None:
    monkeypatch.delenv("QUARTO_DOCUMENT_FILE", raising=False)
    render_cache.open_cache(project)  # a cache exists, but no chapter is being executed
    _table(2)
    _table(2)
    assert CALLS == [(2, "x"), (2, "x")]


def test_during_a_render_each_call_computes_once(project: Path, monkeypatch) -> None:
    monkeypatch.setenv("QUARTO_DOCUMENT_FILE", "fairseq.qmd")
    assert render_cache.active_cache() is None  # pre-render has not opened it: no caching
    _table(1)
    render_cache.open_cache(project)
    first = _table(3, label="a")
    again = _table(3, label="a")
    other = _table(3, label="b")
    assert CALLS == [(1, "x"), (3, "a"), (3, "b")]
    pd.testing.assert_frame_equal(first, again)
    assert list(other["label"]) == ["b"] * 3
    assert len(list(render_cache.cache_dir(project).glob("*._table-*.pkl"))) == 2
    # arguments that do not pickle: computed every time, never an error
    lock = threading.Lock()
    assert _with_lock(lock) == _with_lock(lock) == 1
    assert CALLS[-2:] == [("lock",), ("lock",)]
    render_cache.close_cache(project)
    _table(3, label="a")
    assert CALLS[-1] == (3, "a") and not render_cache.cache_dir(project).exists()


def test_pre_render_opens_an_empty_cache_and_post_render_removes_it(project: Path) -> None:
    stale = render_cache.cache_dir(project) / "left-by-a-killed-render.pkl"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    freeze.pre_render(project, environ={}, log=lambda *_: None)
    folder = render_cache.cache_dir(project)
    assert folder.is_dir() and not any(folder.iterdir())
    freeze.post_render(project, log=lambda *_: None)
    assert not folder.exists()
