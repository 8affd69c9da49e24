"""How fast each recorded run went, from its manifest: one table for every chapter.

On a CPU a run's speed depends on the threads it had as much as on the device model, and runs
were made two at a time on a 2-core machine, so manifests record ``device.threads`` (torch's
intra-op threads) beside the device; times compare only where both agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

SPEED_COLUMNS = ["experiment", "framework", "init", "seed", "run", "device", "threads",
                 "updates", "wall time (min)", "updates/s", "setting"]


def device_name(manifest: dict[str, Any], *, cores: bool = False) -> str:
    """``"1× NVIDIA H100 …"`` for GPUs, the CPU model otherwise (with ``cores``, plus the
    machine's core count), ``"?"`` if unrecorded: the one way every chapter names a device."""
    dev = manifest.get("device") or {}
    name = dev.get("name") or dev.get("cpu") or "?"
    if dev.get("type") == "cuda":
        return f"{dev.get('count', 1)}× {name}"
    return f"{name} ({dev['cpu_count']} cores)" if cores and dev.get("cpu_count") else str(name)


def device_threads(manifest: dict[str, Any]) -> float:
    """CPU threads the run had (NaN on a GPU, where they do not set the pace, or if unrecorded)."""
    dev = manifest.get("device") or {}
    if dev.get("type") == "cuda" or dev.get("threads") is None:
        return np.nan
    return float(dev["threads"])


def setting(manifest: dict[str, Any]) -> str:
    """The device, plus the thread count on a CPU: what a run's time depends on."""
    name, threads = device_name(manifest), device_threads(manifest)
    if (manifest.get("device") or {}).get("type") == "cuda":
        return name
    if np.isnan(threads):
        return f"{name}, threads not recorded"
    return f"{name}, {int(threads)} thread{'s' if threads != 1 else ''}"


def speed_table(records: Iterable) -> pd.DataFrame:
    """Per run (registry records): device, threads, updates, wall time and the median
    updates/s that fairseq logged (NaN where the framework logs no rate)."""
    rows = []
    for r in records:
        m = r.manifest or {}
        rows.append({
            "experiment": r.experiment, "framework": m.get("framework"), "init": r.init,
            "seed": r.seed, "run": r.name, "device": device_name(m),
            "threads": device_threads(m),
            "updates": (m.get("hyperparameters") or {}).get("total_updates"),
            "wall time (min)": m["wall_time_s"] / 60,
            "updates/s": (m.get("throughput") or {}).get("updates_per_s", np.nan),
            "setting": setting(m),
        })
    t = pd.DataFrame(rows, columns=SPEED_COLUMNS)
    return t.sort_values(["experiment", "init", "seed"]).reset_index(drop=True)


def fmt_threads(value: float) -> str:
    """A table cell: the thread count, or "–" (a GPU run, or a manifest from before threads
    were recorded; the ``setting`` column says which)."""
    return "–" if pd.isna(value) else f"{int(value)}"


def _settings(t: pd.DataFrame) -> list[str]:
    return sorted(set(t["setting"]))


def comparable(t: pd.DataFrame) -> bool:
    """True when every run had the same device model and (on a CPU) the same thread count."""
    return len(_settings(t)) == 1


def settings_sentence(t: pd.DataFrame) -> str:
    """Where the runs ran, and whether their times therefore compare."""
    settings = _settings(t)
    if len(settings) == 1:
        return f"all on one setting, {settings[0]}, so their times compare"
    return (f"on {len(settings)} different settings ({'; '.join(settings)}), so their times do "
            "not compare directly")


def _interval(manifest: dict[str, Any]) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    start, end = manifest.get("start_time"), manifest.get("end_time")
    return (pd.Timestamp(start), pd.Timestamp(end)) if start and end else None


def overlapping(record: Any, others: Iterable[Any], share: float = 0.5) -> list[Any]:
    """The other recorded runs that ran during at least ``share`` of ``record``'s wall time, by
    their manifests' start and end times (what else ran on the machine, tests or a render, the
    manifests do not say)."""
    mine = _interval(record.manifest or {})
    if mine is None:
        return []
    length = (mine[1] - mine[0]).total_seconds()
    found = []
    for other in others:
        theirs = _interval(other.manifest or {})
        if other is record or theirs is None:
            continue
        if (min(mine[1], theirs[1]) - max(mine[0], theirs[0])).total_seconds() > share * length:
            found.append(other)
    return found


LAYOUT_COLUMNS = ["device", "layout", "runs", "median wall time (min)",
                  "runs per hour (machine)"]


def layout_table(records: Iterable[Any], everything: Iterable[Any]) -> pd.DataFrame:
    """Complete CPU runs of one recipe (``records``) grouped by how they shared the machine:
    ``J × T``, J of them side by side with T threads each. A run that overlapped a run of
    anything else among ``everything`` recorded (a pretraining, another framework) is left out:
    its time measures that mix. The machine's throughput is J runs per median wall time: what
    ``--jobs J`` buys."""
    records, everything = list(records), list(everything)
    mine = {id(r) for r in records}
    rows = []
    for r in records:
        m = r.manifest or {}
        threads = device_threads(m)
        if (m.get("device") or {}).get("type") != "cpu" or np.isnan(threads) \
                or not m.get("wall_time_s"):
            continue
        beside = overlapping(r, everything)
        if any(id(o) not in mine for o in beside):
            continue
        rows.append({"device": device_name(m, cores=True), "jobs": 1 + len(beside),
                     "threads": int(threads), "wall": m["wall_time_s"] / 60})
    if not rows:
        return pd.DataFrame(columns=LAYOUT_COLUMNS)
    t = pd.DataFrame(rows).groupby(["device", "jobs", "threads"], as_index=False).agg(
        runs=("wall", "size"), wall=("wall", "median"))
    t["layout"] = [f"{j} × {k} thread{'s' if k > 1 else ''}"
                   for j, k in zip(t["jobs"], t["threads"])]
    t["median wall time (min)"] = t["wall"]
    t["runs per hour (machine)"] = 60 * t["jobs"] / t["wall"]
    return t.sort_values(["device", "jobs", "threads"])[LAYOUT_COLUMNS].reset_index(drop=True)


def jobs_speedup(table: pd.DataFrame, cores: int = 2) -> pd.DataFrame:
    """Per device, the machine's throughput with ``cores`` runs of one thread side by side over
    one run with ``cores`` threads (> 1: ``--jobs`` pays); devices that lack either layout are
    left out."""
    out = []
    side, alone = f"{cores} × 1 thread", f"1 × {cores} threads"
    for device, g in table.groupby("device"):
        rate = dict(zip(g["layout"], g["runs per hour (machine)"]))
        count = dict(zip(g["layout"], g["runs"]))
        if rate.get(side) and rate.get(alone):
            out.append({"device": device, "speed-up": rate[side] / rate[alone],
                        "runs": int(count[side] + count[alone]),
                        "side by side": int(count[side]), "alone": int(count[alone])})
    return pd.DataFrame(out, columns=["device", "speed-up", "runs", "side by side", "alone"])
