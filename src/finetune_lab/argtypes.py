"""argparse types that check a value before anything starts (issue 19): a bad ``--seeds -1``
or ``--epochs 0`` is a one-line usage error, not a fairseq traceback and a failed run folder."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from finetune_lab.errors import UserError


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


MAX_SEED = 2**32 - 1
"""numpy's and the run manifest's largest seed (trial 13's X7: one past it started fairseq,
which failed, and left a failed run in the run store)."""


def seed_arg(text: str) -> int:
    """A seed: 0 to :data:`MAX_SEED`."""
    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SEED}, not {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def port(text: str) -> int:
    """A TCP port, 1 to 65535 (trial 30's E-18: 99999 started fairseq, which failed)."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be at most 65535, not {value}")
    return value


def bounded_workers(text: str) -> int:
    """Worker processes: 1 to 256 (trial 30's E-12: 100000 forked hundreds of processes a
    second, and Ctrl-C could not stop them)."""
    value = positive_int(text)
    if value > 256:
        raise argparse.ArgumentTypeError(f"must be at most 256, not {value}")
    return value


def python_version(text: str) -> str:
    """A CPython 3 version as pip's ``--python-version`` takes it (trial 30's E-14)."""
    if not re.fullmatch(r"3\.\d{1,2}", text):
        raise argparse.ArgumentTypeError(f"must be a Python version such as 3.12, not {text!r}")
    return text


def segment_minutes(text: str) -> float:
    """A launch's length: 2 minutes at least, since a launch with less than a minute left stops
    before training (trial 15's W2-n3: `--segment-minutes 1` trained nothing)."""
    value = positive_float(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be 2 minutes or more (a launch needs a minute "
                                         f"to start), not {text}")
    return value


def positive_float(text: str) -> float:
    """More than 0 and finite: ``1e400`` reads as infinity, which no budget can be divided by
    (it reached the trainer as an OverflowError)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def non_negative_float(text: str) -> float:
    """0 or more and finite (a weight, or a budget where 0 means "the default")."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, not {text}")
    return value


def probability(text: str) -> float:
    """A dropout rate: at least 0 and less than 1."""
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and less than 1, not {text}")
    return value


def fraction(text: str) -> float:
    """A share from 0 to 1, both included (``--tapt-fraction 1``: task texts only)."""
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, not {text}")
    return value


def folder(text: str) -> Path:
    """A folder argument: a file there is refused now, said as it is (it was reported as a
    folder that "is missing", or ended in a NotADirectoryError traceback)."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    return path


def resolved_folder(text: str) -> Path:
    """:func:`folder`, resolved as :func:`resolved_path` is."""
    return folder(text).resolve()


def resolved_path(text: str) -> Path:
    """A path resolved against the current directory now, so that a step that runs a tool in
    another folder (``fairseq-preprocess`` runs in a scratch folder) still finds it."""
    return Path(text).expanduser().resolve()


def run_name(text: str) -> str:
    """``--run``: a name, when given (trial 20's X-z1: ``--run ""`` from an unset variable ran
    as the default run)."""
    if not text:
        raise argparse.ArgumentTypeError("is empty: give a name, or drop --run for the default")
    if text == "experiment.json":  # the experiment's own file (trial 29's L-15: 70 s of work)
        raise argparse.ArgumentTypeError("is the file that pins the experiment's recipe, not a "
                                         "run: choose another name")
    return text


def experiment_name(text: str) -> str:
    """``--experiment``: a name, when given (trial 29's E-10: ``--experiment ""`` from an unset
    variable ran in the default experiment, the book's own grid)."""
    if not text:
        raise argparse.ArgumentTypeError("is empty: give a name, or drop --experiment for the "
                                         "default")
    return text


def record_name(name: str) -> str:
    """``--name`` of a record kept as ``<folder>/<name>.json`` (a probe, a fill-mask): a file
    name, never a path, so that a record cannot land outside its folder."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):  # trial 29's E-11: the start
        raise UserError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only, "
                        "beginning with a letter or a digit")
    if len(name) > RECORD_NAME_MAX:  # trial 28's E-m11
        raise UserError(f"--name {name[:20]}... is {len(name)} characters long: use at most "
                        f"{RECORD_NAME_MAX} (the record, and a copy kept beside it when --force "
                        "replaces it, must fit a file name)")
    return name


RECORD_NAME_MAX = 100
"""Characters of a record's ``--name``: ``NAME.json.replaced-<UTC second>-N`` within a file
system's 255."""
