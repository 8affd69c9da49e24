"""Producing runs: one folder per run, a manifest that says ``complete`` only when it is true.

Later steps (fine-tuning with fairseq or Transformers) wrap their training in :func:`record_run`;
the recipe (which flags, which data) stays with them. This module only guarantees the layout
``<runs root>/<experiment>/<run>/`` and the honesty of the manifest's status:

* ``running`` is written before training starts, so a run killed mid-way stays ``running``;
* ``complete`` (with end time, wall time and the event files' hashes) only when the training
  process exited 0 (or, for in-process training, the ``with`` body ended without an exception);
* ``failed`` otherwise.

Two launches of one run are kept apart by :mod:`finetune_lab.runs.runlock`; the training
process itself (dying with its launcher, ended when it hangs after saving) is handled by
:mod:`finetune_lab.runs.trainer_process`.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_lab._files import move_aside, utc_now
from finetune_lab.config import paths
from finetune_lab.data.child import PRE_EXEC
from finetune_lab.errors import UserError, open_in_place
from finetune_lab.runs import manifest as mf
from finetune_lab.runs.measurements import killed_end, seconds_between
from finetune_lab.runs.portable import portable_command
from finetune_lab.runs.run_inputs import refuse_inside_output, refuse_inside_runs
from finetune_lab.runs.runlock import run_lock
from finetune_lab.runs.trainer_process import (
    RunInterrupted,
    log_tail,
    terminate_as_interrupt,
    wait_or_end_after,
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
TRAIN_LOG = "train.log"


def _exists(run_dir: Path) -> RunExistsError:
    return RunExistsError(f"{run_dir} already holds a run: it was left as it is; choose another "
                          "--run, or pass --overwrite to redo it")


def refuse_existing_run(experiment: str, run: str, runs_root: Path | None = None, *,
                        overwrite: bool = False) -> None:
    """:func:`record_run`'s refusal of a run folder that holds a run, asked before any work (a
    pretraining's scratch folder, its calibration, its experiment's ``experiment.json``)."""
    run_dir = run_dir_for(experiment, run, runs_root)
    if not overwrite and run_dir.is_dir() and any(run_dir.iterdir()):
        raise _exists(run_dir)


class RunExistsError(UserError):
    """The run folder already holds a run."""


class TrainingFailedError(UserError):
    """The training process exited non-zero (its log is named in the message)."""


def run_dir_for(experiment: str, run: str, runs_root: Path | str | None = None) -> Path:
    """``<runs root>/<experiment>/<run>``, after checking both names are plain folder names."""
    for label, name in (("experiment", experiment), ("run", run)):
        if not _NAME_RE.match(name):
            raise UserError(f"{label} name {name!r} must be a plain folder name (letters, "
                            "digits, . _ + -)")
    root = Path(runs_root) if runs_root is not None else paths().runs
    refuse_inside_output(root.absolute(), "runs root")
    refuse_inside_runs(root.absolute())
    for label, folder, name in (("experiment", root, experiment),
                                ("run", root / experiment, run)):
        twins = [] if (folder / name).exists() or not folder.is_dir() else sorted(
            p.name for p in folder.iterdir() if p.name.casefold() == name.casefold())
        if twins:  # trial 22's N-e1: on a case-insensitive disk, the same folder
            raise UserError(f"{label} name {name!r} differs only in case from {twins[0]!r} in "
                            f"{folder}: choose another name, or use {twins[0]!r}")
    return root / experiment / run


EXIT_GRACE_S = 30.0
"""How long a training process may take to exit after it logged that its work is done (on the
H100, fairseq with ten loading workers did not exit for 90 s, and the call's deadline lost it)."""


@dataclass
class RunHandle:
    """What the body of :func:`record_run` gets: the run folder and a way to launch training."""

    run_dir: Path
    manifest: dict[str, Any]
    exit_code: int | None = None
    log_path: Path | None = field(default=None)
    paused: bool = False
    """Set by a resumable run's body when it stopped before its budget was spent."""

    def run(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        check: bool = True,
        done_marker: str | None = None,
        exit_grace_s: float = EXIT_GRACE_S,
    ) -> int:
        """Run the training process, logging its output to ``train.log`` in the run folder.

        The command line is stored in the manifest (rewritten atomically) before it starts.
        With ``check`` a non-zero exit raises :class:`TrainingFailedError` (the manifest then
        ends ``failed``); either way the exit code decides the final status. A process that
        logged ``done_marker`` (its work saved) but has not exited ``exit_grace_s`` later is
        killed and counted as done; the manifest says so (``exit_forced``).
        """
        command = [str(c) for c in command]
        self.manifest["command"] = portable_command(command)  # launched as given, stored portable
        mf.write_manifest(self.run_dir, self.manifest)
        self.log_path = self.run_dir / TRAIN_LOG
        full_env = {**os.environ, **(env or {})}
        with open_in_place(self.log_path, "a+b") as log:  # readable: the done-marker watch reads it
            start = log.tell()
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                preexec_fn=PRE_EXEC,
            )
            try:
                returncode = wait_or_end_after(proc, log.fileno(), start, done_marker,
                                               exit_grace_s)
            except BaseException:  # an interrupt: the trainer goes too (as subprocess.run does)
                proc.kill()
                proc.wait()
                raise
        if returncode is None:
            self.manifest["exit_forced"] = (
                f"logged {done_marker!r} but had not exited {exit_grace_s:g} s later: killed")
            returncode = 0
        self.exit_code = returncode
        if check and returncode != 0 and "No space left on device" in log_tail(self.log_path):
            save = Path(command[command.index("--save-dir") + 1]) if "--save-dir" in command \
                else self.log_path.parent  # trial 25's E-k10: a traceback, a partial file left
            for partial in save.glob("*.pt.tmp"):
                partial.unlink(missing_ok=True)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(save))
        if check and returncode != 0:
            raise TrainingFailedError(
                f"training exited with code {returncode}; see {self.log_path} "
                f"(command: {' '.join(command)})\nlast lines of the log:\n"
                f"{log_tail(self.log_path)}"
            )
        return returncode


@contextmanager
def record_run(
    experiment: str,
    run: str,
    *,
    framework: str,
    init: str,
    seed: int,
    hyperparameters: Mapping[str, Any],
    data: Sequence[Path | str] = (),
    checkpoint: Path | str | None = None,
    command: Sequence[str] | None = None,
    runs_root: Path | str | None = None,
    overwrite: bool = False,
    extra: Mapping[str, Any] | None = None,
    resume: bool = False,
) -> Iterator[RunHandle]:
    """Create ``<runs root>/<experiment>/<run>/`` and keep its manifest truthful.

    ``data`` are the files/folders the run reads (hashed now); ``checkpoint`` the initial
    weights (``None`` for a random init). ``hyperparameters`` must not contain ``seed`` or
    ``init``: those are recorded separately because they are what varies inside an experiment.
    An existing run folder is refused unless ``overwrite``, which clears it first so that no
    stale event file can mix into the new run: the run there is moved aside
    (:func:`set_aside`), never deleted.

    ``resume`` makes the run resumable: its manifest lists ``segments`` (one per launch), an
    unfinished run with the same seed, init and hyperparameters is continued in place (a new
    segment), and a body that sets ``handle.paused`` leaves it ``paused`` instead of complete.
    """
    if framework not in mf.FRAMEWORKS:
        raise UserError(f"framework {framework!r} is not one of {', '.join(mf.FRAMEWORKS)}")
    clash = {"seed", "init"} & set(hyperparameters)
    if clash:
        raise UserError(
            f"hyperparameters must not contain {sorted(clash)}: pass them as seed=/init="
        )
    run_dir = run_dir_for(experiment, run, runs_root)
    with run_lock(run_dir):
        previous = resumable_manifest(run_dir, seed=seed, init=init,
                                      hyperparameters=hyperparameters) if resume else None
        if previous is None and run_dir.exists() and any(run_dir.iterdir()):
            if not overwrite:
                raise _exists(run_dir)
            set_aside(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)

        start = utc_now()
        start_clock = time.monotonic()
        manifest: dict[str, Any] = {
            "schema": mf.SCHEMA_VERSION,
            "experiment": experiment,
            "run": run,
            "framework": framework,
            "init": init,
            "seed": int(seed),
            "hyperparameters": dict(hyperparameters),
            "command": portable_command(command if command is not None else sys.argv),
            "inputs": {
                "data": [mf.input_record(p) for p in data],
                "checkpoint": mf.input_record(checkpoint) if checkpoint is not None else None,
            },
            "environment": mf.environment_info(),
            "device": mf.device_info(),
            "start_time": start,
            "end_time": None,
            "wall_time_s": None,
            "exit_code": None,
            "outputs": None,
            "status": mf.STATUS_RUNNING,
        }
        if extra:
            manifest["extra"] = dict(extra)
        earlier_wall = 0.0
        if resume:
            manifest, earlier_wall = _with_new_segment(manifest, previous, run_dir)
        mf.write_manifest(run_dir, manifest)
        handle = RunHandle(run_dir=run_dir, manifest=manifest)

        def _finish(status: str, exit_code: int | None, error: str | None = None) -> None:
            manifest["end_time"] = utc_now()
            wall = round(time.monotonic() - start_clock, 3)
            manifest["wall_time_s"] = round(earlier_wall + wall, 3)
            if resume:
                manifest["segments"][-1].update(end_time=manifest["end_time"], wall_time_s=wall,
                                                exit_code=exit_code, ended=status)
            manifest["exit_code"] = exit_code
            manifest["outputs"] = mf.output_hashes(run_dir)
            manifest["logs"] = mf.log_hashes(run_dir)
            manifest["checkpoints"] = mf.checkpoint_hashes(run_dir)
            if error:
                manifest["error"] = error
            manifest["status"] = status
            mf.write_manifest(run_dir, manifest)

        try:
            with terminate_as_interrupt():
                yield handle
        except KeyboardInterrupt as exc:
            _finish(mf.STATUS_FAILED, handle.exit_code,
                    f"interrupted (signal {int(signal.SIGINT)})")
            exc.marked_run = run_dir  # type: ignore[attr-defined]  # the CLI's one line says so
            raise
        except RunInterrupted as exc:
            _finish(mf.STATUS_FAILED, handle.exit_code, str(exc))
            exc.marked_run = run_dir  # type: ignore[attr-defined]
            raise
        except BaseException as exc:
            _finish(mf.STATUS_FAILED, handle.exit_code, f"{type(exc).__name__}: {exc}")
            raise
        code = 0 if handle.exit_code is None else handle.exit_code
        done = mf.STATUS_PAUSED if handle.paused else mf.STATUS_COMPLETE
        _finish(done if code == 0 else mf.STATUS_FAILED, code)


def _with_new_segment(fresh: dict[str, Any], previous: dict[str, Any] | None, run_dir: Path,
                      ) -> tuple[dict[str, Any], float]:
    """A resumable run's manifest for a new launch, and the wall time of the earlier ones.

    A continued run keeps its first launch's start, inputs, command and extra; environment and
    device are this launch's. A launch that never recorded its end was killed: it is marked
    ``killed``, and its end is its ``train.log``'s last line (:func:`measurements.killed_end`).
    """
    segments: list[dict[str, Any]] = []
    manifest = fresh
    if previous is not None:
        manifest = {**previous, "status": mf.STATUS_RUNNING,
                    "environment": fresh["environment"], "device": fresh["device"]}
        segments = [dict(s) for s in previous.get("segments") or []]
        for i, s in enumerate(segments):
            if s.get("end_time") is None:  # killed: it ended at its train.log's last line
                later = segments[i + 1]["start_time"] if i + 1 < len(segments) \
                    else fresh["start_time"]
                s["end_time"] = killed_end(run_dir, segments, i, later)
                s["wall_time_s"] = seconds_between(s["start_time"], s["end_time"])
                s["ended"] = "killed"
    manifest["segments"] = [*segments, {"start_time": fresh["start_time"],
                                        "device": fresh["device"]}]
    return manifest, sum(float(s.get("wall_time_s") or 0) for s in segments)


SUPERSEDED = ".superseded"
"""``<runs root>/.superseded/``: the runs that a re-run replaced, kept (never listed)."""


def set_aside(run_dir: Path) -> Path:
    """Clear ``run_dir`` for a new run by moving it to ``<runs root>/.superseded/<experiment>/
    <run>-<time>/``, the move printed. Whatever its status (complete, paused, failed or never
    finished), a run in the store is a record the book counts, so it is never deleted (trial
    14's W1); a folder without a readable manifest, or holding a user's files, moves too."""
    status = None
    if (run_dir / mf.MANIFEST_NAME).is_file():
        try:
            status = mf.read_manifest(run_dir).get("status")
        except (UserError, AttributeError):
            status = None
    target = move_aside_stamped(run_dir, run_dir.parent.parent / SUPERSEDED / run_dir.parent.name)
    what = {mf.STATUS_COMPLETE: "a complete run", mf.STATUS_PAUSED: "a paused run",
            mf.STATUS_FAILED: "a failed run", mf.STATUS_RUNNING: "an unfinished run",
            None: "no run manifest"}.get(status, "a run of another status")
    print(f"{run_dir} held {what}, which this one replaces: it was moved to {target}",
          flush=True)
    return target


def move_aside_stamped(path: Path, folder: Path) -> Path:
    """Move ``path`` to ``folder/<name>-<UTC time>`` (``-2``, ``-3``… when taken), never over
    anything (:func:`~finetune_lab._files.move_aside`): where a replaced run, or a replaced
    run's resumable state, is kept."""
    for kept in (p for p in (folder, folder.parent) if p.name == SUPERSEDED and p.is_symlink()):
        raise UserError(f"{kept} is a link: what a re-run replaces is kept in the project, never "
                        "moved through one (trial 30's L-8); remove the link")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return move_aside(path, folder / f"{path.name}-{stamp}")


def resumable_manifest(run_dir: Path, *, seed: int, init: str,
                       hyperparameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The manifest of an unfinished resumable run that this launch continues, or None.

    A complete run is never resumed, and one with another seed, init or recipe is a different
    run: both are refused (or overwritten) as usual.
    """
    path = run_dir / mf.MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        previous = mf.read_manifest(run_dir)
    except UserError:
        return None
    same = (previous.get("seed") == int(seed) and previous.get("init") == init
            and previous.get("hyperparameters") == dict(hyperparameters)
            and isinstance(previous.get("segments"), list))
    if not same or previous.get("status") == mf.STATUS_COMPLETE:
        return None
    return previous


FAIRSEQ_DONE = "done training in"
"""What fairseq-train logs once the last checkpoint is saved."""


def fairseq_train_command(args: Sequence[str], run_dir: Path | str,
                          launcher: Sequence[str] | None = None) -> list[str]:
    """``python -m fairseq_cli.train ARGS --tensorboard-logdir RUN_DIR`` with this interpreter,
    or under ``launcher`` (torchrun's command line: ``LAUNCHER -m fairseq_cli.train ARGS``).

    fairseq's ``--tensorboard-logdir`` makes one sub-folder per subset (train, train_inner,
    valid, test), which the loaders keep apart; in data-parallel training only rank 0 writes.
    The recipe (``args``) is the caller's.
    """
    args = [str(a) for a in args]
    if any(a == "--tensorboard-logdir" or a.startswith("--tensorboard-logdir=") for a in args):
        raise UserError("pass no --tensorboard-logdir: the run folder is the log folder")
    head = [*launcher, "-m"] if launcher else [sys.executable, "-m"]
    return [*head, "fairseq_cli.train", *args, "--tensorboard-logdir", str(run_dir)]


def run_fairseq_train(
    handle: RunHandle,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    launcher: Sequence[str] | None = None,
) -> int:
    """Run ``fairseq-train ARGS`` inside a :func:`record_run` block, logging to its folder.

    Checkpoints saved under the run folder (``--save-dir <run>/checkpoints``) are hashed into
    the manifest's ``checkpoints`` when the run ends, which is what lets
    :mod:`finetune_lab.models.checkpoints` trust them later.
    """
    return handle.run(fairseq_train_command(args, handle.run_dir, launcher), env=env,
                      check=check, done_marker=FAIRSEQ_DONE)
