"""The fairseq chapter's tables, figure and sentences (Tasks 3-4: 3 seeds x pretrained/random).

Everything shown is computed: the command lines from :func:`finetune_fairseq.fairseq_args` and
the recipe, the schedule from the training-set size, the results from the run cache
(:mod:`finetune_lab.tblogs`, :mod:`finetune_lab.seedstats`). Runs that fail validation are listed
with their reason, never used. Until the runs exist, every function returns an empty table or a
sentence saying so, so the chapter executes in both states.

The course's own results (:data:`COURSE_TEST_ACCURACY`) and pretraining budget
(:data:`COURSE_PRETRAINING`) are *external reference figures* quoted from the course writeups of
this lab: inputs to compare against, not results of this project.
"""

from __future__ import annotations

import inspect
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from finetune_lab import finetune_fairseq as ff
from finetune_lab import seedstats
from finetune_lab.config import paths
from finetune_lab.recipe import LAB_RECIPE, FinetuneRecipe

EXPERIMENT = ff.EXPERIMENT
INITS = ff.INITS
SEEDS: tuple[int, ...] = tuple(inspect.signature(ff.finetune_grid).parameters["seeds"].default)
FINETUNE_COMMAND = (f"finetune-lab finetune fairseq --init {' '.join(INITS)} "
                    f"--seeds {' '.join(map(str, SEEDS))}")
"""The command that makes the chapter's runs (the grid's defaults, spelled out)."""

# --- external reference figures (inputs, not results) ---------------------------------------

COURSE_SOURCE = "course writeups of this lab"


@dataclass(frozen=True)
class ReferenceRange:
    """A figure reported outside this project, as a range (low == high for a single value)."""

    low: float
    high: float
    unit: str
    source: str = COURSE_SOURCE

    def text(self, digits: int = 0) -> str:
        if self.low == self.high:
            return f"{self.low:.{digits}f}{self.unit}"
        return f"{self.low:.{digits}f}–{self.high:.{digits}f}{self.unit}"


COURSE_TEST_ACCURACY: dict[str, ReferenceRange] = {
    "pretrained": ReferenceRange(79.0, 80.0, " %"),
    "random": ReferenceRange(63.0, 68.0, " %"),
}
"""EXTERNAL REFERENCE: test accuracy on CLS-Books that the course writeups of this lab report
with the course's own RoBERTa_small_fr checkpoint (best-validation epoch, fairseq recipe)."""

COURSE_PRETRAINING: dict[str, Any] = {
    "corpus": "French mC4",
    "corpus_gb": 39.0,
    "epochs": 10,
    "source": COURSE_SOURCE,
}
"""EXTERNAL REFERENCE: how the course's RoBERTa_small_fr was pretrained (masked LM on 39 GB of
French mC4, 10 epochs), as the course writeups of this lab describe it."""


def course_gap() -> ReferenceRange:
    """The pretrained − random gap implied by the course's ranges (widest and narrowest)."""
    p, r = COURSE_TEST_ACCURACY["pretrained"], COURSE_TEST_ACCURACY["random"]
    return ReferenceRange(p.low - r.high, p.high - r.low, " points")


# --- the command and the schedule -------------------------------------------------------------


def _show_path(path: Path | str) -> str:
    """A path as the reader should type it: relative to the project root when inside it."""
    p = Path(path)
    try:
        return p.resolve().relative_to(paths().project.resolve()).as_posix()
    except ValueError:
        return str(p)


def planned_train_size(res: FairseqResults | None = None) -> tuple[int, str]:
    """Number of training reviews the schedule is derived from, and where it was read.

    From the valid fairseq runs' manifests when there are any (what the runs really used), else
    from the committed data summary (``data/summaries/data.json``, written by the data chapter's
    pipeline), so that the command can be shown without the prepared data on this machine.
    """
    from finetune_lab.data_summary import summary_path

    res = res if res is not None else load_results()
    sizes = sorted({int(r.manifest["hyperparameters"]["n_train"]) for r in res.loaded.used
                    if "n_train" in (r.manifest or {}).get("hyperparameters", {})})
    if len(sizes) == 1:
        return sizes[0], "the runs' manifests"
    summary = summary_path()
    if summary.is_file():
        splits = json.loads(summary.read_text(encoding="utf-8"))["cls"]["splits"]
        train = next(s for s in splits if s["split"] == "train")
        return int(train["reviews"]), f"`{_show_path(summary)}`"
    bin_dir = ff.require_cls_bin(_default_bin())
    return ff.train_size(bin_dir), f"`{_show_path(bin_dir)}`"


def _default_bin() -> Path:
    from finetune_lab.binarize import default_output

    return default_output()


def _default_checkpoint() -> Path:
    from finetune_lab.checkpoints import MODEL_FILE, packaged_dir

    return packaged_dir() / MODEL_FILE


def train_command(n_train: int, init: str = "pretrained", seed: int = SEEDS[0], *,
                  recipe: FinetuneRecipe = LAB_RECIPE, bin_dir: Path | None = None,
                  cpu: bool = False, runs_root: Path | None = None) -> list[str]:
    """The ``fairseq-train`` argument list one run of the grid executes (paths as given).

    Built with :func:`finetune_fairseq.fairseq_args` for the default data and checkpoint paths;
    neither needs to exist. ``--tensorboard-logdir`` is the run's folder in the run cache.
    """
    from finetune_lab.recording import run_dir_for

    ckpt = _default_checkpoint() if init == "pretrained" else None
    args = ff.fairseq_args(bin_dir or _default_bin(), recipe, n_train, seed=seed,
                           checkpoint=ckpt, cpu=cpu)
    logdir = run_dir_for(EXPERIMENT, ff.run_name(init, seed), runs_root)
    return ["fairseq-train", *args, "--tensorboard-logdir", str(logdir)]


def render_command(argv: list[str], width: int = 88) -> str:
    """Shell text, one option (with its values) per line, project paths made relative."""
    shown = [_show_path(a) if a.startswith("/") else a for a in argv]
    groups: list[list[str]] = []
    for tok in shown:
        if tok.startswith("--") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    lines: list[str] = []
    for g in groups:
        text = shlex.join(g)
        if lines and not g[0].startswith("--"):
            lines[-1] += " " + text
        elif lines and len(lines[-1]) + 1 + len(text) <= width:
            lines[-1] += " " + text
        else:
            lines.append(text)
    return " \\\n    ".join(lines)


def shell_markdown(text: str):
    """``text`` as a fenced ``bash`` block (displayable Markdown)."""
    from IPython.display import Markdown

    return Markdown(f"```bash\n{text}\n```")


def command_markdown(n_train: int, init: str = "pretrained", seed: int = SEEDS[0]):
    """The rendered ``fairseq-train`` line of one run as a fenced ``bash`` block."""
    return shell_markdown(render_command(train_command(n_train, init, seed)))


def init_flags(n_train: int) -> list[str]:
    """The options the pretrained runs add to the random ones (computed from both lines)."""
    pre = ff.fairseq_args(_default_bin(), LAB_RECIPE, n_train, seed=0,
                          checkpoint=_default_checkpoint(), cpu=False)
    rnd = set(ff.fairseq_args(_default_bin(), LAB_RECIPE, n_train, seed=0, checkpoint=None,
                              cpu=False))
    return [a for a in pre if a.startswith("--") and a not in rnd]


def schedule_table(n_train: int, recipe: FinetuneRecipe = LAB_RECIPE) -> pd.DataFrame:
    """The recipe's schedule derived from ``n_train``: updates, warm-up, peak learning rate."""
    rows = [
        ("training reviews", f"{n_train:,}", "binarized training set"),
        ("batch size", f"{recipe.batch_size}", "recipe"),
        ("updates per epoch", f"{recipe.updates_per_epoch(n_train):,}",
         f"⌈{n_train:,} / {recipe.batch_size}⌉ (the last, smaller batch is kept)"),
        ("epochs", f"{recipe.epochs}", "recipe"),
        ("total updates", f"{recipe.total_updates(n_train):,}",
         f"{recipe.updates_per_epoch(n_train):,} × {recipe.epochs}"),
        ("warm-up updates", f"{recipe.warmup_updates(n_train)}",
         f"⌊{recipe.warmup_ratio:g} × {recipe.total_updates(n_train):,}⌋"),
        ("peak learning rate", f"{recipe.lr:g}", "reached at the end of warm-up, then linear "
                                                 "decay to 0 at the last update"),
    ]
    return pd.DataFrame(rows, columns=["quantity", "value", "how"])


# --- the runs ---------------------------------------------------------------------------------


@dataclass
class FairseqResults:
    """Every recorded run of the experiment (valid or not), the valid ones' scalars, best epochs."""

    loaded: Any  # tblogs.LoadedRuns
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
    from finetune_lab.registry import discover_runs
    from finetune_lab.tblogs import LoadedRuns, load_scalars

    root = Path(runs_root) if runs_root is not None else paths().runs
    records = discover_runs(root, [experiment]) if (root / experiment).is_dir() else []
    valid = [r for r in records if r.valid]
    scalars = load_scalars(valid)
    best = seedstats.best_epochs(scalars) if not scalars.empty else pd.DataFrame()
    return FairseqResults(loaded=LoadedRuns(scalars=scalars, runs=records), best=best)


def results_status(res: FairseqResults) -> str:
    """One plain sentence: which runs exist and, if some are missing, the command that makes them."""
    excluded = len(res.loaded.excluded)
    tail = f" ({excluded} recorded run(s) are excluded, listed below)" if excluded else ""
    want = len(INITS) * len(SEEDS)
    have = {i: res.n(i) for i in INITS}
    if not res.ready:
        return (f"**The runs have not been made yet**{tail}: the run cache holds no valid "
                f"`{EXPERIMENT}` run, so the result tables below are empty and the figure shows "
                f"only the planned learning-rate schedule. `{FINETUNE_COMMAND}` makes the "
                f"{want} runs (on a GPU when one is visible); this chapter then fills in from "
                "their logs.")
    counts = " and ".join(f"{n} {i}" for i, n in have.items())
    missing = "" if sum(have.values()) >= want else (
        f" The full grid has {want} runs; `{FINETUNE_COMMAND}` makes the missing ones.")
    return (f"The run cache holds {counts} valid run(s){tail}; every table and figure below is "
            f"computed from their logs.{missing}")


def exclusions(res: FairseqResults) -> str:
    """Markdown list of excluded runs with their reasons ('' when none)."""
    from finetune_lab.registry import exclusions_markdown

    return exclusions_markdown(res.loaded.runs)


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


def test_by_epoch_table(res: FairseqResults, digits: int = 2) -> pd.DataFrame:
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
                     f"{COURSE_SOURCE} (external reference)": COURSE_TEST_ACCURACY[init].text()})
    g = gap(res)
    rows.append({
        "": "gap pretrained − random (points)",
        "this project": (f"{g.diff:.2f} (95 % Welch CI {g.ci_low:.2f} to {g.ci_high:.2f})"
                         if g else "needs ≥ 2 seeds per init"),
        f"{COURSE_SOURCE} (external reference)": course_gap().text(),
    })
    return pd.DataFrame(rows)


def gap_sentence(res: FairseqResults) -> str:
    """The Welch statement of the gap, or why it cannot be computed yet."""
    g = gap(res)
    if g is None:
        have = ", ".join(f"{res.n(i)} {i}" for i in INITS)
        return (f"The gap needs at least two valid seeds per initialisation (the cache has "
                f"{have}), so it is not computed yet.")
    within = g.ci_low <= 0 <= g.ci_high
    return (f"Test accuracy at the best-validation epoch, {g.describe(' points')}. The 95 % "
            f"interval {'contains 0: with these seeds the gap is not distinguishable from seed noise' if within else 'excludes 0'}.")


# --- figure -----------------------------------------------------------------------------------


def _by_update(df: pd.DataFrame) -> pd.DataFrame:
    # plots.plot_seed_curves groups on "epoch"; every run of the grid logs at the same updates,
    # so putting the update count in that column draws the same seed curves and bands by update.
    return df.assign(epoch=df["step"].astype(float))


def plot_curves(res: FairseqResults, n_train: int | None = None,
                recipe: FinetuneRecipe = LAB_RECIPE):
    """2 × 2 panels against the update count: valid and test accuracy, train loss, learning rate.

    Thin lines are runs; thick line and band the mean ± sample std per init (via
    :func:`finetune_lab.plots.plot_seed_curves`). The learning-rate panel also draws, dashed, the
    schedule the recipe plans (fairseq's own scheduler, :func:`hf_compare.lr_schedules`). Without
    runs, only that planned schedule is drawn.
    """
    import matplotlib.pyplot as plt

    from finetune_lab.hf_compare import lr_schedules
    from finetune_lab.plots import plot_seed_curves

    if n_train is None:
        n_train = planned_train_size()[0]
    planned = lr_schedules(n_train, recipe)
    if not res.ready:
        fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
        ax.plot(planned["update"], planned["fairseq"], ls="--", color="0.3",
                label="planned (no runs yet)")
        ax.set_xlabel("update")
        ax.set_ylabel("learning rate")
        ax.legend(frameon=False, fontsize="small")
        return fig
    df = _by_update(res.loaded.scalars)
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), layout="constrained", sharex=True)
    panels = [(axes[0, 0], seedstats.VALID_SUBSET, "accuracy", "validation accuracy (%)"),
              (axes[0, 1], seedstats.TEST_SUBSET, "accuracy", "test accuracy (%)"),
              (axes[1, 0], "train_inner", "loss", "train loss (bits, per log interval)"),
              (axes[1, 1], "train_inner", "lr", "learning rate")]
    for ax, subset, tag, label in panels:
        plot_seed_curves(df, subset, tag, ax=ax, ylabel=label)
        ax.set_xlabel("update")
    lr_ax = axes[1, 1]
    lr_ax.plot(planned["update"], planned["fairseq"], ls="--", color="0.2", lw=1,
               label="planned schedule")
    lr_ax.legend(frameon=False, fontsize="small")
    for ax in axes[0]:
        ax.tick_params(labelbottom=True)
    return fig


# --- speed and device -------------------------------------------------------------------------


def _device_name(manifest: dict[str, Any]) -> str:
    dev = manifest.get("device") or {}
    name = dev.get("name") or dev.get("cpu") or "?"
    return f"{dev.get('count', 1)}× {name}" if dev.get("type") == "cuda" else str(name)


SPEED_COLUMNS = ["init", "seed", "device", "updates", "wall time (min)", "updates/s"]


def speed_table(res: FairseqResults) -> pd.DataFrame:
    """Per valid run, from its manifest: device, updates, wall time, median updates/s."""
    rows = []
    for r in sorted(res.loaded.used, key=lambda r: (str(r.init), int(r.seed or 0))):
        m = r.manifest or {}
        rows.append({
            "init": r.init, "seed": r.seed, "device": _device_name(m),
            "updates": (m.get("hyperparameters") or {}).get("total_updates"),
            "wall time (min)": m["wall_time_s"] / 60,
            "updates/s": (m.get("throughput") or {}).get("updates_per_s", np.nan),
        })
    return pd.DataFrame(rows, columns=SPEED_COLUMNS)


def speed_sentence(res: FairseqResults) -> str:
    """Mean time per run and the device(s), or that there is nothing to time yet."""
    t = speed_table(res)
    if t.empty:
        return "There is no run to time yet."
    devices = sorted(set(t["device"]))
    dev = (f"all on one device model, {devices[0]}" if len(devices) == 1 else
           f"on {len(devices)} different device models ({'; '.join(devices)}), so their times "
           "do not compare directly")
    return (f"The {len(t)} runs took {t['wall time (min)'].mean():.1f} min each on average "
            f"(fastest {t['wall time (min)'].min():.1f}, slowest {t['wall time (min)'].max():.1f}), "
            f"{dev}; fairseq's median rate was {t['updates/s'].median():.1f} updates/s "
            "(@tbl-speed).")


# --- the stand-in's pretraining budget -------------------------------------------------------


@dataclass
class PretrainBudget:
    """What the stand-in checkpoint was trained with, read from its pretraining run's manifest."""

    run: str
    status: str
    updates: int | None
    tokens_per_update: int | None
    wall_time_s: float | None
    device: str
    tokens_per_s: float | None
    corpus_words: int | None
    corpus_tokens: int | None

    @property
    def tokens_seen(self) -> int | None:
        if self.updates is None or self.tokens_per_update is None:
            return None
        return self.updates * self.tokens_per_update

    @property
    def passes(self) -> float | None:
        """Tokens processed / training-corpus tokens: how many times the corpus was seen."""
        if self.tokens_seen is None or not self.corpus_tokens:
            return None
        return self.tokens_seen / self.corpus_tokens


def _corpus_counts() -> tuple[int | None, int | None]:
    """Words and tokens of the pretraining corpus's train split (prepared data, else summary)."""
    from finetune_lab.data_summary import summary_path
    from finetune_lab.pretrain_corpus import default_output

    for path, keys in ((default_output() / "manifest.json", ("counts",)),
                       (summary_path(), ("pretrain", "counts"))):
        if path.is_file():
            d = json.loads(path.read_text(encoding="utf-8"))
            for k in keys:
                d = d.get(k, {})
            train = d.get("train") or {}
            if train:
                return train.get("words"), train.get("tokens")
    return None, None


def _pretrain_manifest(runs_root: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The pretraining run behind the packaged checkpoint, else the last complete one, if any."""
    from finetune_lab.checkpoints import MANIFEST_FILE, packaged_dir
    from finetune_lab.manifest import read_manifest, resolve_stored_path
    from finetune_lab.pretrain import EXPERIMENT as PRETRAIN

    root = Path(runs_root) if runs_root is not None else paths().runs
    packaged = packaged_dir() / MANIFEST_FILE
    if packaged.is_file():
        run = json.loads(packaged.read_text(encoding="utf-8")).get("run")
        if run and (resolve_stored_path(run) / "manifest.json").is_file():
            return resolve_stored_path(run), read_manifest(resolve_stored_path(run))
    found = []
    for m in sorted((root / PRETRAIN).glob("*/manifest.json")):
        try:
            man = read_manifest(m.parent)
        except Exception:  # unreadable manifests are the pretraining chapter's business
            continue
        if man.get("status") == "complete":
            found.append((man.get("end_time") or "", m.parent, man))
    if not found:
        return None
    _, path, man = max(found, key=lambda x: x[0])
    return path, man


def pretrain_budget(runs_root: Path | None = None) -> PretrainBudget | None:
    """The stand-in's pretraining budget from its run manifest (None when no run exists)."""
    got = _pretrain_manifest(runs_root)
    if got is None:
        return None
    path, man = got
    hp = man.get("hyperparameters") or {}
    words, tokens = _corpus_counts()
    return PretrainBudget(
        run=_show_path(path), status=str(man.get("status")),
        updates=hp.get("max_update"), tokens_per_update=hp.get("tokens_per_update"),
        wall_time_s=man.get("wall_time_s"), device=_device_name(man),
        tokens_per_s=(man.get("throughput") or {}).get("tokens_per_s"),
        corpus_words=words, corpus_tokens=tokens)


def _fmt(value: float | int | None, spec: str = ",.0f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def budget_table(budget: PretrainBudget | None) -> pd.DataFrame:
    """This project's pretraining budget beside the course's (external reference)."""
    words, tokens = (budget.corpus_words, budget.corpus_tokens) if budget else _corpus_counts()
    course = f"{COURSE_SOURCE} (external reference)"
    rows = [
        {"": "corpus", "this project's stand-in": "ELTeC-fra novels 1840-1920 "
                                                   "(+ dvd/music reviews)",
         course: f"{COURSE_PRETRAINING['corpus']}, {COURSE_PRETRAINING['corpus_gb']:g} GB"},
        {"": "training corpus size", "this project's stand-in":
            f"{_fmt(words)} words, {_fmt(tokens)} sentencepiece tokens", course: "–"},
    ]
    if budget is None:
        rows.append({"": "pretraining run", "this project's stand-in": "not run yet",
                     course: "–"})
    else:
        rows += [
            {"": "pretraining run", "this project's stand-in": f"`{budget.run}` ({budget.status})",
             course: "–"},
            {"": "updates × tokens per update", "this project's stand-in":
                f"{_fmt(budget.updates)} × {_fmt(budget.tokens_per_update)}", course: "–"},
            {"": "tokens processed", "this project's stand-in": _fmt(budget.tokens_seen),
             course: "–"},
            {"": "passes over the corpus", "this project's stand-in": _fmt(budget.passes, ".2f"),
             course: f"{COURSE_PRETRAINING['epochs']} epochs"},
            {"": "wall time", "this project's stand-in": _fmt(
                budget.wall_time_s / 60 if budget.wall_time_s else None, ".1f", " min"),
             course: "–"},
            {"": "device", "this project's stand-in": budget.device, course: "–"},
            {"": "throughput", "this project's stand-in": _fmt(budget.tokens_per_s, ",.0f",
                                                               " tokens/s"), course: "–"},
        ]
    return pd.DataFrame(rows)


def budget_sentence(budget: PretrainBudget | None) -> str:
    """One sentence on the stand-in's budget (from its manifest), or that it does not exist yet."""
    words, _ = (budget.corpus_words, budget.corpus_tokens) if budget else _corpus_counts()
    course = (f"{COURSE_PRETRAINING['corpus_gb']:g} GB of {COURSE_PRETRAINING['corpus']} for "
              f"{COURSE_PRETRAINING['epochs']} epochs")
    if budget is None:
        return (f"The stand-in's pretraining run is not in the run cache yet; it will read "
                f"{_fmt(words)} words of novels, against the course's {course}.")
    mins = budget.wall_time_s / 60 if budget.wall_time_s else None
    return (f"Our stand-in saw {_fmt(budget.tokens_seen)} tokens "
            f"({_fmt(budget.passes, '.2f')} passes over {_fmt(words)} words of novels) in "
            f"{_fmt(mins, '.1f')} min on {budget.device} (`{budget.run}`), against the "
            f"course's {course}.")


# --- discussion -------------------------------------------------------------------------------


def result_sentences(res: FairseqResults) -> str:
    """The results in words, every number computed from the runs; a plain 'not yet' without them."""
    if not res.ready:
        return ("No result can be discussed before the runs exist; the comparison with the "
                "course below is the one the runs will be read against.")
    summ = seed_summary(res).set_index("init")
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
        parts.append(f"the {init} runs reach {seedstats.fmt_mean_std(mean, row['test_std'], int(row['n']))} "
                     f"% test accuracy at their best-validation epoch (mean best epoch "
                     f"{row['best_epoch_mean']:.1f} of {int(res.best['best_epoch'].max())} logged), "
                     f"{where} the course's {ref.text()}")
    text = "; ".join(parts)
    text = text[0].upper() + text[1:] + "."
    g = gap(res)
    if g is not None:
        cg = course_gap()
        text += (f" Pretraining is worth {g.diff:.1f} points here (95 % Welch CI {g.ci_low:.1f} "
                 f"to {g.ci_high:.1f}), against {cg.text()} in the course.")
    return text
