"""Which seeds of a grid ran on which GPU, and in how many device calls: read from the runs.

A grid's GPU runs (``fairseq-gpu``, ``transformers-gpu``) can come from several device calls,
on different GPUs; the chapters pool them in one GPU row. Each run's manifest names its GPU,
and its recorded start falls within the call that made it
(:func:`~finetune_lab.runs.gpu_calls.call_devices`), so the sentence is computed from the runs,
not from what a call planned.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from finetune_lab.book.devices import seed_range
from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.runs.consistency import CLOCK_SLACK_S, recorded_time
from finetune_lab.runs.gpu_calls import call_devices
from finetune_lab.runs.gpu_plan import GPU_SUFFIX
from finetune_lab.runs.registry import discover_runs, valid_runs
from finetune_lab.runs.runspeed import device_name


def seeds_by_gpu(base: str, root: Path = PROJECT_ROOT, runs_root: Path | None = None
                 ) -> list[tuple[str, tuple[int, ...], int]]:
    """``(GPU, seeds, device calls)`` for the valid runs of ``base-gpu``, one entry per GPU in
    order of its first seed: the GPU each run's manifest names, and the calls whose time
    span holds a run's recorded start (a run that no call holds counts no call)."""
    runs = Path(runs_root) if runs_root is not None else paths().runs
    experiment = base + GPU_SUFFIX
    if not (runs / experiment).is_dir():
        return []
    calls = call_devices(root)
    found: dict[str, tuple[set[int], set]] = {}
    for rec in valid_runs(discover_runs(runs, [experiment])):
        man = rec.manifest or {}
        start = recorded_time(man.get("start_time"))
        seeds, made_in = found.setdefault(device_name(man), (set(), set()))
        if rec.seed is not None:
            seeds.add(int(rec.seed))
        made_in.update(c.start for c in calls if start is not None and c.start <= start
                       <= c.start + timedelta(seconds=c.wall_s + CLOCK_SLACK_S))
    rows = [(gpu, tuple(sorted(seeds)), len(made_in)) for gpu, (seeds, made_in) in found.items()]
    return sorted(rows, key=lambda row: row[1][:1])


def _seeds(seeds: tuple[int, ...]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + seed_range(seeds)


def _calls(n: int) -> str:
    return "one device call" if n == 1 else f"{n} device calls"


def seeds_by_gpu_sentence(rows: list[tuple[str, tuple[int, ...], int]]) -> str:
    """``Seeds 0 to 8 ran on one NVIDIA H200, in 3 device calls, and seeds 9 to 11 on one NVIDIA
    H100 80GB HBM3, in one device call.`` ("" without GPU runs)."""
    if not rows:
        return ""
    parts = [f"{_seeds(seeds)} on {'one ' + gpu[3:] if gpu.startswith('1× ') else gpu}, in "
             f"{_calls(n)}"
             for gpu, seeds, n in rows]
    parts[0] = parts[0].replace(" on ", " ran on ", 1)
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]
    return text[0].upper() + text[1:] + "."
