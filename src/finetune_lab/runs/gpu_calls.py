"""The device calls' records (``data/summaries/gpu-lab/``), read for what they say of the runs
made in them: each call's start, length, GPU, jobs and the GPU memory its ``nvidia-smi`` saw.
The registry holds a GPU run against the call it ran in (:mod:`~finetune_lab.runs.crosscheck`),
and the book reads the same samples (:mod:`finetune_lab.book.devices`).
"""

from __future__ import annotations

import io

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

from finetune_lab._files import parse_json, regular_text
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.runs.gpu_archive import CALL_RECORDS, call_record_problem


SAMPLES_SLACK_S = 60.0
"""nvidia-smi starts a few seconds after the call's clock and stops with it."""


def gpu_samples(smi: Path, start: datetime, wall_s: float) -> tuple[float | None, float | None]:
    """Mean utilisation (%) while a process held the GPU and peak memory (MiB), from a call's
    ``nvidia-smi`` samples; (None, None) when there are none, or when they cannot be this
    call's: a utilisation outside 0 to 100 %, negative memory, a sample outside the call's
    time (another call's samples under its name), a file that is no such table."""
    import pandas as pd

    try:
        df = pd.read_csv(io.StringIO(regular_text(smi)), skipinitialspace=True)  # no pipe
        stamps = pd.to_datetime(df.iloc[:, 0], format="%Y/%m/%d %H:%M:%S.%f", utc=True)
        util = pd.to_numeric(df.iloc[:, 1].astype(str).str.rstrip(" %"), errors="coerce")
        used = pd.to_numeric(df.iloc[:, 2].astype(str).str.rstrip(" MiB"), errors="coerce")
    except (OSError, ValueError, IndexError, pd.errors.ParserError):
        return None, None
    slack = timedelta(seconds=SAMPLES_SLACK_S)
    inside = stamps.between(pd.Timestamp(start - slack),
                            pd.Timestamp(start + timedelta(seconds=wall_s) + slack))
    running = used > 0  # from the first process on the GPU to the last
    if not running.any() or not inside.all() or not util.dropna().between(0, 100).all() \
            or (used < 0).any():
        return None, None
    return float(util[running].mean()), float(used.max())


class CallDevice(NamedTuple):
    """What a device call's record says of where and how its runs ran."""

    start: datetime
    wall_s: float
    name: str
    count: int | None
    exits: dict[str, int | None]
    """Each job's exit code, by job name (``fairseq-pretrained-seed0``)."""
    seconds: dict[str, float]
    """Each job's duration there, by job name (a run it made took no longer)."""
    peak_mib: float | None = None
    """The most GPU memory in use at once there, all runs together (nvidia-smi; None without
    samples): no run of the call held more."""


def call_start(stem: str) -> datetime | None:
    """A call's UTC start, from its record's name (``20261126T041935Z``); None for a name that
    is no call's (a user's copy, ``old-20261126T041935Z``)."""
    try:
        return datetime.strptime(stem, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def call_devices(root: Path = PROJECT_ROOT) -> list[CallDevice]:
    """Each sound call record's start (its name, the call's UTC start), wall seconds, GPU and
    jobs: a run made within a call was made on that call's GPU, by one of its jobs."""
    calls = []
    for path in sorted((root / CALL_RECORDS).glob("*Z.json")):
        start = call_start(path.stem)
        try:
            meta = parse_json(regular_text(path))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # the chapter that reads the records sets a damaged one aside by name
        if start is None:
            continue
        if call_record_problem(meta, path.stem) is None \
                and isinstance(meta["device"].get("name"), str):
            count = meta["device"].get("count")
            smi = path.with_name(f"{path.stem}-nvidia-smi.csv")
            calls.append(CallDevice(start, float(meta["wall_s"]), meta["device"]["name"],
                                    count if isinstance(count, int) else None,
                                    {j["job"]: j["exit_code"] for j in meta["jobs"]},
                                    {j["job"]: float(j["seconds"]) for j in meta["jobs"]
                                     if "seconds" in j},
                                    gpu_samples(smi, start, float(meta["wall_s"]))[1]))
    return calls
