"""The guard of a sentence that the runs must support: a render whose valid runs no longer
support it fails in one message that names the claim and the runs the registry excluded."""

from __future__ import annotations

import os
from fnmatch import fnmatch
from typing import TypeVar

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.runs.registry import discover_runs, excluded_runs


class ClaimError(AssertionError):
    """A sentence of the book that the valid runs no longer support."""


def holds(ok: bool, claim: str, *experiments: str) -> None:
    """Guard a sentence: when the runs no longer support it, fail in one message naming the
    claim and the runs of ``experiments`` (globs) that the registry excluded, with the first
    reason of each (trial 14's M3: one damaged random run stopped the render with a bare
    assertion that named no run)."""
    if ok:
        return
    everywhere = excluded_runs(discover_runs())
    bad = [r for r in everywhere if any(fnmatch(r.experiment, e) for e in experiments)]
    where = ", ".join(experiments)

    def named(runs: list) -> str:
        return "; ".join(f"{r.experiment}/{r.name} ({r.problems[0] if r.problems else r.reason})"
                         .replace(f"{PROJECT_ROOT}{os.sep}", "") for r in runs)
    # a sentence may read more experiments than its guard lists (trial 20's G-z5: a rejected
    # pretraining run under a guard of fairseq* read as "the results themselves changed")
    why = (f"; excluded there: {named(bad)}. Repair or re-run those runs, or rewrite the "
           "sentence") if bad else (
        f"; no run there is excluded, but these runs of other experiments are, which it may "
        f"read too: {named(everywhere)}. Repair or re-run those runs, or rewrite the sentence"
    ) if everywhere else (
        ": no run is excluded, so the results themselves changed; rewrite the sentence")
    raise ClaimError(f"the sentence '{claim}' no longer holds with the valid runs of {where}{why}")


def excluded_in(*experiments: str) -> list[str]:
    """The runs of ``experiments`` (globs) that the registry excluded, as ``experiment/name``:
    a sentence saying runs were never made must first know none were made and excluded
    (trial 18's G-d: rejected runs read as "not fine-tuned yet", "no run on a GPU yet")."""
    return [f"{r.experiment}/{r.name}" for r in excluded_runs(discover_runs())
            if any(fnmatch(r.experiment, e) for e in experiments)]


T = TypeVar("T")


def needs(value: T | None, claim: str, *experiments: str) -> T:
    """``value``, a fact a page's sentences rest on (an accuracy, a table), when the valid runs
    give it; when they do not (None, or an empty table), :func:`holds` fails naming the runs of
    ``experiments`` the registry excluded (trial 17's G-c: with every lora-qv run rejected, the
    front page stopped at `KeyError: 'lora-qv'`, naming no run)."""
    empty = value is None or bool(getattr(value, "empty", False))
    holds(not empty, claim, *experiments)
    return value  # type: ignore[return-value]
