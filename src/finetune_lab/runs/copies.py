"""Runs that are copies of others: byte for byte, or in what they measured.

An event file holds the times it was written, so a byte-identical one is a copy; a copy re-saved
with its times moved differs in bytes but logs the same losses and accuracies, which another
seed never gives.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs import manifest as mf
from finetune_lab.runs.eventfiles import logged_values
from finetune_lab.runs.run_inputs import cached_sha256


def copy_problems(records: Sequence[Any], suspects: Sequence[Any], valid: set[int]) -> None:
    """A run whose event file is byte-identical to another run's is a copy, not a run of its
    own (an event file holds the times it was written): an unfinished one among ``suspects``
    (which counts as having shared the machine) is rejected beside any run; two valid runs
    (``valid``: their ids) are both rejected, since nothing tells the original from a copy
    edited everywhere. (A copy that contradicts its folder, hashes or command is rejected
    already, its original kept.) So are runs that measured the same under other seeds
    (:func:`_replica_problems`)."""
    by_size: dict[int, list[tuple[Any, Path]]] = {}
    try:
        for r in records:
            if r.path.is_symlink():  # listed, never read (:func:`_linked`)
                continue
            for f in mf.event_files(r.path):
                by_size.setdefault(f.stat().st_size, []).append((r, f))
        for r in suspects:
            for f in mf.event_files(r.path):
                twin = next(((o, g) for o, g in by_size.get(f.stat().st_size, [])
                             if o is not r and (r.unfinished or id(o) in valid)
                             and cached_sha256(g) == cached_sha256(f)), None)
                if twin is not None:
                    r.problems.append(f"event file {f} is byte-identical to {twin[1]} of run "
                                      f"{twin[0].key}: a copy, not a run of its own")
                    break
    except OSError:  # a file gone since it was judged: the run was judged on what was there
        pass
    _replica_problems(records, suspects, valid)


SERIES_TAGS = frozenset({"loss", "accuracy", "train/loss", "train/epoch_loss"})
"""What a run measured at each update (its event files' losses and accuracies: fairseq's, the
Trainer's)."""


def _series(run: Any) -> str | None:
    """A key of what a run measured, each value to four significant digits (check 26b's R-n1:
    every value scaled by 1 + 1e-6, below the log's precision, made a copy another run)."""
    try:
        values = sorted((f.parent.name, tag, step, float(f"{value:.4g}"))
                        for f in mf.event_files(run.path)
                        for tag, step, value in logged_values(f) if tag in SERIES_TAGS)
    except OSError:  # unreadable: the registry names it
        return None
    return hashlib.sha256(repr(values).encode()).hexdigest() if values else None


def _replica_problems(records: Sequence[Any], suspects: Sequence[Any], valid: set[int]) -> None:
    """Two runs that measured the same loss and accuracy at every update under different seeds
    are one run (trial 26's R-m1: a run re-saved with its event times moved by a millisecond
    and filed as another seed made the grid "4 seeds, 78.2 %"); the same seed on the same
    weights gives the same numbers on a CPU, as a candidate's grid repeating the lab's does.
    As for byte copies, an unfinished run is rejected beside any run, a valid one beside
    another valid one."""
    keyed: dict[str, list[Any]] = {}
    for r in records:
        if r.manifest is not None and not r.path.is_symlink() and (key := _series(r)):
            keyed.setdefault(key, []).append(r)
    judged = {id(r) for r in suspects}
    for group in keyed.values():
        for r in (r for r in group if id(r) in judged):
            other = next((o for o in group if o is not r and o.seed != r.seed
                          and (r.unfinished or id(o) in valid)), None)
            if other is not None:
                r.problems.append(f"logs the same loss and accuracy at every update as run "
                                  f"{other.key}, whose seed is {other.seed}, not {r.seed}: a "
                                  "copy, not a run of its own")
