"""The course's own figures for the fairseq lab: external references, not results of this project.

The course writeups of this lab report test accuracy and a pretraining budget for the course's
RoBERTa_small_fr checkpoint, which is not public. The fairseq chapter puts this project's
numbers beside them; keeping them here, labelled with their source, keeps them from being read
as something the project measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COURSE_SOURCE = "course writeups of this lab"


@dataclass(frozen=True)
class ReferenceRange:
    """A figure reported outside this project, as a range (low == high for a single value)."""

    low: float
    high: float
    unit: str
    source: str = COURSE_SOURCE

    def text(self, digits: int = 0) -> str:
        if self.low == self.high:
            return f"{self.low:.{digits}f}{self.unit}"
        return f"{self.low:.{digits}f}–{self.high:.{digits}f}{self.unit}"


COURSE_TEST_ACCURACY: dict[str, ReferenceRange] = {
    "pretrained": ReferenceRange(79.0, 80.0, " %"),
    "random": ReferenceRange(63.0, 68.0, " %"),
}
"""EXTERNAL REFERENCE: test accuracy on CLS-Books that the course writeups of this lab report
with the course's own RoBERTa_small_fr checkpoint (best-validation epoch, fairseq recipe)."""

COURSE_PRETRAINING: dict[str, Any] = {
    "corpus": "French mC4",
    "corpus_gb": 39.0,
    "epochs": 10,
    "source": COURSE_SOURCE,
}
"""EXTERNAL REFERENCE: how the course's RoBERTa_small_fr was pretrained (masked LM on 39 GB of
French mC4, 10 epochs), as the course writeups of this lab describe it."""

COURSE_COLUMN = f"{COURSE_SOURCE} (external reference)"
"""The header of a table column holding the course's figures."""


def course_gap() -> ReferenceRange:
    """The pretrained − random gap implied by the course's ranges (widest and narrowest)."""
    p, r = COURSE_TEST_ACCURACY["pretrained"], COURSE_TEST_ACCURACY["random"]
    return ReferenceRange(p.low - r.high, p.high - r.low, " points")


def course_gap_cell() -> str:
    """The course's gap as a table cell: derived by this project from the course's two ranges
    (the writeups give the accuracies, not the gap), and labelled so."""
    return f"{course_gap().text()} (derived here from the two ranges)"
