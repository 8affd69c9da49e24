"""A fairseq ``train.log`` as the processes that wrote it, each launch of a run held to them.

The lines fairseq logs for a subset at an update (``train_inner``, ``valid``...) are held to
the event files' clock (:func:`~finetune_lab.runs.measurements.log_clock_problems`); the other
lines (start-up, checkpoints, warnings) are not, so a stamp moved or a line inserted there
stretched a launch (check 25b's M-l3, M-l4, M-l7, M-l12: 2 to 85 min more), and launches were
merged or split where no process started (M-l1, M-l2, M-l5). So each process fairseq ran is
found by its start (its configuration line), with what it loaded and when it began to train,
and every other line is tied to a held one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from finetune_lab.runs.fairseq_logs import held_line

QUIET_S = 60.0
"""The most a line the event files do not hold may come after the line before it (30 s at most
in the committed runs: validation starting after an epoch), but a process's first line."""
STARTUP_S = 60.0
"""From a process's first line to its ``Start iterating over samples``: 4 to 27 s measured."""
FIRST_TRAINING_S = 180.0
"""From a process's first line to its first training line (start-up and one logging interval):
at most 86 s in the committed runs (check 26b's M-n5: start-up restamped 400 s earlier, with
that line's ``train_wall`` raised alike in the log and its event file)."""
TRAINING_START_S = (-15.0, 30.0)
"""Its first training line's stamp less that line's ``train_wall`` (the seconds the interval
trained, held to the event files), from ``Start iterating``: -10 to +1 s in the committed runs,
+6 s in a tiny run on a busy machine (the time between steps is not ``train_wall``)."""
TRAILER_S = 30.0
"""From a process's last held line to its last line (saving a checkpoint): 0 to 2 s measured."""
RESTART_S = 10.0
"""From a finished process's ``done training`` to a process the same launch started (the long
run's launcher going on in one launch): 4 to 5 s measured."""
HEADER = ("fairseq.tasks.text_to_speech", "finetune_lab.fairseq_compat",
          "finetune_lab.models.fairseq_compat", "fairseq.distributed.utils")
"""Loggers of the lines a fairseq process writes before its configuration: as it imports, and
each of its ranks as it joins the others."""
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \| (\w+) \| ([\w.]+) \| (.*)$", re.M)
_LOADED = re.compile(r"[Ll]oaded checkpoint .*@ (\d+) updates")
_TRAIN_WALL = re.compile(r"\btrain_wall[=\s]+([0-9]+)")


@dataclass
class Process:
    """One fairseq process of a log: its lines (indices into the stamped lines)."""

    first: int
    config: int
    end: int
    loaded: int | None = None
    after_done: bool = False
    """Whether a process that finished (``done training``) wrote the line before its first."""
    done: bool = False
    """Whether it finished (``done training``)."""
    cpu: bool | None = None
    """Its configuration's ``cpu``: whether it trained on the CPU."""
    seeds: frozenset[int] = frozenset()
    """Its configuration's seeds (``common.seed``, and a task's own where it has one)."""
    logdir: str | None = None
    """Its configuration's ``tensorboard_logdir``: the run's folder where it was made."""


def _config(logger: str, message: str) -> bool:
    return logger == "fairseq_cli.train" and message.startswith(("{'_name'", "Namespace("))


def processes(lines: Sequence[tuple[datetime, str, str, str]]) -> list[Process]:
    """The fairseq processes that wrote ``lines`` (stamp, level, logger, message), in order:
    each from the lines it writes as it imports, then its configuration line."""
    found: list[Process] = []
    for k, (at, _level, logger, message) in enumerate(lines):
        if not _config(logger, message):
            continue
        first = k
        while first > 0 and lines[first - 1][2] in HEADER and \
                (at - lines[first - 1][0]).total_seconds() <= 5:
            first -= 1
        if found:
            found[-1].end = first
        before = lines[first - 1] if first else None
        found.append(Process(first, k, len(lines), after_done=before is not None and
                             before[3].startswith("done training") and
                             (lines[first][0] - before[0]).total_seconds() <= RESTART_S))
    for proc in found:
        own = [msg for _at, _lv, _lg, msg in lines[proc.config:proc.end]]
        proc.loaded = next((int(m[1]) for msg in own if (m := _LOADED.search(msg))), None)
        proc.done = any(msg.startswith("done training") for msg in own)
        cpu = re.search(r"(?:'cpu': |\bcpu=)(True|False)\b", own[0])  # (a Namespace's too)
        proc.cpu = None if cpu is None else cpu[1] == "True"
        proc.seeds = frozenset(int(m) for m in re.findall(r"(?:'seed': |\bseed=)(\d+)", own[0]))
        logdir = re.search(r"(?:'tensorboard_logdir': |\btensorboard_logdir=)'([^']*)'", own[0])
        proc.logdir = None if logdir is None else logdir[1]
    return found


def stamped_lines(text: str) -> list[tuple[datetime, str, str, str]]:
    """``(stamp, level, logger, message)`` of each line of a log that fairseq's logging wrote;
    a stamp that is no time is left to :func:`~finetune_lab.runs.measurements.log_stamps`."""
    lines = []
    for m in _LINE.finditer(text):
        try:
            lines.append((datetime.fromisoformat(m[1]), m[2], m[3], m[4]))
        except ValueError:
            continue
    return lines


def _process_problems(lines: Sequence[tuple[datetime, str, str, str]], proc: Process,
                      held: Sequence[bool]) -> list[str]:
    """A process's lines against its held ones: start-up, its first training line, the gaps of
    the lines no event file holds, and what it wrote after its last held line."""
    at = [line[0] for line in lines]
    first = at[proc.first]
    for k in range(proc.first + 1, proc.end):
        if not held[k] and (at[k] - at[k - 1]).total_seconds() > QUIET_S:
            return [f"its train.log's line \"{lines[k][3][:40]}\" is stamped {at[k]}, "
                    f"{(at[k] - at[k - 1]).total_seconds():.0f} s after the line before it: "
                    "no event file holds it, and fairseq writes such a line within "
                    f"{QUIET_S:.0f} s"]
    iterating = next((k for k in range(proc.config, proc.end)
                      if lines[k][3].startswith("Start iterating")), None)
    if iterating is not None and (at[iterating] - first).total_seconds() > STARTUP_S:
        return [f"its fairseq process that started at {first} began training at "
                f"{at[iterating]}: fairseq starts in under {STARTUP_S:.0f} s"]
    inner = next((k for k in range(proc.config, proc.end)
                  if held[k] and lines[k][2] == "train_inner"), None)
    if inner is not None and (at[inner] - first).total_seconds() > FIRST_TRAINING_S:
        return [f"its fairseq process that started at {first} logged its first training line "
                f"at {at[inner]}: start-up and one logging interval take under "
                f"{FIRST_TRAINING_S:.0f} s"]
    if iterating is not None and inner is not None and \
            (wall := _TRAIN_WALL.search(lines[inner][3])) is not None:
        began = at[inner] - timedelta(seconds=int(wall[1]))
        gap = (began - at[iterating]).total_seconds()
        if not TRAINING_START_S[0] <= gap <= TRAINING_START_S[1]:
            return [f"its train.log says training began at {at[iterating]}, but its first "
                    f"training line ({at[inner]}, train_wall {wall[1]} s) says {gap:+.0f} s "
                    "from that"]
    last_held = next((k for k in range(proc.end - 1, proc.config, -1) if held[k]), None)
    if last_held is not None and (at[proc.end - 1] - at[last_held]).total_seconds() > TRAILER_S:
        return [f"its fairseq process wrote lines until {at[proc.end - 1]}, "
                f"{(at[proc.end - 1] - at[last_held]).total_seconds():.0f} s after its last "
                f"line an event file holds: saving a checkpoint takes seconds"]
    return []


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> tuple[list[tuple[datetime, str, str, str]], list[Process],
                                tuple[str, ...]]:
    """A log's stamped lines, its processes, and what is wrong with its lines whatever its
    manifest says (parsed once per process and text: a copied run store's logs are read
    again; never change them)."""
    lines = stamped_lines(text)
    procs = processes(lines)
    if not lines:
        return lines, procs, ()
    if not procs or procs[0].first != 0:
        return lines, procs, ("its train.log does not begin with a fairseq process starting "
                              "(its configuration line)",)
    held = [held_line(level, logger, message) for _at, level, logger, message in lines]
    for proc in procs:
        if (why := _process_problems(lines, proc, held)):
            return lines, procs, tuple(why)
    return lines, procs, ()


def timeline_problems(text: str, man: dict[str, Any],
                      local: Sequence[tuple[datetime | None, datetime | None]]) -> list[str]:
    """A fairseq log's processes (:func:`processes`) against the run's launches (``segments``,
    ``local``: their starts and ends in the log's local time; none for a run in one launch):
    each launch begins with a process that loaded the update it went on from, any other
    process of it was started by its launcher after one finished, and a launch that ended
    paused or complete finished its last process (trial 25's R-k7); each process ran on the
    launch's device (R-k8); every line is tied to a line the event files hold
    (:func:`_process_problems`)."""
    lines, procs, why = _parsed(text)
    if why:
        return list(why)
    if (who := _identity_problem(lines, procs, man)):
        return [who]
    segments = [s if isinstance(s, dict) else {} for s in man.get("segments") or []]
    slack = timedelta(seconds=2)
    for i, (start, end) in enumerate(local or [(None, None)]):
        name = f"segments[{i}]" if start is not None else "its one launch"
        seg = segments[i] if segments else {}
        window = [k for k, line in enumerate(lines) if start is None or start - slack <= line[0]
                  and (end is None or line[0] <= end + slack)]
        mine = [p for p in procs if p.first in window]
        if window and (not mine or mine[0].first != window[0]):
            return [f"{name} holds lines of {lines[window[0]][0]} on that no fairseq process "
                    "it started wrote (a launch begins with fairseq starting)"]
        if segments and mine and mine[0].loaded is not None and \
                mine[0].loaded != seg.get("updates_from"):
            return [f"{name} goes on from update {seg.get('updates_from')}, but its fairseq "
                    f"process loaded the checkpoint of update {mine[0].loaded}"]
        for proc in mine[1:]:
            if not proc.after_done:
                return [f"{name} holds a fairseq process that started at "
                        f"{lines[proc.first][0]} after one that did not finish: a launch of "
                        "its own"]
        ended = seg.get("ended")  # (one killed may have finished, its end not yet recorded)
        if mine and ended in ("paused", "complete") and not mine[-1].done:
            return [f"{name} says it ended {ended}, but its fairseq process did not finish "
                    "(done training)"]
        device = (seg.get("device") or man.get("device") or {})
        on_cpu = device.get("type") == "cpu" if isinstance(device, dict) else None
        wrong = next((p for p in mine if on_cpu is not None and p.cpu != on_cpu), None)
        if wrong is not None:  # (no `cpu` at all: a configuration edited, check 26b's M-n4)
            return [f"{name} says it ran on the {device.get('type')}, but its fairseq process "
                    f"of {lines[wrong.first][0]} was configured with cpu={wrong.cpu}"]
    return []


def _identity_problem(lines: Sequence[tuple[datetime, str, str, str]], procs: Sequence[Process],
                      man: dict[str, Any]) -> str | None:
    """Each process's configuration against the run it is filed as: its seed and the folder
    it logged to (experiment/run, wherever the project was). A run relabelled as another seed,
    in its manifest, command and folder, still has the log it hashed (trial 27's M-m6)."""
    seed, experiment, run = man.get("seed"), man.get("experiment"), man.get("run")
    for proc in procs:
        at = lines[proc.first][0]
        if isinstance(seed, int) and proc.seeds and proc.seeds != {seed}:
            return (f"is seed {seed}, but its train.log's fairseq process of {at} was "
                    f"configured with seed {', '.join(map(str, sorted(proc.seeds)))}")
        if proc.logdir is None or not isinstance(experiment, str) or not isinstance(run, str):
            continue
        made = proc.logdir.replace("\\", "/").rstrip("/").split("/")[-2:]
        if made != [experiment, run]:
            return (f"is {experiment}/{run}, but its train.log's fairseq process of {at} "
                    f"logged to {'/'.join(made)}: the log of another run")
    return None

