"""The CLS-Books split sizes from the committed data summary, for code that runs without the data.

The lab's schedule (updates per epoch, warm-up) is derived from the number of training reviews.
The runs read it from their prepared data; the chapters and the recipe comparisons read it from
``data/summaries/data.json`` (written by ``finetune-lab data-summary``), which a clean clone has.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from finetune_lab._files import not_there, read_json
from finetune_lab.config import paths
from finetune_lab.data.eltec import ELTEC_SHA256, REVIEW_DOMAINS, REVIEW_FILES
from finetune_lab.data.tokenizer import (ADDED_BY_TASK, FAIRSEQ_SPECIALS, SPM_SPECIAL_IDS,
                                         spelling_problem)
from finetune_lab.errors import UserError

SUMMARY_NAME = "data.json"


def summary_path() -> Path:
    """The committed aggregate summary of the prepared data."""
    return paths().summaries / SUMMARY_NAME


RESTORE = ("restore it (`git checkout -- data/summaries/data.json`) or run `finetune-lab "
           "data-summary` again")


def read_summary(path: Path | None = None) -> dict[str, Any]:
    """The committed data summary, checked: the facts it records twice (each split's reviews,
    its tokens against its mean length) must agree, and every count the data chapter prints
    must fit the counts that bound it (:func:`count_contradiction`), or the file is refused in
    one line. The chapters compute from it (the lab's schedule, the GPU's MFU, the tokenizer's
    rates), and an edited count would otherwise move them silently."""
    path = Path(path) if path is not None else summary_path()
    if not path.is_file():
        raise UserError(f"{path} {not_there(path)}: run `finetune-lab data-summary` after preparing "
                        "the data (`finetune-lab prepare-cls`)")
    record = read_json(path)
    try:
        problem = summary_contradiction(record)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        problem = "it lacks the splits' counts (cls.splits, cls.tokenization, lengths)"
    if not problem:
        problem = count_contradiction(record)
    if problem:
        raise UserError(f"{path}: {problem}: {RESTORE}")
    return record


def summary_contradiction(record: dict[str, Any]) -> str | None:
    """The first fact the summary records twice that disagrees with itself, said in words."""
    lengths = record["lengths"]
    special = int(lengths["special_tokens"])
    splits = {str(s["split"]): s for s in record["cls"]["splits"]}
    if "train" not in splits:
        raise KeyError("train")
    for name, split in splits.items():
        n = int(split["reviews"])
        counts = {"positive + negative": int(split["positive"]) + int(split["negative"]),
                  "cls.tokenization's reviews": int(record["cls"]["tokenization"][name]["reviews"]),
                  "the length histogram's total": sum(int(v) for v in lengths["histogram"][name])}
        for what, value in counts.items():
            if value != n:
                return f"{name} has {n} reviews in cls.splits but {value} by {what}"
        tokens = int(record["cls"]["tokenization"][name]["tokens"])
        mean = float(lengths["stats"][name]["mean"])
        if n <= 0 or abs(tokens / n + special - mean) > 0.006:  # the mean is kept to 2 decimals
            return (f"{name}'s {tokens} tokens over {n} reviews do not give its mean length "
                    f"{mean} ({special} special tokens each)")
        if not 0 <= int(lengths["stats"][name]["truncated"]) <= n:
            return f"{name} has more truncated reviews than reviews"
        stats = lengths["stats"][name]
        order = [float(stats[k]) for k in ("median", "p90", "max")]
        if order != sorted(order) or not float(stats["mean"]) <= order[-1]:
            return (f"{name}'s lengths are not in order (median {stats['median']}, p90 "
                    f"{stats['p90']}, max {stats['max']}, mean {stats['mean']})")
    for pair, count in (record["cls"].get("duplicates") or {}).items():
        inside = [s for s in splits if s in str(pair).split()]  # "within valid", "train and test"
        if inside and int(count) > min(int(splits[s]["reviews"]) for s in inside):
            return f"has {count} duplicates {pair}, more than the reviews there"
    return None


class _Contradiction(Exception):
    """A count of the summary that cannot be, said in words (field paths and values)."""


_MISSING = object()


def _get(record: Any, path: str, default: Any = _MISSING) -> Any:
    """The value at a dotted field path (``pretrain.counts.train.unk``)."""
    value = record
    for key in path.split("."):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif default is not _MISSING:
            return default
        else:
            raise _Contradiction(f"it lacks {path}")
    return value


def _count(record: Any, path: str) -> int:
    """A count at ``path``: a whole number, not negative."""
    value = _get(record, path)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _Contradiction(f"{path} is {value!r}, not a count")
    return value


def _seconds(record: Any, path: str) -> float:
    value = _get(record, path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise _Contradiction(f"{path} is {value!r}, not a duration in seconds")
    return float(value)


def _at_most(record: Any, small: str, big: str, why: str) -> None:
    """``small`` ≤ ``big`` (both counts of the same file), or a contradiction naming both."""
    a, b = _count(record, small), _count(record, big)
    if a > b:
        raise _Contradiction(f"{small} {a} is more than {big} {b} ({why})")


def _equal(record: Any, path: str, want: int, how: str) -> None:
    value = _count(record, path)
    if value != want:
        raise _Contradiction(f"{path} is {value} but {how} gives {want}")


def _fraction(record: Any, path: str) -> None:
    value = _get(record, path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise _Contradiction(f"{path} is {value!r}, not a fraction between 0 and 1")


def _tokenization_bounds(record: Any, base: str, unit: str) -> None:
    """A split's tokenization counts: ``unk`` pieces are pieces, and every whitespace word is
    one sentencepiece piece or more (each starts with its own ``▁`` piece), so
    ``unk ≤ tokens`` and ``words ≤ tokens``; each ``unit`` (review, paragraph) has a word."""
    _at_most(record, f"{base}.unk", f"{base}.tokens", "an unknown piece is one of the pieces")
    _at_most(record, f"{base}.words", f"{base}.tokens",
             "every word is one sentencepiece piece or more")
    _at_most(record, f"{base}.{unit}", f"{base}.words", f"every {unit[:-1]} has a word")


def count_contradiction(record: dict[str, Any]) -> str | None:
    """The first count the data chapter prints that the counts bounding it contradict, in one
    phrase naming both fields and their values (None when all fit): the bounds the code that
    writes each count guarantees (``<unk>`` pieces are pieces, a word is one piece or more, a
    total the sum of its parts, a sample part of its source, the tokenizer's sizes its dict's)."""
    try:
        _cls_counts(record)
        _pretrain_counts(record)
        _tokenizer_counts(record)
        _length_counts(record)
        _example_counts(record)
    except _Contradiction as problem:
        return str(problem)
    return None


def tokenizer_contradiction(record: dict[str, Any]) -> str | None:
    """:func:`count_contradiction` for the tokenizer section alone (the part of the summary
    that ``data-summary`` copies when the tokenizer was adopted from the checkpoint)."""
    try:
        _tokenizer_counts(record)
    except _Contradiction as problem:
        return str(problem)
    return None


UNKNOWN_TOP = 10
"""``cls.unknown_surfaces`` lists the most frequent spans the tokenizer cannot encode, this many
at most: a shorter list is every one of them, whose counts add up to the unknown pieces."""


def _cls_counts(record: Any) -> None:
    _fraction(record, "cls.valid_fraction")
    tokenization = _get(record, "cls.tokenization")
    if not isinstance(tokenization, dict):
        raise _Contradiction("it lacks cls.tokenization")
    for split in tokenization:
        _tokenization_bounds(record, f"cls.tokenization.{split}", "reviews")
    unk = sum(_count(record, f"cls.tokenization.{split}.unk") for split in tokenization)
    surfaces = _get(record, "cls.unknown_surfaces", [])
    if not isinstance(surfaces, list) or not all(
            isinstance(s, list) and len(s) == 2 and isinstance(s[1], int)
            and not isinstance(s[1], bool) and s[1] > 0 for s in surfaces):
        raise _Contradiction("cls.unknown_surfaces is not a list of [text, count] pairs")
    listed = sum(s[1] for s in surfaces)
    if listed > unk:
        raise _Contradiction(f"cls.unknown_surfaces counts {listed} unknown pieces, more than "
                             f"the {unk} of cls.tokenization's unk (all splits)")
    if len(surfaces) < UNKNOWN_TOP and listed != unk:  # a short list is every span (trial 10)
        raise _Contradiction(f"cls.unknown_surfaces, shorter than {UNKNOWN_TOP} and so every "
                             f"span, counts {listed} unknown pieces, but cls.tokenization's unk "
                             f"(all splits) is {unk}")


def _pretrain_counts(record: Any) -> None:
    counts = _get(record, "pretrain.counts")
    if not isinstance(counts, dict) or not {"train", "valid"} <= set(counts):
        raise _Contradiction("it lacks pretrain.counts.train and pretrain.counts.valid")
    for split in counts:
        base = f"pretrain.counts.{split}"
        _tokenization_bounds(record, base, "paragraphs")
        _at_most(record, f"{base}.documents", f"{base}.paragraphs",
                 "a document is written only with a paragraph")
        _at_most(record, f"{base}.novels", f"{base}.documents", "a novel is a document")
    valid = _get(record, "pretrain.valid_documents")
    if not isinstance(valid, list):
        raise _Contradiction("it lacks pretrain.valid_documents")
    _equal(record, "pretrain.counts.valid.novels",
           sum(1 for name in valid if str(name).endswith(".txt.xz")),
           "pretrain.valid_documents (its .txt.xz novels)")
    held = _get(record, "pretrain.parameters.review_valid", None)
    if "valid1" in counts and held is not None:
        _equal(record, "pretrain.counts.valid1.paragraphs", _count(record,
               "pretrain.parameters.review_valid"), "pretrain.parameters.review_valid")
    _fraction(record, "pretrain.parameters.valid_fraction")
    _timings(record, "pretrain.timings_s", ("encode", "fairseq_preprocess"))
    _pretrain_documents(record, valid)


def _pretrain_documents(record: Any, valid: list[Any]) -> None:
    """The corpus's documents from its parameters (trial 30's R-8, R-20, check 30b): each novel
    once, each review file ``review_repeat`` times, every ELTeC-fra novel unless fewer asked."""
    params, names = _get(record, "pretrain.parameters"), [str(v) for v in valid]
    if not isinstance(params, dict) or params.get("task_repeat") or params.get("corpus") \
            or params.get("train_novels") is False:
        return
    held = [n for n in names if n.endswith(".txt.xz")]
    if len(set(names)) < len(names) or not set(held) <= set(ELTEC_SHA256):
        raise _Contradiction("pretrain.valid_documents names a novel twice or not ELTeC-fra's")
    if not params.get("with_reviews") and _get(record, "pretrain.counts.valid1", None):
        raise _Contradiction("pretrain.counts.valid1 holds reviews, but with_reviews is off")
    novels = _count(record, "pretrain.counts.train.novels")
    files = len(REVIEW_DOMAINS) * len(REVIEW_FILES)
    repeat = int(params.get("with_reviews") and _count(record, "pretrain.parameters.review_repeat"))
    _equal(record, "pretrain.counts.train.documents", novels + files * repeat,
           f"pretrain.counts.train.novels {novels} + {files} review files written "
           f"pretrain.parameters.review_repeat {repeat} times each")
    if params.get("max_novels") is None:
        _equal(record, "pretrain.counts.train.novels", len(ELTEC_SHA256) - len(held),
               f"ELTeC-fra's {len(ELTEC_SHA256)} novels less the {len(held)} of "
               "pretrain.valid_documents")


def _timings(record: Any, base: str, parts: tuple[str, ...]) -> None:
    """A total time is at least the sum of the steps it timed (each kept to 3 decimals)."""
    total = _seconds(record, f"{base}.total")
    present = [p for p in parts if _get(record, f"{base}.{p}", None) is not None]
    summed = sum(_seconds(record, f"{base}.{p}") for p in present)
    if summed > total + 0.001 * (len(present) + 1):
        raise _Contradiction(f"{base}.total {total} is less than the sum of "
                             + " + ".join(f"{base}.{p}" for p in present) + f", {summed:.3f}")


def _tokenizer_counts(record: Any) -> None:
    params = "tokenizer.parameters"
    entries = _count(record, "tokenizer.dict_entries")
    _equal(record, f"{params}.embedding_rows",
           len(FAIRSEQ_SPECIALS) + entries + len(ADDED_BY_TASK),
           f"tokenizer.dict_entries {entries} (fairseq's {len(FAIRSEQ_SPECIALS)} specials + one "
           f"row per dict.txt line + {' '.join(ADDED_BY_TASK)})")
    _equal(record, f"{params}.vocab_size", entries + len(SPM_SPECIAL_IDS),
           f"tokenizer.dict_entries {entries} (sentencepiece's {len(SPM_SPECIAL_IDS)} specials "
           "+ one piece per dict.txt line)")
    special = _get(record, f"{params}.special_ids", None)
    if special is not None and special != SPM_SPECIAL_IDS:
        raise _Contradiction(f"{params}.special_ids is {special} but dict.txt's ids need "
                             f"{SPM_SPECIAL_IDS}")
    corpus = "tokenizer.corpus"
    _at_most(record, f"{corpus}.paragraphs", f"{corpus}.sentences",
             "a paragraph is one sentence or more")
    _at_most(record, f"{corpus}.paragraphs", f"{corpus}.words", "every paragraph has a word")
    _at_most(record, f"{corpus}.words", f"{corpus}.characters", "a word is a character or more")
    _at_most(record, f"{corpus}.sample_sentences", f"{corpus}.sentences",
             "the sample is drawn from the sentences")
    for part in ("words", "characters"):
        if _get(record, f"{corpus}.sample_{part}", None) is not None:
            _at_most(record, f"{corpus}.sample_{part}", f"{corpus}.{part}",
                     "the sample is drawn from the sentences")
    if _get(record, f"{corpus}.sample_words", None) is not None and \
            _count(record, f"{corpus}.sample_sentences") == _count(record, f"{corpus}.sentences"):
        _equal(record, f"{corpus}.sample_words", _count(record, f"{corpus}.words"),
               f"{corpus}.words, all of whose sentences are the sample,")
    _timings(record, "tokenizer.timings_s", ("read_and_sample", "spm_train", "dict"))


def _length_counts(record: Any) -> None:
    lengths = "lengths"
    width, top = _count(record, f"{lengths}.bin_width"), _count(record, f"{lengths}.max_bin")
    cut = _count(record, f"{lengths}.max_positions")
    _at_most(record, f"{lengths}.special_tokens", f"{lengths}.max_positions",
             "the specials are part of an input")
    if width == 0 or top % width or cut % width or cut > top:
        raise _Contradiction(f"{lengths}.bin_width {width} does not divide {lengths}.max_bin "
                             f"{top} and {lengths}.max_positions {cut}")
    for split, hist in _get(record, f"{lengths}.histogram").items():
        path = f"{lengths}.histogram.{split}"
        if not isinstance(hist, list) or len(hist) != top // width + 1:
            raise _Contradiction(f"{path} has {len(hist) if isinstance(hist, list) else hist!r} "
                                 f"bins but {lengths}.max_bin {top} / bin_width {width} gives "
                                 f"{top // width + 1}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in hist):
            raise _Contradiction(f"{path} holds a bin that is not a count")
        stats = f"{lengths}.stats.{split}"
        _equal(record, f"{stats}.truncated", sum(hist[cut // width:]),
               f"{path}'s bins above {lengths}.max_positions {cut}")
        longest = _count(record, f"{stats}.max")
        last = max((i for i, n in enumerate(hist) if n), default=None)
        if last is not None and last != min(max(longest - 1, 0) // width, len(hist) - 1):
            raise _Contradiction(f"{stats}.max {longest} is not in {path}'s last filled bin "
                                 f"({last * width}, {(last + 1) * width}]")
        _quantiles_in_bins(record, stats, path, hist, width)
        _mean_in_bins(record, stats, path, hist, width, longest)


MEAN_DECIMALS = 0.006
"""The mean is kept to two decimals (as its check against the tokens allows)."""


def _mean_in_bins(record: Any, stats: str, path: str, hist: list[int], width: int,
                  longest: int) -> None:
    """The mean length lies between the histogram's least and greatest possible means (each
    review at its bin's shortest or longest length, none above the maximum): trial 28's R-m3,
    a train mean of 185.33 (and its tokens with it) where the bins allow at most 155.7, moved
    the tokens per word and the MFU the book prints."""
    n = sum(hist)
    mean = _get(record, f"{stats}.mean")
    if n == 0 or isinstance(mean, bool) or not isinstance(mean, (int, float)):
        return  # no reviews; a mean that is no number is named by the schema
    low = sum(c * (b * width + 1 if b else 0) for b, c in enumerate(hist)) / n
    high = sum(c * min((b + 1) * width, longest) for b, c in enumerate(hist)) / n
    if not low - MEAN_DECIMALS <= mean <= high + MEAN_DECIMALS:
        raise _Contradiction(f"{stats}.mean {mean!r} is not in [{low:.2f}, {high:.2f}], the "
                             f"means {path}'s bins allow (each review at its bin's shortest or "
                             "longest length)")


def _quantiles_in_bins(record: Any, stats: str, path: str, hist: list[int], width: int) -> None:
    """The median and 90th percentile the chapter prints lie in the histogram's bins that hold
    the reviews they are taken from (trial 11's D19, D23: a p90 of 250 was printed beside 12.8 %
    of reviews over 256)."""
    n = sum(hist)
    if n == 0:
        return
    ends = list(itertools.accumulate(hist))

    def span(i: int) -> tuple[float, float]:  # the bin of the i-th shortest review (from 0)
        b = next(k for k, end in enumerate(ends) if end > i)
        return (b * width if b else -math.inf), ((b + 1) * width if b < len(hist) - 1
                                                 else math.inf)
    for key, (i, j) in (("median", ((n - 1) // 2, n // 2)), ("p90", (int(0.9 * (n - 1)),) * 2)):
        value = _get(record, f"{stats}.{key}")
        low, high = span(i)[0], span(j)[1]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not low < value <= high:
            raise _Contradiction(f"{stats}.{key} {value!r} is not in ({low:g}, {high:g}], "
                                 f"where {path}'s bins put that review")
        if (2 * value) % 1:  # trial 12's D32: a length, or the mean of two
            raise _Contradiction(f"{stats}.{key} {value!r} is no length, nor the mean of two")


def _example_counts(record: Any) -> None:
    vocab = _count(record, "tokenizer.parameters.vocab_size")
    examples, named = _get(record, "examples", []), {}
    if not isinstance(examples, list):
        raise _Contradiction("examples is not a list")
    for i, example in enumerate(examples):
        pieces, ids = _get(example, "pieces", None), _get(example, "ids", None)
        if not isinstance(pieces, list) or not isinstance(ids, list) or len(pieces) != len(ids):
            raise _Contradiction(f"examples.{i} has {len(pieces) if isinstance(pieces, list) else pieces!r} "
                                 f"pieces but {len(ids) if isinstance(ids, list) else ids!r} ids")
        bad = [n for n in ids if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < vocab]
        if bad:
            raise _Contradiction(f"examples.{i}.ids holds {bad[0]!r}, not an id below "
                                 f"tokenizer.parameters.vocab_size {vocab}")
        if (why := spelling_problem(_get(example, "text", None), pieces, ids, named)) is not None:
            raise _Contradiction(f"examples.{i} {why}")


def split_sizes(path: Path | None = None) -> dict[str, int]:
    """CLS-Books reviews per split (train, valid, test), from the committed summary."""
    return {str(s["split"]): int(s["reviews"]) for s in read_summary(path)["cls"]["splits"]}


def train_size(path: Path | None = None) -> int:
    """CLS-Books training reviews, from the committed summary: the size the lab's schedule is
    derived from, available without the prepared data (the runs read it from their data)."""
    return split_sizes(path)["train"]
