"""The pretraining runs the chapter reads, the run behind the packaged checkpoint, and its recipe.

Everything is read from the run cache (``data/runs/pretrain/``, ``data/runs/pretrain-ablation/``),
the packaged checkpoint's manifest and the committed data summary; nothing here is typed in
except the course model's description, an external reference labelled as such. The curves and
long runs are in :mod:`~finetune_lab.book.pretrain_curves`, the plateau in
:mod:`~finetune_lab.book.pretrain_plateau`, the fill-mask demo in
:mod:`~finetune_lab.book.fill_mask`, and the weights tried in
:mod:`~finetune_lab.book.pretrain_candidates`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab.book.fill_mask import dictionary_counts
from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.models.checkpoints import (
    DICT_FILE,
    lineage_step_updates,
    package_manifest,
    packaged_dir,
)
from finetune_lab.runs.fairseq_logs import mean_tokens_per_update, updates_per_epoch
from finetune_lab.runs.manifest import run_key
from finetune_lab.runs.registry import RunRecord, find_run
from finetune_lab.runs.runspeed import device_name, device_threads
from finetune_lab.runs.tblogs import LoadedRuns, load_experiments
from finetune_lab.train.pretrain_ablations import ABLATIONS
from finetune_lab.train.pretrain_ablations import EXPERIMENT as ABLATION_EXPERIMENT
from finetune_lab.train.pretrain_recipe import EXPERIMENT, PretrainRecipe
from finetune_lab.runs.reading import reads_once

COURSE_MODEL = {
    "corpus": "French part of mC4, 39 GB of web text",
    "training": "masked LM, 10 epochs",
    "hardware": "2 x NVIDIA RTX A6000",
    "source": "the course's description of RoBERTa_small_fr (external reference, not re-run)",
}
"""The course checkpoint as the course describes it: an external reference, not a result."""

VALID_SUBSETS = ("valid", "valid1")
"""fairseq's names for the held-out novels and (when the corpus has them) held-out reviews."""


@dataclass
class PretrainRuns:
    """The pretraining runs of the cache, the valid ones' scalars, and the packaged model."""

    loaded: LoadedRuns | None  # None when no run was ever recorded
    checkpoint: dict[str, Any] | None

    @property
    def runs(self) -> list[RunRecord]:
        return list(self.loaded.runs) if self.loaded is not None else []

    @property
    def used(self) -> list[RunRecord]:
        return list(self.loaded.used) if self.loaded is not None else []

    @property
    def latest(self) -> RunRecord | None:
        """The valid run the packaged checkpoint came from; without a packaged checkpoint, the
        most recent valid run. None when the checkpoint's own run is not valid: another run is
        never shown as the checkpoint's (trial 16's R-v1)."""
        used = self.used
        if not used:
            return None
        source = (self.checkpoint or {}).get("run")
        if source:
            return next((rec for rec in used if rec.key == run_key(source)), None)
        return max(used, key=lambda r: r.manifest.get("end_time") or "")

    @property
    def scalars(self) -> pd.DataFrame:
        return self.loaded.scalars if self.loaded is not None else pd.DataFrame()


def load_pretrain_runs() -> PretrainRuns:
    loaded = None
    if (paths().runs / EXPERIMENT).is_dir():
        loaded = load_experiments([EXPERIMENT])
    return PretrainRuns(loaded=loaded, checkpoint=package_manifest())


def run_facts(runs: PretrainRuns) -> dict[str, Any]:
    """Budget, tokens seen, device and final validation loss of the run behind the checkpoint,
    and what the context is worth to it (``context_bits``: the unigram entropy minus its loss);
    ``{}`` before any run."""
    rec = runs.latest
    if rec is None:
        return {}
    # a continued run's package lists every run behind the weights (pretrain --continue-from)
    package = runs.checkpoint or {}
    facts = facts_of(runs, rec, checked_lineage(list(package.get("lineage") or []), package))
    unigram = unigram_bits()
    loss = facts["valid_loss_bits"]
    return {**facts, "unigram_bits": unigram,
            "context_bits": unigram - loss if unigram is not None and loss is not None else None}


def corpus_blocks(rec: RunRecord) -> int | None:
    """Training samples (blocks of ``tokens_per_sample``) in the corpus the run read, from its
    own log: the corpus can be prepared again differently after a run."""
    log = rec.path / "train.log"
    if not log.is_file():
        return None
    found = re.findall(r"loaded (\d+) blocks from: \S+/train\s*$",
                       log.read_text(encoding="utf-8", errors="replace"), flags=re.M)
    return int(found[-1]) if found else None


def expected_blocks(counts: dict[str, Any], tokens_per_sample: int) -> int:
    """Blocks ``masked_lm`` cuts from a split with these counts: every line ends with ``</s>``
    (an empty line between documents too), and a block holds ``tokens_per_sample - 1`` of
    them (one place is left for ``<s>``)."""
    lines = counts["paragraphs"] + counts["documents"] - 1
    return -(-(counts["tokens"] + lines) // (tokens_per_sample - 1))


def loss_curve(scalars: pd.DataFrame, subset: str = "valid") -> pd.DataFrame:
    """The validation losses (bits) on one held-out set among ``scalars``, by update."""
    return scalars[(scalars["tag"] == "loss") & (scalars["subset"] == subset)].sort_values("step")


def valid_curve(runs: PretrainRuns, name: str, subset: str = "valid") -> pd.DataFrame:
    """One run's validation losses (bits) on one held-out set, by update."""
    df = runs.scalars
    return loss_curve(df[df["run"] == name], subset)


def facts_of(runs: PretrainRuns, rec: RunRecord, lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`run_facts` of any pretraining run, given the lineage of its weights (each step's
    figures from its own run where the cache has it: :func:`checked_lineage`, as every caller
    in the book reads it); ``passes``: the passes over its training corpus (from its log), or
    None."""
    man = rec.manifest
    hp = man["hyperparameters"]
    thr = man.get("throughput") or {}
    valid, valid_reviews = (valid_curve(runs, rec.name, s) for s in VALID_SUBSETS)
    updates = int(man.get("updates_done") or hp["max_update"])  # a time budget can stop it early
    own_tokens = updates * int(hp["tokens_per_update"])
    tokens = [step.get("tokens") for step in lineage]
    total = (sum(tokens) if len(lineage) > 1 and None not in tokens else own_tokens)
    blocks = corpus_blocks(rec)
    samples = updates * int(hp["batch_size"]) * int(hp.get("update_freq") or 1)
    log = rec.path / "train.log"
    log_text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    whole_lines = hp.get("sample_break_mode", "none") != "none"
    per_epoch = updates_per_epoch(log_text) if whole_lines else None
    return {
        "lineage": lineage,
        "tokens_total": total,
        "run": f"{rec.experiment}/{rec.name}",
        "device": device_name(man, cores=True),
        "precision": hp.get("precision"),
        "updates": updates,
        "tokens_per_update": int(hp["tokens_per_update"]),
        "tokens_seen": own_tokens,
        "wall_time_min": (man.get("wall_time_s") or 0) / 60,
        "tokens_per_s": thr.get("tokens_per_s"),
        "mfu": thr.get("mfu"),
        "valid_loss_bits": float(valid["value"].iloc[-1]) if len(valid) else None,
        # a continued run warms up to the peak learning rate again: its first validation shows
        # what that costs the weights it started from
        "valid_first": ((int(valid["step"].iloc[0]), float(valid["value"].iloc[0]))
                        if len(valid) else None),
        "valid_reviews_loss_bits": (float(valid_reviews["value"].iloc[-1])
                                    if len(valid_reviews) else None),
        "calibration": (man.get("extra") or {}).get("calibration"),
        "corpus_blocks": blocks,
        "tokens_per_sample": int(hp["tokens_per_sample"]),
        "samples_seen": samples,
        # batches of whole lines are filled by tokens, so their count per pass is fairseq's
        "passes": (updates / per_epoch if per_epoch else None) if whole_lines
        else (samples / blocks if blocks else None),
        "whole_lines": whole_lines,
        "bow_weight": float(hp.get("bow_weight") or 0.0),
        "all_task_adaptive": float(hp.get("tapt_fraction") or 0.0) >= 1.0,
        "tokens_per_update_measured": mean_tokens_per_update(log_text),
    }


# --- the runs behind some weights: each step's figures from its own run -----------------------


def checked_step(step: dict[str, Any], rec: RunRecord, package: dict[str, Any] | None = None,
                 folder: Path | None = None, restore: str | None = None) -> dict[str, Any]:
    """A lineage step with the updates (fewer only for ``package``'s run, packaged on the way)
    and tokens of its valid run ``rec``, from the run's own manifest; the step's copy is held
    against them (:func:`~finetune_lab.models.checkpoints.lineage_step_updates`: a disagreement
    is one line; ``folder``: the package keeping the copy, the committed one by default)."""
    updates = lineage_step_updates(step, rec.manifest, package or {}, folder, restore)
    return {**step, "updates": updates,
            "tokens": updates * int(rec.manifest["hyperparameters"]["tokens_per_update"])}


@reads_once
def checked_lineage(lineage: list[dict[str, Any]], package: dict[str, Any] | None = None,
                    folder: Path | None = None, root: Path | None = None, *,
                    restore: str | None = None) -> list[dict[str, Any]]:
    """:func:`checked_step` of every step whose run the registry finds valid under ``root`` (the
    run cache by default); a step whose run is not there, or not valid, keeps its copy's
    figures. ``restore``: the fix a refusal names, when the copy is not a package's."""
    out = []
    for step in lineage:
        rec = find_run(run_key(str(step["run"])), root) if step.get("run") else None
        out.append(checked_step(step, rec, package, folder, restore)
                   if rec is not None and rec.valid else step)
    return out


def copied_lineage(lineage: list[dict[str, Any]], run_folder: Path,
                   root: Path | None = None) -> list[dict[str, Any]]:
    """:func:`checked_lineage` of the copy a run's manifest keeps of the runs behind the weights
    it started from (``extra.continued_from``; a fine-tuning run's ``checkpoint_source``): the
    last step is those weights' own run, which may have been packaged on the way. The steps'
    runs are looked up in ``root``, by default the cache that holds the run. A refusal names
    the run's manifest and says how to restore it."""
    manifest = Path(run_folder) / "manifest.json"
    try:
        restore = ("restore it with `git checkout -- "
                   f"{manifest.resolve().relative_to(PROJECT_ROOT)}`")
    except ValueError:
        restore = "restore the run's folder from where it was copied, or run it again"
    last = lineage[-1] if lineage else {}
    return checked_lineage(lineage, {"run": last.get("run"), "num_updates": last.get("updates")},
                           Path(run_folder), root or Path(run_folder).parent.parent,
                           restore=restore)


def continued_lineage(manifest: dict[str, Any], folder: Path | None = None,
                      root: Path | None = None) -> list[dict[str, Any]]:
    """The runs behind the weights a pretraining run continued, as its manifest copies them
    (``extra.continued_from.lineage``; none for random weights), checked
    (:func:`copied_lineage`). ``folder``: the run's (default: where the run cache keeps it)."""
    lineage = ((manifest.get("extra") or {}).get("continued_from") or {}).get("lineage") or []
    where = f"{manifest.get('experiment')}/{manifest.get('run')}"
    folder = Path(folder) if folder is not None else Path(root or paths().runs) / where
    return copied_lineage(lineage, folder, root) if lineage else []


def recipe_table(runs: PretrainRuns) -> pd.DataFrame:
    """Every hyperparameter of the run behind the checkpoint, as recorded in its manifest."""
    rec = runs.latest
    budget = ("max_update", "warmup_updates", "batch_size", "update_freq", "tokens_per_update",
              "precision")
    if rec is None:  # the recipe's defaults, without the device- and budget-dependent values
        hp = {k: v for k, v in PretrainRecipe().hyperparameters().items() if k not in budget}
    else:
        hp = rec.manifest["hyperparameters"]
    keep = ["tokens_per_sample", "mask_prob", "leave_unmasked_prob", "random_token_prob", "lr",
            "warmup_updates", "max_update", "adam_betas", "adam_eps", "weight_decay", "clip_norm",
            "dropout", "attention_dropout", "batch_size", "update_freq", "tokens_per_update",
            "precision", "sample_break_mode", "bow_weight", "tapt_fraction"]
    return pd.DataFrame([{"hyperparameter": k, "value": str(hp[k])} for k in keep if k in hp])


def unigram_bits(dict_path: Path | None = None) -> float | None:
    """Entropy (bits) of the pieces' corpus frequencies, from the packaged ``dict.txt`` counts:
    the loss of a model that ignores the context and predicts every masked piece from how often
    it occurs. An MLM's loss below it is what the context taught the model. ``dict_path``: the
    ``dict.txt`` of a packaged checkpoint's folder (the committed one by default), read as
    fairseq reads it, once its manifest vouches for it
    (:func:`~finetune_lab.book.fill_mask.dictionary_counts`); None when it is absent."""
    path = Path(dict_path) if dict_path is not None else packaged_dir() / DICT_FILE
    if not path.exists() and not path.is_symlink():
        return None
    counts = [count for _, count in dictionary_counts(path.parent)]
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts if c) if total else None


# --- recipe ablations: short runs at equal wall time ------------------------------------------


def load_ablations() -> LoadedRuns | None:
    """The ``pretrain-ablation`` runs (``finetune-lab pretrain-ablations``), or None."""
    if not (paths().runs / ABLATION_EXPERIMENT).is_dir():
        return None
    return load_experiments([ABLATION_EXPERIMENT])


def ablation_table(loaded: LoadedRuns | None) -> pd.DataFrame:
    """One row per ablation: what it changed, its speed, the tokens it saw in its wall time,
    and its last held-out losses, also as a difference to the recipe of the runs so far."""
    if loaded is None or not loaded.used:
        return pd.DataFrame()
    df = loaded.scalars
    baseline = next(iter(ABLATIONS))
    rows = []
    for rec in loaded.used:
        man, hp = rec.manifest, rec.manifest["hyperparameters"]
        last = {}
        for subset in VALID_SUBSETS:
            part = df[(df["run"] == rec.name) & (df["subset"] == subset)
                      & (df["tag"] == "loss")].sort_values("step")
            last[subset] = float(part["value"].iloc[-1]) if len(part) else float("nan")
        updates = int(man.get("updates_done") or hp["max_update"])
        rows.append({
            "ablation": rec.name, "precision": hp.get("precision"), "dropout": hp.get("dropout"),
            "peak lr": hp.get("lr"),
            "threads": device_threads(man),
            "budget (min)": hp.get("budget_minutes"),
            "wall time (min)": (man.get("wall_time_s") or 0) / 60,
            "tokens/s": (man.get("throughput") or {}).get("tokens_per_s"),
            "tokens (M)": updates * int(hp["tokens_per_update"]) / 1e6,
            "valid loss, novels (bits)": last["valid"],
            "valid loss, reviews (bits)": last["valid1"],
        })
    out = pd.DataFrame(rows)
    order = {name: i for i, name in enumerate(ABLATIONS)}
    out = out.sort_values("ablation", key=lambda s: s.map(order).fillna(len(order)))
    base = out[out["ablation"] == baseline]
    for col, label in (("valid loss, novels (bits)", "novels"),
                       ("valid loss, reviews (bits)", "reviews")):
        out[f"minus {baseline}, {label}"] = (out[col] - float(base[col].iloc[0])
                                             if len(base) else float("nan"))
    return out.reset_index(drop=True)


def _loss_column(table: pd.DataFrame) -> str:
    """The held-out reviews' loss (the lab's domain) where the ablations have it, else the
    novels'."""
    col = "valid loss, reviews (bits)"
    return col if table[col].notna().any() else "valid loss, novels (bits)"


def best_ablation(table: pd.DataFrame) -> str | None:
    """The ablation with the lowest held-out review loss (the lab's domain), or None."""
    if table.empty:
        return None
    return str(table.loc[table[_loss_column(table)].idxmin(), "ablation"])


@dataclass(frozen=True)
class AblationReading:
    """What the ablations show: their time budgets and threads, the speed and tokens bf16 buys
    over fp32 (None unless both ran), and the lowest held-out loss, on ``held_out``
    ("reviews", else "novels"), beside the spread of that loss over the rows."""

    budgets_min: tuple[float, ...]
    threads: float | None
    bf16_speedup: float | None
    bf16_token_ratio: float | None
    best: str
    held_out: str
    best_bits: float
    spread_bits: float
    most_tokens_m: float


def ablation_reading(table: pd.DataFrame) -> AblationReading | None:
    """:class:`AblationReading` of :func:`ablation_table`, or None before any ablation ran."""
    if table.empty:
        return None
    rows = table.set_index("ablation")
    speedup = ratio = None
    if {"fp32-dropout", "bf16-dropout"} <= set(rows.index):
        fp32, bf16 = rows.loc["fp32-dropout"], rows.loc["bf16-dropout"]
        speedup = float(bf16["tokens/s"] / fp32["tokens/s"])
        ratio = float(bf16["tokens (M)"] / fp32["tokens (M)"])
    col, best = _loss_column(table), best_ablation(table)
    threads = table["threads"].max()
    return AblationReading(
        budgets_min=tuple(sorted(float(m) for m in table["budget (min)"].dropna().unique())),
        threads=float(threads) if pd.notna(threads) else None,
        bf16_speedup=speedup, bf16_token_ratio=ratio, best=best,
        held_out="reviews" if "reviews" in col else "novels",
        best_bits=float(rows.loc[best, col]), spread_bits=float(table[col].max() - table[col].min()),
        most_tokens_m=float(table["tokens (M)"].max()))


def ablation_display(table: pd.DataFrame, excluded: Sequence[str] = ()) -> pd.DataFrame:
    """:func:`ablation_table` formatted for the chapter (a note row where no ablation is read:
    none was run, or the ``excluded`` runs were all rejected)."""
    if table.empty:
        return pd.DataFrame({"state": [
            f"ablation runs excluded: {', '.join(f'`{k}`' for k in excluded)}" if excluded
            else "no ablation run yet: `finetune-lab pretrain-ablations`"]})
    out = table.copy()
    for col in out.columns:
        if col.startswith("valid loss"):  # n/a: a corpus without that set, a baseline excluded
            out[col] = [f"{v:.3f}" if pd.notna(v) else "n/a" for v in table[col]]
        elif col.startswith("minus"):  # (19b's G1: "+nan" with the baseline rejected)
            out[col] = [f"{v:+.3f}" if pd.notna(v) else "n/a" for v in table[col]]
    out["wall time (min)"] = [f"{v:.1f}" for v in table["wall time (min)"]]
    out["budget (min)"] = [f"{v:g}" if pd.notna(v) else "n/a" for v in table["budget (min)"]]
    out["tokens/s"] = [f"{v:,.0f}" if pd.notna(v) else "n/a" for v in table["tokens/s"]]
    out["tokens (M)"] = [f"{v:.2f}" for v in table["tokens (M)"]]
    out["threads"] = [f"{v:.0f}" if pd.notna(v) else "–" for v in table["threads"]]
    out["peak lr"] = [f"{v:g}" for v in table["peak lr"]]
    return out
