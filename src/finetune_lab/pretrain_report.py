"""What the pretraining chapter shows: the stand-in next to the course model, curves, speed,
and a live fill-mask demo from the committed checkpoint.

Everything is read from the run cache (``data/runs/pretrain/``), the packaged checkpoint's
manifest and the committed data summary; nothing here is typed in except the course model's
description, which is an external reference (the course's own statement), labelled as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from finetune_lab.checkpoints import MANIFEST_FILE, packaged_dir
from finetune_lab.pretrain import EXPERIMENT
from finetune_lab.runspeed import device_name

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
    manifest = packaged_dir() / MANIFEST_FILE
    checkpoint = json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else None
    return PretrainRuns(loaded=loaded, checkpoint=checkpoint)


def run_facts(runs: PretrainRuns) -> dict[str, Any]:
    """Budget, tokens seen, device and final validation loss of the run behind the checkpoint."""
    rec = runs.latest
    if rec is None:
        return {}
    man = rec.manifest
    hp = man["hyperparameters"]
    thr = man.get("throughput") or {}
    df = runs.scalars
    valid = df[(df["run"] == rec.name) & (df["subset"] == "valid") & (df["tag"] == "loss")]
    updates = int(hp["max_update"])
    own_tokens = updates * int(hp["tokens_per_update"])
    # a continued run's package lists every run behind the weights (pretrain --continue-from)
    lineage = list((runs.checkpoint or {}).get("lineage") or [])
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
        "valid_loss_bits": float(valid.sort_values("step")["value"].iloc[-1]) if len(valid) else None,
        "calibration": (man.get("extra") or {}).get("calibration"),
    }


def comparison_table(runs: PretrainRuns, summary: dict[str, Any] | None) -> pd.DataFrame:
    """The course model (external reference) next to the stand-in (from manifests)."""
    facts = run_facts(runs)
    counts = ((summary or {}).get("pretrain") or {}).get("counts") or {}
    train = counts.get("train") or {}
    ours_corpus = (
        f"ELTeC-fra novels ({train.get('novels', '?')}) + Webis dvd/music reviews: "
        f"{train.get('words', 0) / 1e6:.1f} M words, {train.get('tokens', 0) / 1e6:.1f} M tokens"
        if train else "not prepared"
    )
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
              | ((df["subset"] == "valid") & (df["tag"] == "loss"))]
    offset = {rec.name: update_offset(rec.manifest) for rec in runs.used}
    keep = keep.assign(update=keep["step"] + keep["run"].map(offset).fillna(0).astype(int))
    return keep[["run", "subset", "tag", "step", "update", "value"]].reset_index(drop=True)


def update_offset(manifest: dict[str, Any]) -> int:
    """Updates the weights had before this run: 0, or the sum over a continued run's lineage."""
    lineage = ((manifest.get("extra") or {}).get("continued_from") or {}).get("lineage") or []
    return sum(int(step.get("updates") or 0) for step in lineage)


def training_text(facts: dict[str, Any], summary: dict[str, Any] | None) -> str:
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
                 f"masked token, a perplexity of {2 ** loss:,.0f}.")
    corpus = ((summary or {}).get("pretrain") or {}).get("counts", {}).get("train", {}).get("tokens")
    if corpus:
        text += f" That is {facts['tokens_total'] / corpus:.2f} passes over the training corpus."
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
        style = {"train_inner": dict(lw=1, alpha=0.8), "valid": dict(marker="o", lw=2)}[subset]
        label = {"train_inner": "train", "valid": "valid (held-out novels)"}[subset]
        ax.plot(part["update"], part["value"], label=f"{label} [{run}]", **style)
    ax.set_xlabel("update")
    ax.set_ylabel("MLM loss (bits / masked token)")
    ax.legend(frameon=False, fontsize="small")
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
    """Speed of every valid pretraining run, with its device (MFU only on a known GPU)."""
    rows = []
    for rec in runs.used:
        man = rec.manifest
        thr = man.get("throughput") or {}
        rows.append({
            "run": rec.name,
            "device": device_name(man, cores=True),
            "updates": man["hyperparameters"]["max_update"],
            "wall time (min)": f"{(man.get('wall_time_s') or 0) / 60:.1f}",
            "tokens/s": f"{thr['tokens_per_s']:,.0f}" if thr.get("tokens_per_s") else "n/a",
            "updates/s": f"{thr['updates_per_s']:.2f}" if thr.get("updates_per_s") else "n/a",
            "MFU (bf16 peak)": f"{100 * thr['mfu']:.1f} %" if thr.get("mfu") else "n/a (no GPU)",
        })
    return pd.DataFrame(rows)


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
        text += (" Until a longer pretraining replaces it (on a GPU: `finetune-lab pretrain "
                 "--minutes 8 --overwrite`, then the pretrained fine-tuning runs again), every "
                 "pretrained-vs-random comparison in this book measures this weak checkpoint, "
                 "not the value of pretraining.")
    return text
