"""How the pretraining runs trained: loss and learning-rate curves, speed, and the long runs.

The curves put a continued run after the updates of the runs behind it; the long runs
(``pretrain --tokens``) are read from their manifests' launches, complete or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab.book.pretrain_report import (
    VALID_SUBSETS,
    PretrainRuns,
    continued_lineage,
    unigram_bits,
)
from finetune_lab.models import params
from finetune_lab.runs.registry import RunRecord
from finetune_lab.runs.runspeed import device_name
from finetune_lab.runs.tblogs import event_scalars
from finetune_lab.train.pretrain_recipe import PretrainRecipe, tapt_start
from finetune_lab.train.pretrain_throughput import model_flops_per_token
from finetune_lab.runs.reading import reads_once

SUBSET_LABELS = {"train_inner": "train", "valid": "valid (held-out novels)",
                 "valid1": "valid (held-out dvd/music reviews)"}
"""Legend labels of fairseq's subsets."""


def update_offset(manifest: dict[str, Any], folder: Path | None = None) -> int:
    """Updates the weights had before this run: 0, or the sum over a continued run's lineage
    (each run's own updates where the cache has it, the copy in the manifest of the run in
    ``folder`` checked: :func:`~finetune_lab.book.pretrain_report.continued_lineage`)."""
    return sum(int(step.get("updates") or 0) for step in continued_lineage(manifest, folder))


@reads_once
def curves(runs: PretrainRuns) -> pd.DataFrame:
    """Train (every log interval) and valid loss in bits, perplexity, and the learning rate."""
    df = runs.scalars
    if df.empty:
        return df
    keep = df[((df["subset"] == "train_inner") & df["tag"].isin(["loss", "lr"]))
              | (df["subset"].isin(VALID_SUBSETS) & (df["tag"] == "loss"))]
    offset = {rec.name: update_offset(rec.manifest, rec.path) for rec in runs.used}
    keep = keep.assign(update=keep["step"] + keep["run"].map(offset).fillna(0).astype(int))
    return keep[["run", "subset", "tag", "step", "update", "value"]].reset_index(drop=True)


def plot_curves(runs: PretrainRuns):
    """Loss (bits/token, with perplexity = 2^loss on the right axis) and learning rate of the
    runs behind the packaged checkpoint (every run, when nothing is packaged): one colour per
    run, one line style per held-out set, so the legend stays short."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D

    df = curves(runs)
    lineage = {Path(step["run"]).name for step in (runs.checkpoint or {}).get("lineage") or []}
    if lineage and not df.empty:
        df = df[df["run"].isin(lineage)]
    fig, (ax, ax_lr) = plt.subplots(1, 2, figsize=(9, 4), layout="constrained",
                                    gridspec_kw={"width_ratios": [2, 1]})
    if df.empty:
        for a in (ax, ax_lr):
            a.text(0.5, 0.5, "no pretraining run recorded yet", ha="center", va="center")
            a.set_axis_off()
        return check_legend(fig)
    order = [Path(step["run"]).name for step in (runs.checkpoint or {}).get("lineage") or []]
    names = sorted(df["run"].unique(), key=lambda r: order.index(r) if r in order else len(order))
    colours = {run: f"C{i}" for i, run in enumerate(names)}
    styles = {"train_inner": dict(lw=1, alpha=0.6), "valid": dict(marker="o", ms=3, lw=1.8),
              "valid1": dict(marker="s", ms=3, lw=1.8, ls="--")}
    for (run, subset), part in df[df["tag"] == "loss"].groupby(["run", "subset"]):
        part = part.sort_values("step")
        ax.plot(part["update"], part["value"], color=colours[run], **styles[subset])
    ax.set_xlabel("update")
    ax.set_ylabel("MLM loss (bits / masked token)")
    unigram = unigram_bits()
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls=":", lw=1.2,
                   label=f"no context (unigram entropy, {unigram:.2f} bits)")
        ax.set_ylim(top=max(unigram + 2.0, ax.get_ylim()[0] + 1.0))  # the first updates start higher
    handles = ([Line2D([], [], color=c, lw=2, label=run) for run, c in colours.items()]
               + [Line2D([], [], color="black", label=SUBSET_LABELS[k], **v)
                  for k, v in styles.items() if k in set(df["subset"])])
    fig.legend(handles=handles + ax.get_legend_handles_labels()[0], frameon=False,
               fontsize="small", loc="outside lower center", ncol=4)
    sec = ax.secondary_yaxis("right", functions=(lambda b: 2.0 ** b,
                                                 lambda p: np.log2(np.clip(p, 1e-12, None))))
    sec.set_yticks([2.0 ** k for k in range(2, 14, 2)])  # 4 … 4096, one label per 2 bits
    sec.set_ylabel("perplexity")
    for run, part in df[df["tag"] == "lr"].groupby("run"):
        part = part.sort_values("step")
        ax_lr.plot(part["update"], part["value"], color=colours[run])
    ax_lr.set_xlabel("update")
    ax_lr.set_ylabel("learning rate")
    fig.get_layout_engine().set(wspace=0.08)
    return check_legend(fig)


def throughput_table(runs: PretrainRuns) -> pd.DataFrame:
    """Speed of every valid pretraining run, with its device and precision (MFU only on a known
    GPU, and its column only where a run has one); updates are those done (a time budget can
    stop a run before its schedule ends)."""
    rows = []
    for rec in runs.used:
        man = rec.manifest
        thr = man.get("throughput") or {}
        rows.append({
            "run": rec.name,
            "device": device_name(man, cores=True),
            "precision": man["hyperparameters"].get("precision") or "n/a",
            "updates": man.get("updates_done") or man["hyperparameters"]["max_update"],
            "wall time (min)": f"{(man.get('wall_time_s') or 0) / 60:.1f}",
            "tokens/s": f"{thr['tokens_per_s']:,.0f}" if thr.get("tokens_per_s") else "n/a",
            "updates/s": f"{thr['updates_per_s']:.2f}" if thr.get("updates_per_s") else "n/a",
            "MFU (bf16 peak)": f"{100 * thr['mfu']:.1f} %" if thr.get("mfu") else "n/a (no GPU)",
        })
    table = pd.DataFrame(rows)
    if not table.empty and (table["MFU (bf16 peak)"] == "n/a (no GPU)").all():
        table = table.drop(columns="MFU (bf16 peak)")  # a column that would say nothing
    return table


def flops_per_token() -> float:
    """Training FLOPs per token behind the MFU column, for the project's recipe and model."""
    recipe = PretrainRecipe()
    return model_flops_per_token(params.SMALL, recipe.tokens_per_sample, recipe.mask_prob)


# --- long runs: one schedule over a token budget, in as many launches as it takes ------------


def long_runs(runs: PretrainRuns) -> list[RunRecord]:
    """The long runs (``pretrain --tokens``): those whose manifest lists launches (segments),
    complete or not."""
    return [r for r in runs.runs if isinstance(r.manifest, dict)
            and isinstance(r.manifest.get("segments"), list)]


def budget_tokens(rec: RunRecord) -> int:
    """A long run's budget in tokens: its updates times the tokens of one."""
    hp = rec.manifest["hyperparameters"]
    return int(hp["max_update"]) * int(hp["tokens_per_update"])


@dataclass(frozen=True)
class LongRun:
    """A long run's budget (tokens, updates, recipe), its task-adaptive phase (``tapt_tokens``
    from update ``tapt_from``; None without one), the tokens its starting weights had seen
    (None: it starts from random weights), and where it stands."""

    name: str
    budget_tokens: int
    updates: int
    tokens_per_update: int
    precision: str | None
    dropout: float | None
    lr: float | None
    tapt_from: int | None
    tapt_tokens: int | None
    tokens_before: int | None
    status: str | None
    tokens_done: int
    launches: int


def updates_done(rec: RunRecord) -> int:
    """The updates a long run has done: its manifest's count, or for a launch that was killed
    (and so never wrote it) the last update its event files logged."""
    recorded = int(rec.manifest.get("updates_done") or 0)
    segments = [int(s.get("updates_to") or s.get("updates_from") or 0)
                for s in rec.manifest.get("segments") or []]
    steps = event_scalars(rec.path)["step"] if rec.path.is_dir() else pd.Series(dtype=int)
    return max([recorded, *segments, int(steps.max()) if len(steps) else 0])


def long_run_facts(runs: PretrainRuns) -> list[LongRun]:
    """:class:`LongRun` of every long run of the cache, in :func:`long_runs`' order."""
    out = []
    for rec in long_runs(runs):
        man, hp = rec.manifest, rec.manifest["hyperparameters"]
        per, total = int(hp["tokens_per_update"]), int(hp["max_update"])
        switch = tapt_start(hp)
        lineage = continued_lineage(man, rec.path)  # checked against the runs' own records
        out.append(LongRun(
            name=f"{rec.experiment}/{rec.name}", budget_tokens=budget_tokens(rec), updates=total,
            tokens_per_update=per, precision=hp.get("precision"), dropout=hp.get("dropout"),
            lr=hp.get("lr"), tapt_from=switch,
            tapt_tokens=(total - switch) * per if switch is not None else None,
            tokens_before=(sum(int(step.get("tokens") or 0) for step in lineage)
                           if lineage else None),
            status=man.get("status"), tokens_done=updates_done(rec) * per,
            launches=len(man["segments"])))
    return out


@reads_once
def long_run_table(runs: PretrainRuns) -> pd.DataFrame:
    """One row per long run: its budget, the task-adaptive part of it, the tokens behind the
    weights it continues, and how far it got."""
    rows = [{
        "run": f"`{r.name.split('/')[-1]}`",
        "budget (M tokens)": f"{r.budget_tokens / 1e6:.1f}",
        "task-adaptive (M tokens)": "–" if r.tapt_tokens is None else f"{r.tapt_tokens / 1e6:.1f}",
        "continues (M tokens)": "random weights" if r.tokens_before is None
        else f"{r.tokens_before / 1e6:.1f}",
        "done (M tokens)": f"{r.tokens_done / 1e6:.1f}",
        "launches": r.launches,
        "status": r.status if r.status == "complete"  # its state: never in the repository
        else f"{r.status}, not resumable here",
    } for r in long_run_facts(runs)]
    return pd.DataFrame(rows) if rows else pd.DataFrame(
        {"state": ["no long run yet: `finetune-lab pretrain --tokens N`"]})


def segments_table(rec: RunRecord | None) -> pd.DataFrame:
    """A long run's launches: when, where, the updates each did, and how each ended (a note row
    when there is no long run)."""
    if rec is None:
        return pd.DataFrame({"state": ["no long run yet: `finetune-lab pretrain --tokens N`"]})
    hp = rec.manifest["hyperparameters"]
    per = int(hp["tokens_per_update"])
    rows = []
    for i, seg in enumerate(rec.manifest["segments"], start=1):
        a, b = seg.get("updates_from"), seg.get("updates_to")
        rows.append({
            "launch": i, "started (UTC)": str(seg.get("start_time") or "")[:16].replace("T", " "),
            "device": device_name({"device": seg.get("device") or {}}, cores=True),
            "updates": f"{a:,} to {b:,}" if a is not None and b is not None else "n/a",
            "tokens (M)": f"{(b - a) * per / 1e6:.1f}" if a is not None and b is not None
            else "n/a",
            "minutes": f"{seg['wall_time_s'] / 60:.0f}" if seg.get("wall_time_s") else "n/a",
            "ended": seg.get("ended") or "running",
        })
    return pd.DataFrame(rows)
