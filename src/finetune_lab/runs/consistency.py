"""What a run's manifest says twice must agree with itself (issue 35, silent wrong results).

The schema checks each field alone; an edited field that stays in range (a wall time of 60,000 s,
50 updates/s, a seed renamed in a copied run) passed it and changed a table. These checks
compare the fields the book reads with what else records the same fact: the start and end
times, the command line, the run's own ``train.log`` (hashed since it is read) and event files,
its launches (``segments``), and across an experiment the other runs of the same method
(:mod:`~finetune_lab.runs.crosscheck` holds a run against records outside it).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from finetune_lab.runs.derived_counts import derived_count_problems
from finetune_lab.runs.evaluations import (accuracy_problems, log_problems, subset_problems,
                                           trainer_loss_problems)
from finetune_lab.runs.eventfiles import peak_learning_rate, wall_span
from finetune_lab.runs.experiments import check_hyperparameters
from finetune_lab.runs.fairseq_logs import log_rates
from finetune_lab.runs.file_facts import file_fact_problems
from finetune_lab.runs.log_config import config_problems
from finetune_lab.runs.measurements import (log_clock_problems, log_time_problems,
                                            measurement_problems, peak_problems, pretraining)
from finetune_lab.runs.recorded_facts import fact_problems
from finetune_lab.runs.run_inputs import cached_sha256

CLOCK_SLACK_S = 2.0
"""Start and end times are recorded to the second; a wall time is measured to the millisecond."""
RATE_TOLERANCE = 0.01
"""A recorded rate and the one its log gives again: the same median, up to a log line written
after the rate was taken (0.35 % in the one committed run where that happened)."""
TIMED_SHARE = 0.95
"""The least share of a run's wall time that ``extra.time_s`` (the timed training and
evaluation) covers: 98 to 100 % in every recorded run; loading lies outside both (trial 29's
R-1: at 80 %, a GPU run's 141 s stretched to 160 s passed)."""
UNTIMED_S = 5.0
"""What a run may spend outside its timed part whatever its length (a tiny test run of a
second, on a loaded machine: 0.2 s of 0.8)."""


class Judged(Protocol):
    """The registry's record, as these checks read and fill it."""

    path: Path
    experiment: str
    name: str
    manifest: dict[str, Any] | None
    problems: list[str]

    @property
    def valid(self) -> bool: ...


def recorded_time(value: Any) -> datetime | None:
    """A manifest's or record's ISO time with its UTC offset (None when it is none, or has no
    offset, which no other time can be compared with: trial 13's PR-i crashed a chapter)."""
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    # a time before the runs' era cannot be compared either (trial 15's PR1: year 1 at +14:00
    # overflowed the subtraction of a wall time)
    return when if when.tzinfo is not None and 1970 <= when.year < 9999 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def time_problems(man: dict[str, Any]) -> list[str]:
    """The wall time against the run's start and end (and its launches' own wall times)."""
    start, end, wall = recorded_time(man.get("start_time")), recorded_time(man.get("end_time")), \
        _number(man.get("wall_time_s"))
    if start is None or end is None or wall is None:
        return []
    span = (end - start).total_seconds()
    if wall > span + CLOCK_SLACK_S:
        return [f"wall_time_s {wall:g} s is longer than the {span:g} s from its start_time to "
                "its end_time"]
    segments = man.get("segments") or []
    walls = [_number(s.get("wall_time_s")) or 0.0 for s in segments if isinstance(s, dict)]
    if segments:  # each launch records its end (measurements.launch_problems)
        if abs(sum(walls) - wall) > CLOCK_SLACK_S:
            return [f"wall_time_s {wall:g} s is not the sum of its launches' wall times "
                    f"({sum(walls):g} s)"]
    elif not segments and abs(span - wall) > CLOCK_SLACK_S:
        return [f"wall_time_s {wall:g} s disagrees with the {span:g} s from its start_time to "
                "its end_time (one launch)"]
    extra = man.get("extra") or {}
    timed = _number(extra.get("time_s")) if isinstance(extra, dict) else None
    untimed = max((1 - TIMED_SHARE) * wall, UNTIMED_S)  # a second of start-up is most of a
    if timed is not None and not wall - untimed <= timed <= wall + CLOCK_SLACK_S:  # tiny run
        return [f"extra.time_s {timed:g} s is not the {int(100 * TIMED_SHARE)} to 100 % of "
                f"wall_time_s ({wall:g} s) that the timed part of a run takes"]
    return []


def seed_problems(man: dict[str, Any]) -> list[str]:
    """The seed against the command line that ran the run (``--seed N``, ``--seeds A B``)."""
    command = [str(t) for t in man.get("command") or []]
    seed = str(man.get("seed"))
    for i, token in enumerate(command):
        if token == "--seed" and i + 1 < len(command) and command[i + 1] != seed:
            return [f"seed {seed} contradicts its command line (--seed {command[i + 1]})"]
        if token == "--seeds":
            listed = [t for t in _values_after(command, i)]
            if listed and seed not in listed:
                return [f"seed {seed} is not among its command line's --seeds "
                        f"({' '.join(listed)})"]
    return []


FLAG_OF = {"total_updates": ("--total-num-update",), "epochs": ("--max-epoch", "--epochs")}
"""Recipe keys whose command-line flag is not the key with dashes: fairseq's, then this CLI's
(trial 22's M-d5: `finetune transformers --epochs 7` beside 5 recorded epochs passed)."""


def _flags(command: Sequence[str]) -> dict[str, list[str]]:
    return {t: list(_values_after(command, i)) for i, t in enumerate(command) if t.startswith("--")}


def _same(recorded: Any, given: str) -> bool:
    if isinstance(recorded, (int, float)):
        try:
            return math.isclose(float(given), float(recorded), rel_tol=1e-9)
        except ValueError:
            return False
    return given == str(recorded)


def command_problems(man: dict[str, Any]) -> list[str]:
    """Each recipe value the command line also gives (``hyperparameters.lr`` against ``--lr``,
    ``total_updates`` against ``--total-num-update``): the command is what ran. With
    ``--max-tokens`` a pretraining batch is that many tokens (``--batch-size`` is only a cap)."""
    command = [str(t) for t in man.get("command") or []]
    flags, hp = _flags(command), man.get("hyperparameters") or {}
    wanted = {key: (next((f for f in FLAG_OF.get(key, ()) if f in flags),
                         "--" + key.replace("_", "-")), value)
              for key, value in hp.items()
              if isinstance(value, (int, float, str)) and not isinstance(value, bool)}
    if "--max-tokens" in flags and isinstance(hp.get("tokens_per_sample"), int) \
            and isinstance(hp.get("batch_size"), int):
        wanted["batch_size"] = ("--max-tokens", hp["tokens_per_sample"] * hp["batch_size"])
    problems = []
    for key, (flag, value) in sorted(wanted.items()):
        given = flags.get(flag)
        if given and len(given) == 1 and not _same(value, given[0]):
            problems.append(f"hyperparameters.{key} {value} contradicts its command line "
                            f"({flag} {given[0]})")
    return problems


def _values_after(command: Sequence[str], i: int) -> Iterable[str]:
    for token in command[i + 1:]:
        if token.startswith("--"):
            return
        yield token


_RATES: dict[str, dict[str, float]] = {}
"""fairseq's rates by the sha256 of the log they were read from: every listing of the runs
checks them, and the registry has hashed the log already."""


def _log_rates(log: Path) -> dict[str, float]:
    digest = cached_sha256(log)
    if digest not in _RATES:
        _RATES[digest] = log_rates(log.read_text(encoding="utf-8", errors="replace"))
    return _RATES[digest]


def throughput_problems(path: Path, man: dict[str, Any]) -> list[str]:
    """fairseq's median rates recorded in ``throughput`` against the run's ``train.log``, where
    the manifest hashes the log (so the log itself has been checked)."""
    recorded, log = man.get("throughput") or {}, path / "train.log"
    if not isinstance(recorded, dict) or "train.log" not in (man.get("logs") or {}) \
            or not log.is_file():  # a listed log that is gone: the registry says so
        return []
    wanted = {k: _number(recorded.get(k)) for k in ("updates_per_s", "tokens_per_s")}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    if not wanted:
        return []
    rates = _log_rates(log)
    return [f"throughput.{k} {v:g} disagrees with its train.log ({rates.get(k, 'no rate'):g})"
            if k in rates else f"throughput.{k} {v:g} but its train.log logs no rate"
            for k, v in wanted.items()
            if k not in rates or abs(rates[k] - v) > RATE_TOLERANCE * max(abs(v), 1e-12)]


_EVENT_TIME = re.compile(r"events\.out\.tfevents\.(\d+)\.")


def event_time_problems(events: Sequence[Path], man: dict[str, Any]) -> list[str]:
    """The start and end times against the event files' own names, which hold the second each
    was created (hashed when the run ended): a run moved in time moved between machine layouts."""
    start, end = recorded_time(man.get("start_time")), recorded_time(man.get("end_time"))
    if start is None:
        return []
    for f in events:
        if (found := _EVENT_TIME.match(f.name)) is None:
            continue
        made = datetime.fromtimestamp(int(found[1]), tz=timezone.utc)
        if (start - made).total_seconds() > CLOCK_SLACK_S or (
                end is not None and (made - end).total_seconds() > CLOCK_SLACK_S):
            return [f"event file {f.name} was created at {made.isoformat()}, outside the run's "
                    f"start_time to end_time"]
    return []


def device_problems(man: dict[str, Any]) -> list[str]:
    """The device's name against what else names it: the CPU's model on a CPU run, the GPUs'
    names on a GPU run, the device (and the GPU) its peak memory was measured on."""
    device = man.get("device") or {}
    name = device.get("name")
    if device.get("type") == "cpu" and device.get("cpu") not in (None, name):
        return [f"device.name {name!r} is not its device.cpu {device.get('cpu')!r}"]
    if device.get("type") == "cuda" and device.get("names") and name not in device["names"]:
        return [f"device.name {name!r} is not among its device.names {device['names']}"]
    threads, cores = device.get("threads"), device.get("cpu_count")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in (threads, cores)) \
            and threads > cores:  # the split of a machine's cores; the layout table reads it
        return [f"device.threads {threads} is more than its device.cpu_count {cores}"]
    extra = man.get("extra") if isinstance(man.get("extra"), dict) else {}
    peak, rss = extra.get("peak_memory"), extra.get("cpu_peak_rss")
    if isinstance(peak, dict) and peak.get("device") not in (None, device.get("type")):
        return [f"extra.peak_memory was measured on {peak.get('device')!r}, not on its device "
                f"({device.get('type')!r})"]
    if isinstance(peak, dict) and peak.get("device") == "cuda" and peak.get("gpu") != name:
        return [f"extra.peak_memory.gpu {peak.get('gpu')!r} is not its device {name!r}"]  # M-e3
    if isinstance(peak, dict) and isinstance(rss, dict) and peak.get("device") == "cpu" \
            and peak.get("bytes") != rss.get("bytes"):
        return [f"extra.peak_memory.bytes {peak.get('bytes')} is not its extra.cpu_peak_rss "
                f"({rss.get('bytes')}), the same measure on a CPU run"]
    return []


LINEAR = "polynomial_decay"
"""The recipes' scheduler (power 1); a pretraining run's recipe names none and uses it."""


def _schedule(k: int, warmup: int, total: int) -> float:
    """The share of the peak learning rate at update ``k``: a linear warm-up over ``warmup``
    updates, then a linear decay to 0 at ``total`` (fairseq's polynomial_decay of power 1 and
    the Trainer's "linear", the one schedule every run here uses)."""
    if k < warmup:
        return k / warmup
    return max(0.0, (total - k) / (total - warmup)) if total > warmup else 0.0


def learning_rate_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """``hyperparameters.lr`` against the learning rate the event files log. The Trainer logs
    the rate of the update before the logged step and fairseq the rate of the logged step, so
    the peak the schedule gives from the highest logged rate is taken at both."""
    hp = man.get("hyperparameters") or {}
    lr, warmup = _number(hp.get("lr")), _number(hp.get("warmup_updates"))
    total = _number(hp.get("total_updates", hp.get("max_update")))
    if None in (lr, warmup, total) or hp.get("lr_scheduler", LINEAR) != LINEAR:
        return []
    logged = peak_learning_rate(list(events))
    if logged is None:
        return []
    step, value = logged
    shares = [f for k in (step, step - 1) if (f := _schedule(k, int(warmup), int(total))) > 0]
    if not shares or lr <= 0 or value <= 0:  # a rate of 0 (the last update) says no peak
        return []
    low, high = value / max(shares), value / min(shares)
    if low * (1 - RATE_TOLERANCE) <= lr <= high * (1 + RATE_TOLERANCE):
        return []
    return [f"hyperparameters.lr {lr:g} disagrees with its event files, which log {value:.4g} at "
            f"update {step} (a peak of {low:.4g} on its {int(warmup)}-update warm-up and "
            f"{int(total)}-update schedule)"]


EVENTS_BEFORE_END_S = (10.0, 180.0)
"""The most a fine-tuning run, and a pretraining run, goes on after its last event: the
manifest is written (2.4 s at most in the committed fine-tuning runs), and a pretraining run
packages its weights (82 s). Trial 23's M-g: 120 s let a run's minutes grow unseen; trial 29's
R-1: 30 s, a GPU run's by 19 s."""
FIRST_EVENT_S = {"fairseq": 600.0, "transformers": 10.0}
"""The most a run takes to log its first event, by framework: a fairseq run loads its corpus
and model first (up to 52 s for a fine-tuning run, 101 s for a pretraining run, in the
committed runs; its train.log bounds it closer: ``measurements.log_time_problems``); a
Transformers or peft run records its start as the trainer opens its event file (under 1.5 s
in every committed run), so an earlier start_time is an edit."""


def clock_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """The start and end times against the wall-clock times the event files record: an edited
    end time (and wall time to match) moved a run's minutes in every speed table."""
    span, start, end = wall_span(events), recorded_time(man.get("start_time")), recorded_time(man.get("end_time"))
    if span is None or start is None or end is None:
        return []
    first, last = span
    after_last, before_first = end.timestamp() - last, first - start.timestamp()
    problems = []
    if not -CLOCK_SLACK_S <= after_last <= EVENTS_BEFORE_END_S[pretraining(man)]:
        problems.append(f"end_time {man['end_time']} is {abs(after_last):.0f} s "
                        f"{'after' if after_last > 0 else 'before'} its event files' last event")
    if not -CLOCK_SLACK_S <= before_first <= FIRST_EVENT_S.get(man.get("framework"), 600.0):
        problems.append(f"start_time {man['start_time']} is {abs(before_first):.0f} s "
                        f"{'before' if before_first > 0 else 'after'} its event files' first "
                        "event")
    return problems


def progress_problems(man: dict[str, Any], last_step: int) -> list[str]:
    """``updates_done`` against the last update the event files log, and the launches'
    (``segments``) updates and devices against the run's: the pretraining tables read the
    totals, and each launch records them again."""
    problems, done = [], man.get("updates_done")
    if isinstance(done, int) and not isinstance(done, bool) and last_step and done != last_step:
        problems.append(f"updates_done {done} but its event files end at update {last_step}")
    segments = [s for s in man.get("segments") or [] if isinstance(s, dict)]
    reached = [s.get("updates_to") for s in segments]
    if segments and isinstance(done, int) and reached[-1] != done:
        problems.append(f"updates_done {done} but its last launch ended at update {reached[-1]}")
    if segments and _canon(man.get("device")) not in {_canon(s.get("device")) for s in segments}:
        problems.append("device is none of its launches' devices (segments[].device)")
    return problems


def manifest_contradictions(path: Path, man: dict[str, Any], events: Sequence[Path],
                            last_step: int = 0) -> list[str]:
    """Every check above, on a manifest whose shape passed the schema (``events``: the run's
    event files, which the registry has listed already; ``last_step``: the last update they
    log)."""
    return (progress_problems(man, last_step) + time_problems(man) + clock_problems(man, events)
            + event_time_problems(events, man) + seed_problems(man) + command_problems(man)
            + file_fact_problems(man, events)
            + throughput_problems(path, man) + device_problems(man)
            + learning_rate_problems(man, events) + derived_count_problems(man)
            + subset_problems(path, man, events, _valid_subset(man))
            + accuracy_problems(path, man, events, _valid_subset(man))
            + log_problems(path, man, events)
            + trainer_loss_problems(path, man, events) + measurement_problems(man, events)
            + log_time_problems(path, man) + log_clock_problems(path, man, events)
            + config_problems(path, man) + fact_problems(path, man, events))


def _valid_subset(man: dict[str, Any]) -> str | None:
    given = _flags([str(t) for t in man.get("command") or []]).get("--valid-subset")
    return str(given[0]) if given else None


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _flag_minority(group: Sequence[Judged], value: Any, what: str) -> None:
    """Flag each run of ``group`` whose ``value(run)`` differs from a strict majority's (with no
    majority, every run that disagrees)."""
    counts = Counter(_canon(value(r)) for r in group)
    if len(counts) < 2:
        return
    top, n = counts.most_common(1)[0]
    majority = top if n * 2 > len(group) else None
    for rec in group:
        if _canon(value(rec)) != majority:
            rec.problems.append(f"{what} {_canon(value(rec))} differ from those of the other "
                                f"runs of the same method in {rec.experiment} "
                                f"({len(group) - 1} others)")


def _extra(rec: Judged) -> dict[str, Any]:
    extra = (rec.manifest or {}).get("extra")
    return extra if isinstance(extra, dict) else {}


def _hyperparameters(rec: Judged) -> dict[str, Any]:
    return dict((rec.manifest or {}).get("hyperparameters") or {})


def count_problems(records: Sequence[Judged]) -> None:
    """Runs of one experiment and method have the same recipe (the seed and init aside; the
    experiment's ``experiment.json`` lets methods differ, not seeds of one method) and the same
    model, so the same ``extra.parameters``, and on one GPU model the same peak memory: a run
    that differs from a strict majority of its group is flagged."""
    valid = [r for r in records if r.valid]
    by_method: dict[str, list[Judged]] = defaultdict(list)
    by_recipe: dict[str, list[Judged]] = defaultdict(list)
    for rec in valid:
        method = _extra(rec).get("method")
        if isinstance(method, str):
            by_method[_canon([rec.experiment, method])].append(rec)
        if isinstance(_extra(rec).get("parameters"), dict):
            by_recipe[_canon([rec.experiment, method, _hyperparameters(rec)])].append(rec)
    for group in by_method.values():  # as an experiment without experiment.json is judged
        check_hyperparameters(group, None)
    for group in by_recipe.values():
        _flag_minority(group, lambda r: _extra(r)["parameters"], "extra.parameters")
    peak_problems(valid, _extra)  # trial 22's M-d, 22b's M-e
