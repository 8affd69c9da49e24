"""The run registry: find every run under the runs root and say, precisely, which ones to trust.

A run is usable only if its manifest is complete, its event files are present and parse to the
last byte, the event files and its inputs still have the sha256 the manifest recorded, and its
hyperparameters agree with those of its experiment. Anything else is *listed with its reason*,
never silently dropped and never silently mixed into a table.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune_lab.config import paths
from finetune_lab.errors import UserError
from finetune_lab.render_cache import per_render
from finetune_lab.runs import manifest as mf
from finetune_lab.runs.eventfiles import EventFileError, strict_events
from finetune_lab.runs.run_inputs import (
    cached_sha256,
    check_conversion_source,
    check_input,
    recorded_files,
)

if TYPE_CHECKING:  # pandas only for the table: the CLI's run checks start without it
    import pandas as pd

EXPERIMENT_CONFIG = "experiment.json"
VARYING_KEYS = frozenset({"seed", "init"})


class InvalidRunError(UserError):
    """A run that was asked for by name is not usable (the message gives the reasons)."""


# --- records --------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One run folder, its manifest (if readable) and what is wrong with it."""

    path: Path
    experiment: str
    name: str
    manifest: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stale_checkpoint: str | None = None
    """The sha256 of the checkpoint the run started from, when that file has since been
    replaced (its only problem then: the run is sound but measures an earlier model)."""

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def key(self) -> str:
        """``experiment/name``: what a stored run path reads as (:func:`~finetune_lab.runs.manifest.run_key`)."""
        return f"{self.experiment}/{self.name}"

    @property
    def reason(self) -> str:
        """Every problem, ``; ``-joined (empty for a valid run)."""
        return "; ".join(self.problems)

    def _get(self, key: str) -> Any:
        return (self.manifest or {}).get(key)

    @property
    def framework(self) -> str | None:
        return self._get("framework")

    @property
    def init(self) -> str | None:
        return self._get("init")

    @property
    def seed(self) -> int | None:
        return self._get("seed")

    @property
    def status(self) -> str:
        return self._get("status") or "no manifest"


def validate_run(run_dir: Path | str, *, check_inputs: bool = True) -> RunRecord:
    """Check one run folder on its own (manifest, event files, hashes)."""
    path = Path(run_dir)
    rec = RunRecord(path=path, experiment=path.parent.name, name=path.name)
    try:
        rec.manifest = mf.read_manifest(path)
    except mf.ManifestError as exc:
        rec.problems.append(str(exc))
    if rec.manifest is not None:
        rec.problems += mf.manifest_problems(rec.manifest)
        for key, folder in (("experiment", rec.experiment), ("run", rec.name)):
            if key in rec.manifest and rec.manifest[key] != folder:
                rec.problems.append(
                    f"manifest {key} '{rec.manifest[key]}' does not match its folder '{folder}'"
                )

    files = mf.event_files(path)
    if not files:
        rec.problems.append(f"no TensorBoard event files under {path} (empty log directory)")
    last_step = 0
    for f in files:
        try:
            last_step = max(last_step, max((e.step for e in strict_events(f)), default=0))
        except EventFileError as exc:
            rec.problems.append(str(exc))

    man = rec.manifest or {}
    rec.problems += _forced_exit_problems(path, man, last_step)
    outputs = man.get("outputs")
    if man.get("status") == mf.STATUS_COMPLETE and isinstance(outputs, dict):
        present = {f.relative_to(path).as_posix(): f for f in files}
        for rel, want in sorted(outputs.items()):
            if rel not in present:
                rec.problems.append(f"event file {path / rel} listed in the manifest is missing")
            elif (got := cached_sha256(present[rel])) != want:
                rec.problems.append(
                    f"hash mismatch: event file {path / rel} has sha256 {got[:12]}… but the "
                    f"manifest recorded {want[:12]}… when the run finished"
                )
        for rel in sorted(set(present) - set(outputs)):
            rec.problems.append(
                f"event file {path / rel} is not in the manifest (written after the run ended?)"
            )

    if check_inputs and rec.manifest is not None and not mf.input_shape_problems(
            man.get("inputs")):
        checkpoint = man["inputs"].get("checkpoint")
        in_checkpoint = recorded_files(checkpoint) if checkpoint else frozenset()
        for item in man["inputs"].get("data") or []:
            check_input("data", item, rec, skip=in_checkpoint)
        if checkpoint:
            check_input("checkpoint", checkpoint, rec)
            check_conversion_source(rec)
    return rec


def _forced_exit_problems(path: Path, man: dict[str, Any], last_step: int) -> list[str]:
    """A trainer killed after its log showed the done marker (``exit_forced``) must have got to
    its recipe's last update: a marker read from anything but its own log once ended a run
    mid-way, and the manifest said complete."""
    total = (man.get("hyperparameters") or {}).get("total_updates")
    if man.get("status") != mf.STATUS_COMPLETE or not man.get("exit_forced") or not total \
            or last_step >= int(total):
        return []
    return [f"{path} was killed as done ({man['exit_forced']}), but its event files stop at "
            f"update {last_step:,} of {int(total):,}: the run did not finish; run it again"]


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def read_experiment_config(experiment_dir: Path) -> dict[str, Any] | None:
    """``<experiment>/experiment.json`` (``{"hyperparameters": {...}}``) if the experiment has one."""
    path = experiment_dir / EXPERIMENT_CONFIG
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); fix or delete it") from exc
    if not isinstance(config, dict) or not isinstance(config.get("hyperparameters"), dict):
        raise UserError(f'{path} must be a JSON object with a "hyperparameters" mapping')
    return config


def differing_hyperparameters(config: dict[str, Any], hp: dict[str, Any]) -> list[str]:
    """The keys in which ``hp`` departs from an ``experiment.json`` ``config`` (what it lists as
    varying, the seed and the init aside): missing, extra, or of another value."""
    ignore = VARYING_KEYS | set(config.get("varying", []))
    expected = {k: v for k, v in config["hyperparameters"].items() if k not in ignore}
    got = {k: v for k, v in hp.items() if k not in ignore}
    return sorted(k for k in set(expected) | set(got)
                  if k not in expected or k not in got or _canon(got[k]) != _canon(expected[k]))


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


@per_render
def discover_runs(
    root: Path | str | None = None,
    experiments: Iterable[str] | None = None,
    *,
    check_inputs: bool = True,
) -> list[RunRecord]:
    """Every run folder ``<root>/<experiment>/<run>/``, validated, valid or not.

    ``root`` defaults to the runs root (``$FINETUNE_LAB_RUNS_DIR`` or ``data/runs``). Folders
    whose name starts with ``.`` or ``_`` are skipped (scratch space).
    """
    base = Path(root) if root is not None else paths().runs
    wanted = set(experiments) if experiments is not None else None
    records: list[RunRecord] = []
    if not base.is_dir():
        if wanted:
            raise UserError(f"runs root {base} does not exist; no runs were recorded there yet")
        return records
    for exp_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        if exp_dir.name[0] in "._" or (wanted is not None and exp_dir.name not in wanted):
            continue
        exp_records = [
            validate_run(run_dir, check_inputs=check_inputs)
            for run_dir in sorted(p for p in exp_dir.iterdir() if p.is_dir())
            if run_dir.name[0] not in "._"
        ]
        check_hyperparameters(exp_records, read_experiment_config(exp_dir))
        records += exp_records
    if wanted:
        missing = wanted - {r.experiment for r in records}
        if missing:
            raise UserError(f"no runs for experiment(s) {sorted(missing)} under {base}")
    return records


def valid_runs(records: Iterable[RunRecord]) -> list[RunRecord]:
    """Only the usable runs (use :func:`excluded_runs` to show the others with their reasons)."""
    return [r for r in records if r.valid]


def excluded_runs(records: Iterable[RunRecord]) -> list[RunRecord]:
    return [r for r in records if not r.valid]


def runs_table(records: Iterable[RunRecord]) -> pd.DataFrame:
    """One row per run: identity, status, validity and the reason it is excluded (if it is)."""
    import pandas as pd

    rows = [
        {
            "experiment": r.experiment,
            "run": r.name,
            "framework": r.framework,
            "init": r.init,
            "seed": r.seed,
            "status": r.status,
            "valid": r.valid,
            "reason": r.reason,
            "warnings": "; ".join(r.warnings),
        }
        for r in records
    ]
    columns = ["experiment", "run", "framework", "init", "seed", "status", "valid", "reason",
               "warnings"]
    return pd.DataFrame(rows, columns=columns)


def exclusions_markdown(records: Iterable[RunRecord]) -> str:
    """A Markdown list of excluded runs and why (empty string when every run is valid).

    Runs whose only problem is a replaced checkpoint are grouped in one item: they are not
    broken, they measure a model the book no longer uses.
    """
    bad = excluded_runs(records)
    stale = [r for r in bad if r.stale_checkpoint and len(r.problems) == 1]
    lines = [f"- `{r.experiment}/{r.name}` excluded: {r.reason}" for r in bad if r not in stale]
    if stale:
        names = ", ".join(f"`{r.experiment}/{r.name}`" for r in stale)
        lines.insert(0, f"- {names}: made from an earlier stand-in checkpoint, which a new "
                        "pretraining has replaced; excluded until re-run from the current one, "
                        "never mixed with its runs.")
    return "\n".join(lines)


# --- CLI ------------------------------------------------------------------------------------


def _cmd_runs(args: argparse.Namespace) -> int:
    records = discover_runs(args.root, args.experiment or None, check_inputs=not args.no_inputs)
    if not records:
        print(f"no runs under {args.root or paths().runs}")
        return 0
    for r in records:
        mark = "ok " if r.valid else "BAD"
        print(f"{mark} {r.experiment}/{r.name} [{r.framework} init={r.init} seed={r.seed} "
              f"status={r.status}]")
        for p in r.problems:
            print(f"      problem: {p}")
        for w in r.warnings:
            print(f"      warning: {w}")
    n_bad = len(excluded_runs(records))
    print(f"{len(records) - n_bad} valid, {n_bad} excluded")
    return 1 if (args.strict and n_bad) else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("runs", help="list recorded runs, whether each is valid, and why not")
    p.add_argument("--root", type=Path, default=None, help="runs root (default: data/runs)")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument("--no-inputs", action="store_true", help="do not re-hash data and checkpoints")
    p.add_argument("--strict", action="store_true", help="exit 1 if any run is excluded")
    p.set_defaults(func=_cmd_runs)
