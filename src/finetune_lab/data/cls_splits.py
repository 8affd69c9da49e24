"""The CLS-Books split sizes from the committed data summary, for code that runs without the data.

The lab's schedule (updates per epoch, warm-up) is derived from the number of training reviews.
The runs read it from their prepared data; the chapters and the recipe comparisons read it from
``data/summaries/data.json`` (written by ``finetune-lab data-summary``), which a clean clone has.
"""

from __future__ import annotations

from pathlib import Path

from finetune_lab._files import not_there, read_json
from finetune_lab.config import paths
from finetune_lab.errors import UserError

SUMMARY_NAME = "data.json"


def summary_path() -> Path:
    """The committed aggregate summary of the prepared data."""
    return paths().summaries / SUMMARY_NAME


def split_sizes(path: Path | None = None) -> dict[str, int]:
    """CLS-Books reviews per split (train, valid, test), from the committed summary."""
    path = Path(path) if path is not None else summary_path()
    if not path.is_file():
        raise UserError(f"{path} {not_there(path)}: run `finetune-lab data-summary` after preparing "
                        "the data (`finetune-lab prepare-cls`)")
    try:
        sizes = {str(s["split"]): int(s["reviews"]) for s in read_json(path)["cls"]["splits"]}
        if "train" not in sizes:
            raise KeyError("train")
        return sizes
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{path} lacks the splits' review counts (cls.splits): restore "
                        "it (`git checkout -- data/summaries/data.json`) or run `finetune-lab "
                        "data-summary` again") from None


def train_size(path: Path | None = None) -> int:
    """CLS-Books training reviews, from the committed summary: the size the lab's schedule is
    derived from, available without the prepared data (the runs read it from their data)."""
    return split_sizes(path)["train"]
