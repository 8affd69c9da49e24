"""The fairseq chapter's learning curves: every run, the seed band per init, the planned schedule.

Kept apart from :mod:`finetune_lab.book.fairseq_report` because it needs matplotlib, which the
modules reading the run cache for other chapters and the front page should not pull in.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from finetune_lab.book.fairseq_command import Plan
from finetune_lab.book.fairseq_report import FairseqResults
from finetune_lab.book.hf_compare import lr_schedules
from finetune_lab.book.plots import plot_seed_curves
from finetune_lab.runs import seedstats


def plot_curves(res: FairseqResults, p: Plan) -> plt.Figure:
    """2 × 2 panels against the update count: valid and test accuracy, train loss, learning rate.

    Thin lines are runs; thick line and band the mean ± sample std per init (via
    :func:`finetune_lab.book.plots.plot_seed_curves`). The learning-rate panel also draws, dashed,
    the schedule the recipe plans (fairseq's own scheduler, :func:`hf_compare.lr_schedules`).
    Without runs, only that planned schedule is drawn.
    """
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    planned = lr_schedules(p.n_train, p.recipe)
    if not res.ready:
        fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
        ax.plot(planned["update"] - 1, planned["fairseq"], ls="--", color="0.3",
                label="planned (no runs yet)")
        ax.set_xlabel("update")
        ax.set_ylabel("learning rate")
        ax.legend(frameon=False, fontsize="small")
        return check_legend(fig)
    df = res.loaded.scalars
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), layout="constrained", sharex=True)
    panels = [(axes[0, 0], seedstats.VALID_SUBSET, "accuracy", "validation accuracy (%)"),
              (axes[0, 1], seedstats.TEST_SUBSET, "accuracy", "test accuracy (%)"),
              (axes[1, 0], "train_inner", "loss", "train loss (bits, per log interval)"),
              (axes[1, 1], "train_inner", "lr", "learning rate")]
    for ax, subset, tag, label in panels:
        plot_seed_curves(df, subset, tag, ax=ax, ylabel=label, x="step")
    lr_ax = axes[1, 1]
    # fairseq logs, at update n, the rate set after it (the one update n + 1 will use)
    lr_ax.plot(planned["update"] - 1, planned["fairseq"], ls="--", color="0.2", lw=1,
               label="planned schedule")
    lr_ax.legend(frameon=False, fontsize="small")
    for ax in (axes[0, 0], axes[0, 1], axes[1, 0]):  # one legend serves the four panels
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for ax in axes[0]:
        ax.tick_params(labelbottom=True)
    return check_legend(fig)
