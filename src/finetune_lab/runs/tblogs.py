"""TensorBoard logs of recorded runs -> one tidy pandas DataFrame (via tbparse).

Columns: ``experiment, framework, init, seed, run, subset, tag, step, epoch, value``.

* fairseq (``--tensorboard-logdir``) writes one sub-folder per subset: ``train`` (end-of-epoch
  averages), ``train_inner`` (every ``--log-interval`` updates), ``valid``, ``test``...; the
  folder name is the subset and the tag is fairseq's metric name (``accuracy`` is in percent).
  ``step`` is fairseq's update count; ``epoch`` is the epoch that update belongs to, taken from
  the ``train`` subset's end-of-epoch steps.
* Transformers' ``Trainer`` writes tags ``train/loss``, ``eval/accuracy``, ``test/...`` into one
  folder; the part before ``/`` is the subset, the rest the tag. ``epoch`` is the Trainer's own
  (fractional) ``train/epoch`` logged at the same step; ``accuracy`` is whatever the
  ``compute_metrics`` returned (usually a fraction).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from finetune_lab.render_cache import per_render
from finetune_lab.runs.eventfiles import masked_crc32c
from finetune_lab.runs.manifest import event_files
from finetune_lab.runs.registry import InvalidRunError, RunRecord, discover_runs

COLUMNS = ["experiment", "framework", "init", "seed", "run", "subset", "tag", "step", "epoch",
           "value"]


def read_with_c_crc() -> None:
    """Let TensorBoard's reader, which tbparse reads every record through, check each record's
    CRC-32C with the C code the registry's own check uses: its Python CRC took a third of the
    reading time. The result is the same number (tests/test_tblogs.py compares the two)."""
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as stub

    stub.masked_crc32c = masked_crc32c


_READ: dict[tuple[int, int, int, int], pd.DataFrame] = {}
"""Each event file's scalars as tbparse read them, by file (inode), size and modification time:
a chapter, and a test of the book on a copy of the run cache (its event files hard-linked), asks
for the same runs again."""


@per_render
def _read_scalars(run_dir: Path) -> pd.DataFrame:
    from tbparse import SummaryReader

    read_with_c_crc()
    with warnings.catch_warnings():  # tbparse 0.0.9 uses pandas' deprecated inplace sorting
        warnings.simplefilter("ignore", category=FutureWarning)
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*inplace keyword.*")
        # the event files the registry lists and hashes (manifest.event_files), one by one: a
        # folder read whole would take in any file with "tfevents" in its name, and follow links
        frames = []
        for path in event_files(run_dir):
            st = path.stat()  # read once per process for a given file, as eventfiles checks it
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if key not in _READ:
                _READ[key] = SummaryReader(str(path), extra_columns={"wall_time"}).scalars
            one = _READ[key].copy()
            folder = path.parent.relative_to(run_dir).as_posix()
            frames.append(one.assign(dir_name="" if folder == "." else folder))
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if df.empty:
        return pd.DataFrame(columns=["step", "tag", "value", "dir_name"])
    # a resumed run (long pretraining) logs again the updates after its last saved checkpoint:
    # the later launch's values are the ones its weights continued from
    df = df.sort_values("wall_time", kind="stable")
    df = df.drop_duplicates(subset=["dir_name", "tag", "step"], keep="last")
    return df.drop(columns="wall_time").reset_index(drop=True)


def _fairseq_frame(raw: pd.DataFrame) -> pd.DataFrame:
    df = raw.copy()
    df["subset"] = df["dir_name"].astype(str).str.split("/").str[0]
    df = df[df["subset"] != ""]
    ends = np.sort(df.loc[df["subset"] == "train", "step"].unique())
    if len(ends):
        # epoch k covers updates (end_{k-1}, end_k]; steps after the last end belong to k+1
        df["epoch"] = np.searchsorted(ends, df["step"].to_numpy(), side="left") + 1
    else:  # no end-of-epoch records: fall back to the order of each subset's distinct steps
        df["epoch"] = df.groupby("subset")["step"].rank(method="dense").astype(int)
    return df


def _transformers_frame(raw: pd.DataFrame) -> pd.DataFrame:
    df = raw.copy()
    parts = df["tag"].astype(str).str.split("/", n=1)
    has_prefix = parts.str.len() == 2
    df["subset"] = np.where(has_prefix, parts.str[0], df["dir_name"].astype(str))
    df["tag"] = np.where(has_prefix, parts.str[-1], df["tag"])
    epochs = (
        df[(df["subset"] == "train") & (df["tag"] == "epoch")]
        .groupby("step")["value"]
        .max()
    )
    df["epoch"] = df["step"].map(epochs)
    return df


def event_scalars(run_dir: Path) -> pd.DataFrame:
    """Every scalar of a run folder's event files (``step``, ``tag``, ``value``, ``subset``),
    valid run or not: for showing what a failed run logged, labelled as such by the caller."""
    raw = _read_scalars(Path(run_dir))
    raw["subset"] = raw["dir_name"].astype(str).str.split("/").str[0]
    return raw.drop(columns="dir_name")


def run_scalars(record: RunRecord) -> pd.DataFrame:
    """All scalars of one *valid* run, in the tidy layout (raises for an invalid run)."""
    if not record.valid:
        raise InvalidRunError(
            f"run {record.path} is not valid and is not loaded: {record.reason}"
        )
    raw = _read_scalars(record.path)
    if raw.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = _fairseq_frame(raw) if record.framework == "fairseq" else _transformers_frame(raw)
    df["experiment"] = record.experiment
    df["framework"] = record.framework
    df["init"] = record.init
    df["seed"] = record.seed
    df["run"] = record.name
    df["epoch"] = df["epoch"].astype(float)
    df["value"] = df["value"].astype(float)
    df["step"] = df["step"].astype(int)
    return df[COLUMNS].sort_values(["subset", "tag", "step"]).reset_index(drop=True)


def load_scalars(records: Iterable[RunRecord]) -> pd.DataFrame:
    """Concatenate :func:`run_scalars` of ``records``; refuses invalid ones, naming each reason.

    Filter with :func:`finetune_lab.runs.registry.valid_runs` first and show
    :func:`finetune_lab.runs.listing.exclusions_markdown` beside the table: an excluded run is listed,
    never silently dropped.
    """
    records = list(records)
    bad = [r for r in records if not r.valid]
    if bad:
        lines = "; ".join(f"{r.experiment}/{r.name}: {r.reason}" for r in bad)
        raise InvalidRunError(f"refusing to load invalid runs ({lines})")
    frames = [run_scalars(r) for r in records]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["experiment", "framework", "init", "seed", "subset", "tag", "step"],
                           kind="stable").reset_index(drop=True)


@dataclass
class LoadedRuns:
    """What a chapter needs: the tidy scalars of valid runs, and every run with its verdict."""

    scalars: pd.DataFrame
    runs: list[RunRecord]

    @property
    def used(self) -> list[RunRecord]:
        return [r for r in self.runs if r.valid]

    @property
    def excluded(self) -> list[RunRecord]:
        return [r for r in self.runs if not r.valid]


def load_experiments(
    experiments: Sequence[str] | None = None, root: Path | str | None = None
) -> LoadedRuns:
    """Discover + validate the runs of ``experiments`` and load the valid ones' scalars."""
    records = discover_runs(root, experiments)
    return LoadedRuns(scalars=load_scalars(r for r in records if r.valid), runs=records)
