"""Seed statistics: the tie rule on a hand-made frame, then the real tiny grid end to end."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from runfixtures import EPOCHS, SEEDS

from finetune_lab.runs import seedstats as ss
from finetune_lab.book.plots import plot_seed_curves, seed_band_caption
from finetune_lab.runs.tblogs import load_experiments


def _frame(rows):
    df = pd.DataFrame(rows, columns=["init", "seed", "subset", "epoch", "value"])
    df["experiment"], df["framework"], df["tag"] = "e", "fairseq", "accuracy"
    df["run"] = df["init"] + "-" + df["seed"].astype(str)
    df["step"] = (df["epoch"] * 10).astype(int)
    return df


def test_best_epoch_tie_goes_to_earliest_epoch() -> None:
    rows = []
    for epoch, (v, t) in enumerate([(60.0, 50.0), (70.0, 61.0), (70.0, 65.0), (65.0, 66.0)], 1):
        rows += [("random", 1, "valid", epoch, v), ("random", 1, "test", epoch, t)]
    best = ss.best_epochs(_frame(rows))
    assert best[["best_epoch", "valid", "test"]].values.tolist() == [[2, 70.0, 61.0]]
    assert "earliest epoch" in ss.best_epoch_caption() and ss.TIE_RULE in ss.best_epoch_caption()


def test_init_gap_is_welchs_interval_worked_by_hand() -> None:
    """a = 80, 82, 85 and b = 70, 75, 71, 73, worked by hand: means 247/3 and 289/4, sample
    variances 19/3 and 59/12, so se² = 19/9 + 59/48 = 481/144, diff = 121/12, t = 121/√481 and
    the Welch–Satterthwaite df = se⁴ / ((19/9)²/2 + (59/48)²/3). The 0.975 quantile of t at that
    df (2.754076) and the two-sided p come from the regularized incomplete beta function,
    evaluated with mpmath at 30 digits, not with scipy."""
    a, b = [80.0, 82.0, 85.0], [70.0, 75.0, 71.0, 73.0]
    best = pd.DataFrame({"init": ["pretrained"] * 3 + ["random"] * 4, "test": a + b})
    gap = ss.init_gap(best)
    se2 = 481 / 144
    assert (gap.mean_a, gap.mean_b) == (pytest.approx(247 / 3), pytest.approx(289 / 4))
    assert gap.diff == pytest.approx(121 / 12)
    assert gap.t == pytest.approx(121 / 481 ** 0.5) == pytest.approx(5.517125)
    assert gap.dof == pytest.approx(se2 ** 2 / ((19 / 9) ** 2 / 2 + (59 / 48) ** 2 / 3))
    assert gap.dof == pytest.approx(4.083970, abs=1e-6)
    half = 2.754076 * se2 ** 0.5
    assert gap.ci_low == pytest.approx(121 / 12 - half, abs=1e-5)
    assert gap.ci_high == pytest.approx(121 / 12 + half, abs=1e-5)
    assert (gap.ci_low, gap.ci_high) == (pytest.approx(5.049867, abs=1e-6),
                                         pytest.approx(15.116800, abs=1e-6))
    assert gap.p_value == pytest.approx(0.004956903, abs=1e-9)
    assert "n = 3 and 4 seeds" in gap.describe()
    wider = ss.init_gap(best, confidence=0.99)
    assert wider.ci_low < gap.ci_low and wider.ci_high > gap.ci_high
    same = ss.init_gap(pd.DataFrame({"init": ["pretrained"] * 2 + ["random"] * 2,
                                     "test": [80.0, 80.0, 70.0, 70.0]}))
    assert (same.diff, same.ci_low, same.ci_high) == (10.0, 10.0, 10.0) and np.isnan(same.p_value)
    with pytest.raises(ss.UserError, match=">= 2 seeds per init"):
        ss.init_gap(best[best["init"] == "random"].head(3))


def test_epoch_summary_uses_sample_std() -> None:
    rows = [("random", s, "valid", 1, v) for s, v in ((1, 10.0), (2, 20.0), (3, 30.0))]
    rows += [("random", 1, "valid", 2, 40.0)]
    summ = ss.epoch_summary(_frame(rows), "valid", "accuracy")
    assert summ[["epoch", "mean", "std", "n"]].values.tolist()[0] == [1, 20.0, 10.0, 3]
    assert np.isnan(summ["std"].iloc[1]) and summ["n"].iloc[1] == 1
    assert ss.fmt_mean_std(20.0, 10.0, 3) == "20.0 ± 10.0 (n=3)"
    assert ss.fmt_mean_std(78.1333, 0.3786, 3, digits=2) == "78.13 ± 0.38 (n=3)"
    with pytest.raises(ss.MissingMetricError, match="no 'f1'"):
        ss.epoch_summary(_frame(rows), "valid", "f1")


@pytest.mark.slow
def test_grid_tables_and_figure(tiny_grid, tmp_path) -> None:
    """The real tiny runs flow through the same calls a chapter makes."""
    loaded = load_experiments(root=tiny_grid.runs_root)
    df = loaded.scalars
    best = ss.best_epochs(df)
    assert len(best) == 4 and set(best["seed"]) == set(SEEDS)
    for _, row in best.iterrows():  # recompute the rule by hand from the raw rows
        run = df[(df["run"] == row["run"]) & (df["tag"] == "accuracy")]
        valid = run[run["subset"] == "valid"].sort_values("epoch")
        first_best = valid.loc[valid["value"] == valid["value"].max(), "epoch"].min()
        assert row["best_epoch"] == first_best
        test = run[(run["subset"] == "test") & (run["epoch"] == first_best)]["value"].item()
        assert row["test"] == test
    summ = ss.epoch_summary(df, "valid", "accuracy")
    assert len(summ) == 2 * EPOCHS and (summ["n"] == 2).all()
    one = df[(df["subset"] == "valid") & (df["tag"] == "accuracy") & (df["init"] == "random")
             & (df["epoch"] == 1)]["value"]
    got = summ[(summ["init"] == "random") & (summ["epoch"] == 1)]
    assert got["mean"].item() == pytest.approx(one.mean())
    assert got["std"].item() == pytest.approx(one.std(ddof=1))
    table = ss.seed_table(best)
    assert list(table["init"]) == ["pretrained", "random"]
    assert all("(n=2)" in cell for cell in table["test at best epoch"])
    gap = ss.init_gap(best)
    assert gap.n_a == gap.n_b == 2
    assert gap.diff == pytest.approx(
        best[best.init == "pretrained"].test.mean() - best[best.init == "random"].test.mean())

    fig = plot_seed_curves(df, "valid", "accuracy")
    ax = fig.axes[0]
    assert len(ax.lines) == 4 + 2  # one thin line per seed, one mean line per init
    assert len(ax.collections) == 2  # one mean ± std band per init
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "init = pretrained (n = 2)", "init = random (n = 2)"]
    out = tmp_path / "curves.png"
    fig.savefig(out)
    assert out.stat().st_size > 5000
    caption = seed_band_caption({"pretrained": 2, "random": 2})
    assert "sample standard deviation" in caption and "not a confidence interval" in caption
