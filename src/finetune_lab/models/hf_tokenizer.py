"""A tokenizer for the Transformers model that gives exactly the ids fairseq trains on.

fairseq never sees text: the lab writes sentencepiece *pieces* (``binarize.py``), and
``fairseq-preprocess`` splits each line on whitespace, looks every piece up in ``dict.txt``
(unknown -> ``<unk>``, 3) and appends ``</s>`` (2). At training time the ``sentence_prediction``
task prepends ``--init-token 0`` (``<s>``) and ``--shorten-method truncate`` keeps the *first*
``--max-positions`` (256) tokens, so a long review ends on a piece, not on ``</s>``.

:class:`FairseqIdTokenizer` does exactly these steps in plain Python (no fairseq import, no
``AutoTokenizer``): it is a documented project class plus the two files it reads, ``spm.model``
and ``dict.txt``, saved in the converted model's folder. The tests compare its output with
fairseq's own ``Dictionary`` and with ``fairseq-preprocess``'s binarized files, review by review.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_lab._files import parse_json, read_utf8
from finetune_lab.data import tokenizer as project_tokenizer
from finetune_lab.data.cls_books import read_split
from finetune_lab.errors import UserError
from finetune_lab.models.fairseq_compat import quiet_import

SPM_FILE = "spm.model"
DICT_FILE = "dict.txt"
CONFIG_FILE = "fairseq_tokenizer.json"

BOS, PAD, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
"""``fairseq.data.Dictionary()`` before ``dict.txt``: these four, at these ids."""
OVERWRITE_FLAG = "#fairseq:overwrite"
TASK_SYMBOLS = ("<mask>",)
"""Appended after ``dict.txt`` by the masked_lm and sentence_prediction tasks."""
DEFAULT_MAX_POSITIONS = 256

_SPACE = re.compile(r"\s+")  # fairseq.tokenizer.SPACE_NORMALIZER


def tokenize_line(line: str) -> list[str]:
    """fairseq's ``tokenize_line``: collapse whitespace runs, strip, split."""
    return _SPACE.sub(" ", line).strip().split()


def dict_entries(path: Path, fix: str) -> list[tuple[str, int, bool]]:
    """``(piece, count, overwrite)`` for each line of a fairseq ``dict.txt``, read as
    ``Dictionary.add_from_file`` reads it: ``<piece> <count>``, optionally followed by
    ``#fairseq:overwrite``, a piece (the four specials included) repeated only with that flag. A
    line fairseq refuses is one line naming the file, the line and ``fix``, not a traceback."""
    lines = read_utf8(path, fix).split("\n")  # fairseq's readlines, not splitlines
    if lines[-1] == "":
        lines.pop()
    entries: list[tuple[str, int, bool]] = []
    seen = set(SPECIALS)
    for number, line in enumerate(lines, 1):
        try:
            piece, field = line.rstrip().rsplit(" ", 1)
            overwrite = field == OVERWRITE_FLAG
            if overwrite:
                piece, field = piece.rsplit(" ", 1)
            count = int(field)
        except ValueError:
            raise UserError(f"{path}: line {number} ({line[:60]!r}) is not '<piece> <count>' "
                            f"(optionally followed by {OVERWRITE_FLAG}), as fairseq reads a "
                            f"dictionary: {fix}") from None
        if piece in seen and not overwrite:
            raise UserError(f"{path}: line {number} repeats the piece {piece!r} without "
                            f"{OVERWRITE_FLAG}, which fairseq refuses: {fix}")
        seen.add(piece)
        entries.append((piece, count, overwrite))
    return entries


def read_fairseq_dict(path: Path) -> dict[str, int]:
    """Symbol -> id as ``fairseq.data.Dictionary.load`` + the task's ``<mask>`` would build it
    (:func:`dict_entries`; an overwritten symbol moves to a new row, as in fairseq)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} is missing. Run `finetune-lab adopt-tokenizer` first (the "
                        "committed checkpoint's tokenizer).")
    indices = {s: i for i, s in enumerate(SPECIALS)}
    rows = len(indices)
    for symbol, _count, _overwrite in dict_entries(
            path, "restore it with `finetune-lab adopt-tokenizer`"):
        indices[symbol] = rows
        rows += 1
    for symbol in TASK_SYMBOLS:
        if symbol not in indices:
            indices[symbol] = rows
            rows += 1
    return indices


@dataclass
class FairseqIdTokenizer:
    """sentencepiece pieces -> fairseq ``dict.txt`` ids, ``<s> ... </s>``, first ``max_positions``."""

    spm_model: Path
    dict_path: Path
    max_positions: int = DEFAULT_MAX_POSITIONS
    indices: dict[str, int] = field(init=False, repr=False)
    _sp: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        import sentencepiece as spm

        self.spm_model, self.dict_path = Path(self.spm_model), Path(self.dict_path)
        if not self.spm_model.is_file():
            raise UserError(f"{self.spm_model} is missing. Run `finetune-lab adopt-tokenizer` "
                            "(or `finetune-lab convert-hf`, which copies it) first.")
        self.indices = read_fairseq_dict(self.dict_path)
        self._sp = spm.SentencePieceProcessor(model_file=str(self.spm_model))

    # --- loading and saving ---------------------------------------------------------------

    @classmethod
    def from_dir(cls, folder: Path | str, max_positions: int | None = None) -> FairseqIdTokenizer:
        """Load from a converted model folder (or a ``train-tokenizer`` output folder).

        Accepts the course's layout too (``sentencepiece.bpe.model`` instead of ``spm.model``).
        """
        folder = Path(folder)
        spm_path = folder / SPM_FILE
        if not spm_path.is_file() and (folder / "sentencepiece.bpe.model").is_file():
            spm_path = folder / "sentencepiece.bpe.model"
        config: dict[str, Any] = {}
        if (folder / CONFIG_FILE).is_file():
            config = parse_json((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        mp = max_positions or config.get("max_positions", DEFAULT_MAX_POSITIONS)
        return cls(spm_path, folder / DICT_FILE, max_positions=int(mp))

    def save(self, folder: Path | str) -> Path:
        """Copy ``spm.model`` and ``dict.txt`` into ``folder`` and record the settings."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.spm_model.resolve() != (folder / SPM_FILE).resolve():
            shutil.copyfile(self.spm_model, folder / SPM_FILE)
        if self.dict_path.resolve() != (folder / DICT_FILE).resolve():
            shutil.copyfile(self.dict_path, folder / DICT_FILE)
        (folder / CONFIG_FILE).write_text(json.dumps({
            "class": f"{__name__}.{type(self).__name__}",
            "max_positions": self.max_positions,
            "bos": BOS, "pad": PAD, "eos": EOS, "unk": UNK,
            "vocab_size": self.vocab_size,
            "recipe": "<s> + dict ids of sentencepiece pieces + </s>, truncated to the first "
                      "max_positions tokens (fairseq sentence_prediction, --shorten-method truncate)",
        }, indent=2) + "\n", encoding="utf-8")
        return folder

    # --- encoding -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding matrix this dictionary implies (fairseq's ``len(dictionary)``)."""
        return max(self.indices.values()) + 1

    def pieces(self, text: str) -> list[str]:
        """Pieces as ``binarize.py`` writes them: spm ids -> ``id_to_piece`` (unknown -> ``<unk>``)."""
        return [self._sp.id_to_piece(i) for i in self._sp.encode(text)]

    def piece_ids(self, pieces: Sequence[str]) -> list[int]:
        """What ``fairseq-preprocess`` stores for one line of pieces (without its ``</s>``)."""
        line = " ".join(pieces)
        return [self.indices.get(p, UNK) for p in tokenize_line(line)]

    def encode(self, text: str) -> list[int]:
        """The ``src_tokens`` fairseq's sentence_prediction task feeds the model for ``text``."""
        ids = [BOS, *self.piece_ids(self.pieces(text)), EOS]
        return ids[: self.max_positions]

    def __call__(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts (one sentencepiece call for all of them)."""
        rows = self._sp.encode(list(texts))
        out = []
        for row in rows:
            ids = [BOS, *self.piece_ids([self._sp.id_to_piece(i) for i in row]), EOS]
            out.append(ids[: self.max_positions])
        return out


def pad_batch(rows: Sequence[Sequence[int]], pad: int = PAD) -> dict[str, Any]:
    """Right-pad with ``<pad>`` (1), as fairseq's ``RightPadDataset``; mask = real tokens.

    The pad id matters: Transformers' RoBERTa derives position ids from ``input_ids != pad``.
    """
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[i, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask}


# --- references: what fairseq itself produces -------------------------------------------------


def _task_view(dataset, max_positions: int):
    """Wrap token datasets as sentence_prediction does: prepend ``<s>``, then truncate."""
    quiet_import()
    from fairseq.data import PrependTokenDataset
    from fairseq.data.shorten_dataset import maybe_shorten_dataset

    return maybe_shorten_dataset(PrependTokenDataset(dataset, BOS), "train", "", "truncate",
                                 max_positions, 1)


def fairseq_ids_from_text(
    texts: Sequence[str], spm_model: Path, dict_path: Path,
    max_positions: int = DEFAULT_MAX_POSITIONS,
) -> list[list[int]]:
    """Reference ids through fairseq's own code: the project's piece encoder (``binarize.py``),
    ``Dictionary.encode_line`` (as ``fairseq-preprocess`` calls it) and the task's datasets."""
    import sentencepiece as spm

    quiet_import()
    from fairseq.data import Dictionary, ListDataset

    dictionary = Dictionary.load(str(dict_path))
    for symbol in TASK_SYMBOLS:
        dictionary.add_symbol(symbol)
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    lines = project_tokenizer.encode_pieces(sp, list(texts))
    encoded = [dictionary.encode_line(" ".join(p), add_if_not_exist=False, append_eos=True).long()
               for p in lines]
    view = _task_view(ListDataset(encoded, sizes=[len(e) for e in encoded]), max_positions)
    return [view[i].tolist() for i in range(len(encoded))]


def fairseq_ids_from_bin(
    bin_prefix: Path, dict_path: Path, max_positions: int = DEFAULT_MAX_POSITIONS,
) -> list[list[int]]:
    """Reference ids read back from ``fairseq-preprocess`` output (``.../input0/train``)."""
    quiet_import()
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(dict_path))
    dataset = data_utils.load_indexed_dataset(str(bin_prefix), dictionary)
    if dataset is None:
        raise UserError(f"{bin_prefix}.bin/.idx are missing. Run `finetune-lab binarize` first.")
    view = _task_view(dataset, max_positions)
    return [view[i].tolist() for i in range(len(dataset))]


def token_id_check(
    cls_dir: Path, tok: FairseqIdTokenizer, bin_dir: Path | None = None,
    splits: Sequence[str] = ("train", "valid", "test"),
) -> "pd.DataFrame":  # noqa: F821
    """Per split: reviews, how many get identical ids from both sides, how many are truncated.

    The reference is ``fairseq-preprocess``'s binarized ``input0`` when ``bin_dir`` has it, else
    fairseq's ``Dictionary`` applied to the project's pieces (:func:`fairseq_ids_from_text`).
    """
    import pandas as pd

    rows = []
    for split in splits:
        reviews, _ = read_split(Path(cls_dir), split)
        ours = tok(reviews)
        prefix = Path(bin_dir) / "input0" / split if bin_dir is not None else None
        if prefix is not None and Path(f"{prefix}.bin").is_file():
            ref = fairseq_ids_from_bin(prefix, tok.dict_path, tok.max_positions)
            source = "fairseq-preprocess (binarized input0)"
        else:
            ref = fairseq_ids_from_text(reviews, tok.spm_model, tok.dict_path, tok.max_positions)
            source = "fairseq Dictionary.encode_line"
        same = sum(a == b for a, b in zip(ours, ref)) if len(ref) == len(ours) else 0
        rows.append({
            "split": split, "reviews": len(reviews), "reference": source,
            "identical ids": same, "all identical": same == len(reviews) == len(ref),
            f"truncated to {tok.max_positions}": sum(len(r) == tok.max_positions and r[-1] != EOS
                                                    for r in ours),
            f"<unk> in the first {tok.max_positions}": sum(r.count(UNK) for r in ours),
        })
    return pd.DataFrame(rows)
