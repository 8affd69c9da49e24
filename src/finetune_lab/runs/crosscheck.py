"""A run against what records outside it say of the same run (issue 35, silent wrong results).

A GPU run was made within a device call, whose record (``data/summaries/gpu-lab/``) names the
GPU, how many, and how each job ended; weights that a run or a probe names were made by a
pretraining run, which started at a known time. An edited device name, count or checkpoint
sha256 agreed with everything in its own manifest and changed a chapter.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from finetune_lab._files import parse_json, regular_text
from finetune_lab.errors import UserError
from finetune_lab.models.checkpoints import lineage_chain_problem, package_manifest
from finetune_lab.runs.consistency import CLOCK_SLACK_S, Judged, recorded_time
from finetune_lab.runs.experiments import outvoted
from finetune_lab.runs.call_runs import call_device_problems
from finetune_lab.runs.gpu_calls import call_devices
from finetune_lab.runs.file_facts import event_host
from finetune_lab.runs.manifest import event_files, run_key


def outside_problems(records: Sequence[Judged], runs_base: Path) -> list[Judged]:
    """Every check below on the valid runs among ``records``; returns those it rejects."""
    valid = [r for r in records if r.valid]
    unplaced_problems(valid)
    machine_problems(valid, [r for r in records if r.manifest is not None])
    package_problems(valid, [r for r in records if r.manifest is not None])
    weights_time_problems(valid, runs_base)
    lineage_time_problems(valid, records)
    lineage_chain_problems(valid, records)
    source_problems(valid)
    experiment_weights_problems(valid)
    call_device_problems(valid, call_devices())
    return [r for r in valid if not r.valid]


CANDIDATE = re.compile(r"data/work/candidates/(?P<name>(?P<run>[^/]+?)(?:-u\d+)?)/model\.pt")
"""A candidate's weights: its folder (``name``, after which the records of them are named) is
the pretraining run they were taken from (``run``; ``-uN``: at update N of it)."""


PRETRAINING_EXPERIMENTS = ("pretrain", "pretrain-gpu", "pretrain-ablation")


def candidate_name_problem(name: object, path: object, runs_base: Path) -> str | None:
    """A record named as a pretraining run's candidate (``RUN-uN``, RUN a run here) names the
    weights in that candidate's folder, the folder the book knows by that name (trial 19's
    W3-y1: `fill-mask --checkpoint data/work/mine --name cpu-long3-u3930` put other weights'
    answers under cpu-long3's candidate; R-W3-v7: a probe record of that name, other weights)."""
    taken = re.fullmatch(r"(?P<run>.+)-u\d+", name) if isinstance(name, str) else None
    if taken is None or not any((runs_base / exp / taken["run"]).is_dir()
                                for exp in PRETRAINING_EXPERIMENTS):
        return None
    own = f"data/work/candidates/{name}/model.pt"
    if path == own:
        return None
    return (f"is named {name}, the candidate of the pretraining run {taken['run']}, but names "
            f"the weights at {path}, not {own}: record them under another --name")


def packaged_origin() -> tuple[str, str] | None:
    """The packaged checkpoint's weights (sha256) and the pretraining run that made them, as
    ``experiment/run`` (None when there is no readable package manifest)."""
    try:
        packaged = package_manifest() or {}
    except UserError:  # a damaged package manifest: the chapters that read it say so
        return None
    sha = ((packaged.get("files") or {}).get("model.pt") or {}).get("sha256")
    run = packaged.get("run")
    if not isinstance(sha, str) or not isinstance(run, str) or not run.startswith("data/runs/"):
        return None
    return sha, run.removeprefix("data/runs/")


def weights_made_from(path: Any, sha: Any, runs_base: Path,
                      packaged: tuple[str, str] | None = None) -> datetime | None:
    """When the weights named by ``path`` (a candidate's) or ``sha`` (the packaged checkpoint's,
    :func:`packaged_origin`, read when not given) were made: the end of the pretraining run whose
    last weights they are (a complete run, packaged as it ended), else its start (weights taken
    at update N of it, ``-uN``); None when neither names a known run. Nothing that used those
    weights can be older."""
    packaged = packaged if packaged is not None else packaged_origin()
    origins = []  # (run folder, whether the weights are its last: packaged when it completed)
    if isinstance(path, str) and (named := CANDIDATE.fullmatch(path)):
        origins.append((runs_base / "pretrain" / named["run"], named["name"] == named["run"]))
    if packaged is not None and sha == packaged[0]:
        origins.append((runs_base / packaged[1], True))
    times = []
    for run, last in origins:
        try:
            man = parse_json(regular_text(run / "manifest.json"))
            # trial 11's PR12: a probe that started before its weights' run ended
            ended = last and man.get("status") == "complete"
            times.append(recorded_time(man.get("end_time" if ended else "start_time")))
        except (OSError, ValueError, AttributeError):
            continue
    return max((t for t in times if t is not None), default=None)


def weights_time_problems(records: Sequence[Judged], runs_base: Path) -> None:
    """Runs that name weights a pretraining run made only after they started (a sha or a path
    edited to another checkpoint's) are rejected."""
    packaged = packaged_origin()
    for rec in records:
        man = rec.manifest or {}
        ckpt, start = (man.get("inputs") or {}).get("checkpoint"), recorded_time(man.get("start_time"))
        if not isinstance(ckpt, dict) or start is None:
            continue
        sha = (ckpt.get("sha256") or {}).get(".") if isinstance(ckpt.get("sha256"), dict) else None
        made = weights_made_from(ckpt.get("path"), sha, runs_base, packaged)
        if made is not None and start < made - timedelta(seconds=CLOCK_SLACK_S):
            rec.problems.append(f"inputs.checkpoint names weights whose pretraining started at "
                                f"{made:%Y-%m-%d %H:%M}, after this run started: its path or "
                                "sha256 was edited")


def lineage_time_problems(records: Sequence[Judged], everyone: Sequence[Judged]) -> None:
    """A run is built on the runs its copied lineage names (a continued pretraining run's
    ``extra.continued_from``, a fine-tuning run's ``extra.checkpoint_source``): one of them that
    started after it is another run under that name (trial 16's O-1: a lineage run replaced
    with ``--overwrite``, or moved back from elsewhere), and what it records is not this run's
    history."""
    started = {f"{r.experiment}/{r.name}": recorded_time((r.manifest or {}).get("start_time"))
               for r in everyone if r.manifest is not None}
    for rec in records:
        extra = (rec.manifest or {}).get("extra") or {}
        start = recorded_time((rec.manifest or {}).get("start_time"))
        for field in ("continued_from", "checkpoint_source"):
            lineage = (extra.get(field) or {}).get("lineage") if isinstance(extra, dict) else None
            for step in lineage if isinstance(lineage, list) and start is not None else []:
                key = run_key(str(step.get("run"))) if isinstance(step, dict) else None
                other = started.get(key) if key else None
                if other is not None and other > start + timedelta(seconds=CLOCK_SLACK_S):
                    rec.problems.append(
                        f"extra.{field}.lineage names {key}, but the run there started at "
                        f"{other:%Y-%m-%d %H:%M}, after this run started: it is another run "
                        "under that name (an earlier one is kept in data/runs/.superseded/ "
                        "when --overwrite replaced it)")
                    break


def lineage_chain_problems(records: Sequence[Judged], everyone: Sequence[Judged]) -> None:
    """Each copied lineage of a run names every run behind its weights, as the last of them
    recorded its own (:func:`~finetune_lab.models.checkpoints.lineage_chain_problem`)."""
    manifests = {f"{r.experiment}/{r.name}": r.manifest for r in everyone if r.manifest}
    for rec in records:
        extra = (rec.manifest or {}).get("extra") or {}
        for field in ("continued_from", "checkpoint_source"):
            source = extra.get(field) if isinstance(extra, dict) else None
            lineage = source.get("lineage") if isinstance(source, dict) else None
            if not isinstance(lineage, list) or not lineage:
                continue
            if not isinstance(source.get("run"), str):  # check 29b's F5: no run, no check
                rec.problems.append(f"extra.{field}.lineage names runs, but extra.{field}.run "
                                    "names none: the weights' own run")
                break
            if not all(isinstance(step, dict) for step in lineage):
                rec.problems.append(f"extra.{field}.lineage holds an entry that is not an object")
                break
            own = manifests.get(run_key(source["run"]))
            if (why := lineage_chain_problem(lineage, source["run"], own)) is not None:
                rec.problems.append(f"extra.{field}.{why}")
                break


SAME_MACHINE_GAP_S = 300.0
"""Runs on one host that overlap or follow each other within this (a grid's seeds, one after
another) ran on one machine; this machine's sessions are hours apart."""


CpuRun = tuple[str, datetime, datetime, tuple[Any, Any]]
"""A CPU run's host, start, end and machine (processor, cores)."""


def _cpu_run(rec: Judged) -> CpuRun | str | None:
    """A CPU run's :data:`CpuRun`, its host taken from its event files' names, not from its
    manifest (trial 28's M-m2: a renamed or emptied ``environment.hostname`` escaped the runs
    beside it; :func:`~finetune_lab.runs.file_facts.host_problems` holds the manifest to the
    files); the reason it cannot be placed, when it lacks a host or times; None for any other
    run."""
    man = rec.manifest or {}
    device = man.get("device") or {}
    if not isinstance(device, dict) or device.get("type") != "cpu":
        return None
    start, end = recorded_time(man.get("start_time")), recorded_time(man.get("end_time"))
    host = event_host(event_files(rec.path))
    if host is None or start is None or end is None:
        return ("a CPU run is held to the runs beside it on its machine, but "
                + ("its event files' names (events.out.tfevents.<time>.<host>.<pid>.<n>) name "
                   "no one host" if host is None else "its start_time or end_time is no time "
                   "(with a UTC offset, from 1970 on) to compare") + ": it cannot be checked")
    return host, start, end, (device.get("cpu"), device.get("cpu_count"))


def _placed(records: Sequence[Judged]) -> list[tuple[Judged, CpuRun]]:
    """The CPU runs among ``records`` that :func:`_cpu_run` places."""
    return [(r, c) for r in records if isinstance(c := _cpu_run(r), tuple)]


def unplaced_problems(records: Sequence[Judged]) -> None:
    """A CPU run with no host or no times is rejected, never taken for one with nothing beside
    it to compare (trial 28's M-m2: an emptied hostname was "nothing to compare")."""
    for rec in records:
        if isinstance(reason := _cpu_run(rec), str):
            rec.problems.append(reason)


def machine_problems(records: Sequence[Judged], everyone: Sequence[Judged]) -> None:
    """Runs on one host at the same time, or one right after another, ran on one machine: a run
    whose processor or core count no such run records was edited (trial 8's S19: 16 cores
    where the seeds before and after it say 2, which gave the layout table a row of its own)."""
    seen = _placed(everyone)
    for rec, mine in _placed(records):
        host, start, end, machine = mine
        beside = [c[3] for o, c in seen if o is not rec and c[0] == host
                  and (max(start, c[1]) - min(end, c[2])).total_seconds() < SAME_MACHINE_GAP_S]
        if beside and machine not in beside:
            (cpu, cores), n = Counter(beside).most_common(1)[0]
            rec.problems.append(
                f"device {machine[0]} with {machine[1]} cores, but {n} run{'s' if n > 1 else ''} "
                f"on {host} at that time record {cpu} with {cores} cores")


PACKAGES = ("torch", "fairseq-fixed", "fairseq", "transformers", "peft")
"""The packages whose version changes what a run computes, held across runs of one machine
and time (the others, such as numpy or tensorboard, are recorded but not held)."""


def _environment(rec: Judged) -> dict[str, str]:
    """A run's python and :data:`PACKAGES` versions, by manifest field."""
    env = (rec.manifest or {}).get("environment") or {}
    packages = env.get("packages") if isinstance(env, dict) else None
    held = {f"environment.packages.{name}": str(packages[name]) for name in PACKAGES
            if isinstance(packages, dict) and isinstance(packages.get(name), str)}
    if isinstance(env, dict) and isinstance(env.get("python"), str):
        held["environment.python"] = env["python"]
    return held


def package_problems(records: Sequence[Judged], everyone: Sequence[Judged]) -> None:
    """Runs on one host at the same time, or one right after another, ran in one environment,
    as :func:`machine_problems` holds their processor (trial 27's M-m1: fairseq/random-seed0's
    torch edited to 2.5.0+cpu beside seeds that record 2.13.0+cpu). The committed CPU runs span
    one upgrade (transformers 5.23.0 to 5.24.0, between 2026-11-24 and 11-25), hours apart,
    which the window of :data:`SAME_MACHINE_GAP_S` leaves alone."""
    seen = [(r, c, _environment(r)) for r, c in _placed(everyone)]
    for rec, mine in _placed(records):
        host, start, end, _machine = mine
        beside = [env for o, c, env in seen if o is not rec and c[0] == host
                  and (max(start, c[1]) - min(end, c[2])).total_seconds() < SAME_MACHINE_GAP_S]
        for field, value in _environment(rec).items():
            theirs = [env[field] for env in beside if field in env]
            if theirs and value not in theirs:
                other, n = Counter(theirs).most_common(1)[0]
                rec.problems.append(
                    f"{field} {value!r}, but {n} run{'s' if n > 1 else ''} on {host} at that "
                    f"time record{'' if n > 1 else 's'} {other!r}: one machine at one time has one version")


def source_problems(records: Sequence[Judged]) -> None:
    """The pretraining run a fine-tuning run credits (``extra.checkpoint_source.run``, which
    the candidate table reads) against the weights it loaded (a candidate's path is named after
    its run) and the lineage recorded beside it, which ends at that run."""
    for rec in records:
        man = rec.manifest or {}
        source = (man.get("extra") or {}).get("checkpoint_source")
        run = source.get("run") if isinstance(source, dict) else None
        if not isinstance(run, str):
            continue
        ckpt = (man.get("inputs") or {}).get("checkpoint") or {}
        named = CANDIDATE.fullmatch(str(ckpt.get("path"))) if isinstance(ckpt, dict) else None
        lineage = source.get("lineage") or []
        last = lineage[-1].get("run") if lineage and isinstance(lineage[-1], dict) else None
        if named is not None and run.rsplit("/", 1)[-1] != named["run"]:
            rec.problems.append(f"extra.checkpoint_source.run {run} but it loaded "
                                f"{ckpt.get('path')}, the weights of {named['run']}")
        elif last is not None and last != run:
            rec.problems.append(f"extra.checkpoint_source.run {run} but the lineage recorded "
                                f"beside it ends at {last}")



def _weights(man: dict[str, Any]) -> str | None:
    """The fairseq weights a pretrained run fine-tuned, by their sha256: a Transformers or LoRA
    run's conversion names the checkpoint it came from (``extra.converted_from``)."""
    source = (man.get("extra") or {}).get("converted_from") or \
        (man.get("inputs") or {}).get("checkpoint")
    digest = source.get("sha256") if isinstance(source, dict) else None
    return None if digest is None else json.dumps(digest, sort_keys=True)


def experiment_weights_problems(records: Sequence[Judged]) -> None:
    """The pretrained runs of one experiment fine-tune one set of weights (trial 26's R-m2: a
    candidate's run filed as seed 5 of the lab's grid made its headline 76.5 %, not 78.1 %):
    a run whose weights most of the others do not share is rejected, and all of them where no
    weights are most runs'."""
    groups: dict[str, list[tuple[Judged, str]]] = {}
    for rec in records:
        man = rec.manifest or {}
        if man.get("init") == "pretrained" and (weights := _weights(man)) is not None:
            groups.setdefault(rec.experiment, []).append((rec, weights))
    for experiment, group in groups.items():
        counts, odd = outvoted(group)
        n = max(counts.values())
        for rec, _ in odd:
            rec.problems.append(
                f"fine-tunes other weights than {'the other' if n * 2 > len(group) else 'some'}"
                f" pretrained runs of experiment '{experiment}' ({len(counts)} sets of "
                "weights among its runs): one experiment fine-tunes one checkpoint; give "
                "other weights an experiment of their own (--experiment)")
