"""The splits a command trains or fits on hold no test review (trials 23, 24 and 24b, class D).

Every reader that trains or fits on a CLS-Books split reads it through
:func:`read_checked_splits`: the book's own split (its sha256s, pinned) passes as it is; any
other is compared, text by text, with its own test split and with Webis-CLS-10's books test file,
which must be the published one (its review texts' sha256, pinned).
"""

from __future__ import annotations

import hashlib
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
    texts = [r.text for r in read_reviews(published)]
    train = published.with_name("train.review")  # a root of another data set has its own
    if hashlib.sha256("\n".join(texts).encode()).hexdigest() != BOOKS_TEST_TEXTS_SHA256 and \
            train.is_file() and _files.sha256_file(train) == BOOKS_SHA256["train"]:
        raise UserError(f"{published} does not hold Webis-CLS-10's books test reviews, though "
                        f"the training file beside it is Webis-CLS-10's; {needed_by} is compared "
                        "with them: restore the data root's file")
    return published, texts


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
