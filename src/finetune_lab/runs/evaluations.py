"""What a run's logs must hold: every subset its command evaluates, with an accuracy at every
epoch (trial 8's E8, E10, E12: one accuracy removed from an event file left the seed tables
printing "n = 3" over two values, or choosing another best epoch, while the run passed); and, in
a fairseq run, the losses and accuracies its hashed ``train.log`` prints (trial 9's E4, E6, E9:
an edited value, rehashed into the manifest, changed a table or figure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs.eventfiles import (accuracy_steps, all_sound, log_text, logged_values,
                                         once_per_log_and_events)
from finetune_lab.runs.fairseq_logs import printed_metrics

STEP_SERIES = ("train_inner",)
"""fairseq's per-interval training log: not an evaluation, logged every ``--log-interval``."""


def subset_problems(path: Path, man: dict[str, Any], events: Sequence[Path],
                    valid_subset: str | None) -> list[str]:
    """A complete fairseq run logged every subset its command evaluates (``--valid-subset
    valid,test``, one event folder each): a run without its test log was a mean of five
    values under a count of six."""
    if man.get("framework") != "fairseq" or man.get("status") != "complete" or not valid_subset:
        return []
    logged = {p.parent.name for p in events if p.parent != path}  # path: the run folder
    missing = [s for s in valid_subset.split(",") if s and s not in logged]
    return [f"its command evaluates {', '.join(missing)} (--valid-subset {valid_subset}) but no "
            "event file logs it"] if missing else []


def accuracy_series(path: Path, events: Sequence[Path]) -> dict[str, list[int]]:
    """Each evaluated series of a run and the updates it logs an accuracy at, sorted (one file
    logs a tag once per update; two files may both log it): fairseq's ``accuracy`` by subset
    folder (``train``, ``valid``, ``test``), the Trainer's ``eval/…`` and ``test/…`` by
    prefix."""
    series: dict[str, list[int]] = {}
    for event_file in events:
        for tag, steps in accuracy_steps(event_file).items():
            if tag == "accuracy" and event_file.parent != path:
                name = event_file.parent.name
            elif tag.endswith("/accuracy"):
                name = tag.rsplit("/", 1)[0]
            else:
                continue  # best_accuracy: fairseq's running best, derived from valid's
            if name not in STEP_SERIES:
                series.setdefault(name, []).extend(steps)
    return {name: sorted(steps) for name, steps in series.items()}


TRAINER_SERIES = ("eval", "test")
"""What a Transformers (and LoRA) run evaluates every epoch: validation, whose best epoch the
book picks, and test, read at it."""


def accuracy_problems(path: Path, man: dict[str, Any], events: Sequence[Path],
                      valid_subset: str | None = None) -> list[str]:
    """A complete fine-tuning run (its recipe has ``epochs``) logs an accuracy for its
    validation and its test at every epoch (fairseq: each subset of ``--valid-subset``), at the
    same updates: the best epoch is chosen on validation and read on test, so a value missing
    from either is a different result, never a smaller sample (trial 11's E22, E34: a renamed
    test tag left a run counted in n but not in the mean)."""
    epochs = (man.get("hyperparameters") or {}).get("epochs")
    if man.get("status") != "complete" or not isinstance(epochs, int) or isinstance(epochs, bool) \
            or man.get("framework") not in ("fairseq", "transformers"):
        return []
    if not all_sound(events):  # a damaged event file, named already: its accuracies are not
        return []  # missing (trial 11's E31: a false second reason)
    series = accuracy_series(path, events)
    wanted = TRAINER_SERIES if man["framework"] == "transformers" else \
        tuple(s for s in (valid_subset or "").split(",") if s)
    missing = [name for name in wanted if name not in series]
    if not series:
        return ["it is a fine-tuning run, but no event file logs an accuracy"]
    if missing:
        return [f"it is a fine-tuning run, but no event file logs its {' or '.join(missing)} "
                "accuracy"]
    problems = [f"its {name} accuracy is logged {len(steps)} times at {len(set(steps))} "
                f"updates, not once per epoch ({epochs} epochs)"
                for name, steps in sorted(series.items()) if len(steps) != epochs
                or len(set(steps)) != epochs]
    if not problems and len({tuple(steps) for steps in series.values()}) > 1:
        shown = "; ".join(f"{name} at {', '.join(map(str, sorted(steps)))}"
                          for name, steps in sorted(series.items()))
        problems.append(f"its evaluations are logged at different updates ({shown})")
    return problems


def log_problems(path: Path, man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """Each loss and accuracy of a fairseq run's subset event files is one its ``train.log``
    prints at that update (rounded as printed: every one of the 18,355 values of the committed
    runs is), and the log is hashed with the run; an event value the log does not print, or
    prints otherwise, was edited."""
    log = path / "train.log"
    if man.get("framework") != "fairseq":
        return []
    if "train.log" not in (man.get("logs") or {}):  # hashed when a run ends or pauses
        if man.get("status") not in ("complete", "paused"):
            return []
        # trial 11's N6: nothing to hold its values to
        return ["its manifest lists no train.log, which every fairseq run writes and its event "
                "files' values are held against"]
    try:  # read once; a byte that is not UTF-8 must not switch the check off (trial 11's N4)
        text = log_text(log)
    except OSError:
        return []  # the log's own check names it (missing, changed)
    return _values_against_log(text, path, events)


@once_per_log_and_events
def _values_against_log(text: str, path: Path, events: Sequence[Path]) -> list[str]:
    printed = printed_metrics(text)
    for event_file in events:
        if event_file.parent == path:
            continue
        subset = event_file.parent.name
        for tag, step, value in logged_values(event_file):
            said = printed.get((subset, step), {}).get(tag, [])
            if not any(abs(value - v) <= 0.5 * 10 ** -d for v, d in said):
                shown = f"prints {said[0][0]:g}" if said else "prints none"
                return [f"its {subset} {tag} at update {step} is {value:.6g} in "
                        f"{event_file.relative_to(path)}, but its train.log {shown} there"]
    return []


TRAINER_REL_TOL = 1e-5
"""A mean the Trainer logs in float32 against the same mean taken again (1e-7 apart in the
committed runs)."""


EPOCH_TOL = 0.005
"""The Trainer's fractional epoch is updates / updates per epoch, rounded to two decimals by
some versions of it."""


def trainer_loss_problems(path: Path, man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """A Transformers run's fractional epoch (``train/epoch``, by which the book finds its best
    epoch) is its updates over the updates per epoch. Its epoch loss (``train/epoch_loss``,
    which the loss figure draws) is the mean of the interval losses it logged in that epoch,
    and its run loss (``train/train_loss``) the mean of its epochs' (when the logging interval
    divides an epoch, so that the intervals are alike; trial 9's E2: an epoch loss halved on its
    own passed)."""
    hp = man.get("hyperparameters") or {}
    every, total, epochs = (hp.get(k) for k in ("trainer_logging_steps", "total_updates",
                                                "epochs"))
    if man.get("framework") != "transformers" or man.get("status") != "complete" \
            or not all(isinstance(v, int) and v > 0 for v in (total, epochs)) or total % epochs:
        return []
    per_epoch = total // epochs
    values: dict[str, list[tuple[int, float]]] = {}
    for event_file in events:
        for tag, step, value in logged_values(event_file):
            values.setdefault(tag, []).append((step, value))
    for step, epoch in values.get("train/epoch", []):  # trial 10's E13: doubled, it moved
        if not abs(epoch - step / per_epoch) <= EPOCH_TOL:  # the best epoch the book prints
            return [f"its train/epoch at update {step} is {epoch:.6g}, but {step} updates of "
                    f"{per_epoch} per epoch are epoch {step / per_epoch:.6g}"]
    if not (isinstance(every, int) and every > 0) or per_epoch % every:
        return []
    intervals = values.get("train/loss", [])
    means = sorted(values.get("train/epoch_loss", []))
    for step, mean in means:
        inside = [v for s, v in intervals if step - per_epoch < s <= step]
        if inside and not math.isclose(mean, math.fsum(inside) / len(inside),
                                        rel_tol=TRAINER_REL_TOL):
            return [f"its train/epoch_loss at update {step} is {mean:.6g}, but the "
                    f"{len(inside)} train/loss values of that epoch average "
                    f"{math.fsum(inside) / len(inside):.6g}"]
    for step, run_mean in values.get("train/train_loss", []):
        if means and not math.isclose(run_mean, math.fsum(m for _, m in means) / len(means),
                                      rel_tol=TRAINER_REL_TOL):
            return [f"its train/train_loss {run_mean:.6g} is not the mean of its "
                    f"{len(means)} epoch losses"]
    return []
