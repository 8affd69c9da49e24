"""How much of the stand-in's gain over random initialisation is the task's own texts: one row
per pretraining step (general masked LM; + the `<s>` objective on other reviews; + the CLS-Books
training texts), each fine-tuned with the lab's recipe and set against random initialisation.

Rows are read from :func:`~finetune_lab.book.pretrain_candidates.candidate_table`, so every run
passed the registry; a step whose weights were fine-tuned several times takes the weights with
the most seeds within the packaged checkpoint's token budget (the comparison is at equal tokens
or fewer), and says which run answers it.
"""

from __future__ import annotations

import pandas as pd

from finetune_lab.book.pretrain_candidates import kind_of
from finetune_lab.book.report import signed

PACKAGED = "packaged checkpoint"
STEPS: tuple[tuple[str, str | None], ...] = (
    ("masked LM on other text (novels + dvd/music reviews)", "masked LM, no task texts"),
    ("the `<s>` objective on other reviews (dvd/music: domain-adaptive)",
     "`<s>` objective, no task texts"),
    ("the `<s>` objective with the CLS-Books training texts (task-adaptive): the packaged "
     "checkpoint", None),
)
"""Each row of the comparison and the :func:`kind_of` of the weights that answer it (None: the
packaged checkpoint). The rows are different lineages, not steps of one (their budgets and
position tables differ too): named by what they read, never "then"."""


def pick(cand: pd.DataFrame, kind: str | None) -> pd.Series | None:
    """The weights that answer one step: the packaged checkpoint, or among the other weights of
    that kind within the packaged budget, the one fine-tuned with the most seeds (then the most
    tokens)."""
    if cand.empty:
        return None
    packaged = cand[cand["weights"] == PACKAGED]
    if kind is None:
        return packaged.iloc[0] if len(packaged) else None
    budget = float(packaged["tokens (M, all runs)"].iloc[0]) if len(packaged) else float("inf")
    others = cand[(cand["weights"] != PACKAGED)
                  & (cand["tokens (M, all runs)"] <= budget + 1e-9)]
    mine = others[[kind_of(r) == kind for _, r in others.iterrows()]]
    if mine.empty:
        return None
    return mine.sort_values(["n fine-tuned", "tokens (M, all runs)"]).iloc[-1]


def decomposition_table(cand: pd.DataFrame) -> pd.DataFrame:
    """One row per step: the weights that answer it, their tokens, seeds, test accuracy and the
    difference to random initialisation with its 95 % Welch interval (– where it has none)."""
    rows = []
    for step, kind in STEPS:
        row = pick(cand, kind)
        if row is None:
            rows.append({"pretraining": step, "weights": "not run", "tokens (M)": "–", "n": 0,
                         "fine-tuned on": "–", "test acc. (%)": "–",
                         "− random (points, CI)": "–"})
            continue
        n = int(row["n fine-tuned"])
        rows.append({
            "pretraining": step,
            "weights": row["run"].replace("`pretrain/", "`"),
            "tokens (M)": f"{row['tokens (M, all runs)']:.1f}",
            "n": n,
            "fine-tuned on": row["fine-tuned on"],
            "test acc. (%)": (f"{row['acc mean']:.1f}\u00a0±\u00a0{row['acc std']:.1f}" if n > 1
                              else f"{row['acc mean']:.1f}" if n == 1 else "–"),
            "− random (points, CI)": ("–" if pd.isna(row["ci_low"]) else
                                      f"{signed(row['minus random (points)'])} "
                                      f"({signed(row['ci_low'])} to {signed(row['ci_high'])})"),
        })
    return pd.DataFrame(rows)


def beyond_budget(cand: pd.DataFrame, kind: str = STEPS[0][1] or "",
                  min_seeds: int = 2) -> pd.DataFrame:
    """Weights of ``kind`` (by default the general masked LM) pretrained past the packaged
    checkpoint's token budget and fine-tuned over ``min_seeds`` seeds or more, fewest tokens
    first: what more text that is not the task's buys, which the equal-budget steps leave out."""
    packaged = cand[cand["weights"] == PACKAGED]
    if packaged.empty:
        return cand.iloc[0:0]
    budget = float(packaged["tokens (M, all runs)"].iloc[0])
    rows = cand[(cand["weights"] != PACKAGED) & (cand["tokens (M, all runs)"] > budget + 1e-9)
                & (cand["n fine-tuned"] >= min_seeds) & cand["ci_low"].notna()]
    rows = rows[[kind_of(r) == kind for _, r in rows.iterrows()]]
    return rows.sort_values("tokens (M, all runs)")
