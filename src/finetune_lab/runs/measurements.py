"""A run's measurements that its manifest alone records, against what else tells them (trial 22's
M-d: a peak memory tripled or a time cut by 15 % in one manifest moved the book's tables).

The timed part of a run (``extra.time_s``) spans its event files: a Transformers or LoRA run
logs its first event as training starts and its last as the last evaluation ends. The peak GPU
memory (``torch.cuda.max_memory_allocated``) of one recipe on one GPU model and torch is the
same for every seed: 553,377,792 bytes in each of the 24 committed Transformers GPU runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs.eventfiles import wall_span

SPAN_SLACK = 0.03
"""How much shorter than the span of its event files a run's timed part may be: at most 1.3 %
in the committed runs (the first event is logged as the timer starts, the last just before it
stops)."""
SPAN_SLACK_S = 2.0
"""... or this many seconds, for tiny runs of a few seconds."""


def timed_span_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """``extra.time_s`` against the seconds between its event files' first and last events."""
    extra = man.get("extra")
    timed = extra.get("time_s") if isinstance(extra, dict) else None
    span = wall_span(events)
    if not isinstance(timed, (int, float)) or isinstance(timed, bool) or span is None:
        return []
    logged = span[1] - span[0]
    if timed < logged - max(SPAN_SLACK * logged, SPAN_SLACK_S):
        return [f"extra.time_s {timed:g} s is shorter than the {logged:.1f} s between its event "
                "files' first and last events, which its timed part covers"]
    return []


def cuda_peak_groups(records: Sequence[Any], extra: Callable[[Any], dict[str, Any]],
                     ) -> list[list[Any]]:
    """The valid runs whose peak memory is CUDA's, grouped by experiment, method, init, recipe,
    GPU model and torch: runs of one group allocate the same bytes at their peak."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        man = rec.manifest or {}
        peak = extra(rec).get("peak_memory")
        if not isinstance(peak, dict) or peak.get("device") != "cuda":
            continue
        torch = ((man.get("environment") or {}).get("packages") or {}).get("torch")
        key = repr([rec.experiment, extra(rec).get("method"), man.get("init"),
                    sorted((man.get("hyperparameters") or {}).items(), key=str),
                    peak.get("gpu"), torch])
        groups[key].append(rec)
    return [g for g in groups.values() if len(g) > 1]
