"""The French pretraining corpus: ELTeC novels split by novel, encoded and binarized for ``masked_lm``.

The course's RoBERTa_small_fr was pretrained on mC4 French, which is not available; the
public-domain ELTeC-fra novels (level1 + ext1, about 39 M words) stand in for it. Train and
valid are split *by novel* so that no novel contributes to both sides.

Optionally (the default) the Webis-CLS-10 ``dvd`` and ``music`` reviews, train and test files
alike, are added as unlabeled in-domain text: the lab's task is reviews, and 1 % of novels'
text does not teach a small model their language. A seeded slice of them is held out as a
second validation set (``valid1``, in-domain perplexity) and the rest is repeated
``review_repeat`` times in train so that a CPU budget, which sees a fraction of one epoch, sees
each review a few times. Of the ``books`` reviews (the evaluation task), only the lab's
*training* split may enter, and only when asked (``task_repeat``): task-adaptive pretraining
[Gururangan et al. 2020], on the texts without their labels. Its validation and test reviews
never enter.
The tokenizer was trained on ``corpus_documents``'s train side (novels and the two domains'
``train.review``); the pretraining corpus only adds text to it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from finetune_lab.argtypes import (
    bounded_workers,
    folder,
    non_negative_int,
    resolved_folder,
)
from finetune_lab import _files
from finetune_lab.data.tools import tool_versions
from finetune_lab.config import paths, require_data_root
from finetune_lab.data import binarize, tokenizer
from finetune_lab.data.cls_books import BOOKS_DIR, BOOKS_SHA256
from finetune_lab.errors import UserError
from finetune_lab.data.eltec import (
    DEFAULT_REVIEW_REPEAT, DEFAULT_REVIEW_VALID, DEFAULT_SEED, DEFAULT_VALID_FRACTION, ELTEC_DIRS,
    Document, check_documents, corpus_documents, in_domain_reviews, paragraphs,
    task_reviews,
)

OUTPUT_NAME = "pretrain-bin"
TAPT_OUTPUT_NAME = "pretrain-tapt-bin"
TAPT_TASK_REPEAT = 3
"""The task-adaptive phase's corpus: the books training split 3 times beside the dvd/music
reviews once (about as many tokens of each), and no novels."""
DAPT_OUTPUT_NAME = "pretrain-dapt-bin"
"""The domain-adaptive corpus: the dvd/music reviews once, no novels and no CLS-Books text, for
a phase that must not read the task's texts (the tapt corpus without its books)."""
KINDS = ("general", "dapt", "tapt")
"""What a corpus's train side holds (:func:`corpus_kind`); a long run names its phases so."""


def default_output() -> Path:
    return paths().work / OUTPUT_NAME


def prepare_pretrain(
    data_root: Path | None = None,
    tokenizer_dir: Path | None = None,
    out: Path | None = None,
    seed: int = DEFAULT_SEED,
    valid_fraction: float = DEFAULT_VALID_FRACTION,
    with_reviews: bool = True,
    workers: int = 2,
    max_novels: int | None = None,
    force: bool = False,
    review_repeat: int = DEFAULT_REVIEW_REPEAT,
    review_valid: int = DEFAULT_REVIEW_VALID,
    task_repeat: int = 0,
    train_novels: bool = True,
    other_corpus: bool = False,
) -> tuple[Path, bool]:
    """Encode the corpus with the tokenizer and binarize it for ``masked_lm``; skip if up to date.

    Writes ``{train,valid}.spm`` (one paragraph per line, an empty line between documents, the
    format fairseq's ``complete_doc`` mode expects) and ``fairseq-preprocess --only-source``
    output under ``bin/``. With reviews, ``valid1`` holds the held-out reviews and train repeats
    the others ``review_repeat`` times. ``task_repeat`` adds the CLS-Books training split's
    texts that many times; without ``train_novels`` the train side holds reviews only (the
    validation sets stay the same, so the two corpora's losses compare). Files that are not the
    published ones are read only with ``other_corpus`` (:func:`check_documents`).
    Returns ``(out, ran)``; ``ran`` is False when nothing changed.
    """
    root = require_data_root(*ELTEC_DIRS, root=data_root)
    tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else tokenizer.default_output()
    model_path, dict_path = tokenizer.require_tokenizer(tok_dir)
    tokenizer.check_dictionary(model_path, dict_path)
    out = Path(out) if out is not None else default_output()
    docs = corpus_documents(root, seed, valid_fraction, False, max_novels)
    if not train_novels:
        if not (with_reviews or task_repeat):
            raise UserError("a corpus without novels needs reviews: drop --no-train-novels, or "
                            "keep the reviews or add --task-repeat")
        docs["train"] = []
    parameters: dict = {
        "seed": seed,
        "valid_fraction": valid_fraction,
        "with_reviews": with_reviews,
        "max_novels": max_novels,
    }
    if with_reviews:
        review_train, review_held = in_domain_reviews(root, seed, review_valid, review_repeat)
        docs["train"] = docs["train"] + review_train
        if review_held:
            docs["valid1"] = review_held
        parameters.update(review_repeat=review_repeat, review_valid=review_valid)
    if task_repeat:
        docs["train"] = docs["train"] + [task_reviews(root, task_repeat)]
        parameters.update(task_repeat=task_repeat)
    if not train_novels:
        parameters.update(train_novels=False)
    parameters["documents"] = {split: [d.name for d in ds] for split, ds in docs.items()}
    digests, other = check_documents(root, [d for ds in docs.values() for d in ds], other_corpus)
    if other:
        parameters["corpus"] = "other"  # in the parameters: a rebuild when it changes
    inputs = {
        "tokenizer/spm.model": _files.sha256_file(model_path),
        "tokenizer/dict.txt": _files.sha256_file(dict_path),
        **digests,
    }
    if not force and binarize.up_to_date(out, inputs, parameters):
        return out, False

    started = time.perf_counter()
    sp = tokenizer.load_processor(tok_dir)
    with _files.atomic_dir(out, "prepare-pretrain", force=force) as tmp:
        counts: dict[str, dict[str, int]] = {}
        encode_started = time.perf_counter()
        for split, split_docs in docs.items():
            counts[split] = _encode_documents(sp, split_docs, tmp / f"{split}.spm")
            counts[split]["novels"] = sum(1 for d in split_docs if d.name.endswith(".txt.xz"))
        encode_s = time.perf_counter() - encode_started
        command = binarize.preprocess_command(
            trainpref="train.spm", destdir="bin",
            validpref=",".join(f"{split}.spm" for split in docs if split != "train"),
            srcdict=dict_path, workers=workers,
        )
        preprocess_s = binarize.run_preprocess(command, cwd=tmp)
        manifest = {
            "step": "prepare-pretrain",
            "inputs": inputs,
            "outputs": _files.sha256_tree(tmp, exclude=("manifest.json", "preprocess.log")),
            "seed": seed,
            "parameters": parameters,
            "counts": counts,
            "commands": [binarize.display_command(command, srcdict="<tokenizer>/dict.txt")],
            "tool_versions": tool_versions(),
            "timings_s": {
                "encode": round(encode_s, 3),
                "fairseq_preprocess": round(preprocess_s, 3),
                "total": round(time.perf_counter() - started, 3),
            },
        }
        _files.write_json_atomic(tmp / "manifest.json", manifest)
    return out, True


def _encode_documents(sp, docs: list[Document], dest: Path) -> dict[str, int]:
    """Write the pieces of every paragraph, documents separated by an empty line; count them."""
    totals = {"documents": 0, "paragraphs": 0, "words": 0, "tokens": 0, "unk": 0}
    with open(dest, "w", encoding="utf-8", newline="\n") as handle:
        for doc in docs:
            lines = list(paragraphs(doc))
            if not lines:
                continue
            text = "".join(" ".join(pieces) + "\n" for pieces in tokenizer.encode_pieces(sp, lines))
            pieces = text.split()
            for _ in range(doc.repeat):
                if totals["documents"]:
                    handle.write("\n")
                handle.write(text)
                totals["tokens"] += len(pieces)
                totals["unk"] += pieces.count("<unk>")
                totals["documents"] += 1
                totals["paragraphs"] += len(lines)
                totals["words"] += sum(len(line.split()) for line in lines)
    return totals


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare-pretrain",
        help="split ELTeC by novel, spm-encode it and binarize it for fairseq masked_lm",
        description=prepare_pretrain.__doc__,
    )
    parser.add_argument("--data-root", type=folder, default=None)
    parser.add_argument("--tokenizer", type=resolved_folder, default=None,
                        help="folder with spm.model and dict.txt (default: <work dir>/tokenizer)")
    parser.add_argument("--out", type=resolved_folder, default=None,
                        help=f"output folder (default: <work dir>/{OUTPUT_NAME})")
    parser.add_argument("--seed", type=non_negative_int, default=DEFAULT_SEED)
    parser.add_argument("--valid-fraction", type=float, default=DEFAULT_VALID_FRACTION)
    parser.add_argument("--no-reviews", dest="with_reviews", action="store_false",
                        help="ELTeC only: leave out the dvd/music reviews (unlabeled in-domain text)")
    parser.add_argument("--review-repeat", type=int, default=DEFAULT_REVIEW_REPEAT,
                        help="times the in-domain reviews are written in train (upweighting)")
    parser.add_argument("--review-valid", type=int, default=DEFAULT_REVIEW_VALID,
                        help="reviews held out as the in-domain validation set valid1")
    parser.add_argument("--task-repeat", type=non_negative_int, default=0,
                        help="add the texts (no labels) of the CLS-Books training split this many "
                             "times: task-adaptive pretraining (never its valid or test reviews)")
    parser.add_argument("--no-train-novels", dest="train_novels", action="store_false",
                        help="train side without novels (reviews only; valid sets unchanged)")
    parser.add_argument("--tapt", action="store_true",
                        help=f"the task-adaptive phase's corpus: --task-repeat {TAPT_TASK_REPEAT} "
                             "--review-repeat 1 --no-train-novels, into "
                             f"<work dir>/{TAPT_OUTPUT_NAME}")
    parser.add_argument("--dapt", action="store_true",
                        help="the domain-adaptive corpus: --task-repeat 0 --review-repeat 1 "
                             f"--no-train-novels (no CLS-Books text), into <work dir>/{DAPT_OUTPUT_NAME}")
    parser.add_argument("--other-corpus", action="store_true",
                        help="read review files that are not Webis-CLS-10's (each still checked "
                             "against the books test reviews)")
    parser.add_argument("--workers", type=bounded_workers, default=2)
    parser.add_argument("--max-novels", type=int, default=None, help="use only the first N novels")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even if up to date, and replace --out even if this "
                             "command did not make it")
    parser.set_defaults(func=_run)


def tapt_output() -> Path:
    return paths().work / TAPT_OUTPUT_NAME


def dapt_output() -> Path:
    return paths().work / DAPT_OUTPUT_NAME


def corpus_kind(train_documents: list[str]) -> str:
    """``tapt`` if any CLS-Books text is on the train side, ``general`` with novels, else
    ``dapt`` (reviews of the other domains only): from the documents read, not the flags."""
    if any(name.startswith(BOOKS_DIR + "/") for name in train_documents):
        return "tapt"
    if any(name.endswith(".txt.xz") for name in train_documents):
        return "general"
    return "dapt"


def corpus_record(bin_dir: Path) -> dict[str, Any] | None:
    """What a run reading the corpus ``bin_dir`` reads, from the corpus's own manifest: its kind
    (:func:`corpus_kind`), the sources on its train side and the manifest's sha256; None for a
    folder that ``prepare-pretrain`` did not write (a run then records its path alone)."""
    folder = Path(bin_dir)
    manifest = folder.parent / "manifest.json" if folder.name == "bin" else folder / "manifest.json"
    if not manifest.is_file():
        return None
    record = _files.read_json(manifest)
    if not isinstance(record, dict):
        raise UserError(f"{manifest} is not a corpus manifest (a JSON object): prepare the corpus "
                        "again (prepare-pretrain --force)")
    inputs = record.get("inputs") if isinstance(record.get("inputs"), dict) else {}
    read = [name for name, digest in inputs.items() if digest == BOOKS_SHA256["test"]]
    if read:  # made before every file was checked (22b's R-D-e3): its text is the test reviews'
        raise UserError(f"{manifest} records Webis-CLS-10's books test file as its {read[0]}: "
                        f"its reviews are in that corpus; prepare it again (prepare-pretrain "
                        "--force)")
    params = record.get("parameters") or {}
    train = list((params.get("documents") or {}).get("train") or [])
    sources = sorted({"eltec-fra" if n.endswith(".txt.xz") else n.rsplit("/", 1)[0]
                      for n in train})
    return {"kind": corpus_kind(train), "train_sources": sources,
            "task_repeat": int(params.get("task_repeat") or 0),
            **({"corpus": "other"} if params.get("corpus") == "other" else {}),
            "review_repeat": params.get("review_repeat"),
            "manifest_sha256": _files.sha256_file(manifest)}


def _run(args: argparse.Namespace) -> int:
    if args.tapt:
        args.task_repeat, args.review_repeat, args.train_novels = TAPT_TASK_REPEAT, 1, False
        args.out = args.out or tapt_output()
    if args.dapt:
        if args.tapt or args.task_repeat:
            raise UserError("--dapt reads no CLS-Books text: drop --tapt and --task-repeat")
        args.task_repeat, args.review_repeat, args.train_novels = 0, 1, False
        args.out = args.out or dapt_output()
    out, ran = prepare_pretrain(
        args.data_root, args.tokenizer, args.out, seed=args.seed,
        valid_fraction=args.valid_fraction, with_reviews=args.with_reviews,
        workers=args.workers, max_novels=args.max_novels, force=args.force,
        review_repeat=args.review_repeat, review_valid=args.review_valid,
        task_repeat=args.task_repeat, train_novels=args.train_novels,
        other_corpus=args.other_corpus,
    )
    counts = _files.read_json(out / "manifest.json")["counts"]
    summary = ", ".join(f"{s} {c['tokens']:,} tokens" for s, c in counts.items())
    print(f"prepare-pretrain: {'wrote' if ran else 'up to date:'} {out} ({summary})")
    return 0
