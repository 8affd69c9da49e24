"""An experiment's runs against each other: ``experiment.json`` and the hyperparameters every
run of an experiment must share (the seed and the init aside). A damaged ``experiment.json``
is an error naming the file, which the registry turns into a problem of that experiment's runs
only (:func:`~finetune_lab.runs.registry.discover_runs`).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from finetune_lab._files import regular_text, write_json_atomic
from finetune_lab.errors import UserError
from finetune_lab.runs import manifest as mf


class RunRecord(Protocol):
    """What these checks read and fill in: the registry's record (which imports this module)."""

    experiment: str
    manifest: dict[str, Any] | None
    problems: list[str]

    @property
    def valid(self) -> bool: ...

    @property
    def framework(self) -> str | None: ...

EXPERIMENT_CONFIG = "experiment.json"
VARYING_KEYS = frozenset({"seed", "init"})


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def read_experiment_config(experiment_dir: Path) -> dict[str, Any] | None:
    """``<experiment>/experiment.json`` (``{"hyperparameters": {...}}``) if the experiment has one."""
    path = experiment_dir / EXPERIMENT_CONFIG
    if not path.exists() and not path.is_symlink():
        return None
    return parse_config(path)


def parse_config(path: Path) -> dict[str, Any]:
    """An ``experiment.json`` anywhere (the run cache's, or a device call's copy), checked."""
    try:
        config = mf.loads_strict(regular_text(path))
    except (OSError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{path} cannot be read ({exc}); restore or delete it") from exc
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); restore or delete it") from exc
    varying = config.get("varying", []) if isinstance(config, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("hyperparameters"), dict) \
            or not isinstance(varying, list) or not all(isinstance(v, str) for v in varying):
        raise UserError(f'{path} must be a JSON object with a "hyperparameters" mapping (and '
                        'optionally a "varying" list of names); restore or delete it')
    return config


def differing_hyperparameters(config: dict[str, Any], hp: dict[str, Any]) -> list[str]:
    """The keys in which ``hp`` departs from an ``experiment.json`` ``config`` (what it lists as
    varying, the seed and the init aside): missing, extra, or of another value."""
    ignore = VARYING_KEYS | set(config.get("varying", []))
    expected = {k: v for k, v in config["hyperparameters"].items() if k not in ignore}
    got = {k: v for k, v in hp.items() if k not in ignore}
    return sorted(k for k in set(expected) | set(got)
                  if k not in expected or k not in got or _canon(got[k]) != _canon(expected[k]))


class RecipeConflict(UserError):
    """An experiment's ``experiment.json`` does not allow a recipe (``keys``: where it differs)."""

    def __init__(self, message: str, keys: list[str]):
        super().__init__(message)
        self.keys = keys


def _recorded_by(experiment_dir: Path, names: list[str]) -> dict[str, str]:
    """Which of ``names`` a run of the experiment records already (name -> run folder)."""
    found: dict[str, str] = {}
    for run, hp in _run_recipes(experiment_dir).items():
        for name in names:
            if name in hp:
                found.setdefault(name, run)
    return found


def _run_recipes(experiment_dir: Path) -> dict[str, dict[str, Any]]:
    """The recipe each run of the experiment records (run folder -> hyperparameters); damaged
    manifests are skipped (the registry names them)."""
    return {manifest.parent.name: record["hyperparameters"]
            for manifest, record in mf.readable_manifests(experiment_dir, f"*/{mf.MANIFEST_NAME}")
            if isinstance(record.get("hyperparameters"), dict)}


def recipe_kind(hp: dict[str, Any]) -> str:
    """What a recipe trains: LoRA adapters, a whole model on the task, or a masked LM."""
    if "lora" in hp:
        return "LoRA fine-tuning"
    return "full fine-tuning" if "epochs" in hp else "pretraining"


def _refuse_other_kind(experiment_dir: Path, hyperparameters: dict[str, Any]) -> None:
    """An experiment holds runs of one kind: a LoRA run sent into the full fine-tunings'
    experiment became its chapter's only "Transformers" run (trial 8's P8)."""
    kind = recipe_kind(hyperparameters)
    other = next(((run, recipe_kind(hp)) for run, hp in _run_recipes(experiment_dir).items()
                  if recipe_kind(hp) != kind), None)
    if other is not None:
        raise RecipeConflict(f"{experiment_dir} holds {other[1]} runs ({other[0]}): a run of "
                             f"{kind} does not belong there; choose another --experiment",
                             ["kind"])


def write_new_config(experiment_dir: Path, config: dict[str, Any],
                     skip: str | None = None) -> None:
    """Write an experiment's first ``experiment.json``, unless a run it holds already (other than
    ``skip``, the run it is pinned from) has a recipe the file would reject: the file is the
    rule its runs are judged by, and a command must not turn runs it did not make into
    rejected ones."""
    path = experiment_dir / EXPERIMENT_CONFIG
    for run, hp in _run_recipes(experiment_dir).items():
        differ = differing_hyperparameters(config, hp) if run != skip else []
        if differ:
            raise RecipeConflict(f"{experiment_dir} has no {EXPERIMENT_CONFIG}, and its run {run} "
                                 f"was made with another recipe (it differs in "
                                 f"{', '.join(differ)}): pinning this one would reject it, so "
                                 "nothing was written; choose another --experiment", differ)
    write_json_atomic(path, config)


def pin_config(experiment_dir: Path, config: dict[str, Any],
               hyperparameters: dict[str, Any] | None = None) -> None:
    """Write ``experiment.json`` where the experiment has none. One that is there keeps every
    value it pins (the experiment's runs were judged by it): a recipe whose ``hyperparameters``
    (all of them; ``config``'s fixed ones by default) it does not allow is refused here, before
    any work, naming the keys (:class:`RecipeConflict`). Names ``config`` lets vary that the
    file neither pins nor lists (settings a later version records, such as ``num_workers``)
    are added to its ``varying`` list, so that it accepts the run it lets start; that is
    refused too when a run of the experiment records such a name already, since the file
    rejects that run today and would accept it after."""
    path = experiment_dir / EXPERIMENT_CONFIG
    _refuse_other_kind(experiment_dir, config["hyperparameters"] if hyperparameters is None
                       else hyperparameters)
    current = read_experiment_config(experiment_dir)
    if current is None:
        write_new_config(experiment_dir, config)
        return
    varying = list(current.get("varying", []))
    known = {*varying, *current["hyperparameters"]}
    added = [k for k in dict.fromkeys(config.get("varying", [])) if k not in known]
    hp = config["hyperparameters"] if hyperparameters is None else hyperparameters
    differ = differing_hyperparameters({**current, "varying": [*varying, *added]}, hp)
    if differ:
        raise RecipeConflict(f"{path} pins another recipe for this experiment's runs (it "
                             f"differs in {', '.join(differ)}): it was left as it is; choose "
                             "another --experiment (or --run folder)", differ)
    if not added:
        return
    recorded = _recorded_by(experiment_dir, added)
    if recorded:
        name, run = next(iter(recorded.items()))
        raise RecipeConflict(f"{path} does not let its runs vary in {name}, which its run "
                             f"{run} records (and is rejected for): it was left as it is; "
                             "choose another --experiment (or --run folder)", [name])
    write_json_atomic(path, {**current, "varying": [*varying, *added]})
    print(f"{path}: its runs may now vary in {', '.join(added)} too (settings this version "
          "records); every value it pins is kept")


def refuse_other_recipe(experiment_dir: Path, hyperparameters: dict[str, Any]) -> None:
    """Before any work: a run whose recipe the experiment's ``experiment.json`` (if it has
    one) does not allow would be rejected once finished, so it is not started; nor is a run of
    another kind than the experiment's runs."""
    _refuse_other_kind(experiment_dir, hyperparameters)
    config = read_experiment_config(experiment_dir)
    differ = differing_hyperparameters(config, hyperparameters) if config is not None else []
    if differ:
        raise RecipeConflict(f"{experiment_dir / EXPERIMENT_CONFIG} pins another recipe for "
                             f"this experiment's runs (it differs in {', '.join(differ)}): "
                             "choose another --experiment", differ)


def check_hyperparameters(records: Sequence[RunRecord], config: dict[str, Any] | None) -> None:
    """Flag runs whose hyperparameters differ from their experiment's (seed and init aside).

    With an ``experiment.json`` its values are the expected ones. Without one, a value shared by
    a strict majority of the experiment's runs (per framework) is expected; if there is no
    majority, every run involved in the disagreement is flagged, since nothing says which is
    right.
    """
    ignore = VARYING_KEYS | set((config or {}).get("varying", []))
    by_framework: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in records:
        if rec.valid and rec.manifest is not None:
            by_framework[rec.framework or ""].append(rec)
    for group in by_framework.values():
        hps = [{k: v for k, v in r.manifest["hyperparameters"].items() if k not in ignore}
               for r in group]
        if config is not None:
            expected = {k: v for k, v in config["hyperparameters"].items() if k not in ignore}
            for rec, hp in zip(group, hps):
                for key in differing_hyperparameters(config, hp):
                    if key not in hp:
                        rec.problems.append(
                            f"hyperparameter '{key}' missing; experiment.json expects "
                            f"{_canon(expected[key])}"
                        )
                    elif key not in expected:
                        rec.problems.append(
                            f"hyperparameter '{key}' = {_canon(hp[key])} is not in experiment.json"
                        )
                    else:
                        rec.problems.append(
                            f"hyperparameter '{key}' = {_canon(hp[key])} differs from "
                            f"experiment.json ({_canon(expected[key])})"
                        )
            continue
        n = len(group)
        for key in sorted({k for hp in hps for k in hp}):
            values = [_canon(hp[key]) if key in hp else "<absent>" for hp in hps]
            counts = Counter(values)
            if len(counts) == 1:
                continue
            top, top_n = counts.most_common(1)[0]
            if top_n * 2 > n:
                for rec, value in zip(group, values):
                    if value != top:
                        rec.problems.append(
                            f"hyperparameter '{key}' = {value} differs from the other runs of "
                            f"experiment '{rec.experiment}' ({top} in {top_n} of {n} runs)"
                        )
            else:
                listing = ", ".join(f"{v} ×{c}" for v, c in sorted(counts.items()))
                for rec, value in zip(group, values):
                    rec.problems.append(
                        f"hyperparameter '{key}' = {value} disagrees across the runs of "
                        f"experiment '{rec.experiment}' ({listing}) and no {EXPERIMENT_CONFIG} "
                        "says which is expected"
                    )




def check_device_types(records: Sequence[RunRecord], config: dict[str, Any] | None) -> None:
    """An experiment's runs ran on one kind of device, unless its ``experiment.json`` lists
    ``device`` among its ``varying`` names: the chapters read an experiment as CPU runs or as
    GPU runs (trial 27's R-m2: a GPU run filed under the CPU experiment ``transformers`` gave
    the CPU chapter a GPU row). The type most of its runs share is the experiment's; where no
    type is most runs', every run is rejected, as :func:`check_hyperparameters` does."""
    if "device" in (config or {}).get("varying", []):
        return
    typed = [(r, str(((r.manifest or {}).get("device") or {}).get("type"))) for r in records
             if r.valid and isinstance((r.manifest or {}).get("device"), dict)]
    counts, odd = outvoted(typed)
    listing = ", ".join(f"{t} ×{c}" for t, c in sorted(counts.items()))
    for rec, kind in odd:
        rec.problems.append(
            f"device.type {kind!r}, but experiment '{rec.experiment}' holds runs of "
            f"another device ({listing}): one experiment is made on one kind of device; "
            "file it under an experiment of its own (--experiment), or list \"device\" "
            f"in its {EXPERIMENT_CONFIG}'s \"varying\"")


def outvoted(pairs: Sequence[tuple[Any, Any]]) -> tuple[Counter, list[tuple[Any, Any]]]:
    """``(run, value)`` pairs against the value most of them share: the values' counts and
    the pairs of another value (every pair where no value is most's; none where all agree)."""
    counts = Counter(v for _r, v in pairs)
    if len(counts) < 2:
        return counts, []
    top, n = counts.most_common(1)[0]
    return counts, [(r, v) for r, v in pairs if v != top or n * 2 <= len(pairs)]
