"""The committed checkpoint asked to fill masks, live, and how often it answers with the corpus's
most frequent pieces: what a model on the masked-LM plateau does whatever the context.

Weights that are not committed (a candidate under ``data/work/``) are asked once, by
``finetune-lab fill-mask``, and their answers kept in ``data/summaries/fill-mask/``, so that the
book can show them on a machine that does not have those weights.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
import time
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab._files import (
    not_there,
    read_json,
    utc_now,
    write_record,
)
from finetune_lab.argtypes import folder, record_name
from finetune_lab.book.summary_files import (
    NUMBER,
    PROBABILITY,
    device_problem,
    read_records,
    summary_problem,
    weights_record_problem,
)
from finetune_lab.config import check_new_record, paths
from finetune_lab.errors import DamagedFileError, UserError
from finetune_lab.models.checkpoints import (
    DICT_FILE,
    MODEL_FILE,
    check_listed_files,
    load_hub_model,
    package_manifest,
    packaged_dir,
)
from finetune_lab.models.hf_tokenizer import SPECIALS, TASK_SYMBOLS, dict_entries
from finetune_lab.render_cache import per_render
from finetune_lab.runs.manifest import (
    device_info,
    environment_info,
    portable_path,
    refuse_outside_project,
    resolve_stored_path,
    weights_record,
)
from finetune_lab.runs.consistency import recorded_time
from finetune_lab.runs.crosscheck import CANDIDATE, packaged_origin
from finetune_lab.runs.record_names import check_record_name
from finetune_lab.runs.run_inputs import cached_sha256

DEMO_SENTENCES = (
    "Ce livre est vraiment <mask>.",
    "Je n'ai pas aimé ce <mask>.",
    "Une histoire <mask>, je le recommande à tous.",
    "Il ouvrit la <mask> et sortit dans la rue.",
    "Elle était assise près de la <mask>.",
)
"""Review-like sentences (the lab's task) and narrative ones (the pretraining domain)."""


TOPK = 5
"""Answers kept per sentence (ranks 1 to 5)."""


@per_render
def fill_mask_table(sentences: tuple[str, ...] = DEMO_SENTENCES, topk: int = TOPK,
                    folder: Path | None = None) -> pd.DataFrame:
    """Top-k completions of each sentence, computed now on CPU from a packaged checkpoint (the
    committed one by default)."""
    import torch

    torch.manual_seed(0)
    hub = load_hub_model(folder)
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


SYMBOLS = (*SPECIALS, *TASK_SYMBOLS)  # fairseq's besides dict.txt's pieces: no line lists them
"""What fairseq's dictionary holds besides ``dict.txt``'s pieces (its four specials before them,
the masked-LM task's ``<mask>`` after): answers no line of ``dict.txt`` lists."""


def shown_piece(piece: str) -> str:
    """A piece as the answers show it: fairseq's sentencepiece decoding (``▁`` a space), and
    :func:`fill_mask_table`'s strip. ``▁,`` and ``,`` are then one answer, shown twice."""
    return piece.replace("\u2581", " ").strip()


def dictionary_counts(folder: Path | None = None) -> list[tuple[str, int]]:
    """``(piece, count)`` for each line of a packaged checkpoint's ``dict.txt`` (the committed
    one by default), read as fairseq reads it (:func:`~finetune_lab.models.hf_tokenizer.dict_entries`).

    The file is first checked against the folder's manifest (:func:`check_listed_files`, as
    :func:`load_hub_model` does); a file that differs, and a line fairseq would refuse, is one
    line naming the file (and the line), not a traceback."""
    folder = Path(folder) if folder is not None else packaged_dir()
    path = folder / DICT_FILE
    restore = f"restore {folder} (`finetune-lab package-checkpoint`, or git for the committed one)"
    if not path.is_file():  # not opened when it is a pipe or a device
        raise UserError(f"{path} {not_there(path)}: {restore}")
    check_listed_files(folder)
    return [(piece, count) for piece, count, _ in dict_entries(path, restore)]


def frequent_pieces(n: int = 20, folder: Path | None = None) -> set[str]:
    """The ``n`` most frequent pieces of the corpus, from the ``dict.txt`` counts of a packaged
    checkpoint (the committed one by default), checked against its manifest."""
    rows = [(count, shown_piece(piece)) for piece, count in dictionary_counts(folder)]
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


def fill_mask_dir() -> Path:
    """``data/summaries/fill-mask/``: the answers of weights the project does not commit."""
    return paths().summaries / "fill-mask"


def record_fill_mask(folder: Path, name: str, out_dir: Path | None = None, *,
                     force: bool = False) -> Path:
    """Ask the packaged weights in ``folder`` to fill :data:`DEMO_SENTENCES` and write
    ``<out_dir>/<name>.json``: which weights (path and sha256), the answers, when and where.
    An existing record of that name (the book may cite it) is replaced only with ``force``."""
    record_name(name)
    folder = Path(folder)
    out = Path(out_dir or fill_mask_dir()) / f"{name}.json"
    check_new_record(out, f"the answers of the weights recorded as {name!r}", force=force)
    refuse_outside_project(folder, out)
    check_record_name(name, folder, out)
    start = time.monotonic()
    table = fill_mask_table(folder=folder)
    result = {"schema": 1, "name": name, "checkpoint": weights_record(folder, out),
              "predictions": table.to_dict(orient="records"),
              "time": utc_now(), "wall_time_s": round(time.monotonic() - start, 1),
              "environment": environment_info(), "device": device_info()}
    write_record(out, result)
    return out


RECORD_FIELDS = ((("name",), str), (("checkpoint", "sha256"), str), (("predictions",), list))
PREDICTION_FIELDS = ((("sentence",), str), (("predicted piece",), str),
                     (("rank",), int, (1, TOPK)), (("probability",), NUMBER, PROBABILITY))


def checkpoint_folder(record: dict[str, Any]) -> Path | None:
    """The packaged checkpoint folder on this machine that holds the weights a record names:
    the folder of its recorded path, or the committed checkpoint (weights asked before they were
    packaged), whichever's manifest lists a ``model.pt`` of the record's sha256. None where
    neither does (a candidate under the git-ignored ``data/work/`` that this machine lacks): its
    dictionary is then not known here."""
    sha, stored = record["checkpoint"]["sha256"], record["checkpoint"].get("path")
    # a record of the book's names weights inside the project (summary_files.weights_outside)
    folders = [resolve_stored_path(stored).parent] if isinstance(stored, str) and stored else []
    for candidate in [*folders, packaged_dir()]:
        try:
            listed = (package_manifest(candidate) or {}).get("files") or {}
        except (UserError, OSError):  # a damaged manifest tells nothing of whose folder it is
            continue
        if (listed.get(MODEL_FILE) or {}).get("sha256") == sha \
                and (candidate / DICT_FILE).is_file():
            return candidate
    return None


def record_vocabulary(record: dict[str, Any]) -> tuple[Path, Counter[str]] | None:
    """The dictionary of the checkpoint a record names and every answer it can give, as the
    answers are shown (:func:`shown_piece`: ``▁,`` and ``,`` are both ``,``), with how many of
    its pieces show so (one answer per piece: check 30b's 30b-11); None where that
    dictionary is not on this machine or is not the file its manifest lists (which the book's
    readers of the checkpoint report themselves)."""
    folder = checkpoint_folder(record) or _trained_with_committed(record)
    if folder is None:
        return None
    try:
        pieces = dictionary_counts(folder)
    except UserError:
        return None
    return folder / DICT_FILE, Counter([*SYMBOLS, *(shown_piece(piece) for piece, _ in pieces)])


def _trained_with_committed(record: dict[str, Any]) -> Path | None:
    """The committed checkpoint's folder, where the run that made a candidate's weights (its
    folder is not on this machine) trained with the committed ``dict.txt``, as its recorded
    sha256 says: trial 30's R-9, an answer edited to no piece of it was shown."""
    path = record["checkpoint"].get("path")
    named = CANDIDATE.fullmatch(path) if isinstance(path, str) else None
    try:
        man = read_json(paths().runs / "pretrain" / named["run"] / "manifest.json") if named \
            else None
        committed = cached_sha256(packaged_dir() / DICT_FILE)
    except (OSError, DamagedFileError):
        return None
    data = (man.get("inputs") or {}).get("data") if isinstance(man, dict) else None
    shas = {(d.get("sha256") or {}).get(DICT_FILE) for d in data or [] if isinstance(d, dict)}
    return packaged_dir() if shas == {committed} else None


def _predictions_problem(record: dict[str, Any]) -> str | None:
    """Each prediction in range, and together the answers the command writes: the book's
    sentences and no other, each one's ranks 1, 2, 3 ... once each, the probabilities falling
    and adding up to at most 1, and each answer a piece of the dictionary of the checkpoint the
    record names, where that dictionary is on this machine (:func:`record_vocabulary`). A piece
    may be answered twice for one sentence: ``▁,`` and ``,`` are two pieces, shown alike."""
    problem = device_problem(record) or weights_record_problem(record, paths().runs,
                                                               packaged_origin())
    if problem is not None:  # as a probe's record (trial 12's FM12, FM14)
        return problem
    rows = record["predictions"]
    for i, row in enumerate(rows):
        if (problem := summary_problem(row, PREDICTION_FIELDS)) is not None:
            return f"has a prediction (item {i}) that {problem}"
    if {row["sentence"] for row in rows} != set(DEMO_SENTENCES):
        return f"does not answer exactly the book's {len(DEMO_SENTENCES)} sentences"
    for sentence in DEMO_SENTENCES:  # fairseq leaves special pieces out: up to TOPK answers
        answers = sorted((row["rank"], row["probability"]) for row in rows
                         if row["sentence"] == sentence)
        if [rank for rank, _ in answers] != list(range(1, len(answers) + 1)):
            return f"does not rank the answers to {sentence!r} 1, 2, 3 ... once each"
        if any(b > a for (_, a), (_, b) in zip(answers, answers[1:])):
            return f"does not rank the answers to {sentence!r} by probability"
        if sum(p for _, p in answers) > 1 + 1e-6:  # the top answers of one distribution
            return (f"does not give the answers to {sentence!r} probabilities adding up to 1 "
                    "or less")
    if (vocabulary := record_vocabulary(record)) is not None:
        dictionary, known = vocabulary
        for i, row in enumerate(rows):
            if row["predicted piece"] not in known:
                return (f"answers {row['predicted piece']!r} (item {i}), which is no piece of "
                        f"the dictionary of the checkpoint it names ({portable_path(dictionary)})")
        for sentence in DEMO_SENTENCES:
            given = Counter(row["predicted piece"] for row in rows if row["sentence"] == sentence)
            if (twice := next((p for p, n in given.items() if n > known[p]), None)) is not None:
                return (f"answers {twice!r} to {sentence!r} {given[twice]} times, more than the "
                        "pieces that show so")
    return None


def recorded_fill_masks(out_dir: Path | None = None, set_aside: list[str] | None = None
                        ) -> dict[str, dict[str, Any]]:
    """Every record of :func:`record_fill_mask`, by name, with its answers as a table. A damaged
    file is left out, with one line in ``set_aside`` naming it (when a list is given)."""
    records, bad = read_records(Path(out_dir or fill_mask_dir()), RECORD_FIELDS,
                                more=_predictions_problem)
    if set_aside is not None:
        set_aside += bad
    found = {}
    for record in records:
        record["table"] = pd.DataFrame(record["predictions"])
        found[record["name"]] = record
    return found


def split_committed(records: dict[str, dict[str, Any]], folder: Path | None = None
                    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """:func:`recorded_fill_masks` split in two: the records of the committed ``model.pt`` (the
    same sha256: weights asked before they were packaged), and the others."""
    model = Path(folder or packaged_dir()) / MODEL_FILE
    sha = cached_sha256(model) if model.is_file() else None
    mine = {n: r for n, r in records.items() if r["checkpoint"]["sha256"] == sha}
    return mine, {n: r for n, r in records.items() if n not in mine}


def asked_before_packaging(record: dict[str, Any], package: dict[str, Any] | None) -> bool | None:
    """Whether a record of the committed weights was made before they were packaged (its time
    against the package's ``created``), None when a time is not known: the chapter says which,
    not always "before" (trial 15's W3 c)."""
    asked, made = recorded_time(record.get("time")), recorded_time((package or {}).get("created"))
    return None if asked is None or made is None else asked < made


def differing_answers(recorded: pd.DataFrame, live: pd.DataFrame) -> int:
    """How many (sentence, rank) answers of a record differ from the live table's, by piece or
    by probability as the tables show it (two decimals); an answer one side lacks differs."""
    def keyed(df: pd.DataFrame) -> dict[tuple[str, int], tuple[str, float]]:
        return {(s, int(r)): (piece, round(float(prob), 2)) for s, r, piece, prob in
                zip(df["sentence"], df["rank"], df["predicted piece"], df["probability"])}

    a, b = keyed(recorded), keyed(live)
    return sum(a.get(k) != b.get(k) for k in a.keys() | b.keys())


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fill-mask", help="ask packaged weights to fill the book's masked sentences; keep the "
                          "answers in data/summaries/fill-mask/NAME.json")
    p.add_argument("--checkpoint", type=folder, required=True,
                   help="packaged checkpoint folder (model.pt, dict.txt, manifest.json)")
    p.add_argument("--name", required=True, help="record name (the weights' name in the book)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing record of NAME (kept beside it, as "
                        "NAME.json.replaced-<UTC time>)")
    p.set_defaults(func=lambda a: print(
        f"fill-mask: {record_fill_mask(a.checkpoint, a.name, force=a.force)}") or 0)
