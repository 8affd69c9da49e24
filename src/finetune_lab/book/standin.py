"""The stand-in chapter's facts: how the packaged checkpoint was made, run by run, and how it
compares with the course's model. The build log (every other run) is the appendix's."""

from __future__ import annotations

from typing import Any

import pandas as pd

from finetune_lab.book.pretrain_report import VALID_SUBSETS, checked_step, loss_curve
from finetune_lab.models.checkpoints import package_manifest
from finetune_lab.runs.manifest import run_key
from finetune_lab.runs.registry import RunRecord, find_run
from finetune_lab.runs.tblogs import event_scalars
from finetune_lab.train.pretrain_lineage import step_reads_task_texts
from finetune_lab.runs.reading import reads_once

def lineage_steps() -> list[dict[str, Any]]:
    """The packaged checkpoint's lineage as its manifest records it, oldest first."""
    package = package_manifest() or {}
    return package.get("lineage") or ([{"run": package["run"]}] if package.get("run") else [])


@reads_once
def lineage_records() -> list[tuple[dict[str, Any], RunRecord]]:
    """Each run behind the packaged checkpoint, oldest first, with its lineage step, read
    through the registry (a step whose run is not valid is left out, and the table says less).
    What a step's copy in the package's manifest records of its run (updates, tokens) is held
    against the run's own record: a disagreement is refused in one line
    (:func:`~finetune_lab.book.pretrain_report.checked_step`)."""
    package = package_manifest() or {}
    found = []
    for step in lineage_steps():
        rec = find_run(run_key(step["run"]))
        if rec is not None and rec.valid:
            checked_step(step, rec, package)
            found.append((step, rec))
    return found


def step_tokens(step: dict[str, Any], rec: RunRecord) -> int:
    """The tokens a lineage step trained on, from its run's own registry-checked record: its
    updates (the run's, or fewer where the weights were packaged on the way) × its
    ``tokens_per_update``. The lineage's copy is only checked against them, never read for
    the figure (:func:`~finetune_lab.book.pretrain_report.checked_step`, which every reader of
    a lineage shares)."""
    return checked_step(step, rec, package_manifest() or {})["tokens"]


def reads_task_texts(rec: RunRecord) -> bool:
    """Whether the run read the CLS-Books training texts (a task-adaptive corpus)."""
    return step_reads_task_texts(rec.manifest)[0]


def _last_loss(rec: RunRecord, subset: str) -> float | None:
    curve = loss_curve(event_scalars(rec.path), subset)
    return float(curve["value"].iloc[-1]) if len(curve) else None


def lineage_table() -> pd.DataFrame:
    """One row per run behind the packaged checkpoint: what it read, how, for how long, and the
    held-out losses it ended at."""
    rows = []
    for step, rec in lineage_records():
        hp = rec.manifest["hyperparameters"]
        tokens = step_tokens(step, rec)
        novels, reviews = (_last_loss(rec, s) for s in VALID_SUBSETS)
        objective = "masked LM" + (" + `<s>` bag of words" if hp.get("bow_weight") else "")
        rows.append({
            "run": f"`{rec.name}`",
            "starts from": "random weights" if rec.manifest.get("init") == "random"
            else "the run above" + (", sinusoids written into the position table"
                                    if hp.get("position_init") == "sinusoidal" else ""),
            "texts": "CLS-Books training texts + dvd/music reviews" if reads_task_texts(rec)
            else "novels + dvd/music reviews",
            "samples": "whole lines" if hp.get("sample_break_mode", "none") != "none"
            else "256-token stretches",
            "objective": objective,
            "tokens (M)": f"{tokens / 1e6:.1f}",
            "hours": f"{(rec.manifest.get('wall_time_s') or 0) / 3600:.1f}",
            "held-out novels (bits)": "–" if novels is None else f"{novels:.2f}",
            "held-out reviews (bits)": "–" if reviews is None else f"{reviews:.2f}",
        })
    return pd.DataFrame(rows)


def task_adaptive_steps() -> list[str]:
    """Names of the runs behind the packaged checkpoint that read the CLS-Books training texts."""
    return [rec.name for _, rec in lineage_records() if reads_task_texts(rec)]
