"""The statistics the data chapter shows, from the prepared data or from the committed summary.

The prepared data (``cls.books``, the tokenizer, the binarized CLS-Books and pretraining corpus)
lives in the git-ignored work dir. When it is present the chapter computes its numbers from it;
otherwise it reads ``data/summaries/data.json``, which holds aggregate statistics only (counts,
histograms, rates, the commands that were run and encodings of invented example sentences;
no review or novel text). The chapter's tables and figure come from the summary through
:mod:`finetune_lab.book.data_tables`.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from finetune_lab.argtypes import folder
from finetune_lab import _files
from finetune_lab.book.records import read_record
from finetune_lab.config import check_protected_file, paths
from finetune_lab.data import binarize, cls_books, pretrain_corpus, tokenizer
from finetune_lab.data.cls_books import SPLITS, read_split
from finetune_lab.data.cls_splits import (
    SUMMARY_NAME,
    UNKNOWN_TOP,
    count_contradiction,
    read_summary,
    summary_contradiction,
    summary_path,
    tokenizer_contradiction,
)
from finetune_lab.errors import UserError

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
    "finetune-lab adopt-tokenizer",
    "finetune-lab binarize-cls",
    "finetune-lab prepare-pretrain",
    "finetune-lab data-summary",
)
"""The commands that rebuild the prepared data and this summary, in order: with the committed
checkpoint's own tokenizer, as ``finetune-lab reproduce`` does (a new tokenizer would give the
checkpoint's embedding rows other meanings)."""


def work_folders(work: Path | None = None) -> dict[str, Path]:
    """The prepared-data folders the statistics are computed from."""
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


def unknown_surfaces(sp, texts: list[str], top: int = UNKNOWN_TOP) -> list[list[Any]]:
    """The most frequent text spans the tokenizer maps to ``<unk>``, with their counts."""
    counts: Counter[str] = Counter()
    unk = sp.unk_id()
    for text in texts:
        counts.update(p.surface for p in sp.encode(text, out_type="proto").pieces if p.id == unk)
    return [[surface, n] for surface, n in counts.most_common(top)]


def compute_summary(work: Path | None = None) -> dict[str, Any]:
    """All the chapter's statistics, computed from the prepared data in ``work``."""
    folders = work_folders(work)
    if not prepared_data_available(work):
        missing = [str(p) for p in folders.values() if not (p / "manifest.json").is_file()]
        raise UserError(f"prepared data missing: {', '.join(missing)}. Run `finetune-lab "
                        "reproduce` (it makes what is missing and skips the rest), or in order: "
                        + "; ".join(REGENERATE[:-1]))
    cls_manifest = read_record(folders["cls"] / "manifest.json",
                                      {"seed": int, "parameters": dict})
    trained = tokenizer_training(read_record(folders["tokenizer"] / "manifest.json", {}))
    bin_manifest = read_record(folders["cls_bin"] / "manifest.json",
                                      {"counts": dict, "commands": list})
    pre_manifest = read_record(folders["pretrain"] / "manifest.json",
                                      {"counts": dict, "parameters": dict, "timings_s": dict,
                                       "commands": list})

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

    summary = {
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
    check_computed(summary, folders)
    return summary


SOURCE_COMMAND = {"cls_bin": "binarize-cls", "pretrain": "prepare-pretrain",
                  "tokenizer": "adopt-tokenizer", "cls": "prepare-cls"}
"""The command that writes each prepared-data folder (its manifest holds the counts)."""


def check_computed(summary: dict[str, Any], folders: dict[str, Path]) -> None:
    """The same checks as the committed summary's (:func:`~finetune_lab.data.cls_splits.read_summary`)
    on the statistics computed from the prepared data: a count of a prepared folder's manifest
    that its bounds contradict is refused in one line naming that manifest, before the chapter
    prints it or ``data-summary`` commits it."""
    try:
        problem = summary_contradiction(summary)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        problem = "it lacks the splits' counts (cls.splits, cls.tokenization, lengths)"
    problem = problem or count_contradiction(summary)
    if not problem:
        return
    field = problem.split()[-1] if problem.startswith("it lacks") else problem.split()[0]
    folder = ("pretrain" if field.startswith("pretrain.") else
              "tokenizer" if field.startswith(("tokenizer.", "examples.")) else
              "cls_bin" if field.startswith(("cls.tokenization", "lengths.")) else "cls")
    raise UserError(f"{folders[folder] / 'manifest.json'}: the prepared data's {problem}: make it "
                    f"again (`finetune-lab {SOURCE_COMMAND[folder]} --force`, then "
                    "`finetune-lab data-summary`)")


def tokenizer_training(tok_manifest: dict[str, Any]) -> dict[str, Any]:
    """How the tokenizer was trained: its own manifest, or, for the tokenizer that `reproduce`
    adopts from the committed checkpoint (its manifest only names the files), the committed
    summary, written when that tokenizer was trained."""
    if "seed" in tok_manifest:
        return tok_manifest
    path = summary_path()
    if not path.is_file():
        raise UserError(f"the tokenizer was adopted from the checkpoint and {path}, which "
                        "records how it was trained, is missing: restore it from git "
                        "(`git checkout -- data/summaries/data.json`)")
    committed = _files.read_json(path)
    try:
        problem = tokenizer_contradiction(committed)
        training = {**committed["tokenizer"], "tool_versions": committed["tool_versions"]}
    except (KeyError, TypeError, AttributeError):
        problem = "it lacks the tokenizer's record (tokenizer, tool_versions)"
    if problem:
        raise UserError(f"{path}: {problem}: restore it from git "
                        "(`git checkout -- data/summaries/data.json`)")
    return training


def write_summary(summary: dict[str, Any], dest: Path | None = None, *,
                  force: bool = False) -> Path:
    """Write the committed aggregate summary (``data/summaries/data.json``). A file there that
    is not a data summary (a user's ``--out``) is replaced only with ``force``, and kept beside
    it, named for the time it was replaced."""
    dest = check_summary_dest(dest, force=force)
    _files.check_writable(dest.parent)
    if dest.is_file() and not dest.is_symlink() and not _is_summary(dest):  # trial 26's L-m2
        _files.keep_beside(dest)  # at a free name: never over an earlier copy (trial 27's L-m1)
    _files.write_json_atomic(dest, summary)
    return dest


def check_summary_dest(dest: Path | None, *, force: bool = False) -> Path:
    """Where the summary goes, refused (one line) when it is a project file, a link, a folder,
    or a file that is not a data summary and ``force`` is not given."""
    dest = Path(dest) if dest is not None else summary_path()
    check_protected_file(dest)  # first: a link to a project file is named as that file
    if dest.is_symlink() and os.path.abspath(dest) != os.path.abspath(summary_path()):
        # no record through a link (trial 27's L-m2: --out LINK rewrote the committed summary);
        # the default path may be one a user made, as every record's may
        raise UserError(f"{dest} is a link (to {os.readlink(dest)}): the summary is not written "
                        "through a link, --force included; give --out a file's own path")
    if dest.is_dir():
        raise UserError(f"{dest} is a folder, not a file: give --out a file name")
    # among the records, --force replaces only a data summary (trial 11's A15: a probe's record)
    among_records = dest.resolve().is_relative_to(paths().summaries.resolve()) \
        and dest.resolve() != summary_path().resolve()
    if (dest.exists() or dest.is_symlink()) and (not force or among_records) \
            and not _is_summary(dest):
        raise UserError(f"{dest} exists and is not a data summary: it was left as it is; "
                        + ("choose another --out" if among_records else
                           "choose another --out, or pass --force to replace it"))
    if among_records and dest.resolve().parent != paths().summaries.resolve():
        # trial 28's L-m9: a data summary among the probes' records, which read every file there
        raise UserError(f"{dest} lies in {dest.parent}, the folder of another kind of record "
                        "(its chapter reads every file there): give --out a path outside it")
    return dest


def _is_summary(path: Path) -> bool:
    """Whether ``path`` holds what :func:`write_summary` writes: a JSON object with the
    CLS-Books and tokenizer sections."""
    try:
        record = _files.read_json(path)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {"cls", "tokenizer"} <= set(record)


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
    return {**read_summary(path), "source": "committed"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "data-summary",
        help="compute the data chapter's statistics from the prepared data and write data.json",
        description=compute_summary.__doc__,
    )
    parser.add_argument("--work", type=folder, default=None, help="work dir (default: data/work)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"summary file (default: data/summaries/{SUMMARY_NAME})")
    parser.add_argument("--force", action="store_true",
                        help="replace --out even if it is not a data summary")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    check_summary_dest(args.out, force=args.force)  # refused before the statistics are made
    dest = write_summary(compute_summary(args.work), args.out, force=args.force)
    print(f"data-summary: wrote {dest}")
    return 0
