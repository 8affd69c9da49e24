"""The Transformers chapter's tables and figures: conversion check, token ids, recipe, results.

Each function returns the facts for one chapter cell (a DataFrame, a figure, a dataclass); the
sentences around them are the chapter's. Results come only from the run cache (:mod:`finetune_lab.runs.tblogs`, :mod:`finetune_lab.runs.seedstats`); runs that fail
validation are listed with their reason, never used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from finetune_lab.book.report import signed
from finetune_lab.config import paths
from finetune_lab.data.binarize import default_output as default_bin
from finetune_lab.data.cls_books import default_output as default_cls
from finetune_lab.data.cls_splits import train_size
from finetune_lab.data.tokenizer import default_output as default_tok
from finetune_lab.models import hf_convert
from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
from finetune_lab.models.fairseq_compat import quiet_import
from finetune_lab.models.hf_tokenizer import FairseqIdTokenizer, token_id_check
from finetune_lab.models.params import RobertaSize
from finetune_lab.render_cache import per_render
from finetune_lab.runs import seedstats
from finetune_lab.runs.registry import discover_runs
from finetune_lab.runs.runspeed import SPEED_COLUMNS, comparable, speed_table
from finetune_lab.runs.seedstats import TEST_SUBSET, VALID_SUBSET
from finetune_lab.runs.tblogs import LoadedRuns, load_scalars
from finetune_lab.train.recipe import LAB_RECIPE, FinetuneRecipe

FAIRSEQ_EXPERIMENT = "fairseq"
TRANSFORMERS_EXPERIMENT = "transformers"


# --- conversion ------------------------------------------------------------------------------


@dataclass
class ConversionCheck:
    """The equivalence table and what it was computed on: the committed checkpoint (its
    repo-relative path), or, where there is none, a tiny fairseq model of size ``tiny`` with
    every parameter randomized."""

    table: pd.DataFrame
    checkpoint: str | None
    tiny: RobertaSize | None = None

    @property
    def real(self) -> bool:
        return self.checkpoint is not None

    @property
    def all_equal(self) -> bool:
        return bool(self.table["equal"].all())

    @property
    def worst(self) -> float:
        return float(self.table["max abs difference"].max())


@per_render
def conversion_check() -> ConversionCheck:
    """On the committed checkpoint when it exists, else on a tiny randomized fairseq model."""
    ckpt = packaged_dir() / MODEL_FILE
    if ckpt.is_file():
        return ConversionCheck(hf_convert.checkpoint_check(ckpt), _shown(ckpt))
    return ConversionCheck(hf_convert.tiny_check(), None, hf_convert.tiny_size())


@dataclass
class TokenCheck:
    """The token-id table over every CLS-Books review (None where the prepared data are not on
    this machine), the tokenizer folder it used, and the inputs that are missing."""

    table: pd.DataFrame | None
    tokenizer: str
    missing: list[str] = field(default_factory=list)

    @property
    def identical(self) -> int:
        return int(self.table["identical ids"].sum()) if self.table is not None else 0

    @property
    def reviews(self) -> int:
        return int(self.table["reviews"].sum()) if self.table is not None else 0


def _shown(path: Path) -> str:
    """A path as the chapter names it: relative to the project when it lies inside."""
    project = paths().project
    return path.relative_to(project).as_posix() if path.is_relative_to(project) else str(path)


@per_render
def token_check() -> TokenCheck:
    """Token-id check over every CLS-Books review, where the prepared data are here."""
    cls_dir = default_cls()
    tok_dir = packaged_dir() if (packaged_dir() / "dict.txt").is_file() else default_tok()
    missing = [p for p in (cls_dir / "train.review", tok_dir / "dict.txt") if not p.is_file()]
    if missing:
        return TokenCheck(None, _shown(tok_dir), [_shown(p) for p in missing])
    tok = FairseqIdTokenizer.from_dir(tok_dir, max_positions=LAB_RECIPE.max_positions)
    bin_dir = default_bin()
    table = token_id_check(cls_dir, tok, bin_dir if bin_dir.is_dir() else None)
    return TokenCheck(table, _shown(tok_dir))


# --- learning-rate schedules ------------------------------------------------------------------


@per_render
def lr_schedules(n_train: int | None = None, recipe: FinetuneRecipe = LAB_RECIPE) -> pd.DataFrame:
    """The learning rate of every update, from fairseq's and Transformers' own scheduler classes.

    fairseq: ``PolynomialDecayLRSchedule`` driven as ``fairseq.trainer.Trainer`` drives it
    (``step_update(0)`` when built; ``step_begin_epoch`` + ``step_update`` at each epoch start;
    ``step_update(n)`` after update ``n``; ``step`` + ``step_update`` at each epoch end).
    Transformers: ``get_scheduler("linear", ...)`` stepped once per update, as the Trainer does.
    ``n_train`` defaults to the training reviews of the committed data summary.
    """
    import torch
    from transformers import get_scheduler

    quiet_import()
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
    from fairseq.optim.lr_scheduler.polynomial_decay_schedule import (
        PolynomialDecayLRSchedule, PolynomialDecayLRScheduleConfig)

    if n_train is None:
        n_train = train_size()
    total, warm = recipe.total_updates(n_train), recipe.warmup_updates(n_train)
    per_epoch = recipe.updates_per_epoch(n_train)
    param = torch.nn.Parameter(torch.zeros(1))
    fs_opt = FairseqAdam(FairseqAdamConfig(lr=[recipe.lr], adam_betas=str(recipe.adam_betas),
                                           adam_eps=recipe.adam_eps,
                                           weight_decay=recipe.weight_decay), [param])
    sched = PolynomialDecayLRSchedule(PolynomialDecayLRScheduleConfig(
        warmup_updates=warm, total_num_update=total, lr=[recipe.lr], end_learning_rate=0.0,
        power=1.0), fs_opt)
    hf_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=recipe.lr)
    hf_sched = get_scheduler("linear", optimizer=hf_opt, num_warmup_steps=warm,
                             num_training_steps=total)
    rows, n = [], 0
    sched.step_update(0)
    for epoch in range(1, recipe.epochs + 1):
        sched.step_begin_epoch(epoch)
        sched.step_update(n)
        for _ in range(per_epoch):
            rows.append((n + 1, epoch, fs_opt.get_lr(), hf_opt.param_groups[0]["lr"]))
            n += 1
            sched.step_update(n)
            hf_opt.step()
            hf_sched.step()
        sched.step(epoch, None)
        sched.step_update(n)
    df = pd.DataFrame(rows, columns=["update", "epoch", "fairseq", "transformers"])
    df["difference"] = df["transformers"] - df["fairseq"]
    return df


def plot_lr_schedules(df: pd.DataFrame):
    """Both schedules on one axis (they coincide when the recipe is matched)."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
    ax.plot(df["update"], df["fairseq"], lw=3, alpha=0.5, label="fairseq polynomial_decay")
    ax.plot(df["update"], df["transformers"], lw=1, ls="--", label="Transformers linear")
    ax.set_xlabel("update")
    ax.set_ylabel("learning rate")
    ax.legend(frameon=False, fontsize="small")
    return check_legend(fig)


@per_render
def adam_eps_factor(recipe: FinetuneRecipe = LAB_RECIPE, updates: tuple[int, ...] = (1, 10, 67, 200)
                    ) -> pd.DataFrame:
    """fairseq adds eps to √v before bias correction: its eps equals AdamW's ε / √(1 − β₂ᵗ)."""
    beta2 = recipe.adam_betas[1]
    return pd.DataFrame({
        "update t": list(updates),
        "1/√(1−β₂ᵗ)": [1 / math.sqrt(1 - beta2**t) for t in updates],
        "fairseq's ε in AdamW terms": [recipe.adam_eps / math.sqrt(1 - beta2**t) for t in updates],
    })


# --- results ---------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Valid runs of both experiments, their per-seed best epochs, their speed (built once,
    :func:`finetune_lab.runs.runspeed.speed_table`), and every excluded run."""

    loaded: object  # tblogs.LoadedRuns
    best: pd.DataFrame
    present: dict[str, int]
    speed: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SPEED_COLUMNS))

    @property
    def ready(self) -> bool:
        return all(self.present.get(e, 0) > 0 for e in (FAIRSEQ_EXPERIMENT, TRANSFORMERS_EXPERIMENT))


def load_comparison(runs_root: Path | None = None) -> Comparison:
    """Valid runs of ``fairseq`` and ``transformers`` (either may be absent)."""
    root = Path(runs_root) if runs_root is not None else paths().runs
    wanted = [e for e in (FAIRSEQ_EXPERIMENT, TRANSFORMERS_EXPERIMENT) if (root / e).is_dir()]
    records = discover_runs(root, wanted) if wanted else []
    valid = [r for r in records if r.valid]
    scalars = load_scalars(valid)
    loaded = LoadedRuns(scalars=scalars, runs=records)
    present = {e: sum(r.experiment == e for r in valid)
               for e in (FAIRSEQ_EXPERIMENT, TRANSFORMERS_EXPERIMENT)}
    best = seedstats.best_epochs(scalars) if not scalars.empty else pd.DataFrame()
    return Comparison(loaded=loaded, best=best, present=present, speed=speed_table(valid))


PER_SEED_COLUMNS = ["framework", "init", "seed", "best epoch", "valid acc (%)", "test acc (%)",
                    "wall time (min)"]


def inits_without_transformers(comp: Comparison) -> list[str]:
    """Initialisations that have fairseq runs but no Transformers runs (e.g. random init, made
    only where a GPU is)."""
    if comp.best.empty:
        return []
    inits = {f: set(comp.best.loc[comp.best["framework"] == f, "init"])
             for f in ("fairseq", "transformers")}
    return sorted(inits["fairseq"] - inits["transformers"])


def per_seed_table(comp: Comparison) -> pd.DataFrame:
    """One row per run: framework, init, seed, best epoch, valid and test accuracy and wall
    time (from the manifests; their devices and threads are in :func:`time_table`)."""
    if comp.best.empty:
        return pd.DataFrame(columns=PER_SEED_COLUMNS)
    speed = comp.speed[["experiment", "run", "wall time (min)"]]
    best = comp.best.merge(speed, on=["experiment", "run"], how="left")
    return best[["framework", "init", "seed", "best_epoch", "valid", "test", "wall time (min)"]
                ].rename(columns={"best_epoch": "best epoch", "valid": "valid acc (%)",
                                  "test": "test acc (%)"})


def time_table(comp: Comparison) -> pd.DataFrame:
    """Mean wall time per framework and init, with the settings (device, threads) it came from."""
    columns = ["framework", "init", "runs", "mean wall time (min)", "device and threads"]
    t = comp.speed
    if t.empty:
        return pd.DataFrame(columns=columns)
    return (t.groupby(["framework", "init"])
            .agg(runs=("seed", "count"), mean_min=("wall time (min)", "mean"),
                 settings=("setting", lambda d: "; ".join(sorted(set(d)))))
            .reset_index().rename(columns={"mean_min": "mean wall time (min)",
                                           "settings": "device and threads"}))[columns]


def same_device(comp: Comparison) -> bool:
    """True when every valid run of both frameworks had one device model and thread count."""
    return comparable(comp.speed)


def seed_table(comp: Comparison) -> pd.DataFrame:
    """Mean ± sample std per framework and init (seedstats' display table)."""
    if comp.best.empty:
        return pd.DataFrame(columns=["experiment", "framework", "init", "best valid",
                                     "test at best epoch", "mean best epoch"])
    return seedstats.seed_table(comp.best)


def framework_gaps(comp: Comparison, column: str = "test") -> pd.DataFrame:
    """Transformers − fairseq per init (Welch), and whether the gap lies within seed noise.

    "Within seed noise" means the 95 % Welch interval of the difference contains 0. The
    interval's ends are also kept as numbers (``ci_low``, ``ci_high``) for other rounding.
    """
    rows = []
    if comp.best.empty:
        return pd.DataFrame(columns=["init", "difference", "95 % CI", "p", "within seed noise"])
    for init in sorted(comp.best["init"].unique()):
        sub = comp.best[comp.best["init"] == init].assign(init=lambda d: d["framework"])
        absent = [f for f in ("transformers", "fairseq") if not (sub["init"] == f).any()]
        if absent:  # e.g. random-init Transformers runs, made only where a GPU is
            rows.append({"init": init, "difference": np.nan,
                         "95 % CI": f"no {' or '.join(absent)} {init} runs to compare",
                         "p": np.nan, "within seed noise": None})
            continue
        try:
            g = seedstats.init_gap(sub, a="transformers", b="fairseq", column=column)
        except Exception as exc:  # fewer than 2 seeds on a side: say so in the table
            rows.append({"init": init, "difference": np.nan, "95 % CI": str(exc),
                         "p": np.nan, "within seed noise": None})
            continue
        rows.append({"init": init, "difference": g.diff,
                     "95 % CI": f"{signed(g.ci_low)} to {signed(g.ci_high)}", "p": g.p_value,
                     "within seed noise": bool(g.ci_low <= 0 <= g.ci_high),
                     "ci_low": g.ci_low, "ci_high": g.ci_high})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class FrameworkAnswer:
    """The chapter's answer for one initialisation: each framework's test accuracy (mean,
    sample standard deviation, seeds) and the Welch gap Transformers − fairseq."""

    gap: seedstats.InitGap
    std_transformers: float
    std_fairseq: float

    @property
    def within_seed_noise(self) -> bool:
        """True when the 95 % interval of the difference contains 0."""
        return bool(self.gap.ci_low <= 0 <= self.gap.ci_high)


def framework_answer(comp: Comparison, init: str = "pretrained") -> FrameworkAnswer | None:
    """Transformers against fairseq for ``init``; ``None`` unless both have two seeds or more."""
    if comp.best.empty:
        return None
    sub = comp.best[comp.best["init"] == init].assign(init=lambda d: d["framework"])
    if min((sub["init"] == f).sum() for f in ("transformers", "fairseq")) < 2:
        return None
    g = seedstats.init_gap(sub, a="transformers", b="fairseq", column="test")
    std = sub.groupby("init")["test"].std(ddof=1)
    return FrameworkAnswer(g, float(std["transformers"]), float(std["fairseq"]))


def loss_in_bits(df: pd.DataFrame) -> pd.DataFrame:
    """End-of-epoch mean training loss of both frameworks in bits, the unit fairseq logs and
    every other loss of the book is given in (Transformers logs nats)."""
    fs = df[(df["framework"] == "fairseq") & (df["subset"] == "train") & (df["tag"] == "loss")]
    hf = df[(df["framework"] == "transformers") & (df["subset"] == "train")
            & (df["tag"] == "epoch_loss")]
    hf = hf.assign(value=hf["value"] / math.log(2))
    return pd.concat([fs, hf]).assign(subset="train", tag="loss (bits)")


def plot_framework_curves(comp: Comparison, init: str, what: str = "valid"):
    """Per-seed curves by epoch, fairseq vs Transformers, for one init."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    from finetune_lab.book.plots import plot_seed_curves  # heavy: matplotlib

    df = comp.loaded.scalars if comp.loaded is not None else pd.DataFrame()
    df = df[df["init"] == init] if not df.empty else df
    if df.empty:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 2), layout="constrained")
        ax.text(0.5, 0.5, f"no valid {init} runs in the run cache yet", ha="center", va="center")
        ax.set_axis_off()
        return check_legend(fig)
    if what == "loss":
        return plot_seed_curves(loss_in_bits(df), "train", "loss (bits)", hue="framework",
                                ylabel="training loss (bits, epoch mean)")
    subset = VALID_SUBSET if what == "valid" else TEST_SUBSET
    return plot_seed_curves(df, subset, "accuracy", hue="framework", ylabel=f"{what} accuracy (%)")
