"""The reviews a binarized CLS-Books folder holds, read back from fairseq's own files.

``finetune fairseq`` trains on ``input0/train.{bin,idx}``, whatever the folder's manifest says
of them (trial 24's D-i4: the test split's files copied over the training split's were
fine-tuned on). So the training and validation reviews are decoded from those files (fairseq's
``mmap`` index, the pieces of ``dict.txt``, sentencepiece's word marks) and compared with the
test reviews as a split's texts are (:func:`finetune_lab.data.split_checks.check_split`).
"""

from __future__ import annotations

import functools
import re
import struct
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from finetune_lab import _files
from finetune_lab.data.cls_books import read_reviews
from finetune_lab.data.eltec import REVIEW_DOMAINS, REVIEW_FILES
from finetune_lab.data.split_checks import (file_identity, published_test_texts, refuse_test_reviews,
                                            text_keys)
from finetune_lab.errors import UserError

MMAP_INDEX_MAGIC = b"MMIDIDX\x00\x00"
"""The first bytes of a fairseq ``mmap`` index (``fairseq-preprocess``'s default format)."""
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
          7: np.float64, 8: np.uint16}
"""fairseq's dtype codes (``indexed_dataset._code_to_dtype``)."""
SPECIALS = 4
"""``<s> <pad> </s> <unk>``: the ids before the first piece of ``dict.txt``."""

PREPARED_SHA256 = {
    "train.bin": "6aa6d1344e754dbad72b8f78f7f58d502df736881e6d90aa6478811332ea000e",
    "train.idx": "e98774aaca2a42363280680a538cb7bfc92e3b64d7315d7f7a3f224ae32a92c6",
    "valid.bin": "81e12d1d8318b99e7d766d61a043a64c93a339b7bb3f72b3d1c4fca0a6c450fa",
    "valid.idx": "979231ac92996125ac3b9dd278d2a8ee299b51e2dda548f777ea79827aa4307c"}
"""sha256 of ``input0/``'s training and validation files as ``binarize-cls`` writes them from
the book's split with the packaged checkpoint's tokenizer: what every committed fairseq run
read, checked when its split was, and not decoded again."""


def mmap_header(index: Path, head: bytes, fix: str) -> tuple[np.dtype, int]:
    """The dtype and item count of a fairseq ``mmap`` index from its first 26 bytes (magic,
    version 1, dtype code, count), as ``MMapIndexedDataset.Index`` reads them."""
    if len(head) < 26 or head[:9] != MMAP_INDEX_MAGIC or struct.unpack_from("<Q", head, 9) != (1,) \
            or head[17] not in DTYPES:
        raise UserError(f"{index} is no fairseq mmap index (a damaged or foreign file): {fix}")
    return np.dtype(DTYPES[head[17]]), struct.unpack_from("<Q", head, 18)[0]


def _items(prefix: Path, fix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fairseq ``mmap`` dataset (``prefix.idx`` and ``prefix.bin``): its ids, and where each
    item starts in them and how long it is (sizes int32, then pointers int64, in bytes)."""
    index = prefix.with_suffix(".idx")
    try:
        head = _files.regular_bytes(index)
        dtype, count = mmap_header(index, head, fix)
        sizes = np.frombuffer(head, np.int32, count, 26).astype(np.int64)
        starts = np.frombuffer(head, np.int64, count, 26 + 4 * count) // dtype.itemsize
        data = np.frombuffer(_files.regular_bytes(prefix.with_suffix(".bin")), dtype)
    except (OSError, ValueError) as exc:
        raise UserError(f"{index} cannot be read as fairseq binarized data ({exc}): {fix}") \
            from None
    if count and (sizes.min() < 0 or starts.min() < 0 or (starts + sizes).max() > len(data)):
        raise UserError(f"{index} points past the end of {prefix.with_suffix('.bin')}: {fix}")
    return data, starts, sizes


def _texts(prefix: Path, dictionary: Path, fix: str, group: int = 50_000) -> Iterator[str]:
    """Each item of a fairseq ``mmap`` dataset decoded, a group of items at a time: each id's
    piece of ``dictionary`` (the four special symbols empty), joined, ``▁`` kept; one string
    per group, an item per line."""
    pieces = [line.split(" ", 1)[0] for line in _files.regular_text(dictionary).splitlines()]
    symbols = np.array([""] * SPECIALS + pieces + ["\n"], dtype=object)
    data, starts, sizes = _items(prefix, fix)
    for at in range(0, len(sizes), group):
        n, first = sizes[at:at + group] + 1, starts[at:at + group]  # each item and a line end
        ends = np.cumsum(n)
        where = np.arange(ends[-1]) - np.repeat(ends - n, n) + np.repeat(first, n)
        line_end = np.zeros(ends[-1], bool)
        line_end[ends - 1] = True
        ids = np.full(ends[-1], -1, np.int64)  # the last symbol: a line end
        ids[~line_end] = data[where[~line_end]]
        if ids.max() >= len(symbols) - 1:
            raise UserError(f"{prefix.with_suffix('.bin')} holds ids past {dictionary}: {fix}")
        yield "".join(symbols[ids])


def reviews_back(bin_dir: Path, split: str) -> list[str]:
    """The texts of ``input0/{split}``, decoded: each id's piece, and a space for each ``▁``."""
    folder = Path(bin_dir) / "input0"
    fix = "run `finetune-lab binarize-cls` again"
    return [line.replace("\u2581", " ").strip()
            for text in _texts(folder / split, folder / "dict.txt", fix)
            for line in text.split("\n")[:-1]]


def check_binarized(bin_dir: Path) -> None:
    """Refuse binarized training or validation reviews that are test reviews: each of
    ``input0``'s training and validation files fairseq reads (``train``, and ``train1``, ...
    beside it, which it loads too: 24b's D-j2) compared with the folder's own test split and
    with Webis-CLS-10's books test file, unless they are the files of the book's split
    (PREPARED_SHA256) and no other."""
    folder = Path(bin_dir) / "input0"
    shards = sorted(p.stem for p in folder.glob("*.bin") if re.fullmatch(r"(train|valid)\d*",
                                                                         p.stem))
    if shards == ["train", "valid"] and all(
            _files.sha256_file(folder / name) == digest
            for name, digest in PREPARED_SHA256.items()):
        return
    refuse_test_reviews({folder / f"{shard}.bin": reviews_back(bin_dir, shard) for shard in shards},
                        folder / "test.bin", reviews_back(bin_dir, "test"), bin_dir,
                        fix="binarize the prepared split again with `finetune-lab binarize-cls`")


MIN_KEY = 20
"""The shortest test review (in letters and digits) a pretraining corpus is searched for: a
shorter one ("Nul !", "Un chef-d'oeuvre.") may be a line of a novel. One that a source of the
corpus also holds (:func:`check_corpus`) is allowed."""
_BASE = np.uint64(1_000_003)
_TABLE_BITS = 24


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.uint64)


def _head_hashes(codes: np.ndarray) -> np.ndarray:
    """A hash of each :data:`MIN_KEY`-letter window of ``codes`` (by position)."""
    n = len(codes) - MIN_KEY + 1
    hashes = np.zeros(max(n, 0), np.uint64)
    for j in range(MIN_KEY if n > 0 else 0):
        np.multiply(hashes, _BASE, out=hashes)
        np.add(hashes, codes[j:j + n], out=hashes)
    return hashes


STRIDE = 5
"""Every fifth :data:`MIN_KEY`-letter window of a test review is searched for."""
SHARE = 0.5
"""A review is held when this share of its windows is: a few letters changed, its sentences
reordered or interleaved with another's leave most of them whole (check 26b's D-n2 to D-n5)."""
_FOLD = str.maketrans({"œ": "oe", "æ": "ae", "ß": "ss", "ø": "o", "ł": "l", "đ": "d"})
_MARKS = re.compile(r"[\u0300-\u036f]+")


def fold(key: str) -> str:
    """A key's letters without their accents (check 26b's D-n1: the reviews with "é" written
    "e" passed), ``œ`` as ``oe``."""
    return _MARKS.sub("", unicodedata.normalize("NFKD", key.translate(_FOLD)))


def _windows(key: str) -> np.ndarray:
    """The hashes of every :data:`STRIDE`-th window of a key, and its last."""
    hashes = _head_hashes(_codes(key))
    return np.unique(np.concatenate([hashes[::STRIDE], hashes[-1:]]))


def _hits(parts: Iterable[str], wanted: np.ndarray) -> np.ndarray:
    """Which of the sorted hashes ``wanted`` some window of the concatenation of ``parts``
    (folded) has, across the parts' boundaries too."""
    table = np.zeros(1 << _TABLE_BITS, bool)
    table[wanted & np.uint64((1 << _TABLE_BITS) - 1)] = True
    found = np.zeros(len(wanted), bool)
    carry = ""
    for part in parts:
        text = carry + fold(part)
        hashes = _head_hashes(_codes(text))
        found |= np.isin(wanted, hashes[table[hashes & np.uint64((1 << _TABLE_BITS) - 1)]])
        carry = text[max(0, len(text) - MIN_KEY + 1):]
    return found


def _share(windows: np.ndarray, held: np.ndarray) -> float:
    """The share of ``windows`` among the sorted hashes ``held`` (a binary search each: an
    ``np.isin`` would sort ``held`` again for every review)."""
    at = np.minimum(np.searchsorted(held, windows), max(len(held) - 1, 0))
    return float((held[at] == windows).mean()) if len(held) else 0.0


def find_in_stream(parts: Iterable[str], keys: Iterable[str]) -> set[str]:
    """The ``keys`` (each :data:`MIN_KEY` letters or more) whose windows (:func:`_windows`,
    letters folded) the concatenation of ``parts`` holds, :data:`SHARE` of them or more: the
    one stream of items fairseq trains on, where a review split into halves, joined to another
    or prefixed (check 25b's D-l1 to D-l4) is held as well as a whole one."""
    keyed = {key: _windows(fold(key)) for key in keys}
    if not keyed:
        return set()
    wanted = np.unique(np.concatenate(list(keyed.values())))
    held = wanted[_hits(parts, wanted)]
    return {key for key, windows in keyed.items() if _share(windows, held) >= SHARE}


@functools.lru_cache(maxsize=8)
def _source_windows(path: Path, _identity: Any) -> np.ndarray:
    """The hashes of every window of a review file's texts as one stream of folded keys (read
    once per process and file)."""
    stream = "".join(fold(key) for r in read_reviews(path) for key in text_keys(r.text))
    return np.unique(_head_hashes(_codes(stream)))


def check_corpus(bin_dir: Path) -> None:
    """Refuse a pretraining corpus whose binarized files hold Webis-CLS-10's books test reviews
    (24b's D-j5, D-j6: a corpus's ``train.bin`` replaced by the binarized test reviews was
    pretrained on). Each training and validation file fairseq loads is decoded, and its items'
    keys joined into the one stream that fairseq trains on (check 25b's D-l1 to D-l4: reviews
    split into halves or sentences, joined in pairs or prefixed were each searched for as a
    whole item, and passed), and searched by :func:`find_in_stream`; a test review that the
    corpus's sources also hold (the books training file shares 51) is allowed."""
    published, texts = published_test_texts(bin_dir)
    wanted = {key: text for text in texts for key in text_keys(text) if len(key) >= MIN_KEY}
    fr = published.parent.parent
    sources = (published.with_name("train.review"),
               *(fr / d / f for d in REVIEW_DOMAINS for f in REVIEW_FILES))
    fix = "prepare the corpus again (`finetune-lab prepare-pretrain --force`)"
    folder = Path(bin_dir)
    for shard in sorted(p.stem for p in folder.glob("*.bin")
                        if re.fullmatch(r"(train|valid)\d*", p.stem)):
        found = find_in_stream(("".join(text_keys(text)) for text in
                                _texts(folder / shard, folder / "dict.txt", fix)), wanted)
        for source in sources:  # read only for a corpus that holds some test text
            if found and source.is_file():
                held = _source_windows(source, file_identity(source))
                found = {k for k in found if _share(_windows(fold(k)), held) < SHARE}
        if found:
            first = wanted[min(found)]
            raise UserError(f"{folder / shard}.bin holds {len(found)} of Webis-CLS-10's books "
                            f"test reviews (\"{first[:50]}…\", in {published}), which a "
                            f"pretraining corpus never holds: {fix}")
