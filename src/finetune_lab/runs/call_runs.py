"""A GPU run against the device call it ran in (``data/summaries/gpu-lab/``, read by
:func:`~finetune_lab.runs.gpu_calls.call_devices`): the call's GPU, its jobs and how each
ended, and the software its record names.

Fault trial 27: a copy of a call's seed 4 filed as seed 12 (R-m5) and a run whose torch was
edited to another version than its call's (M-m1) were accepted, because a run was held only
to what the call said of its own job, and not at all where the call had no such job.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from finetune_lab.runs.consistency import CLOCK_SLACK_S, Judged, recorded_time
from finetune_lab.runs.gpu_calls import CallDevice


def _in_call(start: datetime, call: CallDevice) -> bool:
    return call.start <= start <= call.start + timedelta(seconds=call.wall_s + CLOCK_SLACK_S)


def _cuda_start(rec: Judged) -> datetime | None:
    """A CUDA run's recorded start (None for any other run, or one without a start)."""
    man = rec.manifest or {}
    device = man.get("device") or {}
    return recorded_time(man.get("start_time")) \
        if isinstance(device, dict) and device.get("type") == "cuda" else None


def disowned_calls(records: Sequence[Judged], calls: Sequence[CallDevice]
                   ) -> dict[datetime, tuple[str, int]]:
    """Calls whose GPU none of the runs made in them names, while two or more of those runs
    agree on another (call start -> that name, how many runs): one edited line of a record
    must not outweigh every manifest of its runs. The book sets such a record aside."""
    names: dict[datetime, list[str]] = {}
    for rec in records:
        start = _cuda_start(rec)
        for call in calls if start is not None else []:
            if _in_call(start, call):
                names.setdefault(call.start, []).append(
                    str(((rec.manifest or {}).get("device") or {}).get("name")))
    return {call.start: (found[0], len(found)) for call in calls
            if len(found := names.get(call.start, [])) >= 2 and len(set(found)) == 1
            and found[0] != call.name}


def _field(man: dict[str, Any], dotted: str) -> Any:
    """A manifest's value at ``a.b.c`` (None where any part is missing)."""
    value: Any = man
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def same_version(run: str, record: str) -> bool:
    """One version, as a run and a call's record write it: the same release, and the same
    build where both name one (a run's ``2.11.0`` is its call's ``2.11.0+cu130``: the runs
    record the release only)."""
    (mine, _, my_build), (theirs, _, their_build) = run.partition("+"), record.partition("+")
    return mine == theirs and (not my_build or not their_build or my_build == their_build)


def environment_problems(man: dict[str, Any], call: CallDevice, said: str) -> list[str]:
    """Every field both the call's record and the run's manifest hold, compared (trial 27's
    M-m1: torch "2.4.0+cu121" in a run of a call whose record says 2.11.0+cu130 made the
    chapter print "torch 2.11.0, 2.4.0")."""
    problems = []
    for dotted, expected in call.environment.items():
        value = _field(man, dotted)
        if value is not None and not same_version(str(value), expected):
            problems.append(f"{dotted} {value!r} but {said} recorded {expected!r}")
    return problems


def call_device_problems(records: Sequence[Judged], calls: Sequence[CallDevice]) -> None:
    """A GPU run that started within a device call (its record's start and wall time) is one
    of that call's jobs' runs, names that call's GPU, GPU count and software, and its job
    there ended well: the call's record and the run's manifest both say so (unless the record
    is the odd one out: :func:`disowned_calls`). One outside every call is refused where its
    experiment's runs come from calls (:func:`outside_calls_problem`)."""
    disowned = disowned_calls(records, calls)
    for rec in records:
        man, start = rec.manifest or {}, _cuda_start(rec)
        if start is None:
            continue
        device, key = man.get("device") or {}, f"{rec.experiment}/{rec.name}"
        inside = [call for call in calls if _in_call(start, call)]
        if not inside and (why := outside_calls_problem(rec.experiment, start, calls)):
            rec.problems.append(why)
        for call in inside:
            said = f"the device call it ran in ({call.start:%Y%m%dT%H%M%SZ})"
            job = call.made.get(key)
            if call.made and job is None:  # trial 27's R-m5: a seed 12 its call never ran
                rec.problems.append(f"started within the device call {call.start:%Y%m%dT%H%M%SZ}"
                                    f", but that call never ran {key}: its jobs made "
                                    f"{_made_there(call, rec.experiment)}")
            if device.get("name") != call.name and call.start not in disowned:
                rec.problems.append(f"device.name {device.get('name')!r} but {said} ran on the "
                                    f"{call.name}")
            if call.count is not None and device.get("count", call.count) != call.count:
                rec.problems.append(f"device.count {device.get('count')} but {said} had "
                                    f"{call.count}")
            rec.problems += environment_problems(man, call, said)
            if job is not None and call.exits.get(job, 0) != 0:
                rec.problems.append(f"its job {job} in {said} exited with {call.exits[job]}")
            peak = ((man.get("extra") or {}).get("peak_memory") or {}).get("bytes")
            if isinstance(peak, (int, float)) and call.peak_mib is not None \
                    and peak > call.peak_mib * 2**20:  # nvidia-smi counts every process
                rec.problems.append(f"extra.peak_memory.bytes {peak:,.0f} but the GPU of {said} "
                                    f"never held more than {call.peak_mib:,.0f} MiB")
            wall = man.get("wall_time_s")
            took = call.seconds.get(job) if job is not None else None
            if isinstance(wall, (int, float)) and took is not None \
                    and wall > took + CLOCK_SLACK_S:  # the job is the run's process
                rec.problems.append(f"wall_time_s {wall:g} s but its job {job} in {said} took "
                                    f"{took:g} s")


def _made_there(call: CallDevice, experiment: str) -> str:
    """The runs a call made in ``experiment``, for a message (or that it made none there)."""
    runs = sorted(k.split("/", 1)[1] for k in call.made if k.split("/", 1)[0] == experiment)
    return ", ".join(runs) if runs else f"no run of experiment '{experiment}'"


def outside_calls_problem(experiment: str, start: datetime,
                          calls: Sequence[CallDevice]) -> str | None:
    """A CUDA run that started within no recorded call, in an experiment whose runs the
    recorded calls bring back, was not made by any of them (a copy given a time between
    calls). Scoped to runs that started after the first recorded call: the GPU runs of
    ``pretrain-gpu`` from before it (gpu, gpu2, gpu3, 2026-11-22) were made before the calls'
    records were kept, and are judged by their own files."""
    if not calls or start < min(call.start for call in calls) \
            or not any(k.split("/", 1)[0] == experiment for c in calls for k in c.made):
        return None
    return (f"a CUDA run that started at {start:%Y-%m-%d %H:%M:%S}, within none of the device "
            f"calls recorded in data/summaries/gpu-lab/, which made the other runs of "
            f"experiment '{experiment}': file a run made elsewhere under an experiment of its "
            "own (--experiment)")
