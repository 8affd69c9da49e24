"""The CLS-Books split sizes from the committed data summary, for code that runs without the data.

The lab's schedule (updates per epoch, warm-up) is derived from the number of training reviews.
The runs read it from their prepared data; the chapters and the recipe comparisons read it from
``data/summaries/data.json`` (written by ``finetune-lab data-summary``), which a clean clone has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finetune_lab._files import not_there, read_json
from finetune_lab.config import paths
from finetune_lab.errors import UserError

SUMMARY_NAME = "data.json"


def summary_path() -> Path:
    """The committed aggregate summary of the prepared data."""
    return paths().summaries / SUMMARY_NAME


RESTORE = ("restore it (`git checkout -- data/summaries/data.json`) or run `finetune-lab "
           "data-summary` again")


def read_summary(path: Path | None = None) -> dict[str, Any]:
    """The committed data summary, checked: the facts it records twice (each split's reviews,
    its tokens against its mean length) must agree, or the file is refused in one line. The
    chapters compute from it (the lab's schedule, the GPU's MFU), and an edited count would
    otherwise move them silently."""
    path = Path(path) if path is not None else summary_path()
    if not path.is_file():
        raise UserError(f"{path} {not_there(path)}: run `finetune-lab data-summary` after preparing "
                        "the data (`finetune-lab prepare-cls`)")
    record = read_json(path)
    try:
        problem = summary_contradiction(record)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        problem = "it lacks the splits' counts (cls.splits, cls.tokenization, lengths)"
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


def split_sizes(path: Path | None = None) -> dict[str, int]:
    """CLS-Books reviews per split (train, valid, test), from the committed summary."""
    return {str(s["split"]): int(s["reviews"]) for s in read_summary(path)["cls"]["splits"]}


def train_size(path: Path | None = None) -> int:
    """CLS-Books training reviews, from the committed summary: the size the lab's schedule is
    derived from, available without the prepared data (the runs read it from their data)."""
    return split_sizes(path)["train"]
