"""Shared, cached builders for the data-pipeline tests (real files, small slices).

Each builder runs once per test session (``functools.cache``) into a private temp folder, so
``test_cls_books``, ``test_tokenizer``, ``test_binarize``, ``test_pretrain_corpus`` and
``test_data_summary`` share one small pipeline instead of rebuilding it.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest

from finetune_lab.config import DATA_ROOT_ENV, default_data_root

BOOKS = "webis-cls-10/fr/books"
TINY_VOCAB = 1000
TINY_NOVELS = 3


def data_root() -> Path:
    """The real data root, or skip: the pipeline tests need the raw XML and novels."""
    root = default_data_root()
    if not (root / BOOKS / "train.review").is_file() or not (root / "eltec-fra").is_dir():
        pytest.skip(f"data root {root} is absent (set {DATA_ROOT_ENV}); CI provides it")
    return root


@functools.cache
def _scratch() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="finetune-lab-data-tests-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@functools.cache
def cls_dir() -> Path:
    """``cls.books`` built from the real XML with the default seed."""
    from finetune_lab.data.cls_books import prepare_cls

    return prepare_cls(data_root(), _scratch() / "work" / "cls.books")


@functools.cache
def tiny_tokenizer() -> Path:
    """A 1000-piece tokenizer trained on a slice of the real corpus (a few novels)."""
    from finetune_lab.data.tokenizer import train_tokenizer

    return train_tokenizer(data_root(), _scratch() / "work" / "tokenizer", vocab_size=TINY_VOCAB,
                           sample_size=5000, max_novels=TINY_NOVELS)


@functools.cache
def cls_bin() -> Path:
    from finetune_lab.data.binarize import binarize_cls

    out, _ = binarize_cls(cls_dir(), tiny_tokenizer(), _scratch() / "work" / "cls-books-bin")
    return out


@functools.cache
def pretrain_bin() -> Path:
    from finetune_lab.data.pretrain_corpus import prepare_pretrain

    out, _ = prepare_pretrain(data_root(), tiny_tokenizer(), _scratch() / "work" / "pretrain-bin",
                              max_novels=TINY_NOVELS, with_reviews=False)
    return out


def work_dir() -> Path:
    """The work dir holding all four prepared folders."""
    cls_bin()
    pretrain_bin()
    return _scratch() / "work"
