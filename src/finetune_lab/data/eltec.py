"""The French texts the stand-in learns from: ELTeC novels split by novel, and the unlabeled reviews.

The course's RoBERTa_small_fr was pretrained on mC4 French, which is not available; the
public-domain ELTeC-fra novels (level1 + ext1, about 39 M words) stand in for it. Train and
valid are split *by novel* so that no novel contributes to both sides. The Webis-CLS-10 ``dvd``
and ``music`` reviews join as unlabeled in-domain text. Both the tokenizer and the binarized
corpus read their documents from here, so neither imports the other.
"""

from __future__ import annotations

import lzma
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from finetune_lab._files import sha256_file
from finetune_lab.data.cls_books import (
    BOOKS_DIR,
    BOOKS_SHA256,
    read_reviews,
    read_sums,
    stratified_split,
)
from finetune_lab.data.overlap import Passage, check_overlap
from finetune_lab.errors import UserError

ELTEC_DIRS = ("eltec-fra/level1", "eltec-fra/ext1")
REVIEW_DOMAINS = ("dvd", "music")
"""Webis-CLS-10 domains usable as unlabeled in-domain text (never ``books``, the task)."""
REVIEW_FILES = ("train.review", "test.review")
DEFAULT_SEED = 1
DEFAULT_VALID_FRACTION = 0.02
DEFAULT_REVIEW_REPEAT = 20
"""About 30 % of train tokens are then reviews (1.2 M review tokens x 20 beside ~55 M of novels)."""
DEFAULT_REVIEW_VALID = 400
WEBIS_SHA256 = {
    **{f"{BOOKS_DIR}/{name}.review": digest for name, digest in BOOKS_SHA256.items()},
    "webis-cls-10/fr/dvd/train.review":
        "150487ab1ea7201c6a1a603cb6991f3297d79e4650502e4fbcb0337ed91d5bde",
    "webis-cls-10/fr/dvd/test.review":
        "b1d007d197489026a5d2cfe3c62d207c2d6b7e0349335d38903673ac05d4b045",
    "webis-cls-10/fr/music/train.review":
        "66961e978b96ba7837cc6ced5f1db200009ad095ff7b55757482a7ceeb73da77",
    "webis-cls-10/fr/music/test.review":
        "8ddcf008c838d81dee5fd57599ceb50de61682b10d38ad98d8337ea35cec7bd8",
}
"""sha256 of every Webis-CLS-10 file a tokenizer or pretraining corpus reads, as
:data:`~finetune_lab.data.cls_books.BOOKS_SHA256` pins the books files for ``prepare-cls``
(trial 22's D-e: the books test reviews, put in as the books or dvd training file, were
pretrained on)."""
ELTEC_SHA256 = read_sums(Path(__file__).with_name("eltec-fra.sha256"))
"""sha256 of each ELTeC-fra novel, the same way (22b's D-f: the books test reviews, one per
line, put in as a novel, were pretrained on)."""


@dataclass(frozen=True)
class Document:
    """One pretraining document: a novel, or one domain's block of reviews."""

    name: str
    """Path relative to the data root (e.g. ``eltec-fra/level1/FRA00101_Adam.txt.xz``)."""
    path: Path
    keep: frozenset[int] | None = None
    """For a review file: the positions of the reviews it contributes (None: all)."""
    repeat: int = 1
    """How many times the document is written (upweighting in-domain text)."""


def list_novels(root: Path) -> list[Document]:
    """All ELTeC novels under the data root, in a fixed (sorted) order."""
    docs: list[Document] = []
    for rel in ELTEC_DIRS:
        folder = root / rel
        if not folder.is_dir():
            raise UserError(f"{folder} is missing; point FINETUNE_LAB_DATA_ROOT at a complete copy.")
        docs.extend(Document(f"{rel}/{p.name}", p) for p in sorted(folder.glob("*.txt.xz")))
    if not docs:
        raise UserError(f"no *.txt.xz novels under {root}/eltec-fra; is the data root complete?")
    return docs


def review_documents(root: Path) -> list[Document]:
    """The optional in-domain documents: ``dvd`` and ``music`` ``train.review`` (never ``books``)."""
    return [
        Document(f"webis-cls-10/fr/{d}/train.review", root / "webis-cls-10" / "fr" / d / "train.review")
        for d in REVIEW_DOMAINS
    ]


def in_domain_reviews(
    root: Path, seed: int = DEFAULT_SEED, n_valid: int = DEFAULT_REVIEW_VALID,
    repeat: int = DEFAULT_REVIEW_REPEAT,
) -> tuple[list[Document], list[Document]]:
    """``dvd``/``music`` train and test reviews: (train side, repeated; held-out ``valid1`` side).

    The held-out reviews are a seeded sample across the four files; no review is on both sides.
    """
    files = [(f"webis-cls-10/fr/{d}/{f}", root / "webis-cls-10" / "fr" / d / f)
             for d in REVIEW_DOMAINS for f in REVIEW_FILES]
    sizes = [len(read_reviews(path)) for _, path in files]
    total = sum(sizes)
    if not 0 <= n_valid < total:
        raise UserError(f"--review-valid must be between 0 and {total - 1} (got {n_valid})")
    if repeat < 1:
        raise UserError(f"--review-repeat must be at least 1 (got {repeat})")
    held = set(random.Random(seed).sample(range(total), n_valid))
    train, valid = [], []
    start = 0
    for (name, path), size in zip(files, sizes):
        mine = {i - start for i in held if start <= i < start + size}
        train.append(Document(name, path, frozenset(set(range(size)) - mine), repeat))
        if mine:
            valid.append(Document(name, path, frozenset(mine)))
        start += size
    return train, valid


def task_reviews(root: Path, repeat: int) -> Document:
    """The texts of the lab's CLS-Books *training* split (1800 reviews, never its validation or
    test reviews), for task-adaptive pretraining; the split is ``prepare-cls``'s own."""
    if repeat < 1:
        raise UserError(f"--task-repeat must be at least 1 (got {repeat})")
    path = root / BOOKS_DIR / "train.review"
    train, _ = stratified_split(read_reviews(path))
    return Document(f"{BOOKS_DIR}/train.review", path,
                    frozenset(r.position - 1 for r in train), repeat)


def check_documents(root: Path, docs: Iterable[Document], other_corpus: bool = False,
                    ) -> tuple[dict[str, str], bool]:
    """Refuse a file a corpus would read (a review file or a novel) that is not the published
    one (:data:`WEBIS_SHA256`, :data:`ELTEC_SHA256`, and the data root's ``SHA256SUMS`` where it
    lists it) unless ``other_corpus``, and then one whose texts are the books test reviews
    (:func:`~finetune_lab.data.overlap.check_overlap`); the books test file itself always.
    Returns each file's sha256 by name (its record, hashed once) and whether another corpus is
    read."""
    test = root / BOOKS_DIR / "test.review"
    sums = root / "SHA256SUMS"
    listed = read_sums(sums) if os.path.lexists(sums) else {}
    other, digests = False, {}
    for doc in {d.name: d for d in docs}.values():
        digest = digests[doc.name] = sha256_file(doc.path)
        if digest == BOOKS_SHA256["test"]:
            raise UserError(f"{doc.path} is Webis-CLS-10's books test file: its reviews would be "
                            f"pretrained on; restore {doc.name}")
        if doc.name in listed and listed[doc.name] != digest:
            raise UserError(f"{doc.path} is not the file the data root's {sums} lists (sha256 "
                            f"{digest[:12]}…, listed {listed[doc.name][:12]}…); restore it")
        pinned = {**WEBIS_SHA256, **ELTEC_SHA256}.get(doc.name, "")
        if digest == pinned:
            continue
        if not other_corpus:
            source = "Webis-CLS-10's" if doc.name.endswith(".review") else "ELTeC-fra's"
            raise UserError(f"{doc.path} is not {source} {doc.name}, which the book's corpora "
                            f"were made from (sha256 {digest[:12]}…"
                            + (f", the published file's {pinned[:12]}…" if pinned else
                               ", and no published file has that name") +
                            "): restore it, or pass --other-corpus to read another corpus")
        if not other and sha256_file(test) != BOOKS_SHA256["test"] and sha256_file(
                test.with_name("train.review")) == BOOKS_SHA256["train"]:  # 22b's D-f6
            raise UserError(f"{test} is not Webis-CLS-10's books test file, which another "
                            "corpus is compared with, though the training file beside it is "
                            "Webis-CLS-10's: restore it")
        texts = read_reviews(doc.path) if doc.name.endswith(".review") else [
            Passage(text) for text in paragraphs(doc)]
        check_overlap({"train": doc.path, "test": test}, texts, read_reviews(test))
        other = True
    return digests, other


def split_novels(
    novels: list[Document], seed: int = DEFAULT_SEED, valid_fraction: float = DEFAULT_VALID_FRACTION
) -> tuple[list[Document], list[Document]]:
    """Seeded split *by novel* (at least one novel on each side); both parts keep sorted order."""
    if len(novels) < 2:
        raise UserError("the pretraining corpus needs at least two novels to split train/valid")
    n_valid = min(len(novels) - 1, max(1, round(valid_fraction * len(novels))))
    chosen = set(random.Random(seed).sample(range(len(novels)), n_valid))
    train = [d for i, d in enumerate(novels) if i not in chosen]
    valid = [d for i, d in enumerate(novels) if i in chosen]
    return train, valid


def paragraphs(doc: Document) -> Iterator[str]:
    """The non-empty lines (paragraphs) of a document, stripped."""
    if doc.name.endswith(".review"):
        for i, review in enumerate(read_reviews(doc.path)):
            if doc.keep is None or i in doc.keep:
                yield review.text
        return
    try:
        with lzma.open(doc.path, "rt", encoding="utf-8") as handle:
            for line in handle:
                text = line.strip()
                if text:
                    yield text
    except (lzma.LZMAError, EOFError, UnicodeDecodeError) as exc:
        raise UserError(f"{doc.path}: cannot read the novel ({exc}); restore it from the data root.") from exc


def corpus_documents(
    root: Path,
    seed: int = DEFAULT_SEED,
    valid_fraction: float = DEFAULT_VALID_FRACTION,
    with_reviews: bool = True,
    max_novels: int | None = None,
) -> dict[str, list[Document]]:
    """``{"train": [...], "valid": [...]}``: the documents of each side of the corpus.

    ``max_novels`` keeps the first novels of the sorted list (for tests on a slice).
    """
    novels = list_novels(root)
    if max_novels is not None:
        novels = novels[:max_novels]
    train, valid = split_novels(novels, seed=seed, valid_fraction=valid_fraction)
    if with_reviews:
        train = train + review_documents(root)
    return {"train": train, "valid": valid}

