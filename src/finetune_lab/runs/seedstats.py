"""Statistics across seeds, stated precisely enough to be checked.

All functions take the tidy frame of :mod:`finetune_lab.runs.tblogs` and group runs by
``experiment, framework, init``; one seed = one run.

* **Best epoch** (model selection on validation): for each run, the epoch with the highest
  validation metric; **ties go to the earliest epoch** (fairseq rounds accuracy to 0.1 %, so
  ties are common). The test metric reported is the one logged at that same epoch.
* **Per-epoch summary**: mean and *sample* standard deviation (``ddof=1``) across seeds, with
  ``n`` the number of seeds that logged that epoch (std is NaN when ``n == 1``).
* **Init gap**: difference of means (A − B) of the per-seed best-epoch test values, with
  Welch's two-sided t-test and its confidence interval (unequal variances,
  Welch–Satterthwaite degrees of freedom), both from :func:`scipy.stats.ttest_ind`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from finetune_lab.errors import UserError

GROUP = ["experiment", "framework", "init"]
TIE_RULE = "ties in validation accuracy go to the earliest epoch"

# Subset names per framework: fairseq's --valid-subset names, Transformers' Trainer prefixes.
VALID_SUBSET = {"fairseq": "valid", "transformers": "eval"}
TEST_SUBSET = {"fairseq": "test", "transformers": "test"}


class MissingMetricError(UserError):
    """The requested subset/tag is not in the logs."""


def _metric(df: pd.DataFrame, subset: str | dict[str, str], tag: str) -> pd.DataFrame:
    if isinstance(subset, dict):
        want = df["framework"].map(subset)
        sel = df[(df["subset"] == want) & (df["tag"] == tag)]
    else:
        sel = df[(df["subset"] == subset) & (df["tag"] == tag)]
    if sel.empty:
        have = sorted({f"{s}/{t}" for s, t in zip(df["subset"], df["tag"])})
        raise MissingMetricError(
            f"no '{tag}' in subset {subset!r} of the loaded logs; present: {', '.join(have[:30])}"
        )
    return sel


def best_epochs(
    df: pd.DataFrame,
    metric: str = "accuracy",
    valid_subset: str | dict[str, str] = VALID_SUBSET,
    test_subset: str | dict[str, str] = TEST_SUBSET,
) -> pd.DataFrame:
    """Per run: best validation epoch (earliest among ties) and the test value at that epoch.

    Returns columns ``experiment, framework, init, seed, run, best_epoch, best_step, valid,
    test`` (``test`` is NaN if the run logged no test value at that epoch).
    """
    valid = _metric(df, valid_subset, metric)
    # one value per (run, epoch): the last logged at that epoch (end-of-epoch evaluation)
    valid = valid.sort_values("step").groupby(GROUP + ["seed", "run", "epoch"], as_index=False).last()
    valid = valid.sort_values(GROUP + ["seed", "run", "epoch"])
    best_idx = valid.groupby(GROUP + ["seed", "run"])["value"].idxmax()  # first max = earliest
    best = valid.loc[best_idx, GROUP + ["seed", "run", "epoch", "step", "value"]]
    best = best.rename(columns={"epoch": "best_epoch", "step": "best_step", "value": "valid"})
    try:
        test = _metric(df, test_subset, metric)
        test = (test.sort_values("step").groupby(GROUP + ["seed", "run", "epoch"], as_index=False)
                .last()[GROUP + ["seed", "run", "epoch", "value"]]
                .rename(columns={"epoch": "best_epoch", "value": "test"}))
        best = best.merge(test, on=GROUP + ["seed", "run", "best_epoch"], how="left")
    except MissingMetricError:
        best["test"] = np.nan
    return best.sort_values(GROUP + ["seed"]).reset_index(drop=True)


def epoch_summary(
    df: pd.DataFrame, subset: str | dict[str, str], tag: str
) -> pd.DataFrame:
    """Mean, sample std (ddof=1) and n across seeds of ``subset/tag`` at each epoch."""
    sel = _metric(df, subset, tag)
    per_run = sel.sort_values("step").groupby(GROUP + ["seed", "run", "epoch"], as_index=False).last()
    out = (per_run.groupby(GROUP + ["epoch"])["value"]
           .agg(mean="mean", std=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan, n="count")
           .reset_index())
    return out


def seed_summary(best: pd.DataFrame) -> pd.DataFrame:
    """Mean ± sample std and n of the best-epoch validation and test values per group."""
    def _std(v: pd.Series) -> float:
        return v.std(ddof=1) if v.count() > 1 else np.nan

    return (best.groupby(GROUP)
            .agg(n=("seed", "count"), valid_mean=("valid", "mean"), valid_std=("valid", _std),
                 test_mean=("test", "mean"), test_std=("test", _std),
                 best_epoch_mean=("best_epoch", "mean"))
            .reset_index())


@dataclass(frozen=True)
class InitGap:
    """Difference of means ``a − b`` with a Welch confidence interval and test."""

    a: str
    b: str
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    confidence: float
    t: float
    dof: float
    p_value: float

    def describe(self, unit: str = "") -> str:
        """One sentence, e.g. for a caption or the text around a table."""
        pct = round(100 * self.confidence)

        def sign(v: float) -> str:  # one decimal, as every accuracy; − not -, as the book prints
            return f"{v:+.1f}".replace("-", "\u2212")
        p = "p < 0.01" if self.p_value < 0.01 else f"p = {self.p_value:.2f}"
        return (
            f"{self.a} − {self.b}: {sign(self.diff)}{unit} "
            f"({pct} % CI {sign(self.ci_low)} to {sign(self.ci_high)}; Welch t = {self.t:.1f}, "
            f"df = {self.dof:.1f}, {p}; n = {self.n_a} and {self.n_b} seeds)"
        )


def init_gap(
    best: pd.DataFrame,
    a: str = "pretrained",
    b: str = "random",
    column: str = "test",
    confidence: float = 0.95,
) -> InitGap:
    """Gap between two inits in ``best`` (from :func:`best_epochs`), Welch's method.

    Needs at least two seeds per init (a sample variance needs two values).
    """
    xa = best.loc[best["init"] == a, column].dropna().to_numpy(float)
    xb = best.loc[best["init"] == b, column].dropna().to_numpy(float)
    if len(xa) < 2 or len(xb) < 2:
        raise UserError(
            f"init gap needs >= 2 seeds per init; have {len(xa)} for '{a}' and {len(xb)} for "
            f"'{b}' (inits present: {sorted(best['init'].unique())})"
        )
    diff = float(xa.mean() - xb.mean())
    if np.ptp(xa) == 0 and np.ptp(xb) == 0:  # no spread at all: no interval, no test
        dof, low, high, t, p = float("nan"), diff, diff, float("nan"), float("nan")
    else:
        res = stats.ttest_ind(xa, xb, equal_var=False)
        ci = res.confidence_interval(confidence)
        dof, low, high = float(res.df), float(ci.low), float(ci.high)
        t, p = float(res.statistic), float(res.pvalue)
    return InitGap(a=a, b=b, n_a=len(xa), n_b=len(xb), mean_a=float(xa.mean()),
                   mean_b=float(xb.mean()), diff=diff, ci_low=low, ci_high=high,
                   confidence=confidence, t=t, dof=dof, p_value=p)


def best_epoch_caption(metric: str = "accuracy") -> str:
    """Caption text stating the selection and tie rule used by :func:`best_epochs`."""
    return (
        f"Per seed: the epoch with the best validation {metric} ({TIE_RULE}) and the test "
        f"{metric} at that epoch. Mean ± sample standard deviation (ddof = 1) over n seeds."
    )


def fmt_mean_std(mean: float, std: float, n: int, digits: int = 1) -> str:
    """``81.2 ± 1.3 (n=3)``; std shown as ``–`` when undefined (one seed)."""
    s = "–" if std is None or (isinstance(std, float) and math.isnan(std)) else f"{std:.{digits}f}"
    return f"{mean:.{digits}f} ± {s} (n={n})"


def seed_table(best: pd.DataFrame, digits: int = 1) -> pd.DataFrame:
    """Display table: one row per group with ``mean ± std (n)`` for validation and test."""
    summ = seed_summary(best)
    return pd.DataFrame({
        "experiment": summ["experiment"],
        "framework": summ["framework"],
        "init": summ["init"],
        "best valid": [fmt_mean_std(m, s, n, digits)
                       for m, s, n in zip(summ["valid_mean"], summ["valid_std"], summ["n"])],
        "test at best epoch": [fmt_mean_std(m, s, n, digits)
                               for m, s, n in zip(summ["test_mean"], summ["test_std"], summ["n"])],
        "mean best epoch": summ["best_epoch_mean"].round(2),
    })
