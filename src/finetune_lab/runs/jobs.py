"""Runs side by side: one process per run, the machine shared between them (``--jobs N``).

Each job is a command line of this project's CLI, so it records its own run folder and manifest
(the threads it was given are in the manifest's ``device``), and writes its output to its own
log. The CPU's threads are split evenly between the jobs running at once; on a machine with
several GPUs each job also gets its own (``CUDA_VISIBLE_DEVICES``). A failed job never stops the
others: it is reported at the end. Ctrl-C (or SIGTERM) stops every job, each of which marks its
run interrupted, so none is left marked complete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.data.child import PRE_EXEC
from finetune_lab.errors import open_in_place, stop_signals_raise


@dataclass(frozen=True)
class Job:
    name: str
    argv: list[str]
    log: Path


@dataclass(frozen=True)
class JobResult:
    name: str
    exit_code: int | None
    """None: stopped by an interruption before it ended."""
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def cli(*args: str) -> list[str]:
    """A command line of this project's CLI, run by this interpreter."""
    return [sys.executable, "-m", "finetune_lab.cli", *args]


def cpu_threads() -> int:
    """The CPUs this process may run on: its affinity (taskset, a container's cpuset, a batch
    scheduler's allocation) where the platform tells it, else every CPU of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def gpu_count() -> int:
    """GPUs a job could be given (0 without CUDA); torch is imported only to count them."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _eta(done: list[JobResult], left: int, running: int, parallel: int) -> str:
    if not done:
        return "ETA after the first job"
    mean = sum(r.seconds for r in done) / len(done)
    rounds = (left + running) / max(1, parallel)
    return f"ETA {rounds * mean / 60:.0f} min"


def _stop(running: dict, done: list[JobResult]) -> None:
    """SIGTERM every running job (each marks its run interrupted and stops its trainer), wait,
    and record them as ended without an exit code."""
    for _job, proc, _slot, _start in running.values():
        proc.send_signal(signal.SIGTERM)
    for job, proc, _slot, start in running.values():
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        done.append(JobResult(job.name, None, round(time.monotonic() - start, 1), job.log))
    running.clear()


def run_parallel(jobs: Sequence[Job], parallel: int, *, env: dict[str, str] | None = None,
                 cwd: Path = PROJECT_ROOT, label: str = "jobs", gpus: int | None = None,
                 deadline: float | None = None,
                 say: Callable[[str], None] = lambda s: print(s, flush=True),
                 on_done: Callable[[JobResult], None] | None = None) -> list[JobResult]:
    """Run ``jobs``, at most ``parallel`` at once; return every job's result, in job order.
    ``on_done`` is called with each job's result as it ends (the GPU call saves each finished run
    at once, so that a deadline or a crash keeps it).
    ``deadline`` (a ``time.monotonic()``, immune to the clock being set): then the running jobs
    are stopped and the waiting ones never start (exit code None), so that what did finish can
    still be saved."""
    parallel = max(1, min(parallel, len(jobs) or 1))
    threads = max(1, cpu_threads() // parallel)
    gpus = gpu_count() if gpus is None else gpus
    base = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads)}
    pending, running = list(jobs), {}
    done: list[JobResult] = []
    free = list(range(parallel))
    say(f"{label}: {len(jobs)} job(s), {parallel} at a time, {threads} thread(s) each"
        + (f", one of {gpus} GPUs each" if gpus > 1 else ""))

    def terminated(signum: int, _frame: object) -> None:
        # SIGTERM (a scheduler, a session's end, `kill`) stops the grid as Ctrl-C does; without
        # this the launcher dies alone and its runs go on unwatched. A launcher started in the
        # background by a shell ignores SIGINT, so SIGTERM is the signal that reaches it.
        raise KeyboardInterrupt(f"signal {signum}")

    stops = ExitStack()
    stops.enter_context(stop_signals_raise(terminated))  # SIGTERM and SIGHUP
    try:
        while pending or running:
            if deadline is not None and time.monotonic() > deadline:
                say(f"{label}: time is up; stopping {len(running)} job(s), "
                    f"{len(pending)} not started")
                _stop(running, done)
                done += [JobResult(j.name, None, 0.0, j.log) for j in pending]
                pending.clear()
                break
            while pending and free:
                job, slot = pending.pop(0), free.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                child_env = dict(base)
                if gpus > 1:
                    child_env["CUDA_VISIBLE_DEVICES"] = str(slot % gpus)
                with open_in_place(job.log, "w") as log:  # its own copy; no link (L-22)
                    proc = subprocess.Popen(job.argv, cwd=cwd, env=child_env, stdout=log,
                                            stderr=subprocess.STDOUT, preexec_fn=PRE_EXEC)
                running[job.name] = (job, proc, slot, time.monotonic())
            time.sleep(0.2)
            for name, (job, proc, slot, start) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                free.append(slot)
                res = JobResult(name, proc.returncode, round(time.monotonic() - start, 1),
                                job.log)
                done.append(res)
                state = "done" if res.ok else f"FAILED (exit {res.exit_code}; log {job.log})"
                say(f"{label}: {name} {state} in {res.seconds / 60:.1f} min; {len(done)} done, "
                    f"{len(running)} running, {len(pending)} left, "
                    f"{_eta(done, len(pending), len(running), parallel)}")
                if on_done is not None:
                    on_done(res)
    except KeyboardInterrupt:
        say(f"{label}: interrupted; stopping {len(running)} running job(s)")
        _stop(running, done)
        raise
    finally:
        stops.close()
    order = {j.name: i for i, j in enumerate(jobs)}
    return sorted(done, key=lambda r: order[r.name])


def report(results: Sequence[JobResult], label: str,
           say: Callable[[str], None] = lambda s: print(s, flush=True)) -> int:
    """One line for the failures (with their logs); the exit code for the whole grid."""
    failed = [r for r in results if not r.ok]
    if failed:
        say(f"{label}: {len(failed)} of {len(results)} failed: "
            + "; ".join(f"{r.name} (exit {r.exit_code}, log {r.log})" for r in failed))
        return 1
    say(f"{label}: all {len(results)} done")
    return 0
