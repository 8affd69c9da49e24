"""The splits a command trains or fits on hold no test review (trials 23, 24 and 24b, class D).

Every reader that trains or fits on a CLS-Books split reads it through
:func:`read_checked_splits`: the book's own split (its sha256s, pinned) passes as it is; any
other is compared, text by text, with its own test split and with Webis-CLS-10's books test file,
which must be the published one (its review texts' sha256, pinned).
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from pathlib import Path

from finetune_lab import _files
from finetune_lab.config import require_data_root
from finetune_lab.data.cls_books import BOOKS_DIR, BOOKS_SHA256, SPLITS, read_reviews, read_split
from finetune_lab.data.overlap import Passage, check_overlap
from finetune_lab.errors import UserError


PREPARED_SHA256 = {
    "train.review": "33d4f7bcc95c5ebd206ef93fe409d0bca5a0a601aafa3373482dd77dbcc9025e",
    "train.label": "f35044737ac71f1668e254ed793bb7668d0d8fb549b45652b0e4a1983144d852",
    "valid.review": "7b9f1a6af5d9492b14d5b50a37e9acbefdd5fdafbb0cb514ebd073a608690a7a",
    "valid.label": "5da13ff696b7aae9289d08b022c8f47686f6cd5647e823fcbd5168d6aa3f29e3",
    "test.review": "5bca5362e9b49154496f275c23d6ba7e6d06f83ac8ee180f0ee499130da6f8ef",
    "test.label": "28c78495388f7a1fac01120ef7ca73e0dd9a035ac91101ba7fe27fc155289933"}
"""sha256 of the split ``prepare-cls`` writes from Webis-CLS-10's books files (BOOKS_SHA256) with
its default seed and validation share, the split every committed run records: checked once,
when it was written, and never compared again."""


BOOKS_TEST_TEXTS_SHA256 = "e4581b0cf862a01aeff95dfe81bccc73933fa0e9c111ef85d342449fb4a2b04d"
"""sha256 of the books test file's 2,000 review texts as :func:`read_reviews` reads them, one per
line: the same for a copy re-saved with other line ends (trial 24's D-i2b), not for another
file put in its place beside Webis-CLS-10's training file (24b's D-j3: the dvd test file, and
the test reviews passed as training ones). A root of another data set (its training file not
Webis-CLS-10's either, as D-f6 has it) is compared with its own test file."""


BOOKS_TRAIN_SKETCH = (
    0x007cbca6471f1e2b, 0x002d7d66b65a2730, 0x00048af44bfd50ff, 0x004839dd27d2a400,
    0x003a9964d1b0c46d, 0x0006b4d0a9dd91f6, 0x003595576c909374, 0x001be050934cafa0,
    0x00254c51280301b3, 0x001521cfeb111ffb, 0x002b46a8c50bd4e3, 0x00be17c122ae847c,
    0x000859a545b498f8, 0x0007dd37257d7b02, 0x0006e618b7741c0c, 0x002e5bec2fe5d3a1,
    0x003bc94d44d3f619, 0x0011062f0f63cb6d, 0x001f3a964c4f7473, 0x000f5706a9895c47,
    0x003c01d2ac99f8c7, 0x00230d2d22c33840, 0x003317de7302442f, 0x0030c34c62b8b4fb,
    0x0018b06b4ba734a5, 0x001645c8262a6627, 0x00101076b4285db5, 0x00239255cb420e2b,
    0x0020463572c65783, 0x0006919dee3b4de8, 0x0009f68abf2db402, 0x0002591fe0e999d1,)
"""A MinHash of the keys (:func:`text_keys`) of Webis-CLS-10's books training texts: for each of
32 keyed hashes, its least value over them. A training file sharing half of it or more is
Webis-CLS-10's, re-saved or edited (trial 25: one line end changed made its root "another data
set", whose test file could then be any, and the test reviews passed as training ones). The
test file shares 2 of the 32; the dvd and music files none. A checksum, not a copy of a review."""
SKETCH_SHARED = 16


_NOT_WORD = re.compile(r"[^\w\n]+")


def text_keys(text: str) -> list[str]:
    """Each line of ``text`` as texts are compared word for word: NFKC (what sentencepiece
    reads), lowercase, its letters and digits only (spaces, punctuation and word marks gone)."""
    return _NOT_WORD.sub("", unicodedata.normalize("NFKC", text).lower()).split("\n")


def text_sketch(texts: list[str]) -> tuple[int, ...]:
    """The MinHash of :data:`BOOKS_TRAIN_SKETCH` of ``texts``."""
    keys = {key.encode() for text in texts for key in text_keys(text) if key}
    return tuple(min((int.from_bytes(hashlib.blake2b(key, digest_size=8, person=str(i).encode())
                                     .digest(), "big") for key in keys), default=0)
                 for i in range(len(BOOKS_TRAIN_SKETCH)))


def published_test_texts(needed_by: Path) -> tuple[Path, list[str]]:
    """The data root's books test file and its review texts, refused unless they are
    Webis-CLS-10's (``needed_by``: what is compared with them, named in the refusal)."""
    books = f"{BOOKS_DIR}/test.review"
    try:
        published = require_data_root(books) / books
    except UserError as exc:
        raise UserError(f"{needed_by} is not the book's split, so its training and validation "
                        "reviews are compared with Webis-CLS-10's books test file, which is not "
                        f"here: {exc}") from None
    texts, train_is_webis = _read_test_file(published, file_identity(published),
                                            file_identity(published.with_name("train.review")))
    if hashlib.sha256("\n".join(texts).encode()).hexdigest() != BOOKS_TEST_TEXTS_SHA256 and \
            train_is_webis:  # a root of another data set has its own test file
        raise UserError(f"{published} does not hold Webis-CLS-10's books test reviews, though "
                        f"the training file beside it is Webis-CLS-10's (re-saved or not); "
                        f"{needed_by} is compared "
                        "with them: restore the data root's file")
    return published, list(texts)


def file_identity(path: Path) -> tuple[int, ...] | None:
    """What tells a file's content from another's without reading it (device, inode, size, time
    of change): the key of a file read once per process."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@functools.lru_cache(maxsize=8)
def _read_test_file(published: Path, _test: tuple[int, ...] | None,
                    train: tuple[int, ...] | None) -> tuple[list[str], bool]:
    """The test file's review texts, and whether the training file beside it is Webis-CLS-10's:
    read once per process and file (a split, a binarized folder and a corpus compared in one
    process read them once)."""
    texts = [r.text for r in read_reviews(published)]
    if train is None:
        return texts, False
    beside = published.with_name("train.review")
    if _files.sha256_file(beside) == BOOKS_SHA256["train"]:
        return texts, True
    sketch = text_sketch([r.text for r in read_reviews(beside)])
    return texts, sum(a == b for a, b in zip(sketch, BOOKS_TRAIN_SKETCH)) >= SKETCH_SHARED


def check_split(cls_dir: Path, reviews: dict[str, list[str]],
                digests: dict[str, str] | None = None) -> None:
    """Refuse training or validation reviews (``reviews``: each split's texts) that are test
    reviews, in a folder that is not the book's split (PREPARED_SHA256): compared with the
    folder's test split and with the data root's books test file, which must be there (trial
    23's D-g: the test reviews written as the training split were fine-tuned on; 23b's D-h:
    train and test swapped; trial 24's D-i: a folder whose own manifest vouched for it, and a
    data root without that file, or with a copy re-saved, passed unchecked). ``digests``: the
    files' sha256s, where the caller has them already."""
    digests = digests or {}
    if all((digests.get(name) or _files.sha256_file(cls_dir / name)) == digest
           for name, digest in PREPARED_SHA256.items()):
        return
    refuse_test_reviews(
        {cls_dir / f"{split}.review": reviews[split] for split in ("train", "valid")},
        cls_dir / "test.review", reviews["test"], cls_dir,
        fix="prepare the splits again with `finetune-lab prepare-cls`")


def refuse_test_reviews(trained: dict[Path, list[str]], own_test: Path, own_texts: list[str],
                        needed_by: Path, fix: str) -> None:
    """Refuse any file of ``trained`` (its texts) that holds test reviews: those of the folder's
    own test split (``own_test``) or of Webis-CLS-10's books test file (``fix``: what to do)."""
    published, texts = published_test_texts(needed_by)
    for path, mine in trained.items():
        for test_path, test in ((own_test, own_texts), (published, texts)):
            check_overlap({"train": path, "test": test_path}, [Passage(t) for t in mine],
                          [Passage(t) for t in test], fix=fix)


def read_checked_splits(cls_dir: Path, digests: dict[str, str] | None = None
                        ) -> dict[str, tuple[list[str], list[int]]]:
    """The three splits of a folder (reviews, labels), read and checked as :func:`check_split`
    says: what every reader that trains or fits on a split reads them through (binarize-cls,
    the Transformers and LoRA runs, the probe: trial 24's D-i3, a probe fitted on test
    reviews)."""
    cls_dir = Path(cls_dir)
    splits = {split: read_split(cls_dir, split) for split in SPLITS}
    check_split(cls_dir, {split: reviews for split, (reviews, _) in splits.items()}, digests)
    return splits
