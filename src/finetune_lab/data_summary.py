"""The statistics the data chapter shows, from the prepared data or from the committed summary.

The prepared data (``cls.books``, the tokenizer, the binarized CLS-Books and pretraining corpus)
lives in the git-ignored work dir. When it is present the chapter computes its numbers from it;
otherwise it reads ``data/summaries/data.json``, which holds aggregate statistics only (counts,
histograms, rates, the commands that were run and encodings of invented example sentences;
no review or novel text).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from finetune_lab import _files
from finetune_lab.cls_books import SPLITS, read_split
from finetune_lab.config import paths
from finetune_lab.errors import UserError

SUMMARY_NAME = "data.json"
MAX_POSITIONS = 256
"""The lab's ``--max-positions``: longer inputs are truncated."""
SPECIAL_TOKENS = 2
"""``<s>`` prepended by sentence_prediction and ``</s>`` appended by fairseq-preprocess."""
BIN_WIDTH = 16
MAX_BIN = 1024
EXAMPLES = (
    "Ce livre est une merveille : je l'ai dévoré en deux jours !",
    "Intrigue creuse, personnages sans épaisseur… je ne le recommande pas.",
    "La diligence s'arrêta devant l'auberge, et le cocher descendit en jurant.",
)
"""Invented sentences (not taken from the data), so their encodings can be committed."""

REGENERATE = (
    "finetune-lab prepare-cls",
    "finetune-lab train-tokenizer",
    "finetune-lab binarize-cls",
    "finetune-lab prepare-pretrain",
    "finetune-lab data-summary",
)
"""The commands that rebuild the prepared data and this summary, in order."""


def summary_path() -> Path:
    return paths().summaries / SUMMARY_NAME


def train_size(path: Path | None = None) -> int:
    """CLS-Books training reviews, from the committed summary: the size the lab's schedule is
    derived from, available without the prepared data (the runs read it from their data)."""
    import json

    path = Path(path) if path is not None else summary_path()
    if not path.is_file():
        raise UserError(f"{path} does not exist: run `finetune-lab data-summary` after preparing "
                        "the data (`finetune-lab prepare-cls`)")
    splits = json.loads(path.read_text(encoding="utf-8"))["cls"]["splits"]
    return int(next(s for s in splits if s["split"] == "train")["reviews"])


def work_folders(work: Path | None = None) -> dict[str, Path]:
    """The prepared-data folders the statistics are computed from."""
    from finetune_lab import binarize, cls_books, pretrain_corpus, tokenizer

    base = Path(work) if work is not None else paths().work
    return {
        "cls": base / cls_books.OUTPUT_NAME,
        "tokenizer": base / tokenizer.OUTPUT_NAME,
        "cls_bin": base / binarize.OUTPUT_NAME,
        "pretrain": base / pretrain_corpus.OUTPUT_NAME,
    }


def prepared_data_available(work: Path | None = None) -> bool:
    """True when every step has written its folder (each one's manifest is its completion mark)."""
    return all((p / "manifest.json").is_file() for p in work_folders(work).values())


def length_histogram(lengths: list[int]) -> list[int]:
    """Counts per bin ``(k*16, (k+1)*16]``, right-closed so that 256 ends a bin; the last bin
    holds everything above ``MAX_BIN``."""
    n_bins = MAX_BIN // BIN_WIDTH + 1
    counts = [0] * n_bins
    for n in lengths:
        counts[min(max(n - 1, 0) // BIN_WIDTH, n_bins - 1)] += 1
    return counts


def duplicate_counts(texts: dict[str, list[str]]) -> dict[str, int]:
    """How many review texts repeat inside a split or occur in two splits (the corpus has some)."""
    sets = {split: set(lines) for split, lines in texts.items()}
    counts = {f"within {split}": len(lines) - len(sets[split]) for split, lines in texts.items()}
    for a, b in (("train", "valid"), ("train", "test"), ("valid", "test")):
        counts[f"{a} and {b}"] = len(sets[a] & sets[b])
    return counts


def unknown_surfaces(sp, texts: list[str], top: int = 10) -> list[list[Any]]:
    """The most frequent text spans the tokenizer maps to ``<unk>``, with their counts."""
    from collections import Counter

    counts: Counter[str] = Counter()
    unk = sp.unk_id()
    for text in texts:
        counts.update(p.surface for p in sp.encode(text, out_type="proto").pieces if p.id == unk)
    return [[surface, n] for surface, n in counts.most_common(top)]


def compute_summary(work: Path | None = None) -> dict[str, Any]:
    """All the chapter's statistics, computed from the prepared data in ``work``."""
    from finetune_lab import tokenizer

    folders = work_folders(work)
    if not prepared_data_available(work):
        missing = [str(p) for p in folders.values() if not (p / "manifest.json").is_file()]
        raise UserError(f"prepared data missing: {', '.join(missing)}. Run, in order: "
                        + "; ".join(REGENERATE[:-1]))
    cls_manifest = _files.read_json(folders["cls"] / "manifest.json")
    trained = tokenizer_training(_files.read_json(folders["tokenizer"] / "manifest.json"))
    bin_manifest = _files.read_json(folders["cls_bin"] / "manifest.json")
    pre_manifest = _files.read_json(folders["pretrain"] / "manifest.json")

    splits, lengths, length_stats, texts = [], {}, {}, {}
    for split in SPLITS:
        texts[split], labels = read_split(folders["cls"], split)
        encoded = (folders["cls_bin"] / "spm" / f"{split}.spm.review").read_text(encoding="utf-8")
        seq = [len(line.split()) + SPECIAL_TOKENS for line in encoded.splitlines()]
        if len(seq) != len(labels):
            raise UserError(f"{folders['cls_bin']} does not match {folders['cls']}; "
                            "run `finetune-lab binarize-cls` again.")
        splits.append({"split": split, "reviews": len(labels), "negative": labels.count(0),
                       "positive": labels.count(1)})
        lengths[split] = length_histogram(seq)
        ordered = sorted(seq)
        length_stats[split] = {
            "median": statistics.median(seq),
            "mean": round(statistics.fmean(seq), 2),
            "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "max": ordered[-1],
            "truncated": sum(n > MAX_POSITIONS for n in seq),
        }

    sp = tokenizer.load_processor(folders["tokenizer"])
    unknown = unknown_surfaces(sp, [t for split in SPLITS for t in texts[split]])
    examples = []
    for text in EXAMPLES:
        ids = sp.encode(text)
        examples.append({"text": text, "pieces": sp.id_to_piece(ids), "ids": ids})

    return {
        "cls": {
            "splits": splits,
            "seed": cls_manifest["seed"],
            "valid_fraction": cls_manifest["parameters"]["valid_fraction"],
            "tokenization": bin_manifest["counts"],
            "duplicates": duplicate_counts(texts),
            "unknown_surfaces": unknown,
        },
        "lengths": {
            "bin_width": BIN_WIDTH,
            "max_bin": MAX_BIN,
            "max_positions": MAX_POSITIONS,
            "special_tokens": SPECIAL_TOKENS,
            "histogram": lengths,
            "stats": length_stats,
        },
        "tokenizer": {
            **{k: trained[k] for k in ("seed", "parameters", "corpus", "timings_s")},
            "dict_entries": sum(1 for _ in open(folders["tokenizer"] / tokenizer.DICT_FILE,
                                                encoding="utf-8")),
        },
        "pretrain": {
            "counts": pre_manifest["counts"],
            "parameters": {k: v for k, v in pre_manifest["parameters"].items() if k != "documents"},
            "valid_documents": pre_manifest["parameters"]["documents"]["valid"],
            "timings_s": pre_manifest["timings_s"],
        },
        "examples": examples,
        "commands": {
            "binarize-cls": bin_manifest["commands"],
            "prepare-pretrain": pre_manifest["commands"],
        },
        "tool_versions": trained["tool_versions"],
    }


def tokenizer_training(tok_manifest: dict[str, Any]) -> dict[str, Any]:
    """How the tokenizer was trained: its own manifest, or, for the tokenizer that `reproduce`
    adopts from the committed checkpoint (its manifest only names the files), the committed
    summary, written when that tokenizer was trained."""
    if "seed" in tok_manifest:
        return tok_manifest
    path = summary_path()
    if not path.is_file():
        raise UserError(f"the tokenizer was adopted from the checkpoint and {path}, which "
                        "records how it was trained, is missing: restore it from git, or train "
                        "a tokenizer with `finetune-lab train-tokenizer`")
    committed = _files.read_json(path)
    return {**committed["tokenizer"], "tool_versions": committed["tool_versions"]}


def write_summary(summary: dict[str, Any], dest: Path | None = None) -> Path:
    """Write the committed aggregate summary (``data/summaries/data.json``)."""
    dest = Path(dest) if dest is not None else summary_path()
    _files.check_writable(dest.parent)
    _files.write_json(dest, summary)
    return dest


def load_summary(work: Path | None = None, committed: Path | None = None) -> dict[str, Any]:
    """The prepared data's statistics if it is there, else the committed summary.

    The result's ``"source"`` says which, so the chapter can tell the reader.
    """
    if prepared_data_available(work):
        return {**compute_summary(work), "source": "prepared"}
    path = Path(committed) if committed is not None else summary_path()
    if not path.is_file():
        raise UserError(f"neither the prepared data nor {path} exist. Regenerate them with: "
                        + "; ".join(REGENERATE))
    return {**_files.read_json(path), "source": "committed"}


# --- views for the chapter ---------------------------------------------------------------------

def source_note(summary: dict[str, Any]):
    """Markdown saying where the numbers come from and, if from the summary, how to regenerate."""
    from IPython.display import Markdown

    if summary["source"] == "prepared":
        text = (f"The numbers below are computed from the prepared data in `{paths().work}` "
                "(the output of the commands at the end of this chapter).")
    else:
        text = ("::: {.callout-note}\nThe prepared data is not present in this checkout, so this "
                "chapter shows the committed summary `data/summaries/data.json` (aggregate "
                "statistics of the last full run). To regenerate the data and the summary, run "
                "from the project root: " + "; ".join(f"`{c}`" for c in REGENERATE) + ".\n:::")
    return Markdown(text)


def unknown_text(summary: dict[str, Any], top: int = 6) -> str:
    """The most frequent ``<unk>`` spans of the reviews, for the prose (e.g. ``€`` (8))."""
    items = summary["cls"]["unknown_surfaces"][:top]
    def code(text: str) -> str:
        if not text.isprintable():  # control characters (mojibake) are shown as code points
            return " ".join(f"U+{ord(c):04X}" if not c.isprintable() else c for c in text)
        return f"`` {text} ``" if "`" in text else f"`{text}`"  # a backtick needs a `` fence

    return ", ".join(f"{code(surface)} ({n})" for surface, n in items) if items else "none"


def duplicates_table(summary: dict[str, Any]):
    """Exact-duplicate review texts, within and across splits."""
    import pandas as pd

    return pd.DataFrame([{"where": k, "review texts": v}
                         for k, v in summary["cls"]["duplicates"].items()])


def split_table(summary: dict[str, Any]):
    """Reviews per split and class, with the positive share."""
    import pandas as pd

    df = pd.DataFrame(summary["cls"]["splits"])
    df["positive share"] = df["positive"] / df["reviews"]
    return df


def length_table(summary: dict[str, Any]):
    """Review length (fairseq tokens, specials included) per split and the truncated share."""
    import pandas as pd

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


def tokenizer_sample_text(summary: dict[str, Any]) -> str:
    """How many sentences the tokenizer was trained on, in words, for the prose."""
    tok = summary["tokenizer"]
    n, total = tok["corpus"]["sample_sentences"], tok["corpus"]["sentences"]
    if n >= total:
        return "all of them, in corpus order (no sampling was needed: training is fast)"
    seed = summary["tokenizer"].get("seed", "?")
    return f"a uniform sample of {n:,} sentences drawn with seed {seed}, kept in corpus order"


def _split_order(split: str) -> int:
    return SPLITS.index(split) if split in SPLITS else len(SPLITS)


def held_out_novels(summary: dict[str, Any]) -> str:
    """The validation novels by file name (author and number), for the prose."""
    names = [Path(n).name.removesuffix(".txt.xz") for n in summary["pretrain"]["valid_documents"]]
    return ", ".join(f"`{n}`" for n in names)


def pretrain_reviews_text(summary: dict[str, Any]) -> str:
    """What the pretraining corpus takes from the dvd/music reviews, from its parameters."""
    from finetune_lab.pretrain_corpus import REVIEW_DOMAINS

    params = summary["pretrain"]["parameters"]
    domains = " and ".join(f"`{d}`" for d in REVIEW_DOMAINS)
    if not params.get("with_reviews"):
        return f"The {domains} reviews of Webis-CLS-10 were left out (`--no-reviews`)."
    if not params.get("review_repeat"):
        return (f"The training side also holds the {domains} training reviews of Webis-CLS-10 "
                "as unlabeled in-domain text (`--no-reviews` leaves them out).")
    held = (summary["pretrain"]["counts"].get("valid1") or {}).get("paragraphs", 0)
    return (f"The lab's task is reviews, and novels are far from them, so the {domains} reviews "
            f"of Webis-CLS-10 (train and test files: unlabeled in-domain text for this purpose) "
            f"are added: {held:,} of them, drawn with the same seed, are held out as a second "
            f"validation set (`valid1`, the in-domain perplexity), and the others are written "
            f"{params['review_repeat']} times into the training side (`--review-repeat`), so "
            "that a budget that sees a fraction of one pass over the novels sees each review a "
            "few times (`--no-reviews` leaves them out).")


def tokenization_table(summary: dict[str, Any]):
    """Tokens per word and ``<unk>`` rate of the tokenizer on CLS-Books and on ELTeC."""
    import pandas as pd

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


def pretrain_table(summary: dict[str, Any]):
    """Size of each side of the pretraining corpus."""
    import pandas as pd

    counts = summary["pretrain"]["counts"]
    keys = ("novels", "documents", "paragraphs", "words", "tokens")
    return pd.DataFrame([{"split": s, **{k: counts[s][k] for k in keys}}
                         for s in sorted(counts, key=_split_order)])


def examples_table(summary: dict[str, Any]):
    """The invented example sentences and their pieces / ids."""
    import pandas as pd

    return pd.DataFrame([{"sentence": e["text"], "pieces": " ".join(e["pieces"]),
                          "tokens": len(e["ids"])} for e in summary["examples"]])


def length_figure(summary: dict[str, Any]):
    """Histogram of review lengths in tokens (all splits), with the 256-token truncation line."""
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
    return fig


def commands_markdown(summary: dict[str, Any]) -> str:
    """The commands that produced the data, as a fenced block for the chapter."""
    lines = ["# from the project root (FINETUNE_LAB_DATA_ROOT points at the raw data)"]
    lines += list(REGENERATE)
    lines += ["", "# what binarize-cls and prepare-pretrain ran, in their output folders:"]
    for step, commands in summary["commands"].items():
        lines += [f"# {step}"] + list(commands)
    return "```bash\n" + "\n".join(lines) + "\n```"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "data-summary",
        help="compute the data chapter's statistics from the prepared data and write data.json",
        description=compute_summary.__doc__,
    )
    parser.add_argument("--work", type=Path, default=None, help="work dir (default: data/work)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"summary file (default: data/summaries/{SUMMARY_NAME})")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    dest = write_summary(compute_summary(args.work), args.out)
    print(f"data-summary: wrote {dest}")
    return 0
