"""Does the stand-in help fine-tuning? The packaged checkpoint and the weights tried since.

Replacing the packaged checkpoint sets aside every run built on it, so other weights are first
fine-tuned into their own ``fairseq-candidate*`` experiment; this module reads those runs beside
the fairseq grid's, and says which verdict each set of weights earns. The chapter words them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab.book import fairseq_report as fr
from finetune_lab.book.pretrain_plateau import GPU_EXPERIMENT
from finetune_lab.book.pretrain_report import (
    VALID_SUBSETS,
    PretrainRuns,
    continued_lineage,
    copied_lineage,
    facts_of,
    loss_curve,
    run_facts,
    valid_curve,
)
from finetune_lab.config import paths
from finetune_lab.runs import seedstats
from finetune_lab.runs.manifest import portable_path, run_key
from finetune_lab.runs.registry import RunRecord, discover_runs
from finetune_lab.runs.tblogs import event_scalars, load_experiments
from finetune_lab.train.finetune_fairseq import candidate_experiments
from finetune_lab.train.pretrain_lineage import lineage_keys, lineage_of
from finetune_lab.train.pretrain_recipe import tapt_start
from finetune_lab.runs.reading import reads_once

PACKAGE_MARGIN = 5.0
"""Points over random initialisation (its 95 % Welch interval above 0 as well) that weights must
win by before they replace the packaged checkpoint: less would not show what pretraining is for,
when the course's checkpoint wins by about 12."""


CANDIDATE = "candidate (not packaged)"
CONTINUED = "continued by the packaged"
"""The ``weights`` of a candidate-table row: weights tried and not (or not yet) adopted, or
weights in the packaged checkpoint's lineage whose own fine-tuning a candidate experiment holds
(an earlier package, say): the packaged weights went on from them."""


def candidates(runs: PretrainRuns, runs_root: Path | None = None) -> list[RunRecord]:
    """Valid pretraining runs other than the packaged checkpoint's own: those not behind it (not
    in its lineage), and those behind it that a candidate experiment fine-tuned, whose results
    stay points on the way (:data:`CONTINUED`)."""
    package = runs.checkpoint or {}
    own = run_key(package["run"]) if package.get("run") else None
    behind = {*lineage_keys(package.get("lineage") or []), own}
    tuned = fine_tuned_sources(runs_root)
    return [r for r in runs.used if r.key not in behind or (r.key in tuned and r.key != own)]


def is_behind(runs: PretrainRuns, rec: RunRecord) -> bool:
    """Whether ``rec`` is in the packaged checkpoint's lineage (its weights were continued)."""
    return rec.key in lineage_keys((runs.checkpoint or {}).get("lineage") or [])


def _source_key(rec: RunRecord) -> str | None:
    """``experiment/name`` of the pretraining run whose weights a fine-tuning run started from."""
    source = (((rec.manifest or {}).get("extra") or {}).get("checkpoint_source") or {}).get("run")
    return run_key(str(source)) if source else None


def _probe_runs(best: pd.DataFrame, records: list[RunRecord], source_run: str) -> pd.DataFrame:
    """The best-epoch rows of the fine-tuning runs whose checkpoint came from ``source_run``."""
    mine = {(r.experiment, r.name) for r in records if r.valid and _source_key(r) == source_run}
    if best.empty:
        return best
    return best[[(e, r) in mine for e, r in zip(best["experiment"], best["run"])]]


def _tuned_source(records: list[RunRecord], source_run: str) -> dict[str, Any] | None:
    """The ``checkpoint_source`` recorded by the fine-tuning runs of ``source_run``'s weights:
    the lineage of the very weights they started from (which may be a saved checkpoint of a
    run still in progress, behind the run's own latest state), each step's figures from its
    own run where the cache has it (the copy checked: :func:`copied_lineage`)."""
    for r in records:
        source = ((r.manifest or {}).get("extra") or {}).get("checkpoint_source") or {}
        if r.valid and _source_key(r) == source_run and source.get("lineage"):
            return {**source, "lineage": copied_lineage(source["lineage"], r.path)}
    return None


def _at_update(curve: pd.DataFrame, update: int) -> float | None:
    """A validation curve's value at ``update`` (None when it was not validated there)."""
    hit = curve[curve["step"] == update] if len(curve) else curve
    return float(hit["value"].iloc[-1]) if len(hit) else None


def _facts_at_checkpoint(runs: PretrainRuns, rec: RunRecord, facts: dict[str, Any],
                         source: dict[str, Any] | None) -> dict[str, Any]:
    """``facts`` of a candidate as of the checkpoint its fine-tuning started from, when that is
    not the run's last recorded update (a long run fine-tuned while still in progress)."""
    if not source:
        return facts
    own = source["lineage"][-1]
    update = int(own.get("updates") or 0)
    if not update or (update == facts["updates"] and rec.valid):
        return facts
    if rec.valid:
        valid, reviews = (valid_curve(runs, rec.name, s) for s in VALID_SUBSETS)
    else:  # in progress, so not among the loaded runs: its event files, read as they are
        raw = event_scalars(rec.path)
        valid, reviews = (loss_curve(raw, s) for s in VALID_SUBSETS)
    return {**facts, "lineage": source["lineage"], "updates": update,
            "tokens_total": sum(int(x.get("tokens") or 0) for x in source["lineage"]),
            "valid_loss_bits": _at_update(valid, update) or source.get("valid_loss_bits"),
            "valid_reviews_loss_bits": _at_update(reviews, update), "at_update": update,
            "valid_first": ((int(valid["step"].iloc[0]), float(valid["value"].iloc[0]))
                            if len(valid) else None)}


@reads_once
def candidate_table(runs: PretrainRuns, runs_root: Path | None = None,
                    facts: dict[str, Any] | None = None) -> pd.DataFrame:
    """The packaged checkpoint beside every candidate: updates and tokens behind the weights,
    last validation loss (held-out novels; held-out reviews), and the lab's fairseq fine-tuning
    from them (test accuracy at the best-validation epoch, and minus random initialisation with
    its 95 % Welch interval). Fine-tuning of a candidate is read from the ``fairseq-candidate``
    experiment, the packaged checkpoint's and random's from the grid. ``facts``: the packaged
    run's :func:`run_facts`, when the caller has them already."""
    tried = [fr.load_results(runs_root, name) for name in candidate_experiments(runs_root)]
    probe_best = pd.concat([t.best for t in tried if t.ready] or [pd.DataFrame()])
    probe_records = [r for t in tried for r in t.loaded.runs]
    # a run still in progress is a candidate once weights it saved have been fine-tuned
    cands = candidates(runs, runs_root) + [
        r for r in runs.runs if r.unfinished and r.status in ("paused", "running")
        and _tuned_source(probe_records, r.key) is not None]
    # weights pretrained in a GPU call and fine-tuned (gpu-bundle --then-finetune, or
    # --checkpoint): read with their own experiment's scalars
    gpu = PretrainRuns(load_experiments([GPU_EXPERIMENT], runs_root), runs.checkpoint) \
        if (Path(runs_root or paths().runs) / GPU_EXPERIMENT).is_dir() else None
    sources = [(runs, r) for r in cands] + [
        (gpu, r) for r in (gpu.used if gpu else []) if _tuned_source(probe_records, r.key)]
    if not sources or runs.latest is None:
        return pd.DataFrame()
    grid = fr.load_results(runs_root)
    random = grid.best[grid.best["init"] == "random"] if grid.ready else pd.DataFrame()
    packaged = grid.best[grid.best["init"] == "pretrained"] if grid.ready else pd.DataFrame()
    device_of = {(r.experiment, r.name): "GPU" if ((r.manifest or {}).get("device") or {})
                 .get("type") == "cuda" else "CPU"
                 for t in [*tried, grid] for r in t.loaded.runs if r.valid}
    rows = []
    entries = [("packaged checkpoint", runs.latest, facts or run_facts(runs), packaged)]
    last_loss = {}  # experiment/name -> its last validation loss, a continued run's start
    for rec in runs.used:
        curve = valid_curve(runs, rec.name)
        if len(curve):
            last_loss[rec.key] = float(curve["value"].iloc[-1])
    for own, rec in sources:
        # the runs before it as its manifest copies them, checked against their own records
        lineage = [*continued_lineage(rec.manifest, rec.path),
                   lineage_of(rec.manifest, portable_path(rec.path))[-1]]
        facts = _facts_at_checkpoint(own, rec, facts_of(own, rec, lineage),
                                     _tuned_source(probe_records, rec.key))
        entries.append((CONTINUED if is_behind(runs, rec) else CANDIDATE, rec, facts,
                        _probe_runs(probe_best, probe_records, rec.key)))
    for role, rec, facts, tuned in entries:
        switch = tapt_start(rec.manifest["hyperparameters"])
        tapt = switch is not None
        at = f" at update {facts['at_update']:,}" if facts.get("at_update") else ""
        hp = rec.manifest["hyperparameters"]
        behind = facts["lineage"][-2].get("run") if len(facts["lineage"]) > 1 else None
        continued = run_key(str(behind)) if behind else None
        row = {"weights": role, "run": f"`{rec.experiment}/{rec.name}`{at}",
               "task-adaptive": "yes: saw the CLS-Books training texts" if tapt else "no",
               "samples": ("whole lines" if hp.get("sample_break_mode", "none") != "none"
                           else "256-token stretches"),
               "bag weight": float(hp.get("bow_weight") or 0.0),
               "tokens per update (measured)": facts["tokens_per_update_measured"],
               "all task-adaptive": switch == 0,
               "updates (all runs)": sum(int(x.get("updates") or 0) for x in facts["lineage"])
               or facts["updates"],
               "tokens (M, all runs)": facts["tokens_total"] / 1e6,
               "valid loss, novels (bits)": facts["valid_loss_bits"],
               "valid loss, reviews (bits)": facts["valid_reviews_loss_bits"],
               "n fine-tuned": len(tuned),
               "fine-tuned on": " and ".join(sorted({device_of.get((e, n), "?") for e, n in zip(
                   tuned["experiment"], tuned["run"])})) if len(tuned) else "–",
               "test acc. (%)": None, "minus random (points)": None,
               "ci_low": None, "ci_high": None, "minus packaged (points)": None,
               "pk_low": None, "pk_high": None,
               "own updates": facts["updates"],
               "dropout": hp.get("dropout"),
               "continued": continued,
               "first valid": facts.get("valid_first"),
               "started at": last_loss.get(continued) if continued else None}
        row["acc mean"] = row["acc std"] = row["valid mean"] = float("nan")
        if len(tuned):
            row["valid mean"] = float(tuned["valid"].astype(float).mean())
            vals = tuned["test"].astype(float)
            row["acc mean"] = float(vals.mean())
            row["acc std"] = float(vals.std(ddof=1)) if len(vals) > 1 else float("nan")
            row["test acc. (%)"] = seedstats.fmt_mean_std(vals.mean(), vals.std(ddof=1)
                                                          if len(vals) > 1 else float("nan"),
                                                          len(vals))
        against = [(random, ("minus random (points)", "ci_low", "ci_high"))]
        if tuned is not packaged:
            against.append((packaged, ("minus packaged (points)", "pk_low", "pk_high")))
        for other, keys in against:
            if len(tuned) >= 2 and len(other) >= 2:  # Welch needs two seeds a side
                both = pd.concat([tuned.assign(init="weights"), other.assign(init="other")])
                g = seedstats.init_gap(both, "weights", "other", "test")
                row.update(dict(zip(keys, (g.diff, g.ci_low, g.ci_high))))
        rows.append(row)
    return pd.DataFrame(rows)


def candidate_verdict(row: pd.Series) -> str:
    """What a candidate's fine-tuning shows (a row of :func:`candidate_table`):
    ``"not fine-tuned"``; ``"one seed"`` (no Welch interval yet); ``"package"`` (beats random
    by a margin the seeds show and by :data:`PACKAGE_MARGIN` points); ``"below the bar"``
    (beats random, by less); ``"beats the packaged"`` (beats the packaged checkpoint, not
    random); ``"neither"``; ``"continued"`` for weights the packaged checkpoint went on from
    (:data:`CONTINUED`), whatever their fine-tuning showed."""
    if row["weights"] == CONTINUED:
        return "continued"
    if row["n fine-tuned"] == 0:
        return "not fine-tuned"
    if pd.isna(row["ci_low"]):
        return "one seed"
    if row["ci_low"] > 0:
        return "package" if row["minus random (points)"] >= PACKAGE_MARGIN else "below the bar"
    if pd.notna(row["pk_low"]) and row["pk_low"] > 0:
        return "beats the packaged"
    return "neither"


def warmup_cost(row: pd.Series) -> str | None:
    """What the fresh warm-up of a continued candidate cost its weights (a row of
    :func:`candidate_table`): ``"none"`` (its first validation was no worse than where its
    weights started), ``"won back"`` (worse, but it ended no worse), ``"not won back"``, or
    None when either loss is unknown, or for a run that is all task-adaptive (its loss on the
    novels rises by design: it trains on reviews only)."""
    if row.get("all task-adaptive"):
        return None
    first, start = row.get("first valid"), row.get("started at")
    if not isinstance(first, tuple) or start is None or pd.isna(start):
        return None
    if first[1] <= start:
        return "none"
    return "not won back" if row["valid loss, novels (bits)"] > start else "won back"


VERDICT_LABELS = {
    "package": "clears the bar", "continued": "continued by the packaged",
    "not fine-tuned": "not fine-tuned", "below the bar": "beats random, under the bar",
    "one seed": "one seed: no interval", "neither": "beats neither",
    "beats the packaged": "beats the packaged, not random",
}
""":func:`candidate_verdict` in a table cell's words."""


def _num(v: Any, spec: str) -> str:
    return "–" if v is None or pd.isna(v) else format(v, spec)


def _short_run(run: str) -> str:
    """A table's run cell without the experiment (every row is a pretraining run)."""
    return run.replace("`pretrain/", "`")


def kind_of(row: pd.Series) -> str:
    """What the weights' pretraining was, in the words of the decomposition: masked LM alone on
    general text, with the task's texts, or with the `<s>` objective (either text)."""
    task = str(row["task-adaptive"]).startswith("yes")
    bag = float(row.get("bag weight") or 0) > 0
    if bag:
        return "`<s>` objective" + (", task texts" if task else ", no task texts")
    return "masked LM" + (", task texts" if task else ", no task texts")


def candidate_weights_display(table: pd.DataFrame) -> pd.DataFrame:
    """The weights of :func:`candidate_table`: what trained them and the held-out losses."""
    if table.empty:
        return pd.DataFrame({"state": ["no weights tried besides the packaged checkpoint"]})
    return pd.DataFrame({
        "run": [_short_run(r) for r in table["run"]],
        "pretraining": [kind_of(r) for _, r in table.iterrows()],
        "samples": table["samples"],
        "tokens (M)": [_num(v, ".1f") for v in table["tokens (M, all runs)"]],
        "novels (bits)": [_num(v, ".2f") for v in table["valid loss, novels (bits)"]],
        "reviews (bits)": [_num(v, ".2f") for v in table["valid loss, reviews (bits)"]],
    })


def candidate_tuning_display(table: pd.DataFrame) -> pd.DataFrame:
    """The fine-tuning of :func:`candidate_table`'s weights: accuracy, each gap with its 95 %
    Welch interval (one decimal), and the verdict."""
    if table.empty:
        return pd.DataFrame({"state": ["no weights tried besides the packaged checkpoint"]})

    def gap(d: Any, lo: Any, hi: Any) -> str:
        return "–" if pd.isna(d) else f"{d:+.1f} ({lo:.1f} to {hi:.1f})"

    verdicts = [VERDICT_LABELS[candidate_verdict(r)] for _, r in table.iterrows()]
    verdicts = ["packaged" if w == "packaged checkpoint" else v
                for w, v in zip(table["weights"], verdicts)]
    return pd.DataFrame({
        "run": [_short_run(r) for r in table["run"]],
        "valid acc. (%)": [f"{v:.1f}" if pd.notna(v) else "–"
                           for v in table.get("valid mean", [float("nan")] * len(table))],
        "test acc. (%)": [f"{m:.1f}\u00a0±\u00a0{s:.1f} (n={n})" if n > 1 else
                          (f"{m:.1f} (n=1)" if n == 1 else "–")
                          for m, s, n in zip(table["acc mean"], table["acc std"],
                                             table["n fine-tuned"])],
        "− random (points, CI)": [gap(d, lo, hi) for d, lo, hi in zip(
            table["minus random (points)"], table["ci_low"], table["ci_high"])],
        "− packaged (points, CI)": [gap(d, lo, hi) for d, lo, hi in zip(
            table["minus packaged (points)"], table["pk_low"], table["pk_high"])],
        "verdict": verdicts,
    })


def validation_ranking(table: pd.DataFrame, min_seeds: int = 2) -> dict[str, Any] | None:
    """The packaged weights were chosen by their fine-tuned *test* accuracy
    (:func:`candidate_verdict`); how they rank among the weights fine-tuned over ``min_seeds``
    seeds or more by the mean best-epoch *validation* accuracy, the signal the lab picks epochs
    by, and by test accuracy; and the first by validation. None without the packaged row."""
    rows = table[table["n fine-tuned"] >= min_seeds]
    packaged = rows[rows["weights"] == "packaged checkpoint"]
    if packaged.empty:
        return None
    pk = packaged.iloc[0]
    first = rows.loc[rows["valid mean"].idxmax()]
    return {"n": len(rows), "min_seeds": min_seeds,
            "rank_valid": 1 + int((rows["valid mean"] > pk["valid mean"]).sum()),
            "rank_test": 1 + int((rows["acc mean"] > pk["acc mean"]).sum()),
            "valid": float(pk["valid mean"]), "test": float(pk["acc mean"]),
            "first_run": _short_run(first["run"]), "first_valid": float(first["valid mean"]),
            "first_test": float(first["acc mean"]),
            "first_gain": float(first["minus random (points)"])}


def random_accuracy(runs_root: Path | None = None) -> tuple[float, float, int] | None:
    """Mean, std and number of seeds of the fairseq grid's random initialisation (test accuracy
    at the best-validation epoch), or None before it has two seeds."""
    grid = fr.load_results(runs_root)
    if not grid.ready:
        return None
    vals = grid.best.loc[grid.best["init"] == "random", "test"].astype(float)
    return (float(vals.mean()), float(vals.std(ddof=1)), len(vals)) if len(vals) >= 2 else None


def plot_accuracy_vs_tokens(table: pd.DataFrame, random: tuple[float, float, int] | None):
    """Fine-tuned test accuracy of every set of weights tried, against the pretraining tokens
    behind them, beside random initialisation's band (mean ± std over its seeds)."""
    from finetune_lab.book.plots import check_legend, label_points  # heavy: matplotlib
    import matplotlib.pyplot as plt

    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    tuned = table[table["acc mean"].notna()] if not table.empty else table
    if tuned.empty:
        ax.text(0.5, 0.5, "no pretrained weights fine-tuned yet", ha="center", va="center")
        ax.set_axis_off()
        return check_legend(fig)
    if random is not None:
        mean, std, n = random
        ax.axhspan(mean - std, mean + std, color="grey", alpha=0.25,
                   label=f"random initialisation, mean ± std (n={n})")
        ax.axhline(mean, color="grey", lw=1)
    kinds = tuned.assign(kind=[("packaged: " if w == "packaged checkpoint" else "")
                               + kind_of(r) for w, (_, r) in zip(tuned["weights"],
                                                                 tuned.iterrows())])
    markers = iter("o^sDvP*X")
    for kind, part in kinds.groupby("kind", sort=True):
        ax.errorbar(part["tokens (M, all runs)"], part["acc mean"],
                    yerr=part["acc std"].fillna(0), fmt=next(markers), capsize=3,
                    ms=8 if kind.startswith("packaged") else 5, label=kind.replace("`", ""))
    ax.set_xscale("log")
    ax.margins(x=0.08)
    label_points(ax, [(x, y, str(r).replace("`", "").split("/")[-1].replace(" at update ", " @"))
                      for x, y, r in zip(tuned["tokens (M, all runs)"], tuned["acc mean"],
                                         tuned["run"])])
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 10, 20, 50, 100, …
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("pretraining tokens behind the weights (M, log scale)")
    ax.set_ylabel("test accuracy (%), best-valid epoch")
    fig.legend(frameon=False, fontsize="small", loc="outside lower center", ncol=2)
    return check_legend(fig)


def fine_tuned_sources(runs_root: Path | None = None) -> set[str]:
    """``experiment/name`` of every pretraining run whose weights (its last, or a checkpoint it
    saved on its way) a candidate experiment fine-tuned, read from the fine-tuning manifests."""
    root = Path(runs_root) if runs_root is not None else paths().runs
    return {key for experiment in candidate_experiments(root)
            for rec in discover_runs(root, [experiment])
            if rec.valid and (key := _source_key(rec))}
