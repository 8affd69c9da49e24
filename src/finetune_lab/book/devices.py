"""The lab's recipe on the CPU and on a GPU, side by side.

A device call (:mod:`finetune_lab.gpu_lab`) re-runs the lab into experiments of their own
(``fairseq-gpu``, ``transformers-gpu``, ``lora-gpu``), so the CPU runs stay what the chapters
are built on and the GPU runs are a second column, never a silent replacement. This module reads
both through the registry's valid set, compares them with Welch's interval (do the GPU runs
reproduce the CPU runs within seed noise?), and reads what the call itself recorded
(:data:`~finetune_lab.runs.gpu_archive.CALL_RECORDS`): its wall time, its setup, the GPU's use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from finetune_lab.book.lora_cls_runs import cached_runs, per_run_table
from finetune_lab.book.report import signed
from finetune_lab.book.summary_files import read_json_files, set_aside_markdown
from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.models import params
from finetune_lab.runs import seedstats
from finetune_lab.render_cache import per_render
from finetune_lab.runs.call_runs import disowned_calls
from finetune_lab.runs.gpu_archive import CALL_RECORDS, PREP_JOBS
from finetune_lab.runs.gpu_calls import call_devices, call_problem, call_start, gpu_samples
from finetune_lab.runs.gpu_plan import GPU_SUFFIX
from finetune_lab.runs.registry import discover_runs, valid_runs
from finetune_lab.runs.runspeed import device_name
from finetune_lab.runs.tblogs import load_scalars
from finetune_lab.train.pretrain_throughput import gpu_peak_flops, model_flops_per_token

PARTS = ("fairseq", "transformers", "lora")
NBSP = "\u00a0"
"""Keeps a mean with its spread on one line of a narrow table."""
COLUMNS = ["group", "seed", "device", "device name", "torch", "test", "best epoch", "wall (s)",
           "peak memory (bytes)", "tokens/s", "updates/s"]


@per_render  # several answers of one chapter read the same runs
def runs_by_device(base: str, root: Path | None = None) -> pd.DataFrame:
    """One row per valid run of ``base`` (made on the CPU) and ``base-gpu``: its group (the
    initialisation, or the LoRA method), seed, device, test accuracy at the best-validation
    epoch, wall time, peak memory where measured and fairseq's logged tokens/s."""
    root = Path(root) if root is not None else paths().runs
    rows = []
    for experiment in (base, base + GPU_SUFFIX):
        if not (root / experiment).is_dir():
            continue
        if base == "lora":
            loaded = cached_runs(root, experiment)
            if loaded is None or not loaded.used:
                continue
            own = {r.name: r for r in loaded.used if r.experiment == experiment}
            table = per_run_table(loaded)
            table = table[table["run"].isin(own)].assign(group=lambda d: d["method"])
        else:
            own = {r.name: r for r in valid_runs(discover_runs(root, [experiment]))}
            scalars = load_scalars(list(own.values()))
            if scalars.empty:
                continue
            table = seedstats.best_epochs(scalars).assign(group=lambda d: d["init"])
        for _, run in table.iterrows():
            man = own[run["run"]].manifest or {}
            peak = ((man.get("extra") or {}).get("peak_memory") or {})
            rows.append({
                "group": run["group"], "seed": int(run["seed"]),
                "device": "GPU" if (man.get("device") or {}).get("type") == "cuda" else "CPU",
                "device name": device_name(man),
                "torch": str(((man.get("environment") or {}).get("packages") or {})
                             .get("torch", "?")).split("+")[0],
                "test": float(run["test"]),
                "best epoch": int(run["best_epoch"]), "wall (s)": float(man["wall_time_s"]),
                "peak memory (bytes)": peak.get("bytes", np.nan),
                "tokens/s": (man.get("throughput") or {}).get("tokens_per_s", np.nan),
                "updates/s": (man.get("throughput") or {}).get("updates_per_s", np.nan)})
    return pd.DataFrame(rows, columns=COLUMNS)


def gpu_records(base: str, root: Path | None = None) -> list:
    """Every recorded run of ``base-gpu`` (valid or not), for a chapter's provenance footer."""
    root = Path(root) if root is not None else paths().runs
    experiment = base + GPU_SUFFIX
    return discover_runs(root, [experiment]) if (root / experiment).is_dir() else []


def device_table(runs: pd.DataFrame, gpu_wall_seeds: Iterable[int] | None = None
                 ) -> pd.DataFrame:
    """Per group and device: runs, test accuracy mean ± sample sd, mean best epoch, mean wall
    time per run (the whole process; on the GPU, of ``gpu_wall_seeds`` only when given: the runs
    of one command, which shared the device alike), and mean peak memory (MiB; – where the runs
    did not measure it)."""
    wall_seeds = set(gpu_wall_seeds) if gpu_wall_seeds is not None else None
    if runs.empty:
        return pd.DataFrame(columns=["group", "device", "runs", "test acc (%)", "best epoch",
                                     "wall time per run (min)", "peak memory (MiB)"])
    out = []
    order = {name: i for i, name in enumerate(dict.fromkeys(runs["group"]))}
    runs = runs.sort_values(["group", "device"], key=lambda c: c.map(order)
                            if c.name == "group" else c, kind="stable")
    for (group, device), g in runs.groupby(["group", "device"], sort=False):
        sd = g["test"].std(ddof=1) if len(g) > 1 else np.nan
        peak = g["peak memory (bytes)"].mean()
        timed = g[g["seed"].isin(wall_seeds)] if device == "GPU" and wall_seeds else g
        timed = timed if len(timed) else g
        out.append({"group": group, "device": " / ".join(sorted(set(g["device name"]))),
                    "runs": len(g),
                    "test acc (%)": seedstats.fmt_mean_std(g["test"].mean(), sd, len(g),
                                                           digits=1).split(" (")[0]
                    .replace(" ± ", NBSP + "±" + NBSP),
                    "best epoch": f"{g['best epoch'].mean():.1f}",
                    "wall time per run (min)": f"{timed['wall (s)'].mean() / 60:.1f}",
                    "peak memory (MiB)": "–" if np.isnan(peak) else f"{peak / 2**20:,.0f}"})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class DeviceGap:
    """GPU − CPU test accuracy of one group, with Welch's 95 % interval."""

    group: str
    n_gpu: int
    n_cpu: int
    diff: float
    ci_low: float
    ci_high: float

    @property
    def within_noise(self) -> bool:
        return self.ci_low <= 0 <= self.ci_high


def device_gaps(runs: pd.DataFrame) -> list[DeviceGap]:
    """For each group with at least two runs on each device: GPU − CPU, Welch's interval."""
    out = []
    for group, g in runs.groupby("group", sort=False):
        if min((g["device"] == d).sum() for d in ("GPU", "CPU")) < 2:
            continue
        gap = seedstats.init_gap(g.rename(columns={"device": "init"}), "GPU", "CPU")
        out.append(DeviceGap(group, gap.n_a, gap.n_b, gap.diff, gap.ci_low, gap.ci_high))
    return out


def gaps_table(gaps: list[DeviceGap]) -> pd.DataFrame:
    """The gaps for display: points, interval, and whether the seeds tell the devices apart."""
    return pd.DataFrame([{
        "group": g.group, "runs (GPU, CPU)": f"{g.n_gpu}, {g.n_cpu}",
        "GPU − CPU (points)": signed(g.diff),
        "95 % Welch CI": f"{signed(g.ci_low)} to {signed(g.ci_high)}",
        "reading": "within seed noise" if g.within_noise else "the devices differ"}
        for g in gaps], columns=["group", "runs (GPU, CPU)", "GPU − CPU (points)",
                                 "95 % Welch CI", "reading"])


def gaps_sentence(gaps: list[DeviceGap]) -> str:
    """One sentence on whether the GPU runs reproduce the CPU runs, naming the groups."""
    if not gaps:
        return "No group has two runs on each device yet, so the devices are not compared."

    def names(groups: list[str]) -> str:
        return ", ".join(groups[:-1]) + (" and " if len(groups) > 1 else "") + groups[-1]

    apart = [g.group for g in gaps if not g.within_noise]
    same = [g.group for g in gaps if g.within_noise]
    if not apart:
        widest = max(gaps, key=lambda g: g.ci_high - g.ci_low)
        which = (f"all {len(same)} groups" if len(same) > 2 else names(same))
        return (f"GPU − CPU has a 95 % interval that contains 0 for {which}: these seeds "
                "cannot tell the devices apart. "
                + ("The widest interval" if len(gaps) > 1 else "The interval")
                + f" ({widest.group}: {signed(widest.ci_low)} to {signed(widest.ci_high)} "
                "points) says how large a difference they could miss.")
    return (f"GPU − CPU differs by more than the seeds explain for {names(apart)}"
            + (f", and lies within seed noise for {names(same)}." if same else "."))


# --- the device call ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRecord:
    """What one device call recorded about itself (``gpu-lab.json`` and ``nvidia-smi``)."""

    name: str
    device: str
    torch: str
    wall_s: float
    setup_s: float
    runs_s: float
    jobs: int
    failed: int
    gpu_busy_mean: float | None
    """Mean of ``nvidia-smi``'s utilisation (% of time a kernel ran) over the call."""
    gpu_memory_max_gib: float | None
    full_runs: int = 0
    """Its full fine-tuning runs (fairseq and Transformers), for the MFU."""
    seeds: tuple[int, ...] = ()


def _grid_call(meta: dict) -> bool:
    """A call that ran the lab's grids from the committed checkpoint (not a candidate's seeds
    alone, not a pretraining, not a tiny rehearsal)."""
    plan = meta.get("plan") or {}
    steps = plan.get("steps") or []
    return "lab" in steps and "pretrain" not in steps and not plan.get("checkpoint") \
        and not plan.get("tiny")


def lab_call(meta: dict) -> bool:
    """The call that ran the whole lab (every part) in one go: the one the chapters describe.
    Calls that ran some of its grids again with other seeds are :func:`seed_calls`."""
    return _grid_call(meta) and set(PARTS) <= set((meta.get("plan") or {}).get("lab_parts") or [])


def _read_call_records(root: Path) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The call records that parse (strict JSON) with what the book reads, in time order; and
    one line per record set aside."""
    good, bad = read_json_files(root / CALL_RECORDS, lambda meta: None, "*Z.json")
    named, disowned = [], _disowned(root)
    for path, meta in good:  # whole, kept under its own call's name, naming its runs' GPU
        why, start = call_problem(path, meta), call_start(path.stem)
        if start is None:  # a user's copy ("old-2026...Z.json"): no call's name
            why = why or "is not named as a call's record (YYYYMMDDTHHMMSSZ.json)"
        if why is None and start in disowned:
            name, n = disowned[start]
            why = (f"names the {meta['device'].get('name')} but the {n} runs it made name the "
                   f"{name}")
        if why is None:
            named.append((path, meta))
        else:
            bad.append(f"`{path.name}` {why}")
    return named, bad


def _runs_of(root: Path) -> list:
    """Every run the registry judges under ``root``'s run cache (none where it has none)."""
    runs = root / "data" / "runs" if root != PROJECT_ROOT else paths().runs
    return discover_runs(runs) if runs.is_dir() else []


@per_render
def _disowned(root: Path) -> dict:
    """:func:`~finetune_lab.runs.call_runs.disowned_calls` of the run cache under ``root``."""
    records = _runs_of(root)
    return disowned_calls(records, call_devices(root)) if records else {}


def _made_valid(job: str, meta: dict, valid: set[str]) -> bool:
    """Whether a lab job's run is a valid run of the cache, in one of the experiments the call
    brought back (trial 9's GU1: a job that exited 0 and brought back no run had the chapter
    name its seed among the GPU rows')."""
    part, _, run = job.partition("-")
    experiments = [str(p).rsplit("/", 1)[-1] for p in meta.get("products") or []
                   if str(p).startswith("data/runs/")]
    return part not in PARTS or any(f"{e}/{run}" in valid for e in experiments
                                    if e.startswith(part))


def _call_records(root: Path) -> list[tuple[Path, dict]]:
    return _read_call_records(root)[0]


def call_records_set_aside(root: Path = PROJECT_ROOT) -> str:
    """A paragraph naming the damaged call records, which no sentence or table reads (empty
    when there are none)."""
    return set_aside_markdown(_read_call_records(root)[1], "device-call record",
                              f"restore them from git, under {CALL_RECORDS}")


def _is_full(job: str) -> bool:
    return job.startswith(("fairseq-", "transformers-"))


def latest_call(root: Path = PROJECT_ROOT) -> CallRecord | None:
    """The newest record of a call that ran the lab (:func:`lab_call`), or None when no such
    call was ever unpacked."""
    records = [(path, meta) for path, meta in _call_records(root) if lab_call(meta)]
    if not records:
        return None
    path, meta = records[-1]
    timings = meta.get("timings_s") or {}
    lab = [j for j in meta["jobs"] if j["job"] not in PREP_JOBS]
    busy, mem = gpu_use(path.with_name(path.stem + "-nvidia-smi.csv"), call_start(path.stem),
                        float(meta["wall_s"]))
    dev = meta.get("device") or {}
    return CallRecord(name=path.stem, device=f"{dev.get('count', 1)}× {dev.get('name')}",
                      torch=str(dev.get("torch", "?")),
                      wall_s=float(meta["wall_s"]),
                      setup_s=float(timings.get("install", 0) + timings.get("data", 0)),
                      runs_s=float(timings.get("runs", np.nan)), jobs=len(lab),
                      failed=sum(j["exit_code"] != 0 for j in lab), gpu_busy_mean=busy,
                      gpu_memory_max_gib=mem,
                      full_runs=sum(_is_full(j["job"]) for j in lab),
                      seeds=tuple(int(x) for x in (meta.get("plan") or {}).get("seeds") or ()))


def gpu_use(smi: Path, start: datetime, wall_s: float) -> tuple[float | None, float | None]:
    """Mean utilisation (%) and peak memory (GiB) of a call's GPU, from its ``nvidia-smi``
    samples (:func:`~finetune_lab.runs.gpu_calls.gpu_samples`: (None, None) for samples that
    cannot be the call's)."""
    busy, peak = gpu_samples(smi, start, wall_s)
    return busy, peak / 1024 if peak is not None else None


@dataclass(frozen=True)
class SeedCall:
    """A later call that ran some of the lab's grids again with other seeds."""

    name: str
    parts: tuple[str, ...]
    seeds: tuple[int, ...]
    done_jobs: tuple[str, ...]
    failed: tuple[str, ...]
    """Jobs that exited non-zero (their runs are absent, or were made again by a later call)."""


def seed_calls(root: Path = PROJECT_ROOT) -> list[SeedCall]:
    """The grid calls after the lab's call (:func:`latest_call`), oldest first."""
    records = _call_records(root)
    labs = [path for path, meta in records if lab_call(meta)]
    if not labs:
        return []
    cache = _runs_of(root)  # none: a record's jobs cannot be held against any run
    out, valid = [], {r.key for r in valid_runs(cache)}
    for path, meta in records:
        if path.name <= labs[-1].name or not _grid_call(meta) or lab_call(meta):
            continue
        done = [j["job"] for j in meta["jobs"] if j["job"] not in PREP_JOBS
                and j["exit_code"] == 0 and (not cache or _made_valid(j["job"], meta, valid))]
        seeds = sorted({int(m[1]) for job in done if (m := re.search(r"-seed(\d+)$", job))})
        out.append(SeedCall(
            name=path.stem, parts=tuple(meta["plan"].get("lab_parts") or ()), seeds=tuple(seeds),
            done_jobs=tuple(done),
            failed=tuple(j["job"] for j in meta["jobs"] if j["exit_code"] != 0)))
    return [call for call in out if call.done_jobs]


def seed_range(seeds: tuple[int, ...]) -> str:
    ordered = sorted(seeds)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]} to {ordered[-1]}"
    return ", ".join(map(str, ordered[:-1])) + (" and " if len(ordered) > 1 else "") + \
        str(ordered[-1])


PART_NAMES = {"fairseq": "fairseq", "transformers": "Transformers", "lora": "LoRA"}


def seed_calls_sentence(calls: list[SeedCall], lab_seeds: tuple[int, ...]) -> str:
    """Which seeds later commands added, and so how many runs a GPU row has against a CPU row
    ("" when no command added any)."""
    if not calls:
        return ""
    later = tuple(sorted({s for c in calls for s in c.seeds} - set(lab_seeds)))
    if not later:
        return ""
    grids = " and ".join(PART_NAMES[p] for p in PARTS if any(p in c.parts for c in calls))
    many = len(calls) > 1
    count = {1: "A", 2: "Two", 3: "Three"}.get(len(calls), str(len(calls)))
    return (f"{count} later command{'s' if many else ''} "
            f"ran the {grids} grids with seeds {seed_range(later)} as well, so a GPU row of "
            f"{'these grids' if ' and ' in grids else 'this grid'} has seeds "
            f"{seed_range(tuple(sorted(set(lab_seeds) | set(later))))} and a CPU row seeds "
            f"{seed_range(lab_seeds)}.")


def finetune_flops(tokenization: dict, epochs: int) -> float:
    """Model FLOPs of one full fine-tuning run of the stand-in: 6 per weight per training token
    (forward and backward) and 2 per weight per evaluated token (validation and test, each epoch),
    over the encoder's matrices and attention
    (:func:`~finetune_lab.train.pretrain_throughput.model_flops_per_token` with no masked-LM
    head) at the training reviews' mean length. ``tokenization``: the data summary's
    ``cls.tokenization`` (tokens and reviews per split)."""
    train = tokenization["train"]
    context = round(train["tokens"] / train["reviews"])
    per_token = model_flops_per_token(params.SMALL, context, 0.0)
    evaluated = tokenization["valid"]["tokens"] + tokenization["test"]["tokens"]
    return epochs * per_token * (train["tokens"] + evaluated / 3)


def call_mfu(call: CallRecord, runs: int, flops_per_run: float) -> float | None:
    """Model-FLOPs utilisation of the call's full fine-tuning runs together, against the GPU's
    dense bf16 peak: their FLOPs over the time the runs took side by side."""
    peak = gpu_peak_flops(call.device)
    if not peak or not call.runs_s or np.isnan(call.runs_s):
        return None
    return runs * flops_per_run / call.runs_s / peak
