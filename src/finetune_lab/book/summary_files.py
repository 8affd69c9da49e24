"""Committed summary files (probes, fill-mask answers) read so that one bad file never takes a
chapter down: each is parsed strictly and checked for the fields the book reads; a damaged one
is set aside with one line naming it and what is wrong, as the registry does for runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from finetune_lab._files import regular_text
from finetune_lab.runs.consistency import recorded_time
from finetune_lab.runs.crosscheck import CANDIDATE, weights_made_from
from finetune_lab.runs.manifest import hidden, loads_strict, outside_project, portable_path
from finetune_lab.runs.reading import reads_once
from finetune_lab.runs.record_names import name_problem, packages_made  # noqa: F401 (tests)

Field = tuple[Any, ...]
"""A path of keys into the record, the type(s) its value must have, and optionally the closed
range ``(low, high)`` a number must lie in (a probability of 7.5 was a number too)."""
NUMBER = (int, float)
PERCENT = (0.0, 100.0)
PROBABILITY = (0.0, 1.0)


def summary_problem(record: Any, fields: Sequence[Field]) -> str | None:
    """What is wrong with ``record`` for a reader of ``fields`` (None: nothing)."""
    if not isinstance(record, dict):
        return f"holds a {type(record).__name__}, not a record"
    for path, kind, *within in fields:
        value: Any = record
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return f"lacks {'.'.join(path)}"
            value = value[key]
        if not isinstance(value, kind) or isinstance(value, bool) or (
                isinstance(value, float) and not math.isfinite(value)):
            return f"has {'.'.join(path)} = {value!r}, not {_kind_name(kind)}"
        if within and not within[0][0] <= value <= within[0][1]:
            low, high = within[0]
            return f"has {'.'.join(path)} = {value!r}, outside {low:g} to {high:g}"
    return None


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if kind == NUMBER:
        return "a finite number"
    names = {str: "a string", list: "a list", dict: "a mapping"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))  # type: ignore[arg-type]


def read_json_files(folder: Path, problem: Any, pattern: str = "*.json"
                    ) -> tuple[list[tuple[Path, Any]], list[str]]:
    """Every file of ``folder`` matching ``pattern`` that parses (strict JSON: no NaN) and of
    which ``problem(record)`` says nothing (None), with its path, in name order; and one line
    per file set aside."""
    good, bad = [], []
    for path in sorted(Path(folder).glob(pattern)):
        if hidden(path.name):  # not committed, not hashed by the freeze: not read
            continue
        try:
            record = loads_strict(regular_text(path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            bad.append(f"`{path.name}` cannot be read as JSON ({str(exc).splitlines()[0]})")
            continue
        if (why := problem(record)) is not None:
            bad.append(f"`{path.name}` {why}")
        else:
            good.append((path, record))
    return good, bad


@reads_once  # the store's packages, read once for all its records (packages_made)
def read_records(folder: Path, fields: Sequence[Field],
                 more: Any = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Every ``*.json`` of ``folder`` that parses (strict JSON: no NaN), has ``fields`` and is
    named as it names itself, in name order; and one line per file set aside, in name order.
    ``more(record)`` may return a further problem (or None)."""
    in_project = not outside_project(str(portable_path(folder)))
    good, bad = read_json_files(folder, lambda record: summary_problem(record, fields)
                                or (weights_outside(record) if in_project else None)
                                or (more(record) if more else None))
    kept = []
    for path, record in good:  # NAME.json names itself NAME: a renamed copy read as its source,
        # and a candidate's record its weights' folder (trial 9: another's weights took its result)
        checkpoint = record.get("checkpoint")
        weights = CANDIDATE.fullmatch(str(checkpoint.get("path"))) \
            if isinstance(checkpoint, dict) else None
        if isinstance(record.get("name"), str) and record["name"] != path.stem:
            bad.append(f"`{path.name}` is the record of {record['name']!r} (a copy under another "
                       "name?): a record is kept as NAME.json")
        elif weights is not None and weights["name"] != path.stem:
            bad.append(f"`{path.name}` names the weights of {weights['name']!r} "
                       f"({checkpoint['path']}): a candidate's record is named after its weights")
        else:
            kept.append(record)
    return kept, sorted(bad)


def weights_outside(record: dict[str, Any]) -> str | None:
    """A record of the book's (inside the project) names weights inside it: the book reads
    their folder, and what it reads must be something the freeze can name (trial 16's CF-v2:
    whether ``/tmp/...`` existed decided whether a damaged record was shown)."""
    checkpoint = record.get("checkpoint")
    stored = checkpoint.get("path") if isinstance(checkpoint, dict) else None
    if isinstance(stored, str) and outside_project(stored):
        return (f"names weights outside the project ({stored}), which the book cannot keep "
                "track of: ask again with them copied to data/work/candidates/<name>/")
    return None


def set_aside_markdown(bad: Sequence[str], what: str, fix: str) -> str:
    """A paragraph listing the files set aside (empty when none is)."""
    if not bad:
        return ""
    return (f"{len(bad)} {what} file{'s were' if len(bad) != 1 else ' was'} set aside, damaged "
            f"({fix}):\n\n" + "\n".join(f"- {line}" for line in bad) + "\n")


def device_problem(record: dict[str, Any]) -> str | None:
    """A record's device is named as one is: a CPU by its processor, a GPU by another name."""
    device = record.get("device") if isinstance(record.get("device"), dict) else {}
    if (device.get("type") == "cpu") != (device.get("name") == device.get("cpu")):
        return (f"says device type {device.get('type')!r} named {device.get('name')!r} on the "
                f"processor {device.get('cpu')!r}: a CPU is named by its processor, a GPU not")
    return None


def weights_record_problem(record: dict[str, Any], runs_base: Path,
                           packaged: tuple[str, str] | None) -> str | None:
    """A record of pretrained weights (a probe, fill-mask answers) names them by sha256 and was
    started (its time less its wall time) after they were made (trials 11 and 12's PR12, FM12:
    a record older than its weights was shown as theirs)."""
    problem = summary_problem(record, ((("checkpoint", "sha256"), str), (("time",), str),
                                       (("wall_time_s",), NUMBER, (0, 1e7))))
    if problem is not None:
        return problem
    if (problem := name_problem(record, runs_base, packaged)) is not None:
        return problem
    made = weights_made_from(record["checkpoint"].get("path"), record["checkpoint"]["sha256"],
                             runs_base, packaged)
    began = recorded_time(record["time"])
    if made is not None and began is not None:
        began -= timedelta(seconds=float(record["wall_time_s"]))
    if made is not None and (began is None or began < made):
        when = "an unknown time" if began is None else f"{began:%Y-%m-%d %H:%M:%S}"
        return (f"started at {when} ({record['time']} less its {record['wall_time_s']:g} s), "
                f"before its weights were made at {made:%Y-%m-%d %H:%M:%S}: its checkpoint, its "
                "time or its wall time was edited")
    return None
