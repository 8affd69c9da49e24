"""CLS-Books: read the Webis-CLS-10 French ``books`` XML and write the course's ``cls.books`` layout.

The course fine-tunes on ``cls.books/{train,valid,test}.{review,label}``: one review per line
(newlines removed), label 1 for ratings above 3 and 0 below, a stratified 10 % validation slice
of ``train.review`` (1800 / 200) and the 2000 test reviews in XML order. The course's own random
validation draw is unknown, so the split is seeded and recorded in a manifest.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from finetune_lab.argtypes import folder, non_negative_int
from finetune_lab import _files
from finetune_lab.data.overlap import check_overlap
from finetune_lab.data.tools import tool_versions
from finetune_lab.config import paths, require_data_root
from finetune_lab.errors import UserError

BOOKS_DIR = "webis-cls-10/fr/books"
"""The CLS-Books XML files, relative to the data root."""
BOOKS_SHA256 = {"train": "fb11d1a20d436ecfe34e19e7fcf3a81473909da593b967bf9f78f22b89256b99",
                "test": "70c42f8e351fd18311be71f28f3f51022ffa6c7b98ff4c3cf68c0839e916a31c"}
"""sha256 of Webis-CLS-10's French books files, which the book's runs were prepared from (as a
dataset loader checks a download). Any other file is another corpus and is prepared only when
asked (``--other-corpus``): a comparison of texts finds test reviews in a training file only as
far as it knows their disguise (trials 13 to 21, D), a checksum whatever was done to them."""

SPLITS = ("train", "valid", "test")
DEFAULT_SEED = 1
DEFAULT_VALID_FRACTION = 0.1
OUTPUT_NAME = "cls.books"
COMMAND = "prepare-cls"
"""The command that writes (and alone may replace) the output folder."""

_NEWLINES = re.compile(r"[ \t]*[\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029]+[ \t]*")
"""Every line boundary of ``str.splitlines``, which the readers split the files on (trial 13's
D5: a review holding U+2028 made its split file three lines longer than its labels)."""


class ClsDataError(UserError):
    """A CLS review file is malformed: the message names the file, the item and the fix."""


@dataclass(frozen=True)
class Review:
    """One labelled review, in the form the course writes it (single line)."""

    text: str
    label: int
    rating: float
    position: int
    """1-based position of the ``<item>`` in its XML file."""


RATINGS = (1.0, 2.0, 4.0, 5.0)
"""The star ratings CLS-Books holds (3, neither positive nor negative, was left out by its
authors): any other value is a damaged file, never a label."""


def label_for_rating(rating: float) -> int:
    """1 when the rating is above 3, 0 below; 3 has no sentiment label in the course's scheme,
    and a rating CLS-Books cannot hold (6, 0, 4.5) is an error, not a label."""
    if rating not in RATINGS:
        raise ValueError("is neither positive (> 3) nor negative (< 3)" if rating == 3 else
                         "is not one of the ratings CLS-Books holds ("
                         + ", ".join(f"{r:g}" for r in RATINGS) + ")")
    return 1 if rating > 3 else 0


def single_line(text: str) -> str:
    """Remove the newlines inside a review (and the spaces around them), as the course did."""
    return _NEWLINES.sub(" ", text).strip()


def _item_error(path: Path, position: int, asin: str | None, problem: str) -> ClsDataError:
    where = f"item {position}" + (f" (asin {asin})" if asin else "")
    return ClsDataError(
        f"{path}: {where}: {problem}. Fix or remove this <item>, or point the data root at an "
        "unmodified copy of Webis-CLS-10."
    )


def read_reviews(path: Path) -> list[Review]:
    """Parse one Webis-CLS-10 ``*.review`` XML file into labelled single-line reviews.

    Uses a real XML parser (entities, CDATA and nesting are handled by the parser, not by
    regular expressions). Every item must have a numeric rating other than 3 and a non-empty
    ``<text>``; anything else raises :class:`ClsDataError` naming the file and the item.
    """
    path = Path(path)
    if not path.is_file():
        what = ("is a folder, not a review file" if path.is_dir() else
                "is not a regular file" if path.exists() else "does not exist")
        raise ClsDataError(f"{path} {what}. Check the data root (FINETUNE_LAB_DATA_ROOT).")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        line, column = exc.position
        raise ClsDataError(
            f"{path}: not well-formed XML at line {line}, column {column} ({exc.msg}). "
            "Restore the file from the original Webis-CLS-10 archive."
        ) from exc
    items = root.findall("item")
    if not items:
        raise ClsDataError(f"{path}: no <item> elements found; is this a Webis-CLS-10 .review file?")
    reviews: list[Review] = []
    for position, item in enumerate(items, start=1):
        asin = (item.findtext("asin") or "").strip() or None
        for tag in ("rating", "text"):  # a second one would be dropped (check 29b's F14)
            if len(item.findall(tag)) > 1:
                raise _item_error(path, position, asin, f"{len(item.findall(tag))} <{tag}> "
                                  "elements, where a Webis-CLS-10 item has one")
        rating_text = item.findtext("rating")
        if rating_text is None or not rating_text.strip():
            raise _item_error(path, position, asin, "missing <rating>")
        try:
            rating = float(rating_text)
        except ValueError:
            raise _item_error(path, position, asin, f"rating {rating_text!r} is not a number") from None
        try:
            label = label_for_rating(rating)
        except ValueError as exc:
            raise _item_error(path, position, asin, f"rating {rating_text.strip()} {exc}") from None
        raw = item.findtext("text")
        if raw is None:
            raise _item_error(path, position, asin, "missing <text>")
        if len(markup := item.find("text")) > 0:  # its text would be cut there (trial 29's E-7)
            raise _item_error(path, position, asin, f"<text> holds markup (<{markup[0].tag}>), "
                              "which no Webis-CLS-10 review has")
        text = single_line(raw)
        if not text:
            raise _item_error(path, position, asin, "empty review <text>")
        reviews.append(Review(text=text, label=label, rating=rating, position=position))
    return reviews


def stratified_split(
    reviews: list[Review], seed: int = DEFAULT_SEED, valid_fraction: float = DEFAULT_VALID_FRACTION
) -> tuple[list[Review], list[Review]]:
    """Seeded stratified hold-out: ``valid_fraction`` of each class goes to validation.

    Both parts keep XML order, so the result depends only on the input and the seed.
    """
    if not 0 < valid_fraction < 1:
        raise UserError(f"--valid-fraction must be between 0 and 1, got {valid_fraction}")
    rng = random.Random(seed)
    held_out: set[int] = set()
    for label in sorted({r.label for r in reviews}):
        members = [i for i, r in enumerate(reviews) if r.label == label]
        n_valid = round(valid_fraction * len(members))
        if not 0 < n_valid < len(members):  # trial 26's E-m1: "train 0", then a traceback
            part = "validation" if n_valid == 0 else "training"
            raise UserError(f"--valid-fraction {valid_fraction} leaves the {len(members)} "
                            f"reviews of class {label} no {part} review: choose a fraction "
                            f"that holds out at least one of each class and keeps one")
        held_out.update(rng.sample(members, n_valid))
    train = [r for i, r in enumerate(reviews) if i not in held_out]
    valid = [r for i, r in enumerate(reviews) if i in held_out]
    return train, valid


def write_split(folder: Path, split: str, reviews: list[Review]) -> None:
    """Write ``{split}.review`` and ``{split}.label``, one line per review, UTF-8."""
    with open(folder / f"{split}.review", "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{r.text}\n" for r in reviews)
    with open(folder / f"{split}.label", "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{r.label}\n" for r in reviews)


def read_split(folder: Path, split: str) -> tuple[list[str], list[int]]:
    """Read a written split back, checking that ``.review`` and ``.label`` line up."""
    review_path, label_path = folder / f"{split}.review", folder / f"{split}.label"
    for p in (review_path, label_path):
        if not p.is_file():
            raise ClsDataError(f"{p} is missing. Run `finetune-lab prepare-cls` first.")
    regenerate = "regenerate the splits with `finetune-lab prepare-cls`"
    reviews = _files.read_utf8(review_path, regenerate).splitlines()
    raw_labels = _files.read_utf8(label_path, regenerate).splitlines()
    check_same_length(review_path, len(reviews), label_path, len(raw_labels))
    labels: list[int] = []
    for number, value in enumerate(raw_labels, start=1):
        if value not in ("0", "1"):
            raise ClsDataError(f"{label_path}: line {number}: label {value!r} is not 0 or 1: "
                               f"{regenerate}")
        labels.append(int(value))
    for number, text in enumerate(reviews, start=1):
        if not text.strip():
            raise ClsDataError(f"{review_path}: line {number}: empty review: {regenerate}")
    return reviews, labels


def check_same_length(a: Path, n_a: int, b: Path, n_b: int) -> None:
    """Reviews and labels are paired by line number, so their counts must agree; and a split
    holds one at least (trial 30's E-20: an empty one reached fairseq, which cannot read it)."""
    if n_a == 0:
        raise ClsDataError(f"{a} is empty: every split holds reviews. Regenerate it with "
                           "`finetune-lab prepare-cls`.")
    if n_a != n_b:
        raise ClsDataError(
            f"{a} has {n_a} lines but {b} has {n_b}: reviews and labels must pair line by line. "
            "Regenerate both with `finetune-lab prepare-cls`."
        )


def count_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for _ in handle)


def default_output() -> Path:
    return paths().work / OUTPUT_NAME


_BSD_SUM = re.compile(r"SHA256 \((.+)\) = ([0-9a-fA-F]{64})$")
_GNU_SUM = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)$")


def read_sums(sums: Path) -> dict[str, str]:
    """``{path: lowercase sha256}`` of a ``SHA256SUMS`` in GNU (``HASH  path``, ``HASH *path``)
    or BSD format (``SHA256 (path) = HASH``, ``--tag``); a line of neither is skipped, and a file
    that cannot be read is one line (trial 15's D-n2: a BSD file was silently not read)."""
    try:
        text = _files.regular_text(sums)
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{sums} cannot be read as a list of sha256 sums ({exc}): restore the "
                        "data root's file") from None
    listed = {}
    for line in text.splitlines():
        if gnu := _GNU_SUM.match(line.strip()):
            digest, rel = gnu.groups()
        elif bsd := _BSD_SUM.match(line.strip()):
            rel, digest = bsd.groups()
        else:
            continue
        listed[rel.strip().removeprefix("./")] = digest.lower()
    return listed


def check_sources(root: Path, sources: dict[str, Path],
                  other_corpus: bool = False) -> dict[str, str]:
    """The sources' sha256, checked against the data root's ``SHA256SUMS`` where it lists them
    and against Webis-CLS-10's (:data:`BOOKS_SHA256`) unless ``other_corpus``, and the training
    file never the test file (trial 13's D8: a ``train.review`` copied from ``test.review`` went
    through, and the test reviews leaked into training)."""
    hashes = {name: _files.sha256_file(p) for name, p in sources.items()}
    sums = root / "SHA256SUMS"
    listed = read_sums(sums) if os.path.lexists(sums) else {}
    if os.path.lexists(sums) and not any(p.relative_to(root).as_posix() in listed
                                         for p in sources.values()):
        raise UserError(f"{sums} lists neither books file in a format this reads (`HASH  path`, "
                        "`HASH *path` or `SHA256 (path) = HASH`): restore the data root's file")
    for name, p in sources.items():
        rel = p.relative_to(root).as_posix()
        if rel in listed and listed[rel] != hashes[name]:
            raise UserError(f"{p} is not the file the data root's {sums} lists (sha256 "
                            f"{hashes[name][:12]}…, listed {listed[rel][:12]}…); restore it")
    if len(set(hashes.values())) < len(hashes):
        raise UserError(f"{sources['train']} is the same file as {sources['test']}: the test "
                        "reviews would be trained on; restore Webis-CLS-10's training file")
    for name in [] if other_corpus else [n for n in sources if hashes[n] != BOOKS_SHA256[n]]:
        raise UserError(f"{sources[name]} is not Webis-CLS-10's {name}.review, which the book's "
                        f"runs were prepared from (sha256 {hashes[name][:12]}…, Webis-CLS-10's "
                        f"{BOOKS_SHA256[name][:12]}…): restore it, or pass --other-corpus to "
                        "prepare another corpus")
    return hashes


def prepare_cls(
    data_root: Path | None = None,
    out: Path | None = None,
    seed: int = DEFAULT_SEED,
    valid_fraction: float = DEFAULT_VALID_FRACTION,
    force: bool = False,
    other_corpus: bool = False,
) -> Path:
    """Build ``cls.books/`` atomically from the books XML and return its path.

    Reads and checks both XML files before writing anything, so a bad item leaves no output.
    An existing ``out`` is replaced only if ``prepare-cls`` made it (``force``: whatever it is).
    ``other_corpus``: books files that are not Webis-CLS-10's are prepared too, still checked
    for test reviews in the training file (:func:`check_overlap`).
    """
    started = time.perf_counter()
    root = require_data_root(f"{BOOKS_DIR}/train.review", f"{BOOKS_DIR}/test.review", root=data_root)
    out = Path(out) if out is not None else default_output()
    _files.check_replaceable(out, COMMAND, force=force)
    sources = {name: root / BOOKS_DIR / f"{name}.review" for name in ("train", "test")}
    train_all = read_reviews(sources["train"])  # a file that is none is said here, in one line
    test = read_reviews(sources["test"])
    for name, reviews in (("train", train_all), ("test", test)):  # trial 29's E-8
        if len(held := {r.label for r in reviews}) < 2:
            raise ClsDataError(f"{sources[name]}: every review is of class {held.pop()}: a "
                               "sentiment classifier needs reviews of both (ratings 1-2 and 4-5)")
    hashes = check_sources(root, sources, other_corpus)
    check_overlap(sources, train_all, test)
    train, valid = stratified_split(train_all, seed=seed, valid_fraction=valid_fraction)
    parts = {"train": train, "valid": valid, "test": test}
    with _files.atomic_dir(out, COMMAND, force=force) as tmp:
        for split, reviews in parts.items():
            write_split(tmp, split, reviews)
        manifest = {
            "step": COMMAND,
            "inputs": {f"{BOOKS_DIR}/{name}.review": hashes[name] for name in sources},
            "outputs": _files.sha256_tree(tmp, exclude=("manifest.json",)),
            "seed": seed,
            "corpus": ("other" if set(hashes.items()) - set(BOOKS_SHA256.items())
                       else "webis-cls-10"),
            "parameters": {"valid_fraction": valid_fraction, "label": "1 if rating > 3, 0 if < 3"},
            "counts": {
                split: {str(k): v for k, v in sorted(Counter(r.label for r in rs).items())}
                for split, rs in parts.items()
            },
            "tool_versions": tool_versions(),
            "timings_s": {"total": round(time.perf_counter() - started, 3)},
        }
        _files.write_json_atomic(tmp / "manifest.json", manifest)
    return out


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="build cls.books/{train,valid,test}.{review,label} from the Webis-CLS-10 books XML",
        description=prepare_cls.__doc__,
    )
    parser.add_argument("--data-root", type=folder, default=None,
                        help="raw data root (default: $FINETUNE_LAB_DATA_ROOT or ../shared/data)")
    parser.add_argument("--out", type=folder, default=None,
                        help=f"output folder (default: <work dir>/{OUTPUT_NAME})")
    parser.add_argument("--seed", type=non_negative_int, default=DEFAULT_SEED)
    parser.add_argument("--valid-fraction", type=float, default=DEFAULT_VALID_FRACTION)
    parser.add_argument("--force", action="store_true",
                        help="replace --out even if prepare-cls did not make it")
    parser.add_argument("--other-corpus", action="store_true",
                        help="prepare books files that are not Webis-CLS-10's (the book's numbers "
                             "are Webis-CLS-10's)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out = prepare_cls(args.data_root, args.out, seed=args.seed, valid_fraction=args.valid_fraction,
                      force=args.force, other_corpus=args.other_corpus)
    manifest = _files.read_json(out / "manifest.json")
    sizes = ", ".join(f"{s} {sum(manifest['counts'][s].values())}" for s in SPLITS)
    print(f"prepare-cls: wrote {out} ({sizes})")
    return 0
