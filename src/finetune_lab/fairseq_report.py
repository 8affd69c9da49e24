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


@dataclass(frozen=True)
class Plan:
    """What one run of the grid executes: training-set size, recipe and architecture overrides."""

    n_train: int
    source: str
    """Where ``n_train`` (and the recipe) were read, for the prose."""
    recipe: FinetuneRecipe = LAB_RECIPE
    arch: dict[str, int] = field(default_factory=dict)


def plan(res: FairseqResults | None = None) -> Plan:
    """The runs' own size, recipe and architecture when valid runs agree on them; else the lab's.

    Without runs, ``n_train`` is read from the committed data summary
    (``data/summaries/data.json``, written by the data pipeline) and the recipe is
    :data:`recipe.LAB_RECIPE`, so that the command can be shown without the prepared data.
    """
    from dataclasses import fields

    from finetune_lab.data_summary import summary_path, train_size

    res = res if res is not None else load_results()
    hps = {json.dumps(r.manifest["hyperparameters"], sort_keys=True) for r in res.loaded.used}
    if len(hps) == 1:
        hp = json.loads(hps.pop())
        names = {f.name for f in fields(FinetuneRecipe)}
        kw = {k: v for k, v in hp.items() if k in names}
        if "adam_betas" in kw:
            kw["adam_betas"] = tuple(kw["adam_betas"])
        return Plan(int(hp["n_train"]), "the runs' manifests", FinetuneRecipe(**kw),
                    dict(hp.get("arch_overrides") or {}))
    summary = summary_path()
    if summary.is_file():
        return Plan(train_size(summary), f"`{_show_path(summary)}`")
    bin_dir = ff.require_cls_bin(_default_bin())
    return Plan(ff.train_size(bin_dir), f"`{_show_path(bin_dir)}`")


def recipe_note(p: Plan) -> str:
    """'' when the runs follow the lab's recipe, else the settings in which they differ."""
    ours, lab = p.recipe.as_dict(), LAB_RECIPE.as_dict()
    diff = [f"{k} = {ours[k]} (the lab: {lab[k]})" for k in ours if ours[k] != lab[k]]
    diff += [f"{k} = {v}" for k, v in sorted(p.arch.items())]
    if not diff:
        return ""
    return ("**These runs do not follow the lab's recipe exactly**: " + "; ".join(diff) + ".")


def _default_bin() -> Path:
    from finetune_lab.binarize import default_output

    return default_output()


def _default_checkpoint() -> Path:
    from finetune_lab.checkpoints import MODEL_FILE, packaged_dir

    return packaged_dir() / MODEL_FILE


def train_command(p: Plan, init: str = "pretrained", seed: int = SEEDS[0], *,
                  bin_dir: Path | None = None, cpu: bool = False,
                  runs_root: Path | None = None) -> list[str]:
    """The ``fairseq-train`` argument list one run of the grid executes.

    Built with :func:`finetune_fairseq.fairseq_args` for the default data and checkpoint paths;
    neither needs to exist. ``--tensorboard-logdir`` is the run's folder in the run cache.
    """
    from finetune_lab.recording import run_dir_for

    ckpt = _default_checkpoint() if init == "pretrained" else None
    args = ff.fairseq_args(bin_dir or _default_bin(), p.recipe, p.n_train, seed=seed,
                           checkpoint=ckpt, cpu=cpu, arch=p.arch or None)
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
        if lines and len(lines[-1]) + 1 + len(text) <= width:
            lines[-1] += " " + text
        else:
            lines.append(text)
    return " \\\n    ".join(lines)


def shell_markdown(text: str):
    """``text`` as a fenced ``bash`` block (displayable Markdown)."""
    from IPython.display import Markdown

    return Markdown(f"```bash\n{text}\n```")


def command_markdown(p: Plan, init: str = "pretrained", seed: int = SEEDS[0]):
    """The rendered ``fairseq-train`` line of one run as a fenced ``bash`` block."""
    return shell_markdown(render_command(train_command(p, init, seed)))


def init_flags(p: Plan) -> list[str]:
    """The options the pretrained runs add to the random ones (computed from both lines)."""
    pre = train_command(p, "pretrained", 0)
    rnd = set(train_command(p, "random", 0))
    return [a for a in pre if a.startswith("--") and a not in rnd]


def code_list(items: list[str]) -> str:
    """``a``, ``b`` and ``c`` as inline code, for prose."""
    codes = [f"`{i}`" for i in items]
    return codes[0] if len(codes) == 1 else ", ".join(codes[:-1]) + " and " + codes[-1]


def schedule_table(p: Plan) -> pd.DataFrame:
    """The recipe's schedule derived from ``n_train``: updates, warm-up, peak learning rate."""
    n_train, recipe = p.n_train, p.recipe
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
        ("peak learning rate", f"{recipe.lr:g}",
         "reached at the end of warm-up, then linear decay to 0 at the last update"),
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
    need_ckpt = "" if _default_checkpoint().is_file() else (
        f" The pretrained runs start from `{_show_path(_default_checkpoint())}`, which does not "
        "exist yet: `finetune-lab pretrain` makes it.")
    if not res.ready:
        return (f"**The runs have not been made yet**{tail}: the run cache holds no valid "
                f"`{EXPERIMENT}` run, so the result tables below are empty and the figure shows "
                f"only the planned learning-rate schedule. `{FINETUNE_COMMAND}` makes the "
                f"{want} runs (on a GPU when one is visible); this chapter then fills in from "
                f"their logs.{need_ckpt}")
    counts = " and ".join(f"{n} {i}" for i, n in have.items())
    missing = "" if sum(have.values()) >= want else (
        f" The full grid has {want} runs; `{FINETUNE_COMMAND}` makes the missing ones."
        + (need_ckpt if res.n("pretrained") < len(SEEDS) else ""))
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


def plot_curves(res: FairseqResults, p: Plan | None = None):
    """2 × 2 panels against the update count: valid and test accuracy, train loss, learning rate.

    Thin lines are runs; thick line and band the mean ± sample std per init (via
    :func:`finetune_lab.plots.plot_seed_curves`). The learning-rate panel also draws, dashed, the
    schedule the recipe plans (fairseq's own scheduler, :func:`hf_compare.lr_schedules`). Without
    runs, only that planned schedule is drawn.
    """
    import matplotlib.pyplot as plt

    from finetune_lab.hf_compare import lr_schedules
    from finetune_lab.plots import plot_seed_curves

    p = p if p is not None else plan(res)
    planned = lr_schedules(p.n_train, p.recipe)
    if not res.ready:
        fig, ax = plt.subplots(figsize=(6, 3), layout="constrained")
        ax.plot(planned["update"] - 1, planned["fairseq"], ls="--", color="0.3",
                label="planned (no runs yet)")
        ax.set_xlabel("update")
        ax.set_ylabel("learning rate")
        ax.legend(frameon=False, fontsize="small")
        return fig
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
    for ax in axes[0]:
        ax.tick_params(labelbottom=True)
    return fig


# --- speed and device -------------------------------------------------------------------------


SPEED_COLUMNS = ["init", "seed", "device", "threads", "updates", "wall time (min)", "updates/s"]


def speed_table(res: FairseqResults) -> pd.DataFrame:
    """Per valid run, from its manifest: device, threads, updates, wall time, median updates/s."""
    from finetune_lab.runspeed import speed_table as run_speeds

    return run_speeds(res.loaded.used)[SPEED_COLUMNS]


def speed_sentence(res: FairseqResults) -> str:
    """Mean time per run and the device(s), or that there is nothing to time yet."""
    from finetune_lab.runspeed import settings_sentence
    from finetune_lab.runspeed import speed_table as run_speeds

    t = run_speeds(res.loaded.used)
    if t.empty:
        return "There is no run to time yet."
    dev = settings_sentence(t)
    return (f"The {len(t)} runs took {t['wall time (min)'].mean():.1f} min each on average "
            f"(fastest {t['wall time (min)'].min():.1f}, slowest {t['wall time (min)'].max():.1f}), "
            f"{dev}; fairseq's median rate was {t['updates/s'].median():.1f} updates/s.")


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


def _corpus_record() -> dict[str, Any]:
    """The pretraining corpus's record (prepared data's manifest, else the committed summary)."""
    from finetune_lab.data_summary import summary_path
    from finetune_lab.pretrain_corpus import default_output

    prepared = default_output() / "manifest.json"
    if prepared.is_file():
        return json.loads(prepared.read_text(encoding="utf-8"))
    if summary_path().is_file():
        return json.loads(summary_path().read_text(encoding="utf-8")).get("pretrain") or {}
    return {}


def _corpus_counts() -> tuple[int | None, int | None]:
    """Words and tokens of the pretraining corpus's train split."""
    train = (_corpus_record().get("counts") or {}).get("train") or {}
    return train.get("words"), train.get("tokens")


def corpus_description() -> str:
    """What the stand-in's pretraining corpus holds, from its recorded parameters and counts."""
    from finetune_lab.pretrain_corpus import REVIEW_DOMAINS

    rec = _corpus_record()
    train = (rec.get("counts") or {}).get("train") or {}
    novels = train.get("novels")
    text = f"{novels:,} ELTeC-fra novels" if novels else "ELTeC-fra novels"
    params = rec.get("parameters") or {}
    if params.get("with_reviews") and params.get("review_repeat"):
        text += (f" + Webis-CLS-10 {'/'.join(REVIEW_DOMAINS)} reviews (train and test files, "
                 f"{params['review_valid']:,} held out, the rest written "
                 f"{params['review_repeat']}x; never books)")
    elif params.get("with_reviews"):
        text += f" + Webis-CLS-10 {'/'.join(REVIEW_DOMAINS)} training reviews (not books)"
    return text


def _pretrain_manifest(runs_root: Path | None = None, checkpoint_dir: Path | None = None
                       ) -> tuple[Path, dict[str, Any]] | None:
    """The pretraining run behind the packaged checkpoint, else the last complete one, if any."""
    from finetune_lab.checkpoints import MANIFEST_FILE, packaged_dir
    from finetune_lab.manifest import ManifestError, read_manifest, resolve_stored_path
    from finetune_lab.pretrain import EXPERIMENT as PRETRAIN

    root = Path(runs_root) if runs_root is not None else paths().runs
    packaged = (Path(checkpoint_dir) if checkpoint_dir else packaged_dir()) / MANIFEST_FILE
    if packaged.is_file():
        run = json.loads(packaged.read_text(encoding="utf-8")).get("run")
        if run and (resolve_stored_path(run) / "manifest.json").is_file():
            return resolve_stored_path(run), read_manifest(resolve_stored_path(run))
    found = []
    for m in sorted((root / PRETRAIN).glob("*/manifest.json")):
        try:
            man = read_manifest(m.parent)
        except ManifestError:  # an unreadable manifest is the pretraining chapter's business
            continue
        if man.get("status") == "complete":
            found.append((man.get("end_time") or "", m.parent, man))
    if not found:
        return None
    _, path, man = max(found, key=lambda x: x[0])
    return path, man


def pretrain_budget(runs_root: Path | None = None,
                    checkpoint_dir: Path | None = None) -> PretrainBudget | None:
    """The stand-in's pretraining budget from its run manifest (None when no run exists).

    The run is the one the packaged checkpoint names (its ``manifest.json``'s ``run``), else the
    last complete run of the ``pretrain`` experiment.
    """
    from finetune_lab.runspeed import device_name

    got = _pretrain_manifest(runs_root, checkpoint_dir)
    if got is None:
        return None
    path, man = got
    hp = man.get("hyperparameters") or {}
    words, tokens = _corpus_counts()
    return PretrainBudget(
        run=_show_path(path), status=str(man.get("status")),
        updates=hp.get("max_update"), tokens_per_update=hp.get("tokens_per_update"),
        wall_time_s=man.get("wall_time_s"), device=device_name(man),
        tokens_per_s=(man.get("throughput") or {}).get("tokens_per_s"),
        corpus_words=words, corpus_tokens=tokens)


def _fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def budget_table(budget: PretrainBudget | None) -> pd.DataFrame:
    """This project's pretraining budget beside the course's (external reference)."""
    words, tokens = (budget.corpus_words, budget.corpus_tokens) if budget else _corpus_counts()
    course = f"{COURSE_SOURCE} (external reference)"
    rows = [
        {"": "corpus", "this project's stand-in": corpus_description(),
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
        return (f"No complete pretraining run of the stand-in is in the run cache yet; it reads "
                f"{_fmt(words)} words, against the course's {course}.")
    mins = budget.wall_time_s / 60 if budget.wall_time_s else None
    return (f"Our stand-in saw {_fmt(budget.tokens_seen)} tokens "
            f"({_fmt(budget.passes, '.2f')} passes over {_fmt(words)} words) in "
            f"{_fmt(mins, '.1f')} min on {budget.device} (`{budget.run}`), against the "
            f"course's {course}.")


# --- discussion -------------------------------------------------------------------------------


def result_sentences(res: FairseqResults) -> str:
    """The results in words, every number computed from the runs; a plain 'not yet' without them."""
    if not res.ready:
        return ("No result can be discussed before the runs exist; the comparison with the "
                "course below is the one the runs will be read against.")
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
    text = text[0].upper() + text[1:] + "."
    g = gap(res)
    if g is not None:
        text += f" {gap_verdict(g)} The course measured {course_gap().text()}."
    return text


def gap_verdict(g: seedstats.InitGap | None) -> str:
    """Whether fine-tuning from the stand-in beats random initialisation by a margin the seeds
    can show (the 95 % Welch interval of pretrained − random excludes 0 on the positive side)."""
    if g is None:
        return ("Whether fine-tuning from the stand-in beats random initialisation is not known "
                "yet: that needs at least two valid seeds per initialisation.")
    ci = f"95 % Welch CI {g.ci_low:.1f} to {g.ci_high:.1f}; n = {g.n_a} and {g.n_b} seeds"
    if g.ci_low > 0:
        return (f"Fine-tuning from the stand-in beats random initialisation by {g.diff:.1f} "
                f"points of test accuracy ({ci}): a margin the seeds clearly show.")
    if g.ci_high < 0:
        return (f"Fine-tuning from the stand-in does worse than random initialisation, by "
                f"{-g.diff:.1f} points of test accuracy ({ci}): this checkpoint does not do "
                "what pretraining is for.")
    return (f"Fine-tuning from the stand-in and from a random initialisation differ by "
            f"{g.diff:+.1f} points of test accuracy ({ci}): within seed noise, so this "
            "checkpoint does not beat random initialisation by a margin the seeds can show.")
