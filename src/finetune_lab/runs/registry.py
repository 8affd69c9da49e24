"""The run registry: find every run under the runs root and say, precisely, which ones to trust.

A run is usable only if its manifest is complete, its event files are present and parse to the
last byte, the event files and its inputs still have the sha256 the manifest recorded, and its
hyperparameters agree with those of its experiment. Anything else is *listed with its reason*,
never silently dropped and never silently mixed into a table.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_lab.config import paths
from finetune_lab.errors import UserError
from finetune_lab.models import trust
from finetune_lab.render_cache import per_render
from finetune_lab.runs import manifest as mf
from finetune_lab.runs.consistency import count_problems, manifest_contradictions
from finetune_lab.runs.copies import copy_problems
from finetune_lab.runs.crosscheck import outside_problems
from finetune_lab.runs.eventfiles import checked_events
from finetune_lab.runs.experiments import EXPERIMENT_CONFIG as EXPERIMENT_CONFIG
from finetune_lab.runs.experiments import VARYING_KEYS as VARYING_KEYS
from finetune_lab.runs.experiments import check_device_types
from finetune_lab.runs.experiments import check_hyperparameters as check_hyperparameters
from finetune_lab.runs.experiments import differing_hyperparameters as differing_hyperparameters
from finetune_lab.runs.experiments import read_experiment_config as read_experiment_config
from finetune_lab.runs.reading import READING
from finetune_lab.runs.run_inputs import (
    cached_sha256,
    check_conversion_source,
    check_input,
    recorded_files,
)


class InvalidRunError(UserError):
    """A run that was asked for by name is not usable (the message gives the reasons)."""


# --- records --------------------------------------------------------------------------------


UNFINISHED = (mf.STATUS_RUNNING, mf.STATUS_PAUSED, mf.STATUS_FAILED)
GRID_RUN = re.compile(r"(?P<init>pretrained|random)-seed(?P<seed>\d+)")
"""The folder name of a fine-tuning grid's run (``finetune`` names them so)."""


@dataclass
class RunRecord:
    """One run folder, its manifest (if readable) and what is wrong with it.

    The registry is the one gate between the run cache and the book: once a run is judged
    (:func:`validate_run`, :func:`discover_runs`), ``manifest`` holds the manifest only for a
    valid run or an :attr:`unfinished` one; a rejected run's manifest moves to ``rejected``, so
    no table, figure or sentence can read a field of it by accident.
    """

    path: Path
    experiment: str
    name: str
    manifest: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stale_checkpoint: str | None = None
    """The sha256 of the checkpoint the run started from, when that file has since been
    replaced (its only problem then: the run is sound but measures an earlier model)."""
    status_note: str | None = None
    """The problem the manifest's status alone makes (:func:`manifest.status_problem`)."""
    rejected: dict[str, Any] | None = None
    """The manifest of a rejected run, for the registry's own listing only."""

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def unfinished(self) -> bool:
        """A sound run that did not finish (running, paused or failed, and nothing else wrong):
        a chapter may show it, labelled as such, never use it as a result."""
        return (self.status_note is not None and self.problems == [self.status_note]
                and (self.manifest or {}).get("status") in UNFINISHED)

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

    def described(self, key: str) -> str:
        """A manifest field as text for the registry's listing, rejected runs included (a
        damaged value shows as ``?``, never raises)."""
        value = (self.manifest or self.rejected or {}).get(key)
        return str(value) if isinstance(value, (str, int)) and len(str(value)) < 40 else "?"

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
        """The manifest's status; ``rejected`` for a rejected run (its status is not a fact
        anything may build on), ``no manifest`` when none was read."""
        if self.manifest is None:
            return "rejected" if self.rejected is not None else "no manifest"
        return self._get("status") or "no manifest"


def seal(rec: RunRecord) -> RunRecord:
    """Close the gate on a judged run: a rejected run keeps its manifest only as ``rejected``."""
    if rec.manifest is not None and not rec.valid and not rec.unfinished:
        rec.rejected, rec.manifest = rec.manifest, None
    return rec


def shown_name(name: str) -> str:
    """A folder name as text that prints anywhere: bytes that are not UTF-8 (Python keeps them
    as lone surrogates) are escaped as ``\\xff``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def validate_run(run_dir: Path | str, *, check_inputs: bool = True) -> RunRecord:
    """Check one run folder on its own (manifest, event files, hashes). Whatever the folder
    holds, the answer is a record: a file that cannot be read (permissions, a name that is not
    UTF-8, an input path that is no data folder) is that run's problem, never an exception."""
    path = Path(run_dir)
    experiment, name = shown_name(path.parent.name), shown_name(path.name)
    if (experiment, name) != (path.parent.name, path.name):
        rec = RunRecord(path=path, experiment=experiment, name=name)
        rec.problems.append(f"the folder name {experiment}/{name} is not UTF-8: rename it")
        return seal(rec)
    try:
        return _validate_run(path, check_inputs=check_inputs)
    except (OSError, UnicodeError) as exc:
        rec = RunRecord(path=path, experiment=experiment, name=name)
        where = getattr(exc, "filename", None)
        where = os.fsdecode(where) if where is not None else str(path)
        rec.problems.append(f"{shown_name(where)} cannot be read: "
                            f"{getattr(exc, 'strerror', None) or exc}")
        return seal(rec)


def _validate_run(path: Path, *, check_inputs: bool) -> RunRecord:
    rec = RunRecord(path=path, experiment=path.parent.name, name=path.name)
    try:
        rec.manifest = mf.read_manifest(path)
    except mf.ManifestError as exc:
        rec.problems.append(str(exc))
    shape_ok = False
    if rec.manifest is not None:
        rec.problems += mf.manifest_problems(rec.manifest)
        shape_ok = not rec.problems or rec.problems == [mf.status_problem(rec.manifest)]
        rec.status_note = mf.status_problem(rec.manifest) if shape_ok else None
        for key, folder in (("experiment", rec.experiment), ("run", rec.name)):
            if key in rec.manifest and rec.manifest[key] != folder:
                rec.problems.append(
                    f"manifest {key} '{rec.manifest[key]}' does not match its folder '{folder}'"
                )
        named = GRID_RUN.fullmatch(rec.name)  # a grid run's folder names its init and seed
        if named and (rec.manifest.get("init"), rec.manifest.get("seed")) != (
                named["init"], int(named["seed"])):
            rec.problems.append(
                f"manifest init {rec.manifest.get('init')!r} and seed "
                f"{rec.manifest.get('seed')!r} contradict its folder name '{rec.name}'")

    files = mf.event_files(path)
    if not files:
        rec.problems.append(f"no TensorBoard event files under {path} (empty log directory)")
    last_step = 0
    for f in files:
        step, problem = checked_events(f)
        last_step = max(last_step, step)
        rec.problems += [problem] if problem else []

    man = rec.manifest if shape_ok else {}  # a damaged manifest's fields are never read
    rec.problems += manifest_contradictions(path, man, files, last_step) if shape_ok else []
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
    for name, want in sorted((man.get("logs") or {}).items()):
        log = path / name
        if not log.is_file():
            rec.problems.append(f"log {log} listed in the manifest is missing")
        elif cached_sha256(log) != want:
            rec.problems.append(f"log {log} changed after the run ended (its sha256 is not the "
                                f"one the manifest recorded)")

    if check_inputs and shape_ok:
        checkpoint = man["inputs"].get("checkpoint")
        in_checkpoint = recorded_files(checkpoint) if checkpoint else frozenset()
        for item in man["inputs"].get("data") or []:
            check_input("data", item, rec, skip=in_checkpoint)
        if checkpoint:
            check_input("checkpoint", checkpoint, rec)
            check_conversion_source(rec)
    return seal(rec)


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
    memo = READING.get()  # within one reading (:mod:`~finetune_lab.runs.reading`), judged once
    key = ("discover_runs", str(base.resolve()), None if wanted is None else tuple(sorted(wanted)),
           check_inputs)
    if memo is None or key not in memo:
        judged = _judge_store(base, wanted, check_inputs)
        if memo is None:
            return judged
        memo[key] = judged
    return list(memo[key])


def _judge_store(base: Path, wanted: set[str] | None, check_inputs: bool) -> list[RunRecord]:
    records: list[RunRecord] = []
    if not base.is_dir():
        if wanted:
            raise UserError(f"runs root {base} does not exist; no runs were recorded there yet")
        return records
    for exp_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        if exp_dir.name[0] in "._" or (wanted is not None and exp_dir.name not in wanted):
            continue
        if exp_dir.is_symlink():
            records.append(_linked(exp_dir, shown_name(exp_dir.name), "(link)"))
            continue
        exp_records = [
            _linked(run_dir, shown_name(exp_dir.name), shown_name(run_dir.name))
            if run_dir.is_symlink()
            else validate_run(run_dir, check_inputs=check_inputs)
            for run_dir in sorted(p for p in exp_dir.iterdir() if p.is_dir())
            if run_dir.name[0] not in "._"
        ]
        try:
            config = read_experiment_config(exp_dir)
            check_hyperparameters(exp_records, config)
            check_device_types(exp_records, config)
            count_problems(exp_records)
        except UserError as exc:  # a damaged experiment.json rejects its own experiment only
            for rec in exp_records:
                rec.problems.append(f"its experiment cannot be checked: {exc}")
        records += [seal(rec) for rec in exp_records]
    list(map(seal, outside_problems(records, base)))  # rejected after the others were judged
    _reject_copies(records)
    if wanted:
        missing = wanted - {r.experiment for r in records}
        if missing:
            raise UserError(f"no runs for experiment(s) {sorted(missing)} under {base}")
    return records


def _linked(path: Path, experiment: str, name: str) -> RunRecord:
    """A link where a run or experiment folder goes: listed, never read. Through it the same
    runs would count twice (a link to the runs root is a loop), and a copy check would take
    the runs it points at for copies of themselves."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return seal(RunRecord(path=path, experiment=experiment, name=name, problems=[
        f"{path} is a link (to {target}), not a folder of its own: the registry reads no run "
        "through a link; remove the link (the runs it points at are listed where they are)"]))


def _reject_copies(records: list[RunRecord]) -> None:
    """:func:`~finetune_lab.runs.copies.copy_problems` among the valid and unfinished runs,
    then each sealed again."""
    suspects = [r for r in records if r.unfinished or r.valid]
    if suspects:
        copy_problems(records, suspects, {id(r) for r in records if r.valid})
    for r in suspects:
        seal(r)


def find_run(key: str, root: Path | str | None = None) -> RunRecord | None:
    """The judged record of run ``experiment/name`` under ``root`` (None when no such folder):
    how a chapter reads one named run (the packaged checkpoint's, a lineage step) through the
    same gate as every other."""
    base = Path(root) if root is not None else paths().runs
    experiment, _, name = key.partition("/")
    if not experiment or not name or not (base / experiment / name).is_dir():
        return None
    memo = READING.get()
    if memo is None:
        judged = discover_runs(base, [experiment])
    else:
        judged = memo.setdefault((str(base.resolve()), experiment), [])
        judged += [] if judged else discover_runs(base, [experiment])
    return next((r for r in judged if r.name == name), None)


def accepted_manifests(manifests: list[Path]) -> list[Path]:
    """The manifests whose runs the registry accepts, each experiment judged once: only these
    may vouch for the checkpoints they list (installed below as
    :func:`trust.gate_run_manifests`)."""
    by_experiment: dict[Path, list[Path]] = {}
    for m in manifests:
        by_experiment.setdefault(Path(m).parent.parent, []).append(Path(m))
    valid = set()
    for exp, listed in by_experiment.items():
        wanted = {m.parent.name for m in listed}
        valid |= {r.path / "manifest.json" for r in discover_runs(exp.parent, [exp.name])
                  if r.valid and r.name in wanted}
    return [Path(m) for m in manifests if Path(m) in valid]


trust.gate_run_manifests(accepted_manifests)


def valid_runs(records: Iterable[RunRecord]) -> list[RunRecord]:
    """Only the usable runs (use :func:`excluded_runs` to show the others with their reasons)."""
    return [r for r in records if r.valid]


def sound_runs(records: Iterable[RunRecord]) -> list[RunRecord]:
    """The valid runs and the unfinished ones (:attr:`RunRecord.unfinished`): every run whose
    manifest the registry vouches for, e.g. what else was running on the machine at a time."""
    return [r for r in records if r.valid or r.unfinished]


def excluded_runs(records: Iterable[RunRecord]) -> list[RunRecord]:
    return [r for r in records if not r.valid]
