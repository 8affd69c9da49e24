"""The French sentencepiece BPE tokenizer and its fairseq ``dict.txt``.

The course's RoBERTa_small_fr had an embedding of exactly 32,000 rows. fairseq builds that
matrix from ``dict.txt``: its 4 specials (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3), then
one row per ``dict.txt`` line, then ``<mask>``, which the ``masked_lm`` and
``sentence_prediction`` tasks append. The sentencepiece model is trained with those same four
specials at the same ids (bos 0, pad 1, eos 2, unk 3), and ``dict.txt`` lists every other piece
in sentencepiece id order, so a piece has the same id in both (the CamemBERT convention without
its id shift). Hence ``rows = vocab_size + 1`` and the model has 31,999 pieces.
"""

from __future__ import annotations

import argparse
import io
import random
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_lab import _files
from finetune_lab.data.tools import tool_versions
from finetune_lab.data.child import ChildFailed, in_child
from finetune_lab.argtypes import folder, positive_int, seed_arg
from finetune_lab.config import paths, require_data_root
from finetune_lab.errors import UserError
from finetune_lab.data import eltec

EMBEDDING_ROWS = 32_000
"""Rows of the course model's embedding matrix."""
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
"""What ``fairseq.data.Dictionary()`` holds before ``dict.txt`` is read, in id order."""
ADDED_BY_TASK = ("<mask>",)
"""Symbols that the masked_lm / sentence_prediction tasks append after ``dict.txt``."""
SPM_SPECIAL_IDS = {"bos_id": 0, "pad_id": 1, "eos_id": 2, "unk_id": 3}
"""sentencepiece ids of its control/unk pieces, chosen to equal fairseq's."""

DEFAULT_SEED = 1
CHARACTER_COVERAGE = 1.0
"""Every character of the corpus gets a piece: a few hundred slots of 32k buy a lower <unk> rate
on reviews (at 0.9999 the typographic apostrophe, '/', '%' and '&' fell out)."""
DEFAULT_SAMPLE_SENTENCES = 0
"""0: every sentence of the train side (about 2.2 M; spm trains on them in well under a minute)."""
OUTPUT_NAME = "tokenizer"
MODEL_FILE = "spm.model"
DICT_FILE = "dict.txt"
COMMAND = "train-tokenizer"
ADOPT_COMMAND = "adopt-tokenizer"
"""The command that makes the work tokenizer the committed checkpoint's own (what every
committed run read): the fix to name when the tokenizer is missing."""
MAKE_TOKENIZER = ("`finetune-lab adopt-tokenizer` (the committed checkpoint's own tokenizer, which "
                  "every committed run used; `finetune-lab train-tokenizer` makes a new one, for "
                  "pretraining from scratch only)")
"""How a message says to make the work tokenizer: never a retraining that would undo the
adopted one."""
ADOPTED_STEP = "adopted from the packaged checkpoint"
"""The manifest step of a tokenizer copied from the checkpoint (``reproduce``): a folder of this
project that ``train-tokenizer`` may replace."""

_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+(?=[«—–\"'(\[A-ZÀ-ÖØ-Þ])")


def embedding_rows(dict_entries: int) -> int:
    """Rows of a fairseq embedding built from a ``dict.txt`` of ``dict_entries`` lines."""
    return len(FAIRSEQ_SPECIALS) + dict_entries + len(ADDED_BY_TASK)


def spm_vocab_size(rows: int = EMBEDDING_ROWS) -> int:
    """sentencepiece vocabulary size giving ``rows`` embedding rows (its 4 specials are fairseq's)."""
    dict_entries = rows - len(FAIRSEQ_SPECIALS) - len(ADDED_BY_TASK)
    return dict_entries + len(SPM_SPECIAL_IDS)


DEFAULT_VOCAB_SIZE = spm_vocab_size()


def split_sentences(paragraph: str) -> list[str]:
    """Rough French sentence split (end punctuation + capital/quote/dash): sample units for spm."""
    return [s for s in _SENTENCE_END.split(paragraph) if s]


def sample_sentences(sentences: Sequence[str], n: int, seed: int) -> list[str]:
    """Deterministic uniform sample of ``n`` sentences (all of them if ``n`` is 0 or too big).

    The sample keeps corpus order, so it depends only on the corpus and the seed.
    """
    if n <= 0 or n >= len(sentences):
        return sentences
    keep = sorted(random.Random(seed).sample(range(len(sentences)), n))
    return [sentences[i] for i in keep]


def train_spm(
    sentences: Sequence[str],
    model_prefix: Path,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = DEFAULT_SEED,
    num_threads: int = 2,
) -> float:
    """Train a BPE model on ``sentences``, write ``<prefix>.model`` and ``.vocab``; return seconds.

    The sentences are streamed to the trainer in order (``input_sentence_size=0``: no internal
    sampling or shuffling) and the model is written from memory, so the file records no temp
    path and is byte-identical for the same sentences: it depends only on the caller's seeded
    sample.
    """
    import sentencepiece as spm

    if not sentences:
        raise UserError("the tokenizer corpus is empty; check the data root")

    def trained() -> bytes:
        model = io.BytesIO()
        spm.set_random_generator_seed(seed)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            model_type="bpe",
            vocab_size=vocab_size,
            character_coverage=CHARACTER_COVERAGE,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            max_sentence_length=16384,
            num_threads=num_threads,
            minloglevel=2,
            **SPM_SPECIAL_IDS,
        )
        return model.getvalue()

    started = time.perf_counter()
    try:  # in a child: the trainer is one C++ call, which no signal handler interrupts
        model = in_child(trained)
    except ChildFailed as exc:
        raise UserError(f"sentencepiece could not train the tokenizer: {exc}") from None
    elapsed = time.perf_counter() - started
    prefix = Path(model_prefix)
    prefix.with_name(prefix.name + ".model").write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    with open(prefix.with_name(prefix.name + ".vocab"), "w", encoding="utf-8", newline="\n") as fh:
        fh.writelines(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n"
                      for i in range(sp.get_piece_size()))
    return elapsed


def load_processor(tokenizer_dir: Path):
    """The trained ``SentencePieceProcessor`` of a tokenizer folder."""
    return _processor(require_tokenizer(tokenizer_dir)[0])


def _processor(model_path: Path):
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(model_path))
    except (RuntimeError, OSError) as exc:  # a damaged model is sentencepiece's RuntimeError
        raise UserError(f"{model_path} is not a sentencepiece model ({str(exc).strip()[:120]}): "
                        "restore the tokenizer (`finetune-lab adopt-tokenizer --force`) or train "
                        "it again") from None


def require_tokenizer(tokenizer_dir: Path) -> tuple[Path, Path]:
    """``(spm.model, dict.txt)`` of ``tokenizer_dir``, or a UserError saying how to build them."""
    model_path, dict_path = Path(tokenizer_dir) / MODEL_FILE, Path(tokenizer_dir) / DICT_FILE
    for p in (model_path, dict_path):
        if not p.is_file():
            raise UserError(f"{p} is missing. Run {MAKE_TOKENIZER} first.")
    return model_path, dict_path


def check_dictionary(model_path: Path, dict_path: Path) -> None:
    """``dict.txt`` must list the model's pieces in its order, as what binarizes with them
    reads it (trial 26's E-m13: one cut short at a line end binarized the split with 56 % of
    its tokens unknown)."""
    listed = [line.split(" ", 1)[0] for line in _files.regular_text(dict_path).splitlines()]
    pieces = [line.split(" ", 1)[0] for line in fairseq_dict_lines(_processor(model_path))]
    if listed != pieces:
        raise UserError(f"{dict_path} does not list the {len(pieces)} pieces of {model_path} in "
                        f"its order ({len(listed)} lines): a copy cut short or edited; restore "
                        "the tokenizer (`finetune-lab adopt-tokenizer --force`) or train it again")


def encode_pieces(sp, lines: Sequence[str], num_threads: int = 2) -> list[list[str]]:
    """Pieces of each line; unknown pieces are written ``<unk>`` (fairseq maps both forms to id 3)."""
    ids = sp.encode(list(lines), num_threads=num_threads)
    return [sp.id_to_piece(row) for row in ids]


def fairseq_dict_lines(sp, counts: Counter[int] | None = None) -> list[str]:
    """``piece count`` lines of ``dict.txt``: all non-control, non-unk pieces in spm id order.

    Keeping spm order (not fairseq's usual count order) makes spm id == fairseq id.
    """
    counts = counts or Counter()
    lines = []
    for piece_id in range(sp.get_piece_size()):
        if sp.is_control(piece_id) or sp.is_unknown(piece_id):
            continue
        piece = sp.id_to_piece(piece_id)
        if len(piece.split()) != 1 or piece != piece.strip():
            raise UserError(f"sentencepiece piece {piece!r} (id {piece_id}) contains whitespace; "
                            "fairseq's dict.txt cannot hold it. Retrain with the default normalizer.")
        lines.append(f"{piece} {counts.get(piece_id, 0)}")
    specials = sum(1 for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i))
    if specials != len(FAIRSEQ_SPECIALS) or any(
        sp.id_to_piece(i) != s for i, s in enumerate(FAIRSEQ_SPECIALS)
    ):
        raise UserError("the sentencepiece model's specials are not <s> <pad> </s> <unk> at ids 0-3; "
                        "retrain it with `finetune-lab train-tokenizer`.")
    return lines


def write_fairseq_dict(sp, dest: Path, counts: Counter[int] | None = None) -> int:
    """Write ``dict.txt`` and return the embedding rows it yields (``embedding_rows``)."""
    lines = fairseq_dict_lines(sp, counts)
    dest.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return embedding_rows(len(lines))


def piece_counts(sp, sentences: Sequence[str]) -> Counter[int]:
    """How often each piece id occurs in ``sentences`` (the ``count`` column of ``dict.txt``)."""
    counts: Counter[int] = Counter()
    for start in range(0, len(sentences), 50_000):
        for row in sp.encode(list(sentences[start:start + 50_000]), num_threads=2):
            counts.update(row)
    return counts


def default_output() -> Path:
    return paths().work / OUTPUT_NAME


def train_tokenizer(
    data_root: Path | None = None,
    out: Path | None = None,
    seed: int = DEFAULT_SEED,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    sample_size: int = DEFAULT_SAMPLE_SENTENCES,
    with_reviews: bool = True,
    max_novels: int | None = None,
    num_threads: int = 2,
    force: bool = False,
    other_corpus: bool = False,
) -> Path:
    """Train the BPE model on a seeded sample of the pretraining corpus's *train* side.

    The valid novels are left out so that held-out perplexity stays held out. Writes
    ``spm.model``, ``spm.vocab``, ``dict.txt`` and ``manifest.json`` atomically, replacing only
    a tokenizer folder of this project (trained or adopted) unless ``force``.
    """
    started = time.perf_counter()
    root = require_data_root(*eltec.ELTEC_DIRS, root=data_root)
    out = Path(out) if out is not None else default_output()
    mine = _files.data_step_output(COMMAND, ADOPTED_STEP)
    _files.check_replaceable(out, COMMAND, force=force, earlier=mine)  # before the slow part
    docs = eltec.corpus_documents(root, seed=seed, with_reviews=with_reviews, max_novels=max_novels)
    train_docs = docs["train"]
    digests, other = eltec.check_documents(root, train_docs, other_corpus)
    read_started = time.perf_counter()
    all_paragraphs = [p for doc in train_docs for p in eltec.paragraphs(doc)]
    sentences = [s for p in all_paragraphs for s in split_sentences(p)]
    sample = sample_sentences(sentences, sample_size, seed)
    read_s = time.perf_counter() - read_started
    with _files.atomic_dir(out, COMMAND, force=force, earlier=mine) as tmp:
        train_s = train_spm(sample, tmp / "spm", vocab_size=vocab_size, seed=seed, num_threads=num_threads)
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(tmp / MODEL_FILE))
        count_started = time.perf_counter()
        counts = piece_counts(sp, sample)
        rows = write_fairseq_dict(sp, tmp / DICT_FILE, counts)
        count_s = time.perf_counter() - count_started
        manifest = {
            "step": COMMAND,
            "inputs": digests,
            "outputs": _files.sha256_tree(tmp, exclude=("manifest.json",)),
            "seed": seed,
            "parameters": {
                "model_type": "bpe",
                "vocab_size": vocab_size,
                "embedding_rows": rows,
                "special_ids": SPM_SPECIAL_IDS,
                "character_coverage": CHARACTER_COVERAGE,
                "sample_sentences": sample_size,
                "with_reviews": with_reviews,
                "max_novels": max_novels,
                "num_threads": num_threads,
                "held_out_novels": [d.name for d in docs["valid"]],
                **({"corpus": "other"} if other else {}),
            },
            "corpus": {
                "documents": len(train_docs),
                "paragraphs": len(all_paragraphs),
                "words": sum(len(p.split()) for p in all_paragraphs),
                "characters": sum(len(p) for p in all_paragraphs),
                "sentences": len(sentences),
                "sample_sentences": len(sample),
                "sample_words": sum(len(s.split()) for s in sample),
                "sample_characters": sum(len(s) for s in sample),
            },
            "tool_versions": tool_versions(),
            "timings_s": {
                "read_and_sample": round(read_s, 3),
                "spm_train": round(train_s, 3),
                "dict": round(count_s, 3),
                "total": round(time.perf_counter() - started, 3),
            },
        }
        _files.write_json_atomic(tmp / "manifest.json", manifest)
    return out


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        COMMAND,
        help="train the 32k sentencepiece BPE model and fairseq dict.txt on the pretraining corpus",
        description=train_tokenizer.__doc__,
    )
    parser.add_argument("--data-root", type=folder, default=None)
    parser.add_argument("--out", type=folder, default=None,
                        help=f"output folder (default: <work dir>/{OUTPUT_NAME})")
    parser.add_argument("--seed", type=seed_arg, default=DEFAULT_SEED)  # 30's E-21
    parser.add_argument("--vocab-size", type=positive_int, default=DEFAULT_VOCAB_SIZE,
                        help=f"sentencepiece pieces (default {DEFAULT_VOCAB_SIZE}: "
                        f"{EMBEDDING_ROWS} embedding rows with fairseq's <mask>)")
    parser.add_argument("--sample-sentences", type=positive_int, default=DEFAULT_SAMPLE_SENTENCES)
    parser.add_argument("--no-reviews", dest="with_reviews", action="store_false",
                        help="ELTeC only: leave out the dvd/music reviews")
    parser.add_argument("--max-novels", type=positive_int, default=None)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--other-corpus", action="store_true",
                        help="read review files that are not Webis-CLS-10's (each still checked "
                             "against the books test reviews)")
    parser.add_argument("--force", action="store_true",
                        help="replace --out even if train-tokenizer did not make it")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out = train_tokenizer(
        args.data_root, args.out, seed=args.seed, vocab_size=args.vocab_size,
        sample_size=args.sample_sentences, with_reviews=args.with_reviews,
        max_novels=args.max_novels, num_threads=args.threads, force=args.force,
        other_corpus=args.other_corpus,
    )
    manifest = _files.read_json(out / "manifest.json")
    print(f"train-tokenizer: wrote {out} ({manifest['parameters']['embedding_rows']} embedding rows, "
          f"spm training {manifest['timings_s']['spm_train']:.0f} s)")
    return 0


def spelling_problem(text: Any, pieces: list[Any], ids: list[Any], named: dict[Any, Any]
                     ) -> str | None:
    """Why an encoded example cannot be what the tokenizer made of its text, or None: its pieces
    must spell the text as sentencepiece normalises it (NFKC), and an id must name one piece
    wherever it stands (``named``: the ids seen so far, across examples). Trial 30's R-21: a
    piece edited alone showed "merveille" encoded as "▁catastrophe"."""
    spelt = "".join(map(str, pieces)).replace("\u2581", " ").split()
    if not isinstance(text, str) or spelt != unicodedata.normalize("NFKC", text).split():
        return f"has pieces that do not spell its text {text!r}"
    for piece, n in zip(pieces, ids):
        if named.setdefault(n, piece) != piece:
            return f"has id {n} for {piece!r}, which names {named[n]!r} elsewhere"
    return None
