"""The device calls' records (``data/summaries/gpu-lab/``), read for what they say of the runs
made in them: each call's start, length, GPU, jobs and the GPU memory its ``nvidia-smi`` saw.
The registry holds a GPU run against the call it ran in (:mod:`~finetune_lab.runs.call_runs`),
and the book reads the same samples (:mod:`finetune_lab.book.devices`).
"""

from __future__ import annotations

import io

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

from finetune_lab._files import parse_json, regular_text
from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.runs.gpu_archive import (CALL_RECORDS, PREP_JOBS, SEQUENTIAL,
                                             call_record_problem)
from finetune_lab.runs.gpu_plan import GPU_SUFFIX, SUFFIX_TINY


SAMPLES_SLACK_S = 60.0
"""nvidia-smi starts a few seconds after the call's clock and stops with it."""
LAST_SAMPLE_S = (-5.0, 2.0)
"""The last sample, from the call's end (its name's second plus ``wall_s``): the sampler stops
with the runs (-0.5 to +0.3 s in the committed calls; the name drops the start's fraction)."""
FIRST_SAMPLE_S = (-1.0, 6.0)
"""The first sample, from the end of the install phase: the sampler starts once the call's data
is unpacked (+0.2 to +3.9 s in the committed calls)."""
DATA_SLACK_S = 15.0
"""The data phase beyond its jobs' seconds: unpacking the data (3 to 7 s measured)."""


def _samples(smi: Path):
    """A call's ``nvidia-smi`` samples (stamps, utilisation, memory used), or None for a file
    that is missing or no such table."""
    import pandas as pd

    try:
        df = pd.read_csv(io.StringIO(regular_text(smi)), skipinitialspace=True)  # no pipe
        stamps = pd.to_datetime(df.iloc[:, 0], format="%Y/%m/%d %H:%M:%S.%f", utc=True)
        util = pd.to_numeric(df.iloc[:, 1].astype(str).str.rstrip(" %"), errors="coerce")
        used = pd.to_numeric(df.iloc[:, 2].astype(str).str.rstrip(" MiB"), errors="coerce")
    except (OSError, ValueError, IndexError, pd.errors.ParserError):
        return None
    return (stamps, util, used) if len(df) else None


def call_problem(path: Path, meta: object) -> str | None:
    """What sets a call's record aside: :func:`call_record_problem`, or (check 25b's G-l1,
    G-l2, G-l4) times its own clock contradicts. The phases one after another make the call,
    and a GPU call's ``nvidia-smi`` samples, which began after its install phase and stopped
    with it, hold its ``wall_s`` and install time; its data phase is its data jobs' seconds and
    the unpacking (a call whose wall time grew by ten minutes, with its install phase or with
    its jobs' seconds shrunk, was read as the lab's call)."""
    why = call_record_problem(meta, path.stem)
    if why is not None:
        return why
    assert isinstance(meta, dict)
    wall, timings = float(meta["wall_s"]), meta["timings_s"]
    phases = sum(timings.get(k, 0.0) for k in SEQUENTIAL)
    if "runs" in timings and abs(phases - wall) > 1.0:  # a finished call: the phases are all
        return (f"has wall_s = {wall:g} but its phases one after another "
                f"({', '.join(SEQUENTIAL)}) took {phases:g} s")
    prep = sum(j.get("seconds") or 0.0 for j in meta["jobs"] if j["job"] in PREP_JOBS)
    if timings.get("data", 0.0) > prep + DATA_SLACK_S:
        return (f"says its data phase took {timings['data']:g} s, though its data jobs took "
                f"{prep:g} s")
    if (why := _missing_product(meta)) is not None:
        return why
    start = call_start(path.stem)
    if start is None:
        return None
    if (why := _runs_problem(path.parents[len(Path(CALL_RECORDS).parts)], meta, start)):
        return why
    if meta["device"].get("type") != "cuda":
        return None
    smi = path.with_name(f"{path.stem}-nvidia-smi.csv")
    read = _samples(smi)
    if read is None:
        return f"has no nvidia-smi samples that can be read beside it ({smi.name})"
    first, last = ((t - start).total_seconds() for t in (read[0].min(), read[0].max()))
    if not LAST_SAMPLE_S[0] <= last - wall <= LAST_SAMPLE_S[1]:
        return (f"says the call took {wall:g} s, but its nvidia-smi samples ({smi.name}) end "
                f"{last:.0f} s after its start")
    install = timings.get("install", 0.0)
    if not FIRST_SAMPLE_S[0] <= first - install <= FIRST_SAMPLE_S[1]:
        return (f"says its install phase took {install:g} s, but its nvidia-smi samples "
                f"({smi.name}) begin {first:.0f} s after its start")
    return None


RUNS_AFTER_SETUP_S = (-2.0, 30.0)
"""The first run a call made starts this long after its setup (install, data and any
pretraining before its fine-tuning): +4 to +10 s in the committed calls."""
CALL_AFTER_RUNS_S = (-2.0, 30.0)
"""A finished call ends this long after the last run it made (its last snapshot): +1 to +8 s."""


def _runs_problem(root: Path, meta: dict, start: datetime) -> str | None:
    """A call's phases against the runs it made, which record their own start and end (check
    26b's G-n1 to G-n3: ten minutes added to its runs phase, or five to its install or data
    phase, with its nvidia-smi samples moved or extended to match): each of its jobs' runs
    that started within the call, in the experiments it brought back."""
    base = paths().runs if root.resolve() == PROJECT_ROOT.resolve() else root / "data" / "runs"
    wall, timings = float(meta["wall_s"]), meta["timings_s"]
    experiments = [str(p).rsplit("/", 1)[-1] for p in meta.get("products") or []
                   if str(p).startswith("data/runs/")]
    made = []
    for job in meta["jobs"]:
        part, _, run = job["job"].partition("-")
        for experiment in (e for e in experiments if e.startswith(part)):
            try:
                record = parse_json(regular_text(base / experiment / run / "manifest.json"))
                began, ended = (datetime.fromisoformat(record[k]) for k in ("start_time",
                                                                            "end_time"))
            except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError):
                continue  # none, or damaged: the registry names it
            if began.tzinfo is not None and ended.tzinfo is not None \
                    and start <= began <= start + timedelta(seconds=wall):
                made.append((began, ended))
    if not made:
        return None
    setup = sum(timings.get(k, 0.0) for k in ("install", "data", "pretraining"))
    first = (min(b for b, _e in made) - start).total_seconds()
    if not RUNS_AFTER_SETUP_S[0] <= first - setup <= RUNS_AFTER_SETUP_S[1]:
        return (f"says its setup took {setup:g} s, but the first run it made started {first:.0f} "
                "s after its start")
    last = (max(e for _b, e in made) - start).total_seconds()
    if "runs" in timings and not CALL_AFTER_RUNS_S[0] <= wall - last <= CALL_AFTER_RUNS_S[1]:
        return (f"says the call took {wall:g} s, but the last run it made ended {last:.0f} s "
                "after its start")
    return None


def gpu_samples(smi: Path, start: datetime, wall_s: float) -> tuple[float | None, float | None]:
    """Mean utilisation (%) while a process held the GPU and peak memory (MiB), from a call's
    ``nvidia-smi`` samples; (None, None) when there are none, or when they cannot be this
    call's: a utilisation outside 0 to 100 %, negative memory, a sample outside the call's
    time (another call's samples under its name), a file that is no such table."""
    import pandas as pd

    read = _samples(smi)
    if read is None:
        return None, None
    stamps, util, used = read
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
    made: dict[str, str] = {}
    """The runs its jobs made, as ``experiment/run`` -> job name (:func:`made_runs`): a run
    that started within the call is one of them."""
    environment: dict[str, str] = {}
    """What the record says of the software and recipe its runs share, by the run manifest's
    field (``environment.packages.torch`` -> ``2.11.0+cu130``; :data:`RECORD_FIELDS`)."""


RUN_JOBS = ("fairseq", "transformers", "lora", "pretrain")
"""The first word of the jobs that make a run, which the call brings back in an experiment."""


def _destination(job: str, plan: dict) -> str | None:
    """The experiment a job that makes a run writes it to, as :func:`gpu_plan.lab_jobs` sends
    it: a candidate's fairseq pretrained seeds to the candidate experiment."""
    part, _, rest = job.partition("-")
    if part not in RUN_JOBS:
        return None
    tiny = SUFFIX_TINY if plan.get("tiny") else ""
    if part == "fairseq" and rest.startswith("pretrained-") and plan.get("checkpoint"):
        return plan.get("candidate_experiment") or f"fairseq-candidate{GPU_SUFFIX}{tiny}"
    return f"{part}{GPU_SUFFIX}{tiny}"


def _missing_product(meta: dict) -> str | None:
    """A job that made a run and ended well, in the experiment the call brought back (trial
    29's R-23: a record that lost its ``data/runs/transformers-gpu`` product blamed the six
    runs it had made instead of setting itself aside; check 29b's F7: by the experiment the
    job wrote to, not by its first word, which a sibling experiment shares)."""
    brought = {str(p).rsplit("/", 1)[-1] for p in meta.get("products") or []
               if str(p).startswith("data/runs/")}
    plan = meta.get("plan") if isinstance(meta.get("plan"), dict) else {}
    for job in meta["jobs"]:
        where = _destination(str(job["job"]), plan)
        if where is not None and job.get("exit_code") == 0 and where not in brought:
            return (f"says its job {job['job']} ended with exit code 0, but it brought back no "
                    f"experiment {where} (products: {', '.join(sorted(brought)) or 'none'})")
    return None


RECORD_FIELDS = {"torch": "environment.packages.torch", "python": "environment.python",
                 "platform": "environment.platform", "hostname": "environment.hostname"}
"""A call record's ``device`` entries that a run's manifest records too, by its field there
(the committed records carry ``torch`` only; the others are held wherever a record has them)."""


def made_runs(meta: dict) -> dict[str, str]:
    """Each run a call's jobs made (``experiment/run`` -> job): a job ``PART-RUN`` made ``RUN``
    in whichever experiment of the call's products is PART's (``fairseq-pretrained-seed0``:
    ``fairseq-gpu/pretrained-seed0``, or a candidate experiment's seed), the ``pretrain`` job
    the plan's ``pretrain_run`` in the pretraining experiment (``pretrain-gpu/gpu4``)."""
    plan = meta.get("plan") if isinstance(meta.get("plan"), dict) else {}
    experiments = [str(p).rsplit("/", 1)[-1] for p in meta.get("products") or []
                   if str(p).startswith("data/runs/")]
    made = {}
    for job in meta.get("jobs") or []:
        part, _, run = str(job.get("job")).partition("-")
        if part == "pretrain" and not run and isinstance(plan.get("pretrain_run"), str):
            run = plan["pretrain_run"] + (SUFFIX_TINY if plan.get("tiny") else "")
        for experiment in (e for e in experiments if run and e.startswith(part)):
            made[f"{experiment}/{run}"] = str(job.get("job"))
    return made


def record_environment(meta: dict) -> dict[str, str]:
    """The fields of :data:`RECORD_FIELDS` a call's record holds, and its plan's epochs (every
    fine-tuning job ran ``--epochs`` of the plan), by the run manifest's field."""
    device, plan = meta.get("device") or {}, meta.get("plan") or {}
    held = {field: str(device[key]) for key, field in RECORD_FIELDS.items()
            if isinstance(device.get(key), (str, int, float))}
    if isinstance(plan, dict) and isinstance(plan.get("epochs"), int):
        held["hyperparameters.epochs"] = str(plan["epochs"])
    return held


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
        if call_problem(path, meta) is None \
                and isinstance(meta["device"].get("name"), str):
            count = meta["device"].get("count")
            smi = path.with_name(f"{path.stem}-nvidia-smi.csv")
            calls.append(CallDevice(start, float(meta["wall_s"]), meta["device"]["name"],
                                    count if isinstance(count, int) else None,
                                    {j["job"]: j["exit_code"] for j in meta["jobs"]},
                                    {j["job"]: float(j["seconds"]) for j in meta["jobs"]
                                     if "seconds" in j},
                                    gpu_samples(smi, start, float(meta["wall_s"]))[1],
                                    made_runs(meta), record_environment(meta)))
    return calls
