"""The CLS-Books split sizes from the committed data summary, for code that runs without the data.

The lab's schedule (updates per epoch, warm-up) is derived from the number of training reviews.
The runs read it from their prepared data; the chapters and the recipe comparisons read it from
``data/summaries/data.json`` (written by ``finetune-lab data-summary``), which a clean clone has.
"""

from __future__ import annotations

from pathlib import Path

from finetune_lab._files import read_json
from finetune_lab.config import paths
from finetune_lab.errors import UserError

SUMMARY_NAME = "data.json"


def summary_path() -> Path:
    """The committed aggregate summary of the prepared data."""
    return paths().summaries / SUMMARY_NAME


def train_size(path: Path | None = None) -> int:
    """CLS-Books training reviews, from the committed summary: the size the lab's schedule is
    derived from, available without the prepared data (the runs read it from their data)."""
    path = Path(path) if path is not None else summary_path()
    if not path.is_file():
        raise UserError(f"{path} does not exist: run `finetune-lab data-summary` after preparing "
                        "the data (`finetune-lab prepare-cls`)")
    try:
        splits = read_json(path)["cls"]["splits"]
        return int(next(s for s in splits if s["split"] == "train")["reviews"])
    except (KeyError, TypeError, ValueError, StopIteration):
        raise UserError(f"{path} lacks the training split's review count (cls.splits): restore "
                        "it (`git checkout -- data/summaries/data.json`) or run `finetune-lab "
                        "data-summary` again") from None
