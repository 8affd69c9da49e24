"""Reading the LoRA-vs-full run cache for the chapter: which runs count, per run and per method.

The runs are made by :mod:`finetune_lab.train.lora_cls`. A run's method is its ``method``
hyperparameter; the ``full`` row, when the experiment has no ``full`` runs of its own, is the
Transformers experiment's pretrained runs (the same function and recipe), admitted only when they
carry the measurements and agree with this experiment's pinned recipe. Within a method the runs
must agree on everything but the seed. Every run that fails a check stays in the result with its
reason, so the chapter lists it as excluded.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd

from finetune_lab.config import paths
from finetune_lab.errors import UserError
from finetune_lab.runs.gpu_plan import GPU_SUFFIX
from finetune_lab.runs.registry import (
    RunRecord,
    check_hyperparameters,
    differing_hyperparameters,
    discover_runs,
    read_experiment_config,
    valid_runs,
)
from finetune_lab.runs.seedstats import best_epochs, seed_summary
from finetune_lab.runs.tblogs import LoadedRuns, load_scalars
from finetune_lab.train.lora_cls import EXPERIMENT, FULL_BASELINE, METHODS

MEASUREMENTS = ("parameters", "peak_memory", "time_s")
"""What every run's manifest ``extra`` must hold for the table (recorded by ``measure_run``)."""


def method_of(rec: RunRecord) -> str | None:
    """A run's method: its ``method`` hyperparameter, or ``full`` for a pretrained run of
    :data:`~finetune_lab.train.lora_cls.FULL_BASELINE` (a plain Transformers fine-tune)."""
    man = rec.manifest or {}
    hp = man.get("hyperparameters") or {}
    if "method" in hp:
        return hp["method"]
    if rec.experiment.removesuffix(GPU_SUFFIX) == FULL_BASELINE and man.get("init") == "pretrained":
        return "full"
    return None


def full_baseline(experiment: str) -> str:
    """The Transformers experiment whose pretrained runs are ``experiment``'s ``full`` row: the
    one made on the same kind of device (``lora-gpu`` takes ``transformers-gpu``)."""
    return FULL_BASELINE + (GPU_SUFFIX if experiment.endswith(GPU_SUFFIX) else "")


def baseline_full_runs(base: Path, experiment_dir: Path) -> list[RunRecord]:
    """The valid pretrained runs of :func:`full_baseline` (the Transformers experiment of the
    same device), as this experiment's ``full`` row.

    Each must carry the measurements (parameters, peak memory, time) and agree with this
    experiment's pinned recipe and with the lab's learning rate; one that does not is returned
    with the reason, so the chapter lists it as excluded.
    """
    baseline = full_baseline(experiment_dir.name)
    if not (base / baseline).is_dir():
        return []
    try:
        config, damaged = read_experiment_config(experiment_dir), None
    except UserError as exc:  # its own runs are rejected by the registry for the same reason
        config, damaged = None, str(exc)
    full_lr = METHODS["full"].lr()
    out = []
    for rec in discover_runs(base, [baseline]):
        if not rec.valid or rec.init != "pretrained":
            continue  # the Transformers chapter lists those; they are no full fine-tuning row
        hp = (rec.manifest or {}).get("hyperparameters") or {}
        extra = (rec.manifest or {}).get("extra") or {}
        missing = [k for k in MEASUREMENTS if k not in extra]
        if damaged:
            rec.problems.append(f"as the full fine-tuning row: {damaged}")
        elif missing:
            rec.problems.append(f"as the full fine-tuning row: manifest extra lacks {missing} "
                                "(made before runs were measured; re-run it)")
        elif hp.get("lr") != full_lr:
            rec.problems.append(f"as the full fine-tuning row: lr {hp.get('lr')} is not the "
                                f"lab's {full_lr:g}")
        elif config is not None and (differ := differing_hyperparameters(config, hp)):
            rec.problems.append("as the full fine-tuning row: hyperparameters "
                                f"{differ} differ from {experiment_dir.name}'s experiment.json")
        out.append(rec)
    check_hyperparameters([r for r in out if r.valid], None)
    return out


def check_methods(records: list[RunRecord]) -> None:
    """Per method, the runs must agree on every hyperparameter but the seed; each run must
    name a known method and carry its measurements. Problems are added to the records."""
    groups = defaultdict(list)
    for rec in records:
        if not rec.valid:
            continue
        man = rec.manifest or {}
        name = method_of(rec)
        extra = man.get("extra") or {}
        if name not in METHODS:
            rec.problems.append(f"hyperparameter 'method' = {name!r} is not one of "
                                f"{', '.join(METHODS)}")
            continue
        missing = [k for k in MEASUREMENTS if k not in extra]
        if missing:
            rec.problems.append(f"manifest extra lacks {missing}")
            continue
        groups[name].append(rec)
    for group in groups.values():
        check_hyperparameters(group, None)


def cached_runs(root: Path | str | None = None, experiment: str = EXPERIMENT
                ) -> LoadedRuns | None:
    """Every recorded run of the experiment (valid or not) with the valid ones' scalars;
    ``None`` when none was ever recorded under the runs root (the Transformers pretrained runs
    count, as the full fine-tuning row)."""
    base = Path(root) if root is not None else paths().runs
    exp = base / experiment
    recorded = exp.is_dir() and any(p.is_dir() and p.name[0] not in "._" for p in exp.iterdir())
    records = discover_runs(base, [experiment]) if recorded else []
    check_methods(records)
    if not any(r.valid and method_of(r) == "full" for r in records):
        records += baseline_full_runs(base, exp)
    if not records:
        return None
    return LoadedRuns(scalars=load_scalars(valid_runs(records)), runs=records)


def per_run_table(loaded: LoadedRuns) -> pd.DataFrame:
    """One row per valid run: method, seed, best valid epoch, valid and test accuracy there,
    parameters, time and peak memory (from the manifest)."""
    best = best_epochs(loaded.scalars)
    info = []
    for rec in loaded.used:
        extra = (rec.manifest or {}).get("extra") or {}
        info.append({"run": rec.name, "method": method_of(rec),
                     "trainable": extra["parameters"]["trainable"],
                     "total": extra["parameters"]["total"],
                     "time_s": extra["time_s"], "peak_bytes": extra["peak_memory"]["bytes"],
                     "peak_device": extra["peak_memory"]["device"],
                     "lr": (rec.manifest or {})["hyperparameters"]["lr"]})
    out = best.merge(pd.DataFrame(info), on="run", how="left")
    order = {name: i for i, name in enumerate(METHODS)}
    return out.sort_values(["method", "seed"], key=lambda s: s.map(order) if s.name == "method"
                           else s).reset_index(drop=True)


def summary(loaded: LoadedRuns, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per method (numbers): n, mean/std of best-valid and test-at-best-epoch accuracy,
    trainable and total parameters, and, over the runs on the device most of them ran on
    (``peak_device``), mean time per run and mean peak memory. ``runs``: the
    :func:`per_run_table` of ``loaded`` when the caller has it already."""
    runs = per_run_table(loaded) if runs is None else runs
    # seedstats groups by (experiment, framework, init); every run here is "pretrained", and
    # the method is what varies, so the method takes the init column's place
    stats = seed_summary(runs.assign(init=runs["method"])).rename(columns={"init": "method"})
    agg = runs.groupby("method").agg(
        trainable_min=("trainable", "min"), trainable_max=("trainable", "max"),
        total=("total", "max"), lr=("lr", "first")).reset_index()
    # time and memory only of the device most runs share (trial 26's R-m3: a GPU run filed
    # among the CPU runs made the full row's memory the mean of CPU and CUDA peaks)
    device = runs["peak_device"].mode().iloc[0] if len(runs) else ""
    cost = runs[runs["peak_device"] == device].groupby("method").agg(
        time_s=("time_s", "mean"), peak_bytes=("peak_bytes", "mean")).reset_index()
    agg = agg.merge(cost, on="method", how="left").assign(peak_device=device)
    out = stats.drop(columns=["experiment", "framework"]).merge(agg, on="method")
    order = {name: i for i, name in enumerate(METHODS)}
    return out.sort_values("method", key=lambda s: s.map(order)).reset_index(drop=True)
