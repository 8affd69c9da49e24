"""Replacing the packaged checkpoint: the runs it sets aside, and whether its weights were
tried first as a candidate (and how the grid's runs of the same file compare).

A candidate's fine-tuning and the grid's run of the same bytes should agree; where they do not,
the CPU threads each side recorded say why (the order of floating-point sums).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from finetune_lab.book import fairseq_report as fr
from finetune_lab.config import paths
from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
from finetune_lab.runs import seedstats
from finetune_lab.runs.registry import RunRecord, discover_runs
from finetune_lab.runs.run_inputs import cached_sha256, recorded_checkpoint_sha
from finetune_lab.runs.runspeed import device_threads
from finetune_lab.train.finetune_fairseq import candidate_experiments, candidate_index
from finetune_lab.train.pretrain_recipe import EXPERIMENT


def runs_on_checkpoint(runs_root: Path | None = None) -> list[RunRecord]:
    """Valid runs that started from the packaged checkpoint (fairseq from ``model.pt``, the
    Transformers and LoRA runs from its conversion): what replacing it sets aside."""
    root = runs_root or paths().runs
    return [r for r in discover_runs(root) if r.valid
            and r.experiment != EXPERIMENT and candidate_index(r.experiment) is None
            and ((r.manifest or {}).get("inputs") or {}).get("checkpoint")]


@dataclass(frozen=True)
class ReplacementCost:
    """What replacing the packaged checkpoint sets aside: the runs built on it, by experiment
    (in name order), and their recorded run time."""

    runs: int
    by_experiment: dict[str, int]
    hours: float


def replacement_cost(records: list[RunRecord]) -> ReplacementCost:
    """:class:`ReplacementCost` of :func:`runs_on_checkpoint`'s runs."""
    by = Counter(r.experiment for r in records)
    hours = sum(float((r.manifest or {}).get("wall_time_s") or 0) for r in records) / 3600
    return ReplacementCost(runs=len(records), by_experiment=dict(sorted(by.items())), hours=hours)


@dataclass(frozen=True)
class Rehearsal:
    """The packaged weights fine-tuned as a candidate before they were packaged, beside the
    grid's runs of the packaged file: the same weights (sha256), recipe and seeds."""

    experiment: str
    tried: str
    shared_seeds: int
    max_diff: float | None
    """The largest difference of test accuracy over the seeds both hold (points)."""
    threads: str
    """The CPU threads each side's runs recorded (e.g. "1 and 2"; "" when not all recorded)."""


def packaged_rehearsal(runs_root: Path | None = None) -> Rehearsal | None:
    """The candidate experiment whose pretrained runs started from the packaged checkpoint's
    very file (None when the packaged weights were never tried first)."""
    model = packaged_dir() / MODEL_FILE
    if not model.is_file():
        return None
    sha = cached_sha256(model)
    grid = fr.load_results(runs_root)
    packaged = (grid.best[grid.best["init"] == "pretrained"].set_index("seed")["test"]
                if grid.ready else pd.Series(dtype=float))
    for name in candidate_experiments(runs_root):
        res = fr.load_results(runs_root, name)
        seeds = {r.seed for r in res.loaded.runs if r.valid and r.init == "pretrained"
                 and recorded_checkpoint_sha(r.manifest) == sha}
        if not res.ready or not seeds:
            continue
        tried = res.best[(res.best["init"] == "pretrained") & res.best["seed"].isin(seeds)]
        test = tried.set_index("seed")["test"].astype(float)
        shared = sorted(set(test.index) & set(packaged.index))
        sides = [[r for r in runs.loaded.runs if r.valid and r.init == "pretrained"
                  and r.seed in shared] for runs in (res, grid)]
        counts = [sorted({device_threads(r.manifest or {}) for r in side}) for side in sides]
        threads = (" and ".join("/".join(f"{t:g}" for t in c) for c in counts)
                   if all(c and not any(pd.isna(c)) for c in counts) else "")
        return Rehearsal(
            experiment=name,
            tried=seedstats.fmt_mean_std(test.mean(), test.std(ddof=1), len(test)),
            shared_seeds=len(shared),
            max_diff=max((abs(float(test[s]) - float(packaged[s])) for s in shared),
                         default=None),
            threads=threads)
    return None
