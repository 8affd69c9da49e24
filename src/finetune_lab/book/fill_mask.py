"""The committed checkpoint asked to fill masks, live, and how often it answers with the corpus's
most frequent pieces: what a model on the masked-LM plateau does whatever the context.
"""

from __future__ import annotations

import re

import pandas as pd

from finetune_lab.models.checkpoints import DICT_FILE, load_hub_model, packaged_dir
from finetune_lab.render_cache import per_render

DEMO_SENTENCES = (
    "Ce livre est vraiment <mask>.",
    "Je n'ai pas aimé ce <mask>.",
    "Une histoire <mask>, je le recommande à tous.",
    "Il ouvrit la <mask> et sortit dans la rue.",
    "Elle était assise près de la <mask>.",
)
"""Review-like sentences (the lab's task) and narrative ones (the pretraining domain)."""


@per_render
def fill_mask_table(sentences: tuple[str, ...] = DEMO_SENTENCES, topk: int = 5) -> pd.DataFrame:
    """Top-k completions of each sentence, computed now on CPU from the committed checkpoint."""
    import torch

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
    rows = []
    for line in (packaged_dir() / DICT_FILE).read_text(encoding="utf-8").splitlines():
        piece, _, count = line.rpartition(" ")
        rows.append((int(count), piece.replace("\u2581", " ").strip()))
    return {piece for _, piece in sorted(rows, reverse=True)[:n]}


def fill_mask_reading(df: pd.DataFrame, n: int = 20) -> dict[str, int]:
    """How many top-1 predictions are among the corpus's ``n`` most frequent pieces (a model
    that has learned little beyond unigram frequencies predicts those whatever the context), and
    how many repeat a word of their own sentence (what a model trained to predict a text's bag
    of words from ``<s>`` can learn to do without learning French)."""
    top1 = df[df["rank"] == 1]
    frequent = frequent_pieces(n)
    copied = sum(bool(re.fullmatch(r"\w+", piece.lower()))
                 and piece.lower() in re.findall(r"\w+", sentence.lower().replace("<mask>", " "))
                 for sentence, piece in zip(top1["sentence"], top1["predicted piece"]))
    return {"sentences": len(top1), "frequent": int(top1["predicted piece"].isin(frequent).sum()),
            "n": n, "copied": int(copied)}
