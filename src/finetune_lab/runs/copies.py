"""Runs that are copies of others: byte for byte, or in what they measured.

An event file holds the times it was written, so a byte-identical one is a copy; a copy re-saved
with its times moved differs in bytes but logs the same losses and accuracies, which another
seed never gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_lab.runs import manifest as mf
from finetune_lab.runs.eventfiles import files_key, logged_values
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
PRECISION = 1e-3
"""Two values agree when they differ by at most this: the three decimals fairseq's log prints
of a loss (a copy's values moved below them are the same values)."""
REPLICA_SHARE = 0.5
"""Two runs that agree at this share of the points they both measured are one run. Runs of
different seeds agree at under 14 % of them in the committed store, a seed repeated on the same
weights at 100 %; a copy must be changed at half its points to pass for another seed (trial
27's R-m1: one loss moved across a rounding boundary made a copy another seed's run, when runs
were keyed by their values rounded)."""


@dataclass(frozen=True)
class _Measured:
    keys: tuple[tuple[str, str, int], ...]
    """(subset, tag, update) of each value, sorted."""
    values: Any
    """Their values (a numpy array)."""


_MEASURED: dict[tuple[Any, ...], _Measured | None] = {}
""":func:`_measured` by the run's event files (:func:`~finetune_lab.runs.eventfiles.files_key`):
read once per process, though every judgement of the store compares every run (issue 36)."""


def _measured(run: Any) -> _Measured | None:
    try:
        files = mf.event_files(run.path)
        key = files_key(run.path, files)
    except (OSError, ValueError):  # unreadable: the registry names it
        return None
    if key not in _MEASURED:
        _MEASURED[key] = _points(files)
    return _MEASURED[key]


def _points(files: Sequence[Path]) -> _Measured | None:
    import numpy as np

    try:
        points = sorted(((f.parent.name, tag, step), value) for f in files
                        for tag, step, value in logged_values(f) if tag in SERIES_TAGS)
    except OSError:  # unreadable: the registry names it
        return None
    if not points:
        return None
    return _Measured(tuple(k for k, _ in points), np.array([v for _, v in points], dtype=float))


def _agreement(a: _Measured, b: _Measured) -> float:
    """The share of the points both runs measured at which their values agree (0 when they
    share under nine tenths of their points: other recipes, not one run)."""
    import numpy as np

    if a.keys == b.keys:
        x, y = a.values, b.values
    else:
        if min(len(a.keys), len(b.keys)) < 0.9 * max(len(a.keys), len(b.keys)):
            return 0.0
        other = dict(zip(b.keys, b.values))
        common = [(v, other[k]) for k, v in zip(a.keys, a.values) if k in other]
        if len(common) < 0.9 * max(len(a.keys), len(b.keys)):
            return 0.0
        x, y = np.array(common).T
    close = np.abs(x - y) <= PRECISION
    return float(close.mean())


def _replica_problems(records: Sequence[Any], suspects: Sequence[Any], valid: set[int]) -> None:
    """Two runs that measured the same losses and accuracies under different seeds are one run
    (trial 26's R-m1: a run re-saved with its event times moved by a millisecond and filed as
    another seed made the grid "4 seeds, 78.2 %"), compared point by point within the log's
    precision (:data:`REPLICA_SHARE`); the same seed on the same weights gives the same numbers
    on a CPU, as a candidate's grid repeating the lab's does. As for byte copies, an unfinished
    run is rejected beside any run, a valid one beside another valid one."""
    import numpy as np

    measured = {id(r): m for r in records
                if r.manifest is not None and not r.path.is_symlink() and (m := _measured(r))}
    # runs that logged at the same points (a recipe's) are compared all at once
    grids: dict[tuple[tuple[str, str, int], ...], list[Any]] = {}
    for r in records:
        if id(r) in measured:
            grids.setdefault(measured[id(r)].keys, []).append(r)
    stacked = {keys: np.stack([measured[id(o)].values for o in runs])
               for keys, runs in grids.items()}
    for r in suspects:
        mine = measured.get(id(r))
        if mine is None:
            continue
        shares = {id(o): float(share) for o, share in zip(grids[mine.keys], (
            np.abs(stacked[mine.keys] - mine.values) <= PRECISION).mean(axis=1))}
        for o in records:
            if o is r or o.seed == r.seed or not (r.unfinished or id(o) in valid) \
                    or id(o) not in measured:
                continue
            share = shares[id(o)] if id(o) in shares else _agreement(mine, measured[id(o)])
            if share >= REPLICA_SHARE:
                r.problems.append(f"logs the same loss and accuracy as run {o.key} at "
                                  f"{share:.0%} of the points both logged, though that run's "
                                  f"seed is {o.seed}, not {r.seed}: a copy, not a run of its own")
                break
