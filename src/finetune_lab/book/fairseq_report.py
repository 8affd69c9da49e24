"""The fairseq chapter's results, read from the run cache (Tasks 3-4: 3 seeds x pretrained/random).

Every run of the experiment is discovered and validated (:mod:`finetune_lab.runs.registry`); the
valid ones' scalars (:mod:`finetune_lab.runs.tblogs`) give the best epochs, the tables and the
Welch gap (:mod:`finetune_lab.runs.seedstats`). Runs that fail validation are listed with their
reason, never used. Until the runs exist every table is empty, so the chapter executes in both
states; the few paragraphs whose wording depends on what the cache holds (the run status, the
answer, the gap, the times) are returned as Markdown, for a cell with ``output: asis``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from finetune_lab.book.course_reference import COURSE_COLUMN, COURSE_TEST_ACCURACY, course_gap_cell
from finetune_lab.book.fairseq_command import (
    EXPERIMENT, FINETUNE_COMMAND, INITS, SEEDS, default_checkpoint)
from finetune_lab.book.report import project_path, signed
from finetune_lab.config import paths
from finetune_lab.runs import seedstats
from finetune_lab.runs.listing import exclusions_markdown
from finetune_lab.runs.registry import RunRecord, discover_runs, sound_runs, valid_runs
from finetune_lab.runs.runspeed import layout_table, settings_sentence
from finetune_lab.runs.runspeed import speed_table as run_speeds
from finetune_lab.runs.tblogs import LoadedRuns, load_scalars

# --- the runs ---------------------------------------------------------------------------------


@dataclass
class FairseqResults:
    """Every recorded run of the experiment (valid or not), the valid ones' scalars, best epochs."""

    loaded: LoadedRuns
    best: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def ready(self) -> bool:
        """At least one valid run."""
        return not self.best.empty

    def n(self, init: str) -> int:
        """Valid runs (seeds) of one init."""
        return 0 if self.best.empty else int((self.best["init"] == init).sum())

    @property
    def has_gap(self) -> bool:
        """Welch's interval needs two seeds per init."""
        return all(self.n(i) >= 2 for i in INITS)


def load_results(runs_root: Path | None = None, experiment: str = EXPERIMENT) -> FairseqResults:
    """Discover and validate ``<runs root>/<experiment>/*``; load the valid runs' scalars."""
    root = Path(runs_root) if runs_root is not None else paths().runs
    records = discover_runs(root, [experiment]) if (root / experiment).is_dir() else []
    valid = [r for r in records if r.valid]
    scalars = load_scalars(valid)
    best = seedstats.best_epochs(scalars) if not scalars.empty else pd.DataFrame()
    return FairseqResults(loaded=LoadedRuns(scalars=scalars, runs=records), best=best)


BEST_COLUMNS = ["init", "seed", "best epoch", "best update", "valid acc (%)",
                "test acc (%) at that epoch"]


def best_epoch_table(res: FairseqResults) -> pd.DataFrame:
    """Per seed and init: best validation epoch and update, its validation and test accuracy."""
    if not res.ready:
        return pd.DataFrame(columns=BEST_COLUMNS)
    b = res.best.sort_values(["init", "seed"])
    return pd.DataFrame({
        "init": b["init"], "seed": b["seed"].astype(int),
        "best epoch": b["best_epoch"].astype(int), "best update": b["best_step"].astype(int),
        "valid acc (%)": b["valid"], "test acc (%) at that epoch": b["test"],
    }).reset_index(drop=True)


def seed_summary(res: FairseqResults) -> pd.DataFrame:
    """seedstats' numeric summary per init: n, mean/std of best valid and test, mean best epoch."""
    if not res.ready:
        return pd.DataFrame(columns=seedstats.GROUP + ["n", "valid_mean", "valid_std",
                                                       "test_mean", "test_std", "best_epoch_mean"])
    return seedstats.seed_summary(res.best)


def seed_table(res: FairseqResults) -> pd.DataFrame:
    """Display version of :func:`seed_summary` (mean ± std (n))."""
    if not res.ready:
        return pd.DataFrame(columns=["init", "best valid", "test at best epoch",
                                     "mean best epoch"])
    return seedstats.seed_table(res.best).drop(columns=["experiment", "framework"])


def test_by_epoch(res: FairseqResults) -> pd.DataFrame:
    """Numeric per-epoch test accuracy across seeds: init, epoch, mean, std (ddof=1), n."""
    if not res.ready:
        return pd.DataFrame(columns=["init", "epoch", "mean", "std", "n"])
    s = seedstats.epoch_summary(res.loaded.scalars, seedstats.TEST_SUBSET, "accuracy")
    return s[["init", "epoch", "mean", "std", "n"]].reset_index(drop=True)


def test_by_epoch_table(res: FairseqResults, digits: int = 1) -> pd.DataFrame:
    """Display table: one row per epoch, one ``mean ± std (n)`` column per init."""
    s = test_by_epoch(res)
    if s.empty:
        return pd.DataFrame(columns=["epoch", *INITS])
    s = s.assign(cell=[seedstats.fmt_mean_std(m, sd, int(n), digits)
                       for m, sd, n in zip(s["mean"], s["std"], s["n"])])
    wide = s.pivot(index="epoch", columns="init", values="cell").reset_index()
    wide["epoch"] = wide["epoch"].astype(int)
    wide.columns.name = None
    return wide[["epoch", *[i for i in INITS if i in wide.columns]]]


def gap(res: FairseqResults) -> seedstats.InitGap | None:
    """Pretrained − random test accuracy at the best epoch (Welch), or None without 2+2 seeds."""
    return seedstats.init_gap(res.best, "pretrained", "random", "test") if res.has_gap else None


def comparison_table(res: FairseqResults) -> pd.DataFrame:
    """Ours (mean ± std over seeds; the gap with its 95 % Welch CI) beside the course's figures."""
    summ = seed_summary(res).set_index("init") if res.ready else pd.DataFrame()
    rows = []
    for init in INITS:
        ours = (seedstats.fmt_mean_std(summ.loc[init, "test_mean"], summ.loc[init, "test_std"],
                                       int(summ.loc[init, "n"]))
                if init in summ.index else "not run yet")
        rows.append({"": f"test accuracy, {init} (%)", "this project": ours,
                     COURSE_COLUMN: COURSE_TEST_ACCURACY[init].text()})
    g = gap(res)
    rows.append({
        "": "gap pretrained − random (points)",
        "this project": (f"{signed(g.diff)} (95 % Welch CI {signed(g.ci_low)} to "
                         f"{signed(g.ci_high)})" if g else "needs ≥ 2 seeds per init"),
        COURSE_COLUMN: course_gap_cell(),
    })
    return pd.DataFrame(rows)


SPEED_COLUMNS = ["init", "seed", "device", "threads", "updates", "wall time (min)", "updates/s"]


def speed_table(res: FairseqResults) -> pd.DataFrame:
    """Per valid run, from its manifest: device, threads, updates, wall time, median updates/s."""
    return run_speeds(res.loaded.used)[SPEED_COLUMNS]


def layout_speeds(res: FairseqResults, runs_root: Path | None = None, *,
                  everything: list[RunRecord] | None = None) -> pd.DataFrame:
    """Every valid run of the lab's fairseq recipe (this grid and the candidates': the same
    updates, other weights) by how it shared the machine (:func:`runspeed.layout_table`), from
    the manifests of ``everything`` recorded (default: the run store's). Only the
    registry's valid runs count, and as neighbours its sound ones (an unfinished run did share
    the machine): a rejected copy or a damaged manifest changes no row, and a rejected run is
    no neighbour (:func:`not_neighbours` names them)."""
    if everything is None:
        everything = discover_runs(runs_root or paths().runs)
    updates = {r.manifest["hyperparameters"].get("total_updates") for r in res.loaded.used}
    recipe = [r for r in valid_runs(everything) if r.framework == "fairseq"
              and r.manifest["hyperparameters"].get("total_updates") in updates]
    return layout_table(recipe, sound_runs(everything))


def not_neighbours(everything: list[RunRecord]) -> list[RunRecord]:
    """The rejected runs of the store: their times are not read, so a run that ran beside one
    of them counts as alone in :func:`layout_speeds` (trial 19's M-y1: three runs with damaged
    event files moved three others to "1 × 1 thread", and the chapter named none of them)."""
    return [r for r in everything if not r.valid and not r.unfinished]


# --- paragraphs that depend on what the run cache holds (Markdown, for `output: asis`) ------


def status_markdown(res: FairseqResults) -> str:
    """Which runs exist and, if some are missing, the command that makes them; then the list of
    excluded runs with their reasons (absent when none is)."""
    excluded = len(res.loaded.excluded)
    tail = (f" ({excluded} recorded {'run is' if excluded == 1 else 'runs are'} excluded, "
            "listed below)") if excluded else ""
    want = len(INITS) * len(SEEDS)
    have = {i: res.n(i) for i in INITS}
    need_ckpt = "" if default_checkpoint().is_file() else (
        f" The pretrained runs start from `{project_path(default_checkpoint())}`, which does not "
        "exist yet: `finetune-lab pretrain` makes it.")
    if not res.ready:
        status = (f"**The runs have not been made yet**{tail}: the run cache holds no valid "
                  f"`{EXPERIMENT}` run, so the result tables below are empty and the figure shows "
                  f"only the planned learning-rate schedule. `{FINETUNE_COMMAND}` makes the "
                  f"{want} runs (on a GPU when one is visible); this chapter then fills in from "
                  f"their logs.{need_ckpt}")
    else:
        counts = " and ".join(f"{n} {i}" for i, n in have.items())
        valid = "valid run" if sum(have.values()) == 1 else "valid runs"
        missing = "" if sum(have.values()) >= want else (
            f" The full grid has {want} runs; `{FINETUNE_COMMAND}` makes the missing ones."
            + (need_ckpt if res.n("pretrained") < len(SEEDS) else ""))
        status = (f"The run cache holds {counts} {valid}{tail}; every table and figure "
                  f"below is computed from their logs.{missing}")
    excluded_list = exclusions_markdown(res.loaded.runs)
    return status + (f"\n\n{excluded_list}" if excluded_list else "")


def answer_markdown(res: FairseqResults) -> str:
    """The chapter's Answer callout: both means, the gap with its Welch interval and what the
    seeds say of it, and the course's figures; without two valid seeds per initialisation,
    that the answer is not known."""
    g = gap(res)
    if g is None:
        body = ("Not known yet: the run cache does not hold two valid seeds per initialisation "
                "(@sec-fairseq-results says which runs are missing).")
    else:
        body = (f"With the lab's recipe and {g.n_a} seeds, fine-tuning the pretrained stand-in "
                f"reaches **{g.mean_a:.1f} %** test accuracy at the best-validation epoch and a "
                f"random initialisation **{g.mean_b:.1f} %**: pretrained − random is "
                f"**{signed(g.diff)} points** (95 % Welch CI {signed(g.ci_low)} to "
                f"{signed(g.ci_high)}), {gap_verdict(g)}. The course reports "
                f"{COURSE_TEST_ACCURACY['pretrained'].text()} and "
                f"{COURSE_TEST_ACCURACY['random'].text()} with its own checkpoint.")
    return f"::: {{.callout-tip}}\n## Answer\n{body}\n:::"


def gap_markdown(res: FairseqResults) -> str:
    """How the Answer's interval was computed (Welch's t, its degrees of freedom and p), or why
    it cannot be computed yet; the gap itself is the Answer's, not said again."""
    g = gap(res)
    if g is None:
        have = ", ".join(f"{res.n(i)} {i}" for i in INITS)
        return (f"The gap needs at least two valid seeds per initialisation (the cache has "
                f"{have}), so it is not computed yet.")
    p = "p < 0.01" if g.p_value < 0.01 else f"p = {g.p_value:.2f}"
    return (f"The interval of the Answer is Welch's, which does not assume that the two "
            f"initialisations spread alike over seeds: t = {g.t:.1f}, df = {g.dof:.1f}, {p}, "
            f"n = {g.n_a} and {g.n_b} seeds.")


def results_markdown(res: FairseqResults) -> str:
    """Each init's test accuracy against the course's range (the gap is the Answer's); every
    number computed from the runs, a plain 'not yet' without them."""
    if not res.ready:
        return ("No result can be discussed before the runs exist; the comparison with the "
                "course above is the one the runs will be read against.")
    summ = seed_summary(res).set_index("init")
    epochs = int(res.loaded.scalars.loc[res.loaded.scalars["subset"] == "valid", "epoch"].max())
    parts = []
    for init in INITS:
        if init not in summ.index:
            parts.append(f"there is no valid {init} run yet")
            continue
        row = summ.loc[init]
        ref = COURSE_TEST_ACCURACY[init]
        mean = row["test_mean"]
        where = ("inside" if ref.low <= mean <= ref.high else
                 f"{min(abs(mean - ref.low), abs(mean - ref.high)):.1f} points "
                 f"{'below' if mean < ref.low else 'above'}")
        std = "–" if math.isnan(row["test_std"]) else f"{row['test_std']:.1f}"
        parts.append(f"the {int(row['n'])} {init} runs reach {mean:.1f} ± {std} % test "
                     f"accuracy at their best-validation epoch (on average epoch "
                     f"{row['best_epoch_mean']:.1f} of {epochs}), {where} the course's "
                     f"{ref.text()}")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def speed_markdown(res: FairseqResults) -> str:
    """Mean time per run and the device(s), or that there is nothing to time yet."""
    t = run_speeds(res.loaded.used)
    if t.empty:
        return "There is no run to time yet."
    return (f"The {len(t)} runs took {t['wall time (min)'].mean():.1f} min each on average "
            f"(fastest {t['wall time (min)'].min():.1f}, slowest {t['wall time (min)'].max():.1f}), "
            f"{settings_sentence(t)}; fairseq's median rate was {t['updates/s'].median():.1f} "
            "updates/s.")


def gap_verdict(g: seedstats.InitGap) -> str:
    """What the 95 % Welch interval of pretrained − random says: a win the seeds show, a
    difference they cannot tell from noise, or a loss they show."""
    if g.ci_low > 0:
        return "a margin the seeds clearly show"
    if g.ci_high < 0:
        return "worse than random, by a margin the seeds show: this checkpoint does not do " \
               "what pretraining is for"
    return "a difference the seeds cannot tell from noise"
