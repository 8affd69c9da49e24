"""The data chapter's tables, figure and counts, from a summary (:mod:`finetune_lab.book.data_summary`).

Each function takes the summary that :func:`~finetune_lab.book.data_summary.load_summary`
returns (from the prepared data or from the committed ``data/summaries/data.json``) and returns
facts: a DataFrame, a figure, a number or a list; the chapter writes the sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab.data.cls_books import SPLITS
from finetune_lab.data.eltec import REVIEW_DOMAINS


def _split_order(split: str) -> int:
    return SPLITS.index(split) if split in SPLITS else len(SPLITS)


def split_table(summary: dict[str, Any]) -> pd.DataFrame:
    """Reviews per split and class, with the positive share."""
    df = pd.DataFrame(summary["cls"]["splits"])
    df["positive share"] = df["positive"] / df["reviews"]
    return df


def duplicates_table(summary: dict[str, Any]) -> pd.DataFrame:
    """Exact-duplicate review texts, within and across splits."""
    return pd.DataFrame([{"where": k, "review texts": v}
                         for k, v in summary["cls"]["duplicates"].items()])


def length_table(summary: dict[str, Any]) -> pd.DataFrame:
    """Review length (fairseq tokens, specials included) per split and the truncated share."""
    rows = []
    for split in sorted(summary["lengths"]["stats"], key=_split_order):
        stats = summary["lengths"]["stats"][split]
        n = next(s["reviews"] for s in summary["cls"]["splits"] if s["split"] == split)
        rows.append({"split": split, **stats, "truncated share": stats["truncated"] / n})
    return pd.DataFrame(rows)


def truncated_share(summary: dict[str, Any], split: str | None = None) -> float:
    """Share of reviews longer than ``max_positions`` (all splits together by default)."""
    stats, splits = summary["lengths"]["stats"], summary["cls"]["splits"]
    names = [split] if split else list(stats)
    total = sum(s["reviews"] for s in splits if s["split"] in names)
    return sum(stats[n]["truncated"] for n in names) / total


def length_figure(summary: dict[str, Any]):
    """Histogram of review lengths in tokens (all splits), with the 256-token truncation line."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    import matplotlib.pyplot as plt
    import numpy as np

    lengths = summary["lengths"]
    width = lengths["bin_width"]
    hist = np.sum([lengths["histogram"][s] for s in lengths["histogram"]], axis=0)
    left = np.arange(len(hist)) * width
    fig, ax = plt.subplots(figsize=(7, 3.2))
    cut = lengths["max_positions"]
    ax.bar(left, hist, width=width, align="edge",
           color=["#4c72b0" if x + width <= cut else "#dd8452" for x in left],
           edgecolor="white", linewidth=0.3)
    ax.axvline(cut, color="black", linestyle="--", linewidth=1)
    ax.text(cut + 8, ax.get_ylim()[1] * 0.9,
            f"--max-positions {cut}: {100 * truncated_share(summary):.1f} % truncated", fontsize=9)
    ax.set_xlabel(f"review length in tokens (pieces + <s> + </s>; last bar > {lengths['max_bin']})")
    ax.set_ylabel("reviews")
    ax.set_xlim(0, len(hist) * width)
    fig.tight_layout()
    return check_legend(fig)


def tokenization_table(summary: dict[str, Any]) -> pd.DataFrame:
    """Tokens per word and ``<unk>`` rate of the tokenizer on CLS-Books and on ELTeC."""
    rows = []
    for corpus, counts in (("CLS-Books", summary["cls"]["tokenization"]),
                           ("pretraining corpus", summary["pretrain"]["counts"])):
        for split in sorted(counts, key=_split_order):
            c = counts[split]
            rows.append({"corpus": corpus, "split": split, "words": c["words"],
                         "tokens": c["tokens"], "tokens per word": c["tokens"] / c["words"],
                         "<unk>": c["unk"], "<unk> rate": c["unk"] / c["tokens"]})
    return pd.DataFrame(rows)


def totals(summary: dict[str, Any], corpus: str) -> dict[str, int]:
    """Words, tokens and ``<unk>`` tokens of ``corpus`` ("cls" or "pretrain"), all splits."""
    counts = summary["cls"]["tokenization"] if corpus == "cls" else summary["pretrain"]["counts"]
    return {k: sum(c[k] for c in counts.values()) for k in ("words", "tokens", "unk")}


def rate(summary: dict[str, Any], corpus: str, what: str) -> float:
    """``tokens per word`` or ``<unk> rate`` (``what="unk"``) of ``corpus``, all splits."""
    t = totals(summary, corpus)
    return t["tokens"] / t["words"] if what == "tokens per word" else t["unk"] / t["tokens"]


def unknown_spans(summary: dict[str, Any], top: int = 6) -> list[tuple[str, int]]:
    """The review text spans the tokenizer maps to ``<unk>`` most often, with their counts."""
    return [(surface, int(n)) for surface, n in summary["cls"]["unknown_surfaces"][:top]]


def code_span(text: str) -> str:
    """Arbitrary text as a Markdown code span: control characters (mojibake) as code points,
    a backtick inside fenced by two."""
    if not text.isprintable():
        return " ".join(f"U+{ord(c):04X}" if not c.isprintable() else c for c in text)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def mojibake(text: str) -> str | None:
    """What a C1 control character (U+0080 to U+009F) most likely was: the cp1252 character of
    the same byte (U+009C is cp1252's œ), read as Latin-1 by whoever decoded the text; None for
    any other text."""
    if len(text) != 1 or not 0x80 <= ord(text) <= 0x9F:
        return None
    try:
        return bytes([ord(text)]).decode("cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8D, 0x8F, 0x90, 0x9D: no cp1252 character
        return None


def unknown_sentence(spans: list[tuple[str, int]]) -> str:
    """The sentence that names the review text the tokenizer has no piece for, with counts, and
    what a control character among it most likely was."""
    if not spans:
        return "The tokenizer has a piece for every character of the reviews."

    def named(text: str, n: int) -> str:
        was = mojibake(text)
        return (f"{code_span(text)} ({n} time{'s' if n != 1 else ''}; a control character, "
                f"probably a cp1252 {code_span(was)} decoded as Latin-1)" if was else
                f"{code_span(text)} ({n})")
    if len(spans) == 1:
        return f"The only review text for which the tokenizer has no piece is {named(*spans[0])}."
    return ("The review text for which the tokenizer has no piece is, most frequent first with "
            f"its count: {', '.join(named(t, n) for t, n in spans)}.")


def examples_table(summary: dict[str, Any]) -> pd.DataFrame:
    """The invented example sentences and their pieces / ids."""
    return pd.DataFrame([{"sentence": e["text"], "pieces": " ".join(e["pieces"]),
                          "tokens": len(e["ids"])} for e in summary["examples"]])


def held_out_novels(summary: dict[str, Any]) -> list[str]:
    """The validation novels by file name (author and number)."""
    return [Path(n).name.removesuffix(".txt.xz") for n in summary["pretrain"]["valid_documents"]]


@dataclass(frozen=True)
class CorpusReviews:
    """What the pretraining corpus takes from the Webis-CLS-10 reviews of ``domains``:
    ``included`` or not (``--no-reviews``); ``repeat``, how many times each training review is
    written (0: once, as summaries before upweighting recorded it); ``held_out``, the reviews
    kept apart as the in-domain validation set ``valid1``."""

    domains: tuple[str, ...]
    included: bool
    repeat: int
    held_out: int


def corpus_reviews(summary: dict[str, Any]) -> CorpusReviews:
    params = summary["pretrain"]["parameters"]
    held = (summary["pretrain"]["counts"].get("valid1") or {}).get("paragraphs", 0)
    return CorpusReviews(tuple(REVIEW_DOMAINS), bool(params.get("with_reviews")),
                         int(params.get("review_repeat") or 0), int(held))


def pretrain_table(summary: dict[str, Any]) -> pd.DataFrame:
    """Size of each side of the pretraining corpus."""
    counts = summary["pretrain"]["counts"]
    keys = ("novels", "documents", "paragraphs", "words", "tokens")
    return pd.DataFrame([{"split": s, **{k: counts[s][k] for k in keys}}
                         for s in sorted(counts, key=_split_order)])
