"""The names records give weights (a probe's, fill-mask answers'): a name the runs know stands
for the weights known by it, whatever the record's path says (trials 13 to 19, W3: another
model's answers were shown under a run's, a candidate's or the packaged checkpoint's name). The
commands that write records ask the same before writing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from finetune_lab._files import regular_text
from finetune_lab.config import paths
from finetune_lab.errors import UserError
from finetune_lab.models.checkpoints import CHECKPOINT_NAME, MODEL_FILE
from finetune_lab.render_cache import per_render
from finetune_lab.runs.crosscheck import (CANDIDATE, PRETRAINING_EXPERIMENTS,
                                         candidate_name_problem, packaged_origin)
from finetune_lab.runs.manifest import loads_strict, weights_record
from finetune_lab.runs.reading import once_per_reading


RANDOM_NAME = "random"
"""The book's name for a random initialisation of the architecture: the probe table's row."""
RECORD_KINDS = ("probes", "fill-mask")
"""The folders of records under ``data/summaries/`` that name weights, one file per name."""


def name_problem(record: dict[str, Any], runs_base: Path,
                 packaged: tuple[str, str] | None, own: Path | str | None = None) -> str | None:
    """A record named after a pretraining run, or of a candidate's folder (named after its run),
    holds the weights known by that name wherever any are: those a run here packaged, continued
    or fine-tuned under it (trial 13's W3: the packaged weights recorded as `cpu-long` were
    shown as cpu-long's; trial 17's W3-v4/v5: other weights packaged into a candidate's folder
    were shown as the candidate's). ``random`` is a random initialisation's; any name, the
    user's own too, holds the weights its records of the other kind hold
    (:func:`other_record_problem`; ``own``: the record's file or kind)."""
    name, path = record.get("name"), record["checkpoint"].get("path")
    if isinstance(name, str) and name.casefold() == RANDOM_NAME:  # trial 20's W3-z1 (`Random`)
        return (f"is the book's name for a random initialisation (`probe --random`), but holds "
                f"trained weights ({path}): record them under another --name")
    if isinstance(name, str) and (twin := _case_twin(name, runs_base)) is not None:
        return (f"differs only in case from {twin}, a name the runs know for weights: record "
                f"them under {twin} (if they are its) or a name of your own")  # 21's W3-c2
    if (problem := candidate_name_problem(name, path, runs_base)) is not None:
        return problem
    if (problem := _known_weights_problem(record, runs_base, packaged)) is not None:
        return problem
    return other_record_problem(name, record["checkpoint"].get("sha256"), own or (
        "probes" if "init" in record else "fill-mask")) if isinstance(name, str) else None


def _case_twin(name: str, runs_base: Path) -> str | None:
    """A name the runs know (a pretraining run's, a package's, the packaged checkpoint's) that
    ``name`` spells in other case (`CPU-SINPOS1`), so the book would show two rows that read as
    one name; None when there is none, or ``name`` is that name."""
    known = {CHECKPOINT_NAME, *run_names(runs_base),
             *(n for names in packages_made(runs_base).values() for n in names)}
    if name in known:
        return None
    base = re.sub(r"-u\d+$", "", name, flags=re.IGNORECASE)  # a candidate (RUN-uN) of a run
    return next((k for k in sorted(known) if k.casefold() in {name.casefold(), base.casefold()}
                 and k not in (name, base)), None)


@once_per_reading
def run_names(runs_base: Path) -> frozenset[str]:
    """The pretraining runs' names (of every pretraining experiment), listed once in a reading
    of the book, not once per record."""
    return frozenset(p.name for exp in PRETRAINING_EXPERIMENTS if (runs_base / exp).is_dir()
                     for p in (runs_base / exp).iterdir() if p.is_dir())


def _known_weights_problem(record: dict[str, Any], runs_base: Path,
                           packaged: tuple[str, str] | None) -> str | None:
    """:func:`name_problem` for the names the runs know (a run's, a candidate's, a package's)."""
    name, path = record.get("name"), record["checkpoint"].get("path")
    candidate = CANDIDATE.fullmatch(path) if isinstance(path, str) else None
    # a run of any pretraining experiment (trial 14's W3: pretrain-gpu, pretrain-ablation)
    run_named = isinstance(name, str) and name in run_names(runs_base)
    label = candidate["name"] if candidate else name
    sha = record["checkpoint"]["sha256"]
    made_by = {k: set(v) for k, v in packages_made(runs_base).items()}  # sha256 -> run names
    if packaged is not None:  # and the packaged checkpoint's folder's (trial 19's W3-y2)
        made_by.setdefault(packaged[0], set()).update({packaged[1].rsplit("/", 1)[-1],
                                                       CHECKPOINT_NAME})
    if candidate is None and not run_named and not any(label in n for n in made_by.values()):
        return None  # a name of the user's own (trial 18's W3-v6: a candidate's, elsewhere)
    known = sorted(s for s, names in made_by.items() if label in names)
    # its own weights: known by its name, or (a candidate at update N of a run) by its run's
    if sha in known or (candidate is not None and candidate["run"] in made_by.get(sha, ())):
        return None
    if sha in made_by:
        said = f"packaged by {', '.join(sorted(made_by[sha]))}"
    elif known:
        said = f"not the weights runs here know as {label}, sha256 {known[0][:12]}…"
    elif candidate is None:
        said = "weights no run here packaged or fine-tuned"
    else:
        return None  # a candidate no run fine-tuned: the record readers compare its folder
    named = "the packaged checkpoint" if label == CHECKPOINT_NAME else "the pretraining run"
    return (f"is named after {named} {label}, but holds other weights ({path}, {said}): "
            "record them under another --name")  # trials 15 to 19: W3


@per_render
@once_per_reading
def packages_made(runs_base: Path) -> dict[str, list[str]]:
    """``{sha256: run names}`` of every package a pretraining run continued (its
    ``continued_from``) and every candidate a run fine-tuned (its checkpoint input): trials 15
    and 16's W3, weights recorded under another run's name were shown as that run's."""
    found: dict[str, list[str]] = {}
    for man in sorted(runs_base.glob("*/*/manifest.json")):
        try:
            data = loads_strict(regular_text(man))
            if man.parent.parent.name.startswith("pretrain"):
                source = data["extra"]["continued_from"]
                sha, name = str(source["sha256"]), Path(str(source["run"])).name
            elif (start := CANDIDATE.fullmatch(str(data["inputs"]["checkpoint"]["path"]))):
                sha, name = str(data["inputs"]["checkpoint"]["sha256"]["."]), start["name"]
            else:
                continue
            if name not in found.setdefault(sha, []):
                found[sha].append(name)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a random start, or a damaged manifest (the registry names it)
    return found


def check_record_name(name: str, folder: Path, record: Path) -> None:
    """Refuse, before any work, to write a record under a name the runs know for other weights
    than those in ``folder`` (the check :func:`name_problem` makes when the book reads it)."""
    if not (Path(folder) / MODEL_FILE).is_file():
        return  # the command's own reading of the folder says what is wrong with it
    weights = weights_record(folder, record)
    if (problem := name_problem({"name": name, "checkpoint": weights}, paths().runs,
                                packaged_origin(), Path(record))) is not None:
        raise UserError(f"--name {name} {problem}")


def other_record_problem(name: str, sha: str | None, own: Path | str) -> str | None:
    """Records of the other kind under ``name`` (a probe's and fill-mask answers') must name the
    same weights (``sha`` None: a random initialisation): in the book one name is one set of
    weights, when a command writes a record and when the book reads them (trial 20's W3-z,
    20b's W3-b5). ``own``: the record's file, or its kind (:data:`RECORD_KINDS`)."""
    for kind in RECORD_KINDS:
        other = paths().summaries / kind / f"{name}.json"
        if kind == own or not other.is_file() or (
                isinstance(own, Path) and other.resolve() == own.resolve()):
            continue
        held_by = weights_by_name(paths().summaries / kind)
        if name not in held_by:
            continue  # a damaged record: the book sets it aside and says why
        held = held_by[name]
        if held != sha:
            return (f"names other weights than {kind}/{name}.json does "
                    f"({'a random initialisation' if held is None else held[:12] + '…'}): "
                    "record them under another --name")
    return None


@once_per_reading
def weights_by_name(folder: Path) -> dict[str, str | None]:
    """``{name: sha256}`` of the weights each readable record in ``folder`` names (None: a
    random initialisation), read once in a reading of the book, not once per record."""
    held: dict[str, str | None] = {}
    for record in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = loads_strict(regular_text(record))
            held[record.stem] = None if data.get("init") == "random" else str(
                data["checkpoint"]["sha256"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a damaged record: the book sets it aside and says why
    return held


def known_name_problem(name: object, runs_base: Path,
                       packaged: tuple[str, str] | None) -> str | None:
    """A random initialisation's record under a name the runs know for weights (a run's, a
    candidate ``RUN-uN``'s, the packaged checkpoint's: 19b's N4, `probe --random --name
    cpu-long3` stood in the probe table as cpu-long3)."""
    if not isinstance(name, str):
        return None
    taken = re.fullmatch(r"(?P<run>.+)-u\d+", name)
    runs = {name, taken["run"]} if taken else {name}
    made = {n for names in packages_made(runs_base).values() for n in names}
    if name == CHECKPOINT_NAME and packaged is not None or name in made \
            or runs & run_names(runs_base):
        return (f"is a random initialisation under {name}, a name the runs know for trained "
                "weights: record it under another --name")
    return None


def check_random_name(name: str, record: Path) -> None:
    """:func:`known_name_problem` and :func:`other_record_problem`, before a random
    initialisation is probed."""
    if (problem := known_name_problem(name, paths().runs, packaged_origin())
            or other_record_problem(name, None, record)) is not None:
        raise UserError(f"--name {name} {problem}")
