"""A run's measurements that its manifest alone records, against what else tells them (trial 22's
M-d: a peak memory tripled or a time cut by 15 % in one manifest moved the book's tables).

The timed part of a run (``extra.time_s``) spans its event files: a Transformers or LoRA run
logs its first event as training starts and its last as the last evaluation ends. The peak GPU
memory (``torch.cuda.max_memory_allocated``) of one recipe on one GPU model is the same for
every seed: 553,377,792 bytes in each of the 24 committed Transformers GPU runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs.eventfiles import wall_span

SPAN_SLACK = 0.03
"""How far from the span of its event files a run's timed part may be: 0 to 1.3 % shorter in
the committed runs (the first event is logged as the timer starts, the last just before it
stops)."""
SPAN_SLACK_S = 2.0
"""... or this many seconds, for tiny runs of a few seconds."""


CPU_SPREAD = 1.2
"""The most that the peak resident memory of a recipe's CPU runs on one processor may spread
(largest over smallest): at most 1.075 among the committed runs (the allocator's and the
kernel's bookkeeping), 1.3 for one edited by 30 % (22b's M-e5)."""


def measurement_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """A run's timed part (``extra.time_s``) against the seconds between its event files'
    first and last events (the device its peak memory names: ``consistency.device_problems``)."""
    extra = man.get("extra") if isinstance(man.get("extra"), dict) else {}
    timed = extra.get("time_s")
    span = wall_span(events)
    if not isinstance(timed, (int, float)) or isinstance(timed, bool) or span is None:
        return []
    logged = span[1] - span[0]
    if abs(timed - logged) > max(SPAN_SLACK * logged, SPAN_SLACK_S):  # 22b's M-e8: longer too
        return [f"extra.time_s {timed:g} s is not the {logged:.1f} s between its event files' "
                "first and last events, which its timed part covers"]
    return []


def _device_name(rec: Any) -> Any:
    return ((rec.manifest or {}).get("device") or {}).get("name")


def _key(rec: Any, extra: Callable[[Any], dict[str, Any]]) -> str:
    """A run's recipe and device model (and threads, for a CPU run's memory)."""
    man = rec.manifest or {}
    return repr([rec.experiment, extra(rec).get("method"), man.get("init"),
                 sorted((man.get("hyperparameters") or {}).items(), key=str),
                 _device_name(rec), (man.get("device") or {}).get("threads")])


def peak_problems(records: Sequence[Any], extra: Callable[[Any], dict[str, Any]]) -> None:
    """The valid runs' peak memory against the other runs of their recipe on the same device
    model: CUDA's peak is the same for every seed, a CPU run's resident peak within
    :data:`CPU_SPREAD`. A group that disagrees is rejected whole, naming the values: which run
    was edited its own numbers cannot say (22b's M-e1: two of three edited alike outvoted the
    true one)."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        peak = extra(rec).get("peak_memory")
        if isinstance(peak, dict) and isinstance(peak.get("bytes"), int) \
                and peak.get("device") in ("cuda", "cpu"):
            groups[peak["device"] + _key(rec, extra)].append(rec)
    for name, group in groups.items():
        values = sorted({extra(r)["peak_memory"]["bytes"] for r in group})
        if len(values) < 2 or (name.startswith("cpu") and values[-1] <= CPU_SPREAD * values[0]):
            continue
        for rec in group:
            rec.problems.append(
                f"extra.peak_memory.bytes {extra(rec)['peak_memory']['bytes']}: the "
                f"{len(group)} runs of its recipe on {_device_name(rec)} in {rec.experiment} "
                f"disagree on their peak memory ({values[0]} to {values[-1]} bytes), which one "
                "recipe on one device model allocates alike")
