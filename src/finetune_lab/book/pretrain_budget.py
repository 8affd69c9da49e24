"""The stand-in checkpoint's pretraining budget, beside the course's.

A smaller pretrained-vs-random gap than the course's measures the stand-in, so the fairseq
chapter says what the stand-in was trained with: read from the manifest of the pretraining run
behind the packaged checkpoint and from the pretraining corpus's recorded counts, never typed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab._files import parse_json
from finetune_lab.book.course_reference import COURSE_COLUMN, COURSE_PRETRAINING
from finetune_lab.book.pretrain_report import checked_lineage
from finetune_lab.data.cls_splits import read_summary, summary_path
from finetune_lab.book.report import project_path
from finetune_lab.config import paths
from finetune_lab.data.eltec import REVIEW_DOMAINS
from finetune_lab.data.pretrain_corpus import default_output as default_corpus
from finetune_lab.models.checkpoints import package_manifest, packaged_dir
from finetune_lab.runs.manifest import resolve_stored_path, run_key
from finetune_lab.runs.fairseq_logs import updates_per_epoch
from finetune_lab.runs.reading import reads_once
from finetune_lab.runs.registry import discover_runs, find_run, valid_runs
from finetune_lab.runs.runspeed import device_name
from finetune_lab.train.pretrain_lineage import sinusoids_in
from finetune_lab.train.pretrain_recipe import EXPERIMENT as PRETRAIN


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
    # the weights' history: tokens over every run behind them (the package's lineage), and how
    # the last run differs from the course's recipe
    tokens_all_runs: int | None = None
    runs_behind: int = 1
    task_adaptive: bool = False
    bow_weight: float = 0.0
    whole_lines: bool = False
    tapt_passes: float | None = None
    sinusoids_in: str | None = None
    """The run of the lineage that wrote sinusoids into the learned position table
    (``pretrain --position-init sinusoidal``), if one did."""

    @property
    def tokens_seen(self) -> int | None:
        """Tokens of the last run (a ceiling for whole-line batches, filled by tokens)."""
        if self.updates is None or self.tokens_per_update is None:
            return None
        return self.updates * self.tokens_per_update

    @property
    def passes(self) -> float | None:
        """How many times the last run read its corpus: the general corpus's tokens over the
        tokens processed, or fairseq's own count for a task-adaptive run."""
        if self.task_adaptive:
            return self.tapt_passes
        if self.tokens_seen is None or not self.corpus_tokens:
            return None
        return self.tokens_seen / self.corpus_tokens


def _corpus_record() -> dict[str, Any]:
    """The pretraining corpus's record: the prepared data's manifest, else the committed
    summary's, read through the summary's one reader
    (:func:`~finetune_lab.data.cls_splits.read_summary`), which refuses a file whose counts
    contradict each other in one line naming it (never a silent "–")."""
    prepared = _json_object(default_corpus() / "manifest.json")
    if prepared is not None and counts_agree(prepared) and _read_by_runs(prepared):
        return prepared
    return read_summary(summary_path())["pretrain"]


def _read_by_runs(prepared: dict[str, Any]) -> bool:
    """Whether the prepared corpus is one the valid pretraining runs trained on (its training
    file's sha256 among theirs): trial 30's R-7, a corpus prepared again with two novels was
    described as the stand-in's."""
    sha = (prepared.get("outputs") or {}).get("bin/train.bin") \
        if isinstance(prepared.get("outputs"), dict) else None
    read = {(d.get("sha256") or {}).get("train.bin")
            for rec in valid_runs(discover_runs(paths().runs, [PRETRAIN]))
            for d in (rec.manifest.get("inputs") or {}).get("data") or [] if isinstance(d, dict)}
    return isinstance(sha, str) and sha in read


def counts_agree(record: dict[str, Any]) -> bool:
    """Whether a corpus record's counts can be right: whole numbers, and in every split at
    least as many sentencepiece tokens as words (a word is one piece or more; a hand-edited
    count that halved the tokens doubled the passes over the corpus)."""
    counts = record.get("counts")
    if not isinstance(counts, dict):
        return False
    for split in counts.values():
        tokens, words = (split.get(k) if isinstance(split, dict) else None
                         for k in ("tokens", "words"))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in (tokens, words)) or tokens < words:
            return False
    return True


def _json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is absent or damaged (a damaged record of the
    prepared data falls back to the committed summary; it never stops a chapter)."""
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def corpus_counts() -> tuple[int | None, int | None]:
    """Words and tokens of the pretraining corpus's train split."""
    train = (_corpus_record().get("counts") or {}).get("train") or {}
    return train.get("words"), train.get("tokens")


def corpus_description() -> str:
    """What the stand-in's pretraining corpus holds, from its recorded parameters and counts."""
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
    """The valid pretraining run behind the packaged checkpoint, else the last valid one, if
    any: read through the registry, so a rejected run never sets the budget."""
    root = Path(runs_root) if runs_root is not None else paths().runs
    package = package_manifest(Path(checkpoint_dir) if checkpoint_dir else packaged_dir())
    run = (package or {}).get("run")
    if isinstance(run, str) and run:  # in the cache read, else where the package says it is
        for base in dict.fromkeys([root, resolve_stored_path(run).parent.parent]):
            rec = find_run(run_key(run), base)
            if rec is not None:
                return (rec.path, rec.manifest) if rec.valid else None
    if not (root / PRETRAIN).is_dir():
        return None
    found = valid_runs(discover_runs(root, [PRETRAIN]))
    if not found:
        return None
    last = max(found, key=lambda r: r.manifest.get("end_time") or "")
    return last.path, last.manifest


@reads_once
def pretrain_budget(runs_root: Path | None = None,
                    checkpoint_dir: Path | None = None) -> PretrainBudget | None:
    """The stand-in's pretraining budget from its run manifest (None when no run exists).

    The run is the one the packaged checkpoint names (its ``manifest.json``'s ``run``), else the
    last complete run of the ``pretrain`` experiment.
    """
    got = _pretrain_manifest(runs_root, checkpoint_dir)
    if got is None:
        return None
    path, man = got
    hp = man.get("hyperparameters") or {}
    words, tokens = corpus_counts()
    package = Path(checkpoint_dir) if checkpoint_dir else packaged_dir()
    record = package_manifest(package) or {}
    # each step's tokens from its own run where the cache has it, the package's copy checked
    lineage = checked_lineage(record.get("lineage") or [], record, package, runs_root)
    behind = [step.get("tokens") for step in lineage]
    whole_lines = hp.get("sample_break_mode", "none") != "none"
    log = path / "train.log"
    per_epoch = updates_per_epoch(log.read_text(encoding="utf-8", errors="replace")) \
        if log.is_file() else None
    updates = hp.get("max_update")
    sinus = sinusoids_in(lineage, _position_init)
    return PretrainBudget(
        run=project_path(path), status=str(man.get("status")),
        updates=updates, tokens_per_update=hp.get("tokens_per_update"),
        wall_time_s=man.get("wall_time_s"), device=device_name(man),
        tokens_per_s=(man.get("throughput") or {}).get("tokens_per_s"),
        corpus_words=words, corpus_tokens=tokens,
        tokens_all_runs=(sum(behind) if len(lineage) > 1 and None not in behind else None),
        runs_behind=max(len(lineage), 1),
        task_adaptive=float(hp.get("tapt_fraction") or 0.0) >= 1.0,
        bow_weight=float(hp.get("bow_weight") or 0.0), whole_lines=whole_lines,
        tapt_passes=updates / per_epoch if updates and per_epoch else None,
        sinusoids_in=Path(sinus).name if sinus else None)


def _position_init(run: str) -> str | None:
    """``hyperparameters.position_init`` of a lineage step's run (None when unrecorded, or when
    the registry rejects that run)."""
    rec = find_run(run_key(run))
    if rec is None or rec.manifest is None:
        return None
    return rec.manifest["hyperparameters"].get("position_init")


def checkpoint_tag(budget: PretrainBudget | None) -> str:
    """:func:`checkpoint_caveat` in a few words, for a table row ("" when it does not apply)."""
    if budget is None:
        return ""
    return ", ".join((["task-adaptive"] if budget.task_adaptive else [])
                     + (["`<s>` trained to summarise"] if budget.bow_weight > 0 else []))


def checkpoint_caveat(budget: PretrainBudget | None) -> str:
    """How the stand-in's pretraining departs from a pretrained model in the usual sense, said
    next to the results it gives (empty when it does not)."""
    if budget is None or not (budget.task_adaptive or budget.bow_weight > 0
                              or budget.sinusoids_in):
        return ""
    what = []
    if budget.task_adaptive:
        what.append("its last pretraining run was task-adaptive (it read the texts of the "
                    "CLS-Books training split, never their labels, nor the validation or test "
                    "reviews)")
    if budget.bow_weight > 0:
        what.append("it was trained to summarise each text at `<s>`, the position the "
                    "classifier reads, with a self-supervised bag-of-words objective "
                    "(@sec-pretrain-summary)")
    if budget.sinusoids_in:
        what.append(f"its learned position table was restarted from sinusoids partway (in "
                    f"`{budget.sinusoids_in}`, @sec-pretrain-positions)")
    # the clauses hold commas, so three or more are set apart by semicolons
    joined = (", and ".join(what) if len(what) < 3
              else "; ".join(what[:-1]) + "; and " + what[-1])
    return f"The stand-in is not pretrained quite as the course's model was: {joined}."


def fmt(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    """``value`` formatted, or – when it is unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def budget_table(budget: PretrainBudget | None) -> pd.DataFrame:
    """This project's pretraining budget beside the course's (external reference)."""
    words, tokens = (budget.corpus_words, budget.corpus_tokens) if budget else corpus_counts()
    course = COURSE_COLUMN
    rows = [
        {"": "corpus", "this project's stand-in": corpus_description() + (
            "; its last run: the task-adaptive corpus (the CLS-Books training texts without "
            "labels, and the dvd/music reviews)" if budget and budget.task_adaptive else ""),
         course: f"{COURSE_PRETRAINING['corpus']}, {COURSE_PRETRAINING['corpus_gb']:g} GB"},
        {"": "training corpus size", "this project's stand-in":
            f"{fmt(words)} words, {fmt(tokens)} sentencepiece tokens", course: "–"},
    ]
    if budget is None:
        rows.append({"": "pretraining run", "this project's stand-in": "not run yet",
                     course: "–"})
    else:
        rows += [
            {"": "pretraining run", "this project's stand-in": f"`{budget.run}` ({budget.status})",
             course: "–"},
            {"": "updates × tokens per update", "this project's stand-in":
                f"{fmt(budget.updates)} × {fmt(budget.tokens_per_update)}", course: "–"},
            {"": "tokens processed" + (" (at most: batches of whole lines)"
                                       if budget.whole_lines else ""),
             "this project's stand-in": fmt(budget.tokens_seen)
             + (f" ({fmt(budget.tokens_all_runs)} over the {budget.runs_behind} runs behind "
                "the weights)" if budget.tokens_all_runs else ""),
             course: "–"},
            {"": "passes over the corpus", "this project's stand-in": fmt(budget.passes, ".2f")
             + (" (over the task-adaptive corpus)" if budget.task_adaptive else ""),
             course: f"{COURSE_PRETRAINING['epochs']} epochs"},
            {"": "objective", "this project's stand-in": "masked LM"
             + (f" + `<s>` bag of words (weight {budget.bow_weight:g})" if budget.bow_weight
                else ""), course: "masked LM"},
            {"": "wall time", "this project's stand-in": fmt(
                budget.wall_time_s / 60 if budget.wall_time_s else None, ".1f", " min"),
             course: "–"},
            {"": "device", "this project's stand-in": budget.device, course: "–"},
            {"": "throughput", "this project's stand-in": fmt(budget.tokens_per_s, ",.0f",
                                                              " tokens/s"), course: "–"},
        ]
    return pd.DataFrame(rows)
