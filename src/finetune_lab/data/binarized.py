"""The reviews a binarized CLS-Books folder holds, read back from fairseq's own files.

``finetune fairseq`` trains on ``input0/train.{bin,idx}``, whatever the folder's manifest says
of them (trial 24's D-i4: the test split's files copied over the training split's were
fine-tuned on). So the training and validation reviews are decoded from those files (fairseq's
``mmap`` index, the pieces of ``dict.txt``, sentencepiece's word marks) and compared with the
test reviews as a split's texts are (:func:`finetune_lab.data.split_checks.check_split`).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np

from finetune_lab import _files
from finetune_lab.data.split_checks import refuse_test_reviews
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


def _sequences(prefix: Path) -> list[np.ndarray]:
    """Each item of a fairseq ``mmap`` dataset (``prefix.idx`` and ``prefix.bin``)."""
    index = prefix.with_suffix(".idx")
    try:
        head = _files.regular_bytes(index)
        if head[:9] != MMAP_INDEX_MAGIC or struct.unpack_from("<Q", head, 9) != (1,):
            raise ValueError("no fairseq mmap index")
        dtype = np.dtype(DTYPES[head[17]])
        (count,) = struct.unpack_from("<Q", head, 18)  # then sizes (int32), pointers (int64)
        sizes = np.frombuffer(head, np.int32, count, 26)
        pointers = np.frombuffer(head, np.int64, count, 26 + 4 * count)
        data = np.frombuffer(_files.regular_bytes(prefix.with_suffix(".bin")), dtype)
        return [data[p // dtype.itemsize:p // dtype.itemsize + n] for p, n in zip(pointers, sizes)]
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise UserError(f"{index} cannot be read as fairseq binarized data ({exc}): run "
                        "`finetune-lab binarize-cls` again") from None


def reviews_back(bin_dir: Path, split: str) -> list[str]:
    """The texts of ``input0/{split}``, decoded: each id's piece, and a space for each ``▁``."""
    folder = Path(bin_dir) / "input0"
    pieces = [line.split(" ", 1)[0] for line in
              _files.regular_text(folder / "dict.txt").splitlines()]
    symbols = np.array([""] * SPECIALS + pieces, dtype=object)
    try:
        return ["".join(symbols[ids]).replace("\u2581", " ").strip()
                for ids in _sequences(folder / split)]
    except IndexError:
        raise UserError(f"{folder / split}.bin holds ids past {folder / 'dict.txt'}: run "
                        "`finetune-lab binarize-cls` again") from None


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
