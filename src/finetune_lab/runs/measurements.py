"""A run's measurements that its manifest alone records, against what else tells them (trial 22's
M-d: a peak memory tripled or a time cut by 15 % in one manifest moved the book's tables).

The timed part of a run (``extra.time_s``) spans its event files: a Transformers or LoRA run
logs its first event as training starts and its last as the last evaluation ends. A fairseq
run's wall time and each launch's start and end lie where its ``train.log``, which fairseq stamps
line by line, says it ran (trial 23's M-g, check 23b's M-h). The peak GPU
memory (``torch.cuda.max_memory_allocated``) of one recipe on one GPU model is the same for
every seed: 553,377,792 bytes in each of the 24 committed Transformers GPU runs.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from finetune_lab._files import regular_bytes
from finetune_lab.runs.eventfiles import wall_span

SPAN_SLACK = 0.03
"""How far from the span of its event files a run's timed part may be: 0 to 1.3 % shorter in
the committed runs (the first event is logged as the timer starts, the last just before it
stops)."""
SPAN_SLACK_S = 2.0
"""... or this many seconds, for tiny runs of a few seconds."""


LOG_SPAN_SLACK_S = (20.0, 150.0)
"""How much longer than its train.log's first to last line a one-launch fairseq run may be, as
a fine-tuning and a pretraining run: Python and fairseq starting, the manifest written (3 to
14 s in the committed fine-tuning runs), and a pretraining run's weights packaged (up to 90 s).
Trial 23's M-g: 650 s more, start and end moved within the event files' bounds, passed."""
LOG_TIME = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", re.MULTILINE)


def pretraining(man: dict[str, Any]) -> bool:
    """Whether a run pretrains (its recipe counts tokens per update; a fine-tuning run's does
    not)."""
    return "tokens_per_update" in (man.get("hyperparameters") or {})


LAUNCH_LINES_S = (30.0, 180.0)
"""How long after a launch starts its first train.log line may come (30 s: Python and fairseq
starting, 2 to 14 s in the committed runs), and how long before it ends its last, as a
fine-tuning and a pretraining launch (180 s: a pretraining run packages its weights, 83 s)."""


def _naive_utc(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value).astimezone(timezone.utc).replace(tzinfo=None)
    except (TypeError, ValueError):
        return None


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def launch_problems(man: dict[str, Any]) -> list[str]:
    """A run's launches (``segments``) as one timeline (trial 24's M-i: a launch placed inside
    another, or one whose end was deleted, made a run longer). Only a long pretraining run is
    launched in parts; the first launch starts with the run and the last ends with it; each
    starts after the one before ended (a launch killed outright recorded neither its end nor
    its wall time) and goes on from the update where it stopped."""
    segments = man.get("segments")
    if segments is None:
        return []
    if "budget_tokens" not in (man.get("hyperparameters") or {}):
        return ["segments: only a long pretraining run (pretrain --tokens) is launched in parts"]
    problems: list[str] = []
    segs = [s if isinstance(s, dict) else {} for s in segments]
    floor, reached = _naive_utc(man.get("start_time")), None
    for i, seg in enumerate(segs):
        start, end = _naive_utc(seg.get("start_time")), _naive_utc(seg.get("end_time"))
        after = "the run started" if i == 0 else "the launch before it ended"
        if start is None or floor is None or not 0 <= (start - floor).total_seconds() <= \
                (1 if i == 0 else float("inf")):
            problems.append(f"segments[{i}] starts at {seg.get('start_time')}, not "
                            f"{'as' if i == 0 else 'after'} {after}")
        last_running = i == len(segs) - 1 and man.get("status") == "running"
        if end is None and not last_running and (seg.get("ended") != "interrupted"
                                                 or seg.get("wall_time_s") is not None):
            problems.append(f"segments[{i}] records no end_time, which only a launch killed "
                            "outright (ended \"interrupted\", no wall time) lacks")
        if start is not None and end is not None and end < start:
            problems.append(f"segments[{i}] ends before it starts")
        if i and seg.get("updates_from") != reached:
            problems.append(f"segments[{i}] starts at update {seg.get('updates_from')}, not "
                            f"where the launch before it stopped ({reached})")
        floor, reached = end or start, seg.get("updates_to")
    run_end = _naive_utc(man.get("end_time"))
    if segs and run_end and floor and abs((run_end - floor).total_seconds()) > 1:
        problems.append(f"its last launch ends at {segs[-1].get('end_time')}, not with the run "
                        f"({man.get('end_time')})")
    return problems


def log_time_problems(path: Path, man: dict[str, Any]) -> list[str]:
    """A fairseq run's times against its ``train.log``, whose lines fairseq stamps with the
    machine's local time: a one-launch run's ``wall_time_s`` against the seconds between its
    first and last lines; each launch's wall time against its own start and end, and the lines
    it logged within them (the log's time zone from the first launch; 23b's M-h: a run given a
    ``segments`` list went unchecked, and a launch's time was tied to nothing)."""
    problems, times = launch_problems(man), []
    if man.get("framework") != "fairseq":
        return problems
    segments = [s for s in man.get("segments") or [] if isinstance(s, dict)]
    for i, seg in enumerate(segments):
        start, end, wall = _naive_utc(seg.get("start_time")), _naive_utc(seg.get("end_time")), \
            seg.get("wall_time_s")
        times.append((start, end))
        if start and end and _seconds(wall) and abs(wall - (end - start).total_seconds()) > 2:
            problems.append(f"segments[{i}].wall_time_s {wall:g} s is not the "
                            f"{(end - start).total_seconds():.0f} s from its start to its end")
    try:
        found = LOG_TIME.findall(regular_bytes(path / "train.log"))
    except OSError:
        found = []  # the log's own checks name it
    stamps = []
    for stamp in found:  # one line stamped with no time must not turn the check off (M-i10)
        try:
            stamps.append(datetime.fromisoformat(stamp.decode()))
        except ValueError:
            return [*problems, f"its train.log has a line stamped {stamp.decode()!r}, which is "
                    "no time: fairseq did not write it"]
    wall, late = man.get("wall_time_s"), pretraining(man)
    if not stamps:
        return problems
    if len(segments) <= 1:
        logged = (stamps[-1] - stamps[0]).total_seconds()
        if _seconds(wall) and not -2.0 <= wall - logged <= LOG_SPAN_SLACK_S[late]:
            problems.append(f"wall_time_s {wall:g} s is not the {logged:.0f} s between its "
                            "train.log's first and last lines (and the start and end of a run "
                            "around them)")
        return problems
    if times[0][0] is None:
        return problems
    zone = timedelta(minutes=15 * round((stamps[0] - times[0][0]).total_seconds() / 900))
    for i, (start, end) in enumerate(times):
        if start is None or end is None:
            continue  # a launch killed outright: no end
        lo, hi = start + zone, end + zone
        lines = [t for t in stamps if lo - timedelta(seconds=2) <= t <= hi + timedelta(seconds=2)]
        if lines and (lines[0] - lo).total_seconds() <= LAUNCH_LINES_S[0] \
                and (hi - lines[-1]).total_seconds() <= LAUNCH_LINES_S[late] \
                or not lines and (hi - lo).total_seconds() <= LAUNCH_LINES_S[0]:
            continue  # (a launch that logged nothing trained nothing: it ended as it began)
        problems.append(f"segments[{i}] ran from {segments[i].get('start_time')} to "
                        f"{segments[i].get('end_time')}, but its train.log's lines of that "
                        "time do not" + (" begin and end with it" if lines else " exist"))
    return problems


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


def _key(rec: Any, device: str) -> str:
    """The row a run's peak memory is shown in: its experiment, init and method, and its
    processor's model, or any GPU (the GPU rows mix H100 and H200 runs, which allocate alike):
    each checked elsewhere (trial 23's M-f2, M-f3: a run given other threads or an unchecked
    ``extra.method`` was a group of its own, compared with none; 23b's M-h1: three H100 runs
    edited alike were a group of their own in a row of H100 and H200 runs)."""
    man = rec.manifest or {}
    return repr([rec.experiment, man.get("init"), (man.get("hyperparameters") or {}).get("method"),
                 _device_name(rec) if device == "cpu" else "any GPU"])


def peak_problems(records: Sequence[Any], extra: Callable[[Any], dict[str, Any]]) -> None:
    """The valid runs' peak memory against the other runs of their recipe on the same device
    model: CUDA's peak is the same for every seed, a CPU run's resident peak within
    :data:`CPU_SPREAD`. A group that disagrees is rejected whole, naming the values: which run
    was edited its own numbers cannot say (22b's M-e1: two of three edited alike outvoted the
    true one)."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        peak = extra(rec).get("peak_memory")
        peak = peak if isinstance(peak, dict) else {}
        if isinstance(peak.get("bytes"), (int, float)) and not isinstance(peak["bytes"], bool) \
                and peak.get("device") in ("cuda", "cpu"):  # a float too (trial 23's M-f1)
            groups[peak["device"] + _key(rec, peak["device"])].append(rec)
    for name, group in groups.items():
        values = sorted({extra(r)["peak_memory"]["bytes"] for r in group})
        if len(values) < 2 or (name.startswith("cpu") and values[-1] <= CPU_SPREAD * values[0]):
            continue
        for rec in group:
            where = _device_name(rec) if name.startswith("cpu") else "GPUs"
            rec.problems.append(
                f"extra.peak_memory.bytes {extra(rec)['peak_memory']['bytes']}: the "
                f"{len(group)} runs of its recipe on {where} in {rec.experiment} disagree on "
                f"their peak memory ({values[0]} to {values[-1]} bytes), which one recipe "
                "allocates alike")
