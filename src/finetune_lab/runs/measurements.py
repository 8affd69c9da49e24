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
from finetune_lab.runs.eventfiles import log_text, loss_times, once_per_log_and_events, wall_span
from finetune_lab.runs.fairseq_logs import printed_times
from finetune_lab.runs.log_timeline import timeline_problems

SPAN_SLACK = 0.03
"""How far from the span of its event files a run's timed part may be: 0 to 1.3 % shorter in
the committed runs (the first event is logged as the timer starts, the last just before it
stops)."""
SPAN_SLACK_S = 2.0
"""... or this many seconds, for tiny runs of a few seconds."""


LOG_SPAN_SLACK_S = (20.0, 30.0, 150.0)
"""How much longer than its train.log's first to last line a one-launch fairseq run may be, as
a fine-tuning run, a pretraining run on a CPU and one on a GPU: Python and fairseq starting, the
manifest written (3 to 14 s in the committed fine-tuning runs), and a pretraining run's weights
packaged (3 to 8 s on a CPU, up to 39 s on a GPU). Trial 23's M-g: 650 s more, start and end
moved within the event files' bounds, passed; trial 25's M-k2: 140 s more on a CPU run, within
the 150 s then allowed every pretraining run, passed."""
LOG_TIME = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", re.MULTILINE)


def _kind(man: dict[str, Any]) -> int:
    """0 for a fine-tuning run, 1 for a pretraining run on a CPU, 2 on a GPU: the index into
    :data:`LOG_SPAN_SLACK_S` and :data:`LAUNCH_LINES_S`."""
    if not pretraining(man):
        return 0
    device = man.get("device") if isinstance(man.get("device"), dict) else {}
    return 2 if device.get("type") == "cuda" else 1


def pretraining(man: dict[str, Any]) -> bool:
    """Whether a run pretrains (its recipe counts tokens per update; a fine-tuning run's does
    not)."""
    return "tokens_per_update" in (man.get("hyperparameters") or {})


LAUNCH_LINES_S = (30.0, 30.0, 180.0)
"""How long after a launch starts its first train.log line may come (30 s: Python and fairseq
starting, 2 to 14 s in the committed runs); and how long before the launch that ends a run ends
its last, as for :data:`LOG_SPAN_SLACK_S` (2 s in the committed CPU runs; a pretraining run on a
GPU packages its weights, 83 s)."""
PAUSE_LINES_S = 20.0
"""... and before a launch the run goes on after ends (paused, failed or killed: nothing is
packaged; 0 to 11 s in the committed runs; trial 25's M-k1: a middle launch's end moved 170 s
past its last line passed)."""
EMPTY_LAUNCH_S = 2.0
"""The longest a launch that logged no line may last: killed as it started (trial 25's R-k4: a
launch of 29 s forged in a gap between two others, with no line of that time, passed)."""


def _naive_utc(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value).astimezone(timezone.utc).replace(tzinfo=None)
    except (TypeError, ValueError):
        return None


def _stamp(value: str) -> datetime | None:
    """A log line's stamp (local time, no zone), or None."""
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        return None


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def launch_problems(man: dict[str, Any]) -> list[str]:
    """A run's launches (``segments``) as one timeline (trial 24's M-i: a launch placed inside
    another, or one whose end was deleted, made a run longer). Only a long pretraining run is
    launched in parts; the first launch starts with the run and the last ends with it; each
    starts after the one before ended and goes on from the update where it stopped. Every
    launch but a running last one records its end: a launch that was killed gets its end, its
    train.log's last line, from the next (check 24b's M-j3: its time was dropped)."""
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
        if end is None and not (i == len(segs) - 1 and man.get("status") == "running"):
            problems.append(f"segments[{i}] records no end_time (a launch that was killed ends "
                            "at its train.log's last line, which the next launch records)")
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


def seconds_between(start: str, end: str) -> float:
    """The seconds from one recorded UTC time to another."""
    a, b = _naive_utc(start), _naive_utc(end)
    return round((b - a).total_seconds(), 3) if a is not None and b is not None else 0.0


def log_stamps(path: Path, raw: bytes | None = None) -> list[datetime]:
    """The times that stamp a fairseq ``train.log``'s lines (the machine's local time; ``raw``:
    its bytes, where the caller has read them); a line stamped with something that is no time
    raises ``ValueError`` naming it (M-i10)."""
    stamps = []
    for stamp in LOG_TIME.findall(regular_bytes(path) if raw is None else raw):
        try:
            stamps.append(datetime.fromisoformat(stamp.decode()))
        except ValueError:
            raise ValueError(f"its train.log has a line stamped {stamp.decode()!r}, which is no "
                             "time: fairseq did not write it") from None
    return stamps


def log_zone(stamps: Sequence[datetime], first_start: datetime) -> timedelta:
    """The offset of a log's local stamps from UTC: its first line's, from its first launch's
    start, to the nearest quarter hour (a launch logs its first line within 30 s)."""
    return timedelta(minutes=15 * round((stamps[0] - first_start).total_seconds() / 900))


def killed_end(run_dir: Path, segments: Sequence[dict[str, Any]], i: int,
               next_start: str) -> str:
    """The end of launch ``i``, which was killed before it recorded one: its train.log's last
    line before the next launch (``next_start``) began, in UTC, or its start if it logged
    nothing. The next launch records it, so that the run's wall time counts the killed one's."""
    start, until = _naive_utc(segments[i].get("start_time")), _naive_utc(next_start)
    first = _naive_utc(segments[0].get("start_time"))
    try:
        stamps = log_stamps(run_dir / "train.log")
    except (OSError, ValueError):
        stamps = []
    if start is None or until is None or first is None or not stamps:
        return str(segments[i].get("start_time"))
    zone = log_zone(stamps, first)
    inside = [t - zone for t in stamps if start <= t - zone + timedelta(seconds=2) and
              t - zone < until]
    end = max(inside[-1], start) if inside else start
    return end.replace(tzinfo=timezone.utc).isoformat(timespec="seconds")


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
        text = log_text(path / "train.log")  # for the stamps and the processes
        stamps = log_stamps(path / "train.log", text.encode())
    except OSError:
        stamps = []  # the log's own checks name it
    except ValueError as exc:  # one line stamped with no time must not turn the check off
        return [*problems, str(exc)]
    wall, late = man.get("wall_time_s"), _kind(man)
    if not stamps:
        return problems
    if len(segments) <= 1:
        logged = (stamps[-1] - stamps[0]).total_seconds()
        if _seconds(wall) and not -2.0 <= wall - logged <= LOG_SPAN_SLACK_S[late]:
            problems.append(f"wall_time_s {wall:g} s is not the {logged:.0f} s between its "
                            "train.log's first and last lines (and the start and end of a run "
                            "around them)")
        return problems + timeline_problems(text, man, [])
    if times[0][0] is None:
        return problems
    zone = log_zone(stamps, times[0][0])
    local = [(a + zone if a else None, b + zone if b else None) for a, b in times]
    return problems + _launch_line_problems(segments, times, stamps, late) + \
        timeline_problems(text, man, local)


def _launch_line_problems(segments: Sequence[dict[str, Any]],
                          times: Sequence[tuple[datetime | None, datetime | None]],
                          stamps: Sequence[datetime], late: int) -> list[str]:
    """Each launch against the train.log lines of its time: the first within 30 s of its start,
    the last within :data:`LAUNCH_LINES_S` of its end, or 2 s for a killed launch, whose end is
    its last line; and no line outside every launch (time a run would leave uncounted)."""
    problems, zone, slack = [], log_zone(stamps, times[0][0]), timedelta(seconds=2)
    inside = [False] * len(stamps)
    for i, (start, end) in enumerate(times):
        if start is None:
            continue
        nxt = next((t[0] for t in times[i + 1:] if t[0] is not None), None)
        lo = start + zone
        hi = end + zone if end is not None else (nxt + zone if nxt is not None else None)
        held = [k for k, t in enumerate(stamps) if lo - slack <= t and (hi is None or
                                                                     t <= hi + slack)]
        for k in held:
            inside[k] = True
        if end is None:
            continue  # launch_problems names it
        lines = [stamps[k] for k in held]
        ended = segments[i].get("ended")
        last_gap = 2.0 if ended == "killed" else LAUNCH_LINES_S[late] \
            if i == len(times) - 1 and ended == "complete" else PAUSE_LINES_S
        if lines and (lines[0] - lo).total_seconds() <= LAUNCH_LINES_S[0] \
                and (hi - lines[-1]).total_seconds() <= last_gap \
                or not lines and (hi - lo).total_seconds() <= EMPTY_LAUNCH_S:
            continue  # (a launch that logged nothing trained nothing: it ended as it began)
        problems.append(f"segments[{i}] ran from {segments[i].get('start_time')} to "
                        f"{segments[i].get('end_time')}, but its train.log's lines of that "
                        "time do not" + (" begin and end with it" if lines else " exist"))
    outside = [t for t, held in zip(stamps, inside) if not held]
    if outside:
        problems.append(f"its train.log has {len(outside)} lines, stamped {outside[0]} to "
                        f"{outside[-1]} (local time), outside every launch: time the run does "
                        "not count")
    return problems


CLOCK_SKEW_S = (-2.0, 1.0)
"""How far a train.log line's stamp (whole seconds, local time) may be from the time its event
file wrote the loss of that update (UTC, to the microsecond): -1.0 to +0.02 s in all 18,000
of the committed runs' (trial 25's M-k3: a middle launch's last line moved 20 min later, the
log's hash rewritten, made a run 20 min longer)."""
WALL_METER_S = (-2.0, 15.0)
"""How long before fairseq's wall meter starts (its first training line's stamp less the
meter's seconds) its log's first line may come: 0 to 3 s in the committed runs (M-i3: a first
line forged 10 min earlier, with the start moved back, was bounded only by the 600 s allowed
before the first event)."""
_WALL = re.compile(r"\| train_inner \| .*\bwall[=\s]+([0-9]+)")


def log_clock_problems(path: Path, man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """A fairseq run's ``train.log`` stamps against its event files' clock: each loss an event
    file logs at an update, against the stamp of the log's line of that update (the log's
    zone from the first pair); and the log's first line against the start of fairseq's wall
    meter, which the first training line gives (the meter's value is held against the event
    files by ``evaluations.log_problems``). A launch's start and end are held to its lines
    (:func:`log_time_problems`), so a stamp moved moves nothing unseen."""
    if man.get("framework") != "fairseq":
        return []
    try:
        text = log_text(path / "train.log")
    except OSError:
        return []  # the log's own checks name it
    return _stamps_against_events(text, path, events) or _meter_problems(text, man)


@once_per_log_and_events
def _stamps_against_events(text: str, path: Path, events: Sequence[Path]) -> list[str]:
    """Each loss an event file logs at an update, against the stamp of the log's line of that
    update (see :func:`log_clock_problems`)."""
    times, zone = printed_times(text), None
    for event_file in events:
        for step, wall in loss_times(event_file) if event_file.parent != path else ():
            when = datetime.fromtimestamp(wall, timezone.utc).replace(tzinfo=None)
            stamps = [t for t in map(_stamp, times.get((event_file.parent.name, step), []))
                      if t is not None]
            if not stamps:
                continue  # a value the log does not print: evaluations.log_problems names it
            if zone is None:
                zone = timedelta(minutes=15 * round((stamps[0] - when).total_seconds() / 900))
            if not any(CLOCK_SKEW_S[0] <= (t - zone - when).total_seconds() <= CLOCK_SKEW_S[1]
                       for t in stamps):
                return [f"its train.log stamps its {event_file.parent.name} line of update "
                        f"{step} {stamps[0]} (local time), but {event_file.relative_to(path)} "
                        f"wrote that update's loss at {when:%Y-%m-%d %H:%M:%S} UTC: fairseq "
                        "prints the line as it writes the event"]
    return []


def _meter_problems(text: str, man: dict[str, Any]) -> list[str]:
    """The log's first line against the start of fairseq's wall meter (see
    :func:`log_clock_problems`)."""
    first_line, meter = LOG_TIME.search(text.encode()), _WALL.search(text)
    if first_line and meter:
        started = _stamp(text[text.rfind("\n", 0, meter.start()) + 1:][:19])
        first = _stamp(first_line.group(1).decode())
        if started is not None and first is not None and _in_first_launch(man, first, started):
            gap = (started - timedelta(seconds=int(meter.group(1))) - first).total_seconds()
            if not WALL_METER_S[0] <= gap <= WALL_METER_S[1]:
                return [f"its train.log's first line is stamped {first}, but fairseq's wall "
                        f"meter started {gap:+.0f} s from it (its first training line less the "
                        "meter's seconds), where 0 to 15 s after it is what fairseq does"]
    return []


def _in_first_launch(man: dict[str, Any], first: datetime, line: datetime) -> bool:
    """Whether a log line (local time) is of a run's first launch: a later launch goes on with
    the meters its state saved, so only the first starts fairseq's wall meter at zero."""
    segments = [s for s in man.get("segments") or [] if isinstance(s, dict)]
    if len(segments) <= 1:
        return True
    start, end = _naive_utc(segments[0].get("start_time")), _naive_utc(segments[0].get("end_time"))
    return start is not None and end is not None and \
        line <= end + log_zone([first], start) + timedelta(seconds=2)


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
