"""The book's figure rules, checked in the plotting code: no legend has more than 12 entries,
and no two tick labels of an axis run into each other."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from matplotlib.ticker import ScalarFormatter

from finetune_lab.book.plots import (
    MAX_LEGEND_ENTRIES,
    LegendTooLongError,
    OverlappingTicksError,
    check_legend,
    overlapping_ticks,
)


def _figure(series: int, figure_legend: bool = False):
    fig, ax = plt.subplots()
    for i in range(series):
        ax.plot([0, 1], [i, i + 1], label=f"run {i}")
    if figure_legend:
        fig.legend()
    else:
        ax.legend()
    return fig, ax


def test_a_legend_of_twelve_entries_passes_and_the_figure_comes_back():
    fig, ax = _figure(MAX_LEGEND_ENTRIES)
    try:
        assert check_legend(fig) is fig
        assert check_legend(ax) is ax  # functions that return their Axes check it the same way
    finally:
        plt.close(fig)


@pytest.mark.parametrize("figure_legend", [False, True], ids=["axes legend", "figure legend"])
def test_a_legend_of_thirteen_entries_fails_naming_the_count(figure_legend: bool):
    fig, ax = _figure(MAX_LEGEND_ENTRIES + 1, figure_legend)
    try:
        with pytest.raises(LegendTooLongError, match=r"13 entries, more than 12.*run 0"):
            check_legend(ax)
    finally:
        plt.close(fig)


def test_the_limit_can_be_lowered_and_a_figure_without_legend_passes():
    fig, ax = _figure(3)
    try:
        with pytest.raises(LegendTooLongError):
            check_legend(fig, limit=2)
        ax.get_legend().remove()
        assert check_legend(fig, limit=0) is fig
    finally:
        plt.close(fig)


def test_every_plotting_function_of_the_book_checks_its_legend():
    """A figure function that forgets the check can grow a 40-entry legend unseen: every
    ``plot_*`` or ``*_figure`` function of the book calls :func:`check_legend` (read from the
    source; the parameter-share plot lives below ``book`` and is checked on its figure)."""
    import ast
    from pathlib import Path

    import finetune_lab.book as book
    from finetune_lab.book.plots import check_legend
    from finetune_lab.models import params

    missing = []
    for path in sorted(Path(book.__file__).parent.glob("*.py")):
        if path.name == "plots.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and (
                    node.name.startswith("plot_") or node.name.endswith("_figure")):
                calls = {n.func.id for n in ast.walk(node)
                         if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
                if "check_legend" not in calls:
                    missing.append(f"{path.name}:{node.name}")
    assert missing == []
    check_legend(params.plot_part_shares(params.SMALL))


def test_a_log_axis_labelling_its_minor_ticks_is_refused_and_its_major_ticks_pass():
    """The candidates' figure labelled 9, 10, 20, …, 90, 100: "90" ran into "100"."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    try:
        ax.plot([9, 105], [0, 1])
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        assert overlapping_ticks(fig) == []
        check_legend(fig)
        ax.xaxis.set_minor_formatter(ScalarFormatter())
        assert ("90", "100") in overlapping_ticks(fig)
        with pytest.raises(OverlappingTicksError, match="'90', '100'"):
            check_legend(ax)
    finally:
        plt.close(fig)
