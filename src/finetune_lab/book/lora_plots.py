"""The LoRA chapter's figures: adapter size against the rank, the NF4 levels, the QA loss.

Each figure draws numbers computed elsewhere (:mod:`finetune_lab.models.lora_counts`,
:mod:`finetune_lab.models.four_bit`, the ``lora-qa`` run cache), so the chapter's tables and its
figures cannot disagree.
"""

from __future__ import annotations

# No matplotlib.use() here (see finetune_lab.book.plots): the kernel's inline backend stays.
import matplotlib.pyplot as plt
import numpy as np
from scipy.stats import norm

from finetune_lab.models.bloom import BloomShape
from finetune_lab.models.four_bit import NF4_OFFSET, nf4_table
from finetune_lab.models.lora_configs import LAB_LORA
from finetune_lab.models.lora_counts import RANKS, TARGET_SETS, rank_sweep
from finetune_lab.runs.tblogs import LoadedRuns


def plot_rank_sweep(ax: plt.Axes | None = None) -> plt.Axes:
    """Trainable parameters against r for the three target sets (formula lines, peft points)."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    shape = BloomShape.of()
    for label, targets in TARGET_SETS.items():
        ax.plot(RANKS, [shape.lora(r, targets) for r in RANKS], marker=".", label=label)
    peft_points = rank_sweep()
    ax.scatter(peft_points["r"], peft_points["trainable (peft)"], s=60, facecolors="none",
               edgecolors="black", label="peft's count (lab's target)", zorder=3)
    ax.axvline(LAB_LORA["r"], color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rank r")
    ax.set_ylabel("trainable parameters")
    ax.legend(fontsize=8)
    return check_legend(ax)


def plot_nf4(ax: plt.Axes | None = None) -> plt.Axes:
    """The 16 NF4 levels over the N(0, 1) density, next to the uniform 4-bit grid."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 2.8))
    df = nf4_table()
    scale = float(norm.ppf(NF4_OFFSET))  # NF4's outermost level, in standard deviations
    xs = np.linspace(-1.1, 1.1, 400)
    ax.plot(xs, norm.pdf(xs * scale), color="grey", lw=1, label="N(0, 1) density (rescaled)")
    ax.vlines(df["NF4 (from N(0,1) quantiles)"], 0, 0.45, color="C0", lw=1.2, label="NF4 levels")
    ax.vlines(df["uniform 4-bit"], -0.12, 0, color="C3", lw=1.2,
              label="uniform 4-bit levels")
    ax.set_yticks([])
    ax.set_xlabel("value / block absmax")
    # below the axes: inside, it covered the tops of the outer levels and the density
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3, frameon=False)
    ax.figure.tight_layout()
    return check_legend(ax)


def plot_qa_loss(loaded: LoadedRuns, ax: plt.Axes | None = None) -> plt.Axes:
    """Training loss per update of every valid ``lora-qa`` run."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.2))
    s = loaded.scalars
    loss = s[(s["subset"] == "train") & (s["tag"] == "loss")]
    for run, df in loss.groupby("run"):
        ax.plot(df["step"], df["value"], marker=".", label=run)
    ax.set_xlabel("update")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8)
    return check_legend(ax)
