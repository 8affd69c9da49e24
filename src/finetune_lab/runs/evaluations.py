"""What a fine-tuning run's logs must hold: every subset its command evaluates, with an accuracy
at every epoch (trial 8's E8, E10, E12: one accuracy removed from an event file left the seed
tables printing "n = 3" over two values, or choosing another best epoch, while the run passed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs.eventfiles import accuracy_steps

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


def accuracy_series(path: Path, events: Sequence[Path]) -> dict[str, frozenset[int]]:
    """Each evaluated series of a run and the updates it logs an accuracy at: fairseq's
    ``accuracy`` by subset folder (``train``, ``valid``, ``test``), the Trainer's ``eval/…`` and
    ``test/…`` by prefix."""
    series: dict[str, set[int]] = {}
    for event_file in events:
        for tag, steps in accuracy_steps(event_file).items():
            if tag == "accuracy" and event_file.parent != path:
                name = event_file.parent.name
            elif tag.endswith("/accuracy"):
                name = tag.rsplit("/", 1)[0]
            else:
                continue  # best_accuracy: fairseq's running best, derived from valid's
            if name not in STEP_SERIES:
                series.setdefault(name, set()).update(steps)
    return {name: frozenset(steps) for name, steps in series.items()}


def accuracy_problems(path: Path, man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """A complete fine-tuning run (its recipe has ``epochs``) logs each evaluated series' accuracy
    once per epoch, at the same updates: the best epoch is chosen on validation and read on
    test, so a value missing from either is a different result, never a smaller sample."""
    epochs = (man.get("hyperparameters") or {}).get("epochs")
    if man.get("status") != "complete" or not isinstance(epochs, int) or isinstance(epochs, bool) \
            or man.get("framework") not in ("fairseq", "transformers"):
        return []
    series = accuracy_series(path, events)
    if not series:
        return ["it is a fine-tuning run, but no event file logs an accuracy"]
    problems = [f"its {name} accuracy is logged at {len(steps)} updates, not once per epoch "
                f"({epochs} epochs)" for name, steps in sorted(series.items())
                if len(steps) != epochs]
    if not problems and len(set(series.values())) > 1:
        shown = "; ".join(f"{name} at {', '.join(map(str, sorted(steps)))}"
                          for name, steps in sorted(series.items()))
        problems.append(f"its evaluations are logged at different updates ({shown})")
    return problems
