"""What the pretraining chapter shows: the stand-in next to the course model, curves, speed,
and a live fill-mask demo from the committed checkpoint.

Everything is read from the run cache (``data/runs/pretrain/``), the packaged checkpoint's
manifest and the committed data summary; nothing here is typed in except the course model's
description, which is an external reference (the course's own statement), labelled as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from finetune_lab.checkpoints import package_manifest, packaged_dir
from finetune_lab.fairseq_report import corpus_description
from finetune_lab.pretrain import EXPERIMENT, lineage_of
from finetune_lab.runspeed import device_name, device_threads

COURSE_MODEL = {
    "corpus": "French part of mC4, 39 GB of web text",
    "training": "masked LM, 10 epochs",
    "hardware": "2 x NVIDIA RTX A6000",
    "source": "the course's description of RoBERTa_small_fr (external reference, not re-run)",
}
"""The course checkpoint as the course describes it: an external reference, not a result."""

DEMO_SENTENCES = (
    "Ce livre est vraiment <mask>.",
    "Je n'ai pas aimé ce <mask>.",
    "Une histoire <mask>, je le recommande à tous.",
    "Il ouvrit la <mask> et sortit dans la rue.",
    "Elle était assise près de la <mask>.",
)
"""Review-like sentences (the lab's task) and narrative ones (the pretraining domain)."""


VALID_SUBSETS = ("valid", "valid1")
"""fairseq's names for the held-out novels and (when the corpus has them) held-out reviews."""
SUBSET_LABELS = {"train_inner": "train", "valid": "valid (held-out novels)",
                 "valid1": "valid (held-out dvd/music reviews)"}


@dataclass
class PretrainRuns:
    """The pretraining runs of the cache, the valid ones' scalars, and the packaged model."""

    loaded: Any  # tblogs.LoadedRuns, or None when no run was ever recorded
    checkpoint: dict[str, Any] | None

    @property
    def runs(self) -> list:
        return list(self.loaded.runs) if self.loaded is not None else []

    @property
    def used(self) -> list:
        return list(self.loaded.used) if self.loaded is not None else []

    @property
    def latest(self):
        """The valid run the packaged checkpoint came from, else the most recent valid run."""
        used = self.used
        if not used:
            return None
        source = (self.checkpoint or {}).get("run")
        for rec in used:
            if source and str(rec.path).endswith(source):
                return rec
        return max(used, key=lambda r: r.manifest.get("end_time") or "")

    @property
    def scalars(self) -> pd.DataFrame:
        return self.loaded.scalars if self.loaded is not None else pd.DataFrame()


def load_pretrain_runs() -> PretrainRuns:
    from finetune_lab.config import paths
    from finetune_lab.tblogs import load_experiments

    loaded = None
    if (paths().runs / EXPERIMENT).is_dir():
        loaded = load_experiments([EXPERIMENT])
    return PretrainRuns(loaded=loaded, checkpoint=package_manifest())


def run_facts(runs: PretrainRuns) -> dict[str, Any]:
    """Budget, tokens seen, device and final validation loss of the run behind the checkpoint."""
    rec = runs.latest
    if rec is None:
        return {}
    # a continued run's package lists every run behind the weights (pretrain --continue-from)
    facts = facts_of(runs, rec, list((runs.checkpoint or {}).get("lineage") or []))
    return {**facts, "unigram_bits": unigram_bits()}


def corpus_blocks(rec) -> int | None:
    """Training samples (blocks of ``tokens_per_sample``) in the corpus the run read, from its
    own log: the corpus can be prepared again differently after a run."""
    import re

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


def valid_curve(runs: PretrainRuns, name: str, subset: str = "valid") -> pd.DataFrame:
    """One run's validation losses (bits) on one held-out set, by update."""
    df = runs.scalars
    return df[(df["run"] == name) & (df["tag"] == "loss")
              & (df["subset"] == subset)].sort_values("step")


def facts_of(runs: PretrainRuns, rec, lineage: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`run_facts` of any pretraining run, given the lineage of its weights."""
    man = rec.manifest
    hp = man["hyperparameters"]
    thr = man.get("throughput") or {}
    valid, valid_reviews = (valid_curve(runs, rec.name, s) for s in VALID_SUBSETS)
    updates = int(man.get("updates_done") or hp["max_update"])  # a time budget can stop it early
    own_tokens = updates * int(hp["tokens_per_update"])
    tokens = [step.get("tokens") for step in lineage]
    total = (sum(tokens) if len(lineage) > 1 and None not in tokens else own_tokens)
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
        "corpus_blocks": corpus_blocks(rec),
        "tokens_per_sample": int(hp["tokens_per_sample"]),
        "samples_seen": updates * int(hp["batch_size"]) * int(hp.get("update_freq") or 1),
    }


def comparison_table(runs: PretrainRuns, summary: dict[str, Any] | None) -> pd.DataFrame:
    """The course model (external reference) next to the stand-in (from manifests)."""
    facts = run_facts(runs)
    counts = ((summary or {}).get("pretrain") or {}).get("counts") or {}
    train = counts.get("train") or {}
    ours_corpus = (
        f"{corpus_description()}: {train.get('words', 0) / 1e6:.1f} M words, "
        f"{train.get('tokens', 0) / 1e6:.1f} M tokens" if train else "not prepared"
    )
    if train and facts.get("corpus_blocks") and facts["corpus_blocks"] != expected_blocks(
            train, facts["tokens_per_sample"]):
        ours_corpus = (f"an earlier preparation of the corpus: {facts['corpus_blocks']:,} "
                       f"samples of {facts['tokens_per_sample']} tokens (from the run's log); "
                       f"the current one (@sec-data) is {ours_corpus}")
    if facts:
        ours_training = (f"masked LM, {facts['updates']:,} updates of "
                         f"{facts['tokens_per_update']:,} tokens "
                         f"({facts['tokens_seen'] / 1e6:.1f} M tokens seen)")
        if len(facts["lineage"]) > 1:
            ours_training += (f", continuing {len(facts['lineage']) - 1} earlier run(s): "
                              f"{facts['tokens_total'] / 1e6:.1f} M tokens in all")
        ours_hw = f"{facts['device']}, {facts['wall_time_min']:.0f} min"
    else:
        ours_training = ours_hw = "not run yet"
    return pd.DataFrame({
        "": ["corpus", "training", "hardware"],
        "course RoBERTa_small_fr (reported)": [COURSE_MODEL["corpus"], COURSE_MODEL["training"],
                                               COURSE_MODEL["hardware"]],
        "this project's stand-in (measured)": [ours_corpus, ours_training, ours_hw],
    })


def recipe_table(runs: PretrainRuns) -> pd.DataFrame:
    """Every hyperparameter of the run behind the checkpoint, as recorded in its manifest."""
    rec = runs.latest
    budget = ("max_update", "warmup_updates", "batch_size", "update_freq", "tokens_per_update",
              "precision")
    if rec is None:  # the recipe's defaults, without the device- and budget-dependent values
        from finetune_lab.pretrain import PretrainRecipe

        hp = {k: v for k, v in PretrainRecipe().hyperparameters().items() if k not in budget}
    else:
        hp = rec.manifest["hyperparameters"]
    keep = ["tokens_per_sample", "mask_prob", "leave_unmasked_prob", "random_token_prob", "lr",
            "warmup_updates", "max_update", "adam_betas", "adam_eps", "weight_decay", "clip_norm",
            "dropout", "attention_dropout", "batch_size", "update_freq", "tokens_per_update",
            "precision"]
    return pd.DataFrame([{"hyperparameter": k, "value": str(hp[k])} for k in keep if k in hp])


def curves(runs: PretrainRuns) -> pd.DataFrame:
    """Train (every log interval) and valid loss in bits, perplexity, and the learning rate."""
    df = runs.scalars
    if df.empty:
        return df
    keep = df[((df["subset"] == "train_inner") & df["tag"].isin(["loss", "lr"]))
              | (df["subset"].isin(VALID_SUBSETS) & (df["tag"] == "loss"))]
    offset = {rec.name: update_offset(rec.manifest) for rec in runs.used}
    keep = keep.assign(update=keep["step"] + keep["run"].map(offset).fillna(0).astype(int))
    return keep[["run", "subset", "tag", "step", "update", "value"]].reset_index(drop=True)


def update_offset(manifest: dict[str, Any]) -> int:
    """Updates the weights had before this run: 0, or the sum over a continued run's lineage."""
    lineage = ((manifest.get("extra") or {}).get("continued_from") or {}).get("lineage") or []
    return sum(int(step.get("updates") or 0) for step in lineage)


def training_text(facts: dict[str, Any]) -> str:
    """The training paragraph's numbers: run, device, budget, tokens (over the whole lineage of a
    continued checkpoint), passes over the corpus, and the last validation loss."""
    if not facts:
        return ("**No pretraining run has been recorded yet**: run `finetune-lab pretrain` "
                "(see the README).")
    text = (f"The checkpoint comes from run `{facts['run']}` on {facts['device']}: "
            f"{facts['updates']:,} updates, {facts['tokens_seen'] / 1e6:.1f} M tokens seen in "
            f"{facts['wall_time_min']:.0f} minutes.")
    earlier = facts["lineage"][:-1]
    if earlier:
        runs = ", ".join(f"`{step['run']}` ({step['updates']:,} updates)" for step in earlier)
        text += (f" It continued from the weights of {runs} (`finetune-lab pretrain "
                 f"--continue-from`), so the weights have seen "
                 f"{facts['tokens_total'] / 1e6:.1f} M tokens in all.")
    loss = facts.get("valid_loss_bits")
    if loss is not None:
        text += (f" The last validation loss on the held-out novels is {loss:.2f} bits per "
                 f"masked token, a perplexity of {2 ** loss:,.0f}")
        reviews = facts.get("valid_reviews_loss_bits")
        text += (f"; on the held-out dvd/music reviews it is {reviews:.2f} bits (perplexity "
                 f"{2 ** reviews:,.0f})." if reviews is not None else ".")
        unigram = facts.get("unigram_bits")
        if unigram is not None:
            text += (f" A model that ignores the context and predicts each masked piece from its "
                     f"corpus frequency scores {unigram:.2f} bits (the entropy of `dict.txt`'s "
                     f"counts): the context is worth {unigram - loss:.2f} bits to this model.")
    if facts.get("corpus_blocks"):
        text += (f" That run read {facts['samples_seen'] / facts['corpus_blocks']:.2f} passes "
                 f"over its training corpus ({facts['corpus_blocks']:,} samples of "
                 f"{facts['tokens_per_sample']} tokens, from its log).")
    return text


def plot_curves(runs: PretrainRuns):
    """Loss (bits/token, with perplexity = 2^loss on the right axis) and learning rate."""
    import matplotlib.pyplot as plt
    import numpy as np

    df = curves(runs)
    fig, (ax, ax_lr) = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    if df.empty:
        for a in (ax, ax_lr):
            a.text(0.5, 0.5, "no pretraining run recorded yet", ha="center", va="center")
            a.set_axis_off()
        return fig
    for (run, subset), part in df[df["tag"] == "loss"].groupby(["run", "subset"]):
        part = part.sort_values("step")
        style = {"train_inner": dict(lw=1, alpha=0.8), "valid": dict(marker="o", lw=2),
                 "valid1": dict(marker="s", lw=2, ls="--")}[subset]
        ax.plot(part["update"], part["value"], label=f"{SUBSET_LABELS[subset]} [{run}]", **style)
    ax.set_xlabel("update")
    ax.set_ylabel("MLM loss (bits / masked token)")
    unigram = unigram_bits()
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls=":", lw=1.2,
                   label=f"no context (unigram entropy, {unigram:.2f} bits)")
        ax.set_ylim(top=max(unigram + 2.0, ax.get_ylim()[0] + 1.0))  # the first updates start higher
    ax.legend(frameon=False, fontsize="x-small")
    sec = ax.secondary_yaxis("right", functions=(lambda b: 2.0 ** b,
                                                 lambda p: np.log2(np.clip(p, 1e-12, None))))
    sec.set_ylabel("perplexity")
    for run, part in df[df["tag"] == "lr"].groupby("run"):
        part = part.sort_values("step")
        ax_lr.plot(part["update"], part["value"], label=run)
    ax_lr.set_xlabel("update")
    ax_lr.set_ylabel("learning rate")
    return fig


def throughput_table(runs: PretrainRuns) -> pd.DataFrame:
    """Speed of every valid pretraining run, with its device and precision (MFU only on a known
    GPU); updates are those done (a time budget can stop a run before its schedule ends)."""
    rows = []
    for rec in runs.used:
        man = rec.manifest
        thr = man.get("throughput") or {}
        rows.append({
            "run": rec.name,
            "device": device_name(man, cores=True),
            "precision": man["hyperparameters"].get("precision") or "n/a",
            "updates": man.get("updates_done") or man["hyperparameters"]["max_update"],
            "wall time (min)": f"{(man.get('wall_time_s') or 0) / 60:.1f}",
            "tokens/s": f"{thr['tokens_per_s']:,.0f}" if thr.get("tokens_per_s") else "n/a",
            "updates/s": f"{thr['updates_per_s']:.2f}" if thr.get("updates_per_s") else "n/a",
            "MFU (bf16 peak)": f"{100 * thr['mfu']:.1f} %" if thr.get("mfu") else "n/a (no GPU)",
        })
    return pd.DataFrame(rows)


def flops_per_token() -> float:
    """Training FLOPs per token behind the MFU column, for the project's recipe and model."""
    from finetune_lab import params
    from finetune_lab.pretrain import PretrainRecipe, model_flops_per_token

    recipe = PretrainRecipe()
    return model_flops_per_token(params.SMALL, recipe.tokens_per_sample, recipe.mask_prob)


def fill_mask_table(sentences: tuple[str, ...] = DEMO_SENTENCES, topk: int = 5) -> pd.DataFrame:
    """Top-k completions of each sentence, computed now on CPU from the committed checkpoint."""
    import torch

    from finetune_lab.checkpoints import load_hub_model

    torch.manual_seed(0)
    hub = load_hub_model()
    rows = []
    for sentence in sentences:
        for rank, (filled, prob, token) in enumerate(hub.fill_mask(sentence, topk=topk), 1):
            rows.append({"sentence": sentence, "rank": rank, "predicted piece": token.strip(),
                         "probability": prob})
    return pd.DataFrame(rows)


def fill_mask_wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per sentence: its top-k pieces with probabilities."""
    return (df.assign(cell=df["predicted piece"].map(lambda t: f"`{t}`") + " "
                      + df["probability"].map(lambda p: f"({p:.2f})"))
              .groupby("sentence", sort=False)["cell"].apply(" · ".join).reset_index()
              .rename(columns={"cell": "top predictions (probability)"}))


def unigram_bits(dict_path=None) -> float | None:
    """Entropy (bits) of the pieces' corpus frequencies, from the packaged ``dict.txt`` counts:
    the loss of a model that ignores the context and predicts every masked piece from how often
    it occurs. An MLM's loss below it is what the context taught the model."""
    import math

    from finetune_lab.checkpoints import DICT_FILE

    path = dict_path or packaged_dir() / DICT_FILE
    if not path.is_file():
        return None
    counts = [int(line.rpartition(" ")[2])
              for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    total = sum(counts)
    return -sum(c / total * math.log2(c / total) for c in counts if c) if total else None


def frequent_pieces(n: int = 20) -> set[str]:
    """The ``n`` most frequent pieces of the corpus, from the packaged ``dict.txt`` counts."""
    from finetune_lab.checkpoints import DICT_FILE

    rows = []
    for line in (packaged_dir() / DICT_FILE).read_text(encoding="utf-8").splitlines():
        piece, _, count = line.rpartition(" ")
        rows.append((int(count), piece.replace("\u2581", " ").strip()))
    return {piece for _, piece in sorted(rows, reverse=True)[:n]}


def fill_mask_reading(df: pd.DataFrame, n: int = 20) -> dict[str, int]:
    """How many top-1 predictions are among the corpus's ``n`` most frequent pieces: a model
    that has learned little beyond unigram frequencies predicts those whatever the context."""
    top1 = df[df["rank"] == 1]["predicted piece"]
    frequent = frequent_pieces(n)
    return {"sentences": len(top1), "frequent": int(top1.isin(frequent).sum()), "n": n}


def finetuning_verdict(runs_root=None) -> str:
    """Whether fine-tuning from the checkpoint beats random initialisation, from the fairseq
    grid's runs (the test the stand-in exists for), and what to do when it does not."""
    from finetune_lab import fairseq_report as fr

    res = fr.load_results(runs_root)
    g = fr.gap(res)
    text = fr.gap_verdict(g)
    if g is not None and g.ci_low <= 0:
        text += (" Until weights past the masked-LM plateau replace it (@sec-pretrain-plateau: "
                 "on a GPU, `finetune-lab gpu-bundle --steps pretrain lab --then-finetune`, see "
                 "the README; on a CPU, a long run of `finetune-lab pretrain --tokens N`, resumed "
                 "over sessions; then the pretrained fine-tuning runs again), every "
                 "pretrained-vs-random comparison in this book measures this weak checkpoint, "
                 "not the value of pretraining.")
    return text


# --- candidates: pretraining runs whose weights were not packaged ---------------------------


def candidates(runs: PretrainRuns) -> list:
    """Valid pretraining runs that are not behind the packaged checkpoint (not in its lineage):
    weights tried, not (or not yet) adopted."""
    package = runs.checkpoint or {}
    behind = {str(step.get("run") or "") for step in package.get("lineage") or []}
    behind = (behind | {str(package.get("run") or "")}) - {""}
    return [r for r in runs.used if not any(str(r.path).endswith(b) for b in behind)]


def _probe_runs(best: pd.DataFrame, records: list, source_run: str) -> pd.DataFrame:
    """The best-epoch rows of the fine-tuning runs whose checkpoint came from ``source_run``."""
    mine = {(r.experiment, r.name) for r in records if r.valid and str(
        (((r.manifest or {}).get("extra") or {}).get("checkpoint_source") or {}).get("run") or ""
    ).endswith(source_run)}
    if best.empty:
        return best
    return best[[(e, r) in mine for e, r in zip(best["experiment"], best["run"])]]


def candidate_table(runs: PretrainRuns, runs_root=None,
                    facts: dict[str, Any] | None = None) -> pd.DataFrame:
    """The packaged checkpoint beside every candidate: updates and tokens behind the weights,
    last validation loss (held-out novels; held-out reviews), and the lab's fairseq fine-tuning
    from them (test accuracy at the best-validation epoch, and minus random initialisation with
    its 95 % Welch interval). Fine-tuning of a candidate is read from the ``fairseq-candidate``
    experiment, the packaged checkpoint's and random's from the grid. ``facts``: the packaged
    run's :func:`run_facts`, when the caller has them already."""
    from finetune_lab import fairseq_report as fr
    from finetune_lab import seedstats
    from finetune_lab.finetune_fairseq import candidate_experiments

    cands = candidates(runs)
    if not cands or runs.latest is None:
        return pd.DataFrame()
    grid = fr.load_results(runs_root)
    tried = [fr.load_results(runs_root, name) for name in candidate_experiments(runs_root)]
    probe_best = pd.concat([t.best for t in tried if t.ready] or [pd.DataFrame()])
    probe_records = [r for t in tried for r in t.loaded.runs]
    random = grid.best[grid.best["init"] == "random"] if grid.ready else pd.DataFrame()
    packaged = grid.best[grid.best["init"] == "pretrained"] if grid.ready else pd.DataFrame()
    rows = []
    entries = [("packaged checkpoint", runs.latest, facts or run_facts(runs), packaged)]
    last_loss = {}  # run path -> its last validation loss, for a continued run's starting point
    for rec in runs.used:
        curve = valid_curve(runs, rec.name)
        if len(curve):
            last_loss[f"data/runs/{rec.experiment}/{rec.name}"] = float(curve["value"].iloc[-1])
    for rec in cands:
        lineage = lineage_of(rec.manifest, f"data/runs/{rec.experiment}/{rec.name}")
        entries.append(("candidate (not packaged)", rec, facts_of(runs, rec, lineage),
                        _probe_runs(probe_best, probe_records, f"{rec.experiment}/{rec.name}")))
    for role, rec, facts, tuned in entries:
        tapt = float(rec.manifest["hyperparameters"].get("tapt_fraction") or 0) > 0
        row = {"weights": role, "run": f"`{rec.experiment}/{rec.name}`",
               "task-adaptive": "yes: saw the CLS-Books training texts" if tapt else "no",
               "updates (all runs)": sum(int(x.get("updates") or 0) for x in facts["lineage"])
               or facts["updates"],
               "tokens (M, all runs)": facts["tokens_total"] / 1e6,
               "valid loss, novels (bits)": facts["valid_loss_bits"],
               "valid loss, reviews (bits)": facts["valid_reviews_loss_bits"],
               "n fine-tuned": len(tuned), "test acc. (%)": None, "minus random (points)": None,
               "ci_low": None, "ci_high": None, "minus packaged (points)": None,
               "pk_low": None, "pk_high": None,
               "own updates": facts["updates"],
               "continued": (str(facts["lineage"][-2].get("run") or "").split("data/runs/")[-1]
                             if len(facts["lineage"]) > 1 else None),
               "first valid": facts.get("valid_first"),
               "started at": (last_loss.get(str(facts["lineage"][-2].get("run")))
                              if len(facts["lineage"]) > 1 else None)}
        row["acc mean"] = row["acc std"] = float("nan")
        if len(tuned):
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


def runs_on_checkpoint(runs_root=None) -> list:
    """Valid runs that started from the packaged checkpoint (fairseq from ``model.pt``, the
    Transformers and LoRA runs from its conversion): what replacing it sets aside."""
    from finetune_lab.config import paths
    from finetune_lab.finetune_fairseq import candidate_index
    from finetune_lab.registry import discover_runs

    root = runs_root or paths().runs
    return [r for r in discover_runs(root) if r.valid
            and r.experiment != EXPERIMENT and candidate_index(r.experiment) is None
            and ((r.manifest or {}).get("inputs") or {}).get("checkpoint")]


def replacement_cost(records: list) -> str:
    """``12 runs: 3 fairseq, 6 lora, 3 transformers; 6.2 h of recorded run time``."""
    from collections import Counter

    by = Counter(r.experiment for r in records)
    hours = sum(float((r.manifest or {}).get("wall_time_s") or 0) for r in records) / 3600
    return (f"{len(records)} run{'s' if len(records) != 1 else ''}: "
            + ", ".join(f"{n} {e}" for e, n in sorted(by.items()))
            + f"; {hours:.1f} h of recorded run time")


PACKAGE_MARGIN = 5.0
"""Points over random initialisation (its 95 % Welch interval above 0 as well) that weights must
win by before they replace the packaged checkpoint: less would not show what pretraining is for,
when the course's checkpoint wins by about 12."""


def candidate_text(table: pd.DataFrame, cost: str = "", runs_root=None) -> str:
    """What the candidates show, and why each is or is not packaged, from :func:`candidate_table`;
    ``cost``: what replacing the packaged checkpoint sets aside (:func:`replacement_cost`)."""
    from finetune_lab.finetune_fairseq import next_candidate_experiment

    if table.empty:
        return ("Every recorded pretraining run is behind the packaged checkpoint: no other "
                "weights have been tried.")
    packaged = table.iloc[0]
    out = []
    for _, c in table.iloc[1:].iterrows():
        parent = c.get("continued")
        own = c.get("own updates")
        own = own if own is not None and pd.notna(own) else (
            c["updates (all runs)"] - packaged["updates (all runs)"])
        text = (f"{c['run']} continued the weights"
                + (f" of `{parent}`" if isinstance(parent, str) and parent else "")
                + f" for {int(own):,} more updates ({int(c['updates (all runs)']):,} updates and "
                f"{c['tokens (M, all runs)']:.1f} M tokens behind them in all): validation loss "
                f"{c['valid loss, novels (bits)']:.2f} bits on the held-out novels, against "
                f"{packaged['valid loss, novels (bits)']:.2f} for the packaged checkpoint")
        if pd.notna(c["valid loss, reviews (bits)"]):
            text += f", and {c['valid loss, reviews (bits)']:.2f} bits on the held-out reviews"
        text += ". "
        if str(c.get("task-adaptive") or "").startswith("yes"):
            text += ("Its last part was task-adaptive, on reviews only (the CLS-Books training "
                     "texts among them), so its loss on the novels says less about it than the "
                     "one on the reviews. ")
        first, start = c.get("first valid"), c.get("started at")
        if isinstance(first, tuple) and start is not None and pd.notna(start):
            text += (f"Its first validation (update {first[0]:,}), after a fresh warm-up to "
                     f"the peak learning rate, read {first[1]:.2f} bits, against the "
                     f"{start:.2f} its weights started from"
                     + ("; the rest of the run had to win that back" if first[1] > start
                        else "")
                     + (f", and did not (it ended at {c['valid loss, novels (bits)']:.2f}). "
                        if first[1] > start and c["valid loss, novels (bits)"] > start
                        else ". "))
        if c["n fine-tuned"] == 0:
            text += ("It has not been fine-tuned yet (`finetune-lab finetune fairseq --init "
                     "pretrained --checkpoint <its package> --experiment "
                     f"{next_candidate_experiment(runs_root)}`).")
        elif pd.isna(c["ci_low"]):
            text += (f"Fine-tuned with the lab's recipe ({c['n fine-tuned']} seed(s)), it reaches "
                     f"{c['test acc. (%)']} test accuracy; two seeds are needed for an interval.")
        else:
            lo, hi = c["ci_low"], c["ci_high"]
            text += (f"Fine-tuned with the lab's recipe, it reaches {c['test acc. (%)']} test "
                     f"accuracy, {c['minus random (points)']:+.1f} points against random "
                     f"initialisation (95 % Welch CI {lo:.1f} to {hi:.1f}). ")
            if pd.notna(c["pk_low"]):
                text += (f"Against the packaged checkpoint's fine-tuning it is "
                         f"{c['minus packaged (points)']:+.1f} points (95 % Welch CI "
                         f"{c['pk_low']:.1f} to {c['pk_high']:.1f}). ")
            aside = f" ({cost})" if cost else ""
            if lo > 0 and c["minus random (points)"] >= PACKAGE_MARGIN:
                text += ("That beats random by a margin the seeds show, and by at least "
                         f"{PACKAGE_MARGIN:g} points: packaging it and re-running the runs built "
                         f"on the packaged checkpoint{aside} is the next step.")
            elif lo > 0:
                text += ("That beats random by a margin the seeds show, but by less than the "
                         f"{PACKAGE_MARGIN:g} points set as the bar for replacing the checkpoint "
                         "(the course's own checkpoint wins by about 12), so it was not packaged: "
                         "more pretraining comes first.")
            elif pd.notna(c["pk_low"]) and c["pk_low"] > 0:
                text += ("So it is a better starting point than the packaged checkpoint, by a "
                         "margin the seeds show, but not better than random. It is not packaged "
                         f"yet: replacing the checkpoint sets aside the runs built on it{aside}, "
                         "which a session that can remake them all should do at once, so that "
                         "the book never mixes two checkpoints.")
            else:
                text += ("That is a margin over neither random nor the packaged checkpoint that "
                         "the seeds can show, so it was not packaged: replacing the checkpoint "
                         f"would set aside the runs built on it{aside} for nothing.")
        out.append(text)
    return "\n\n".join(out)


def candidate_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`candidate_table` formatted for the chapter (a note row when nothing was tried)."""
    if table.empty:
        return pd.DataFrame({"state": ["no weights tried besides the packaged checkpoint"]})

    def num(v, fmt):
        return "n/a" if v is None or pd.isna(v) else format(v, fmt)

    out = table.drop(columns=["ci_low", "ci_high", "pk_low", "pk_high", "first valid",
                              "started at", "own updates", "continued", "acc mean", "acc std"],
                     errors="ignore").copy()
    for col, low, high in (("minus random (points)", "ci_low", "ci_high"),
                           ("minus packaged (points)", "pk_low", "pk_high")):
        out[col] = ["n/a" if pd.isna(d) else f"{d:+.2f} (CI {lo:.2f} to {hi:.2f})"
                    for d, lo, hi in zip(table[col], table[low], table[high])]
    for col in ("valid loss, novels (bits)", "valid loss, reviews (bits)"):
        out[col] = [num(v, ".2f") for v in table[col]]
    out["tokens (M, all runs)"] = [num(v, ".1f") for v in table["tokens (M, all runs)"]]
    out["updates (all runs)"] = [f"{int(v):,}" for v in table["updates (all runs)"]]
    out["test acc. (%)"] = [v if isinstance(v, str) else "not fine-tuned"
                            for v in table["test acc. (%)"]]
    return out


# --- recipe ablations: short runs at equal wall time ------------------------------------------


def load_ablations():
    """The ``pretrain-ablation`` runs (``finetune-lab pretrain-ablations``), or None."""
    from finetune_lab.config import paths
    from finetune_lab.pretrain_ablations import EXPERIMENT as ABLATION
    from finetune_lab.tblogs import load_experiments

    if not (paths().runs / ABLATION).is_dir():
        return None
    return load_experiments([ABLATION])


def ablation_table(loaded) -> pd.DataFrame:
    """One row per ablation: what it changed, its speed, the tokens it saw in its wall time,
    and its last held-out losses, also as a difference to the recipe of the runs so far."""
    from finetune_lab.pretrain_ablations import ABLATIONS

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


def best_ablation(table: pd.DataFrame) -> str | None:
    """The ablation with the lowest held-out review loss (the lab's domain), or None."""
    if table.empty:
        return None
    col = "valid loss, reviews (bits)"
    col = col if table[col].notna().any() else "valid loss, novels (bits)"
    return str(table.loc[table[col].idxmin(), "ablation"])


def random_accuracy(runs_root=None) -> tuple[float, float, int] | None:
    """Mean, std and number of seeds of the fairseq grid's random initialisation (test accuracy
    at the best-validation epoch), or None before it has two seeds."""
    from finetune_lab import fairseq_report as fr

    grid = fr.load_results(runs_root)
    if not grid.ready:
        return None
    vals = grid.best.loc[grid.best["init"] == "random", "test"].astype(float)
    return (float(vals.mean()), float(vals.std(ddof=1)), len(vals)) if len(vals) >= 2 else None


def plot_accuracy_vs_tokens(table: pd.DataFrame, random: tuple[float, float, int] | None):
    """Fine-tuned test accuracy of every set of weights tried, against the pretraining tokens
    behind them, beside random initialisation's band (mean ± std over its seeds)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4), layout="constrained")
    tuned = table[table["acc mean"].notna()] if not table.empty else table
    if tuned.empty:
        ax.text(0.5, 0.5, "no pretrained weights fine-tuned yet", ha="center", va="center")
        ax.set_axis_off()
        return fig
    if random is not None:
        mean, std, n = random
        ax.axhspan(mean - std, mean + std, color="grey", alpha=0.25,
                   label=f"random initialisation, mean ± std (n={n})")
        ax.axhline(mean, color="grey", lw=1)
    for role, part in tuned.groupby("weights", sort=False):
        ax.errorbar(part["tokens (M, all runs)"], part["acc mean"],
                    yerr=part["acc std"].fillna(0), fmt="o", capsize=3, label=role)
        for _, row in part.iterrows():
            ax.annotate(row["run"].strip("`").split("/")[-1], (row["tokens (M, all runs)"],
                        row["acc mean"]), textcoords="offset points", xytext=(4, 4),
                        fontsize="x-small")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining tokens behind the weights (M, log scale)")
    ax.set_ylabel("test accuracy (%), best-valid epoch")
    ax.legend(frameon=False, fontsize="x-small", loc="lower right")
    return fig


def long_runs(runs: PretrainRuns) -> list:
    """The long runs (``pretrain --tokens``): those whose manifest lists launches (segments),
    complete or not."""
    return [r for r in runs.runs if isinstance(r.manifest, dict)
            and isinstance(r.manifest.get("segments"), list)]


def segments_table(rec) -> pd.DataFrame:
    """A long run's launches: when, where, the updates each did, and how each ended."""
    hp = rec.manifest["hyperparameters"]
    per = int(hp["tokens_per_update"])
    rows = []
    for i, seg in enumerate(rec.manifest["segments"], start=1):
        a, b = seg.get("updates_from"), seg.get("updates_to")
        rows.append({
            "launch": i, "started (UTC)": str(seg.get("start_time") or "")[:16].replace("T", " "),
            "device": device_name({"device": seg.get("device") or {}}, cores=True),
            "updates": f"{a:,} to {b:,}" if a is not None and b is not None else "n/a",
            "tokens (M)": f"{(b - a) * per / 1e6:.1f}" if a is not None and b is not None
            else "n/a",
            "minutes": f"{seg['wall_time_s'] / 60:.0f}" if seg.get("wall_time_s") else "n/a",
            "ended": seg.get("ended") or "running",
        })
    return pd.DataFrame(rows)


def ablation_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`ablation_table` formatted for the chapter (a note row before any ablation ran)."""
    if table.empty:
        return pd.DataFrame({"state": ["no ablation run yet: `finetune-lab pretrain-ablations`"]})
    out = table.copy()
    for col in out.columns:
        if col.startswith("valid loss"):
            out[col] = [f"{v:.3f}" for v in table[col]]
        elif col.startswith("minus"):
            out[col] = [f"{v:+.3f}" for v in table[col]]
    out["wall time (min)"] = [f"{v:.1f}" for v in table["wall time (min)"]]
    out["budget (min)"] = [f"{v:g}" if pd.notna(v) else "n/a" for v in table["budget (min)"]]
    out["tokens/s"] = [f"{v:,.0f}" if pd.notna(v) else "n/a" for v in table["tokens/s"]]
    out["tokens (M)"] = [f"{v:.2f}" for v in table["tokens (M)"]]
    out["threads"] = [f"{v:.0f}" if pd.notna(v) else "–" for v in table["threads"]]
    out["peak lr"] = [f"{v:g}" for v in table["peak lr"]]
    return out


def ablation_reading(table: pd.DataFrame) -> str:
    """What the ablations show (Markdown): the speed bf16 buys, and the config with the lowest
    held-out review loss. Depends on which ablations the run cache holds."""
    if table.empty:
        return ("No ablation has been run yet (`finetune-lab pretrain-ablations`): the long run "
                "below uses the recipe's defaults.")
    rows = table.set_index("ablation")
    parts = []
    if {"fp32-dropout", "bf16-dropout"} <= set(rows.index):
        fp32, bf16 = rows.loc["fp32-dropout"], rows.loc["bf16-dropout"]
        parts.append(f"bf16 ran {bf16['tokens/s'] / fp32['tokens/s']:.2f} times as fast as fp32 "
                     f"and so saw {bf16['tokens (M)'] / fp32['tokens (M)']:.2f} times the tokens "
                     "in the same time.")
    best = best_ablation(table)
    col = ("valid loss, reviews (bits)" if table["valid loss, reviews (bits)"].notna().any()
           else "valid loss, novels (bits)")
    spread = table[col].max() - table[col].min()
    parts.append(f"The lowest held-out loss on the {'reviews' if 'reviews' in col else 'novels'} "
                 f"is `{best}`'s, {rows.loc[best, col]:.3f} bits; the rows span "
                 f"{spread:.3f} bits, in runs of {table['tokens (M)'].max():.2f} M tokens at most, "
                 "so only differences of that order are worth reading.")
    parts.append("Not run yet: 128-token samples for most of the budget, and other batch sizes "
                 "in tokens.")
    return " ".join(parts)


def long_run_markdown(runs: PretrainRuns) -> str:
    """The long runs of the cache (Markdown): budget, phases, where each stands, and a table of
    its launches. Depends on what the run cache holds, so it is a paragraph, not a value."""
    found = long_runs(runs)
    if not found:
        return ("No long run has been recorded yet (`finetune-lab pretrain --tokens N`); the "
                "runs above each have their own warm-up and decay.")
    out = []
    for rec in found:
        man, hp = rec.manifest, rec.manifest["hyperparameters"]
        per, total = int(hp["tokens_per_update"]), int(hp["max_update"])
        done = int(man.get("updates_done") or 0)
        phases = hp.get("phases") or []
        lineage = ((man.get("extra") or {}).get("continued_from") or {}).get("lineage") or []
        before = sum(int(step.get("tokens") or 0) for step in lineage)
        text = (f"`{rec.experiment}/{rec.name}` has a budget of {total * per / 1e6:.1f} M tokens "
                f"({total:,} updates of {per:,} tokens, {hp.get('precision')}, dropout "
                f"{hp.get('dropout')}, peak learning rate {hp.get('lr'):g})")
        if len(phases) > 1:
            switch = int(phases[0]["until_update"])
            text += (f", of which the last {(total - switch) * per / 1e6:.1f} M (from update "
                     f"{switch:,}) are task-adaptive")
        if lineage:
            text += (f"; it continues the packaged weights, which had seen {before / 1e6:.1f} M "
                     "tokens")
        status = man.get("status")
        text += (f". It is {status}: {done * per / 1e6:.1f} M tokens done in "
                 f"{len(man['segments'])} launch(es) (@tbl-long-run-launches)."
                 if status != "complete" else
                 f". It is complete: {done * per / 1e6:.1f} M tokens in "
                 f"{len(man['segments'])} launch(es) (@tbl-long-run-launches).")
        if status != "complete":
            text += (" Until it is, its curve is not drawn and its weights are not packaged; "
                     "the same command resumes it.")
        out.append(text)
    table = segments_table(found[-1])
    from finetune_lab.report import markdown_table

    out.append(markdown_table(table) + "\n\n: Launches of the latest long run: when each "
               "started, on what, the updates it did, and how it ended (\"interrupted\": it "
               "was killed, and the next launch resumed from its last saved update). "
               "{#tbl-long-run-launches}")
    return "\n\n".join(out)


# --- the plateau: every pretraining run's held-out loss against the tokens behind it ----------

GPU_EXPERIMENT = "pretrain-gpu"
"""Where runs made on a lent GPU go (``gpu-bundle --steps pretrain``)."""
ESCAPE_BITS = 3.0
"""A run has left the plateau once its held-out loss is this far under the unigram entropy: the
plateau lies 1 to 1.5 bits under it (what token frequencies and positions alone are worth), and
the H100 runs fell from there to 5 bits and below within a few hundred updates."""


def all_pretraining_runs(runs_root=None) -> list:
    """Every pretraining run folder, valid or not (a run the GPU call's deadline killed keeps its
    logs, though its weights are lost)."""
    from finetune_lab.registry import discover_runs

    return discover_runs(runs_root, [EXPERIMENT, GPU_EXPERIMENT], check_inputs=False)


def token_curves(records: list, subsets: tuple[str, ...] = ("valid",)) -> pd.DataFrame:
    """Held-out loss (bits) of every run on ``subsets`` against the tokens behind the weights at
    that point: the run's own updates times its tokens per update, plus every run it
    continues. Each run's event files are read once."""
    from finetune_lab.tblogs import event_scalars

    frames = []
    for rec in records:
        man = rec.manifest or {}
        hp = man.get("hyperparameters") or {}
        per_update = int(hp.get("tokens_per_update") or 0)
        if not per_update:
            continue
        df = event_scalars(rec.path)
        df = df[df["subset"].isin(subsets) & (df["tag"] == "loss")]
        if df.empty:
            continue
        lineage = ((man.get("extra") or {}).get("continued_from") or {}).get("lineage") or []
        before = sum(int(step.get("tokens") or 0) for step in lineage)
        frames.append(pd.DataFrame({
            "run": f"{rec.experiment}/{rec.name}", "status": man.get("status"),
            "device": "GPU" if rec.experiment == GPU_EXPERIMENT else "CPU",
            "subset": df["subset"].to_numpy(),
            "tokens": before + df["step"].astype(int) * per_update,
            "bits": df["value"].astype(float)}).sort_values("tokens"))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "status", "device", "subset", "tokens", "bits"])


def plateau_table(records: list, unigram: float | None) -> pd.DataFrame:
    """One row per run: device, batch, learning rate, loaders, throughput, tokens behind the
    weights, last held-out losses, and the tokens at which the novels' loss first fell
    :data:`ESCAPE_BITS` under the unigram entropy (none: still on the plateau)."""
    from finetune_lab.fairseq_logs import log_rates

    both = token_curves(records, ("valid", "valid1"))
    novels, reviews = both[both["subset"] == "valid"], both[both["subset"] == "valid1"]
    rows = []
    for rec in records:
        name = f"{rec.experiment}/{rec.name}"
        mine = novels[novels["run"] == name]
        if mine.empty:
            continue
        man = rec.manifest or {}
        hp = man.get("hyperparameters") or {}
        log = rec.path / "train.log"
        rate = log_rates(log.read_text(encoding="utf-8", errors="replace")) if log.is_file() else {}
        below = mine[mine["bits"] < unigram - ESCAPE_BITS] if unigram is not None else mine[:0]
        theirs = reviews[reviews["run"] == name]
        rows.append({
            "run": f"`{name}`",
            "status": (f"{man.get('status')}: {man['error']}" if man.get("error")
                       else str(man.get("status"))),
            "weights": ("kept" if rec.valid else "in progress"
                        if man.get("status") in ("running", "paused") else "lost"),
            "device": "GPU" if rec.experiment == GPU_EXPERIMENT else "CPU",
            "tokens per update": int(hp.get("tokens_per_update") or 0),
            "lr": hp.get("lr"), "loaders": hp.get("num_workers", 1),
            "tokens/s": rate.get("tokens_per_s"),
            "tokens behind (M)": float(mine["tokens"].iloc[-1]) / 1e6,
            "novels (bits)": float(mine["bits"].iloc[-1]),
            "reviews (bits)": float(theirs["bits"].iloc[-1]) if len(theirs) else None,
            "left the plateau at (M tokens)": (float(below["tokens"].iloc[0]) / 1e6
                                               if len(below) else None)})
    return pd.DataFrame(rows)


def plot_plateau(records: list, unigram: float | None):
    """Held-out novels' loss of every run against the tokens behind its weights (log scale);
    runs whose weights were lost drawn dashed."""
    import matplotlib.pyplot as plt

    df = token_curves(records)
    fig, ax = plt.subplots(figsize=(8, 3.6), layout="constrained")
    if df.empty:
        ax.text(0.5, 0.5, "no pretraining run recorded yet", ha="center", va="center")
        ax.set_axis_off()
        return fig
    for run, part in df.groupby("run", sort=False):
        lost = part["status"].iloc[0] not in ("complete", "running", "paused")
        ax.plot(part["tokens"] / 1e6, part["bits"], marker="o", ms=2.5,
                ls="--" if lost else "-", lw=1.2,
                label=f"{run} ({part['device'].iloc[0]}{', weights lost' if lost else ''})")
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls=":", lw=1.2,
                   label=f"no context (unigram entropy, {unigram:.2f} bits)")
    ax.set_xscale("log")
    ax.set_xlabel("tokens behind the weights (millions, log scale)")
    ax.set_ylabel("held-out novels, MLM loss (bits)")
    ax.legend(frameon=False, fontsize="x-small", loc="lower left")
    return fig


def plateau_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`plateau_table` formatted for the chapter."""
    if table.empty:
        return table

    def num(fmt: str):
        return lambda v: "n/a" if v is None or pd.isna(v) else format(v, fmt)

    out = table.copy()
    for col, fmt in (("tokens/s", ",.0f"), ("tokens behind (M)", ".1f"), ("novels (bits)", ".2f"),
                     ("reviews (bits)", ".2f"), ("tokens per update", ",d"), ("lr", "g")):
        out[col] = out[col].map(num(fmt))
    out["left the plateau at (M tokens)"] = out["left the plateau at (M tokens)"].map(
        lambda v: "not yet" if v is None or pd.isna(v) else f"{v:.0f}")
    return out
