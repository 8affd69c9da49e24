"""Figures for seed-level results: every seed as a thin line, the mean ± sample std as a band.

Showing the seeds themselves (not only a band) keeps a reader from mistaking a two-seed band for
a confidence interval; :func:`seed_band_caption` says what the band is, with n.

:func:`check_legend` is the book's rule for every figure: at most :data:`MAX_LEGEND_ENTRIES`
entries in any legend (a legend of about 40 runs once squeezed a figure's plots into a strip).
Every plotting function of the book calls it on its figure before returning it.
"""

from __future__ import annotations

import math

# No matplotlib.use() here: forcing a backend on import would switch a Jupyter kernel (Quarto's
# included) away from its inline backend, and every figure of the book would silently vanish.
# Without a display matplotlib falls back to Agg by itself.
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import pandas as pd
import seaborn as sns

from finetune_lab.runs.seedstats import GROUP, _metric, epoch_summary

MAX_LEGEND_ENTRIES = 12
"""The most entries a legend may have; more runs are grouped, faceted or selected instead."""


class LegendTooLongError(ValueError):
    """A figure's legend has more entries than a reader can match to lines."""


class OverlappingTicksError(ValueError):
    """Two tick labels of one axis are drawn over each other."""


def overlapping_ticks(figure: plt.Figure) -> list[tuple[str, str]]:
    """Pairs of neighbouring tick labels of one axis drawn over or against each other (a log
    axis labelling its minor ticks, say), after a draw of ``figure``."""
    renderer = figure.canvas.get_renderer()
    figure.draw_without_rendering()
    pairs = []
    for ax in figure.axes:
        for axis, lo in ((ax.xaxis, 0), (ax.yaxis, 1)):
            low, high = sorted(axis.get_view_interval())
            labels = [t for locs, texts in ((axis.get_majorticklocs(), axis.get_majorticklabels()),
                                            (axis.get_minorticklocs(), axis.get_minorticklabels()))
                      for loc, t in zip(locs, texts)
                      if low <= loc <= high and t.get_visible() and t.get_text()]
            boxes = sorted(((t.get_window_extent(renderer), t.get_text()) for t in labels),
                           key=lambda b: (b[0].x0, b[0].y0)[lo])
            for (a, ta), (b, tb) in zip(boxes, boxes[1:]):
                # less than a third of a character apart reads as one label ("90100")
                pad = labels[0].get_fontsize() * figure.dpi / 72 / 3
                if (a.x1 + pad > b.x0) if lo == 0 else (a.y1 + pad > b.y0):
                    pairs.append((ta, tb))
    return pairs


def check_legend(fig: plt.Figure | plt.Axes, limit: int = MAX_LEGEND_ENTRIES):
    """Raise :class:`LegendTooLongError` if a legend of ``fig`` (an Axes' or the figure's own)
    has more than ``limit`` entries, :class:`OverlappingTicksError` if two tick labels of one
    axis overlap; else return ``fig`` unchanged, so that a plotting function
    can end with ``return check_legend(fig)``. An Axes is checked with its whole figure."""
    figure = fig.figure if isinstance(fig, plt.Axes) else fig
    legends = [(ax, ax.get_legend()) for ax in figure.axes]
    legends += [(None, legend) for legend in figure.legends]
    for ax, legend in legends:
        if legend is None:
            continue
        entries = [t.get_text() for t in legend.get_texts()]
        if len(entries) > limit:
            where = "the figure's legend" if ax is None else (
                f"the legend of the axes {ax.get_title() or ax.get_ylabel() or ax.get_label()!r}")
            raise LegendTooLongError(
                f"{where} has {len(entries)} entries, more than {limit}: group the series "
                f"(one entry per kind of run), facet them, or select a few; the first entries: "
                f"{entries[:5]}")
    clash = overlapping_ticks(figure)
    if clash:
        raise OverlappingTicksError(f"tick labels drawn over each other: {clash[:3]}; label "
                                    "fewer ticks")
    return fig


def plot_seed_curves(
    df: pd.DataFrame,
    subset: str | dict[str, str],
    tag: str,
    hue: str = "init",
    ax: plt.Axes | None = None,
    ylabel: str | None = None,
    x: str = "epoch",
) -> plt.Figure:
    """Per-seed curves of ``subset/tag`` against ``x`` (``"epoch"``, or ``"step"`` when every
    run logs at the same updates), plus a mean ± sample-std band per ``hue``."""
    if x != "epoch":  # the per-seed statistics group on "epoch": put the x values there
        df = df.assign(epoch=df[x].astype(float))
    sel = _metric(df, subset, tag)
    per_run = sel.sort_values("step").groupby(GROUP + ["seed", "run", "epoch"], as_index=False).last()
    summ = epoch_summary(df, subset, tag)
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    else:
        fig = ax.figure
    levels = sorted(per_run[hue].astype(str).unique())
    palette = dict(zip(levels, sns.color_palette("colorblind", len(levels))))
    for level in levels:
        color = palette[level]
        runs = per_run[per_run[hue].astype(str) == level]
        for _, one in runs.groupby("run"):
            ax.plot(one["epoch"], one["value"], color=color, alpha=0.35, lw=0.9, marker=".",
                    ms=3)
        s = summ[summ[hue].astype(str) == level].groupby("epoch", as_index=False).agg(
            mean=("mean", "mean"), std=("std", "mean"), n=("n", "min"))
        ax.plot(s["epoch"], s["mean"], color=color, lw=2,
                label=f"{hue} = {level} (n = {int(s['n'].max())})")
        ax.fill_between(s["epoch"], s["mean"] - s["std"].fillna(0), s["mean"] + s["std"].fillna(0),
                        color=color, alpha=0.2, lw=0)
    ax.set_xlabel({"step": "update"}.get(x, x))
    if x == "epoch":  # whole epochs: a tick at 1.5 epochs marks no evaluation
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel or f"{tag} ({subset if isinstance(subset, str) else 'valid'})")
    ax.legend(frameon=False, fontsize="small")
    sns.despine(ax=ax)
    return check_legend(fig)


def seed_band_caption(n_per_group: dict[str, int] | None = None, what: str = "") -> str:
    """Caption text saying what the lines and the band are."""
    ns = ""
    if n_per_group:
        ns = " (" + ", ".join(f"{k}: n = {v}" for k, v in n_per_group.items()) + ")"
    lead = f"{what}. " if what else ""
    return (
        f"{lead}Thin lines: individual seeds. Thick line and shaded band: mean ± one sample "
        f"standard deviation (ddof = 1) across seeds at each epoch{ns}; the band is a spread of "
        "seeds, not a confidence interval."
    )


def label_points(ax: plt.Axes, points: list[tuple[float, float, str]]) -> None:
    """Name each point of a log-x scatter beside it, in small grey text: to its right, or to its
    left in the last fifth of the axis (where a name would leave the figure), at the first of a
    few heights where it overlaps no name already placed."""
    renderer = ax.figure.canvas.get_renderer()
    lo, hi = (math.log10(v) for v in ax.get_xlim())
    boxes: list = []
    for x, y, name in sorted(points):
        right = (math.log10(x) - lo) / (hi - lo) < 0.8
        heights = (0, 8, -8, 16, -16, 24)
        for dy in heights:  # every height taken: the last one stays, overlapping
            text = ax.annotate(name, (x, y), xytext=(6 if right else -6, dy),
                               textcoords="offset points", ha="left" if right else "right",
                               va="center", fontsize=6.5, color="0.3")
            box = text.get_window_extent(renderer)
            if dy == heights[-1] or not any(box.overlaps(b) for b in boxes):
                break
            text.remove()
        boxes.append(box)
