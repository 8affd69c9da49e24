"""Task 7's data: the e-commerce FAQ in the lab's ``<human>`` / ``<assistant>`` prompt format.

The lab formats each pair as ``<human>: question`` newline ``<assistant>: answer`` and trains a
causal LM on it. Its template ends there, with no end-of-sequence token, so the model never sees
where an answer stops and generation runs on to ``max_new_tokens``. :func:`format_example`
appends the tokenizer's EOS (``</s>`` for BLOOM); :func:`format_prompt` is the generation prompt
(the same text up to ``<assistant>:``); :func:`encode_faq` and :class:`CausalLMCollator` turn the
examples into token ids and batches that keep the EOS a training target.

The FAQ read here is the English original (``qa/ecommerce-faq.en.json`` under the data root);
the lab trained on a French translation that is not available.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from finetune_lab._files import parse_json
from finetune_lab.config import DATA_ROOT_ENV, require_data_root
from finetune_lab.errors import UserError

FAQ_RELATIVE = "qa/ecommerce-faq.en.json"
HUMAN = "<human>:"
ASSISTANT = "<assistant>:"
BLOOM_EOS = "</s>"
"""BLOOM's end-of-sequence token (id 2 in its vocabulary)."""


@dataclass(frozen=True)
class QAPair:
    question: str
    answer: str


def faq_path(root: Path | None = None) -> Path:
    """The FAQ under the data root (raises :class:`DataRootError` naming the fix if missing)."""
    return require_data_root(FAQ_RELATIVE, root=root) / FAQ_RELATIVE


def load_faq(path: Path | str | None = None) -> list[QAPair]:
    """Read a FAQ JSON file: a non-empty list of ``{"question": ..., "answer": ...}`` objects.

    Any other shape is a :class:`UserError` naming the file, the first bad entry and the fix.
    """
    p = Path(path) if path is not None else faq_path()
    fix = ('it must be a JSON list of {"question": "...", "answer": "..."} objects '
           f"(the original is {FAQ_RELATIVE} under ${DATA_ROOT_ENV})")
    try:
        data = parse_json(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UserError(f"FAQ file {p} does not exist; {fix}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"FAQ file {p} is not valid JSON ({exc}); {fix}") from exc
    if not isinstance(data, list) or not data:
        raise UserError(f"FAQ file {p} holds no list of pairs; {fix}")
    pairs = []
    for i, item in enumerate(data):
        ok = (isinstance(item, dict)
              and all(isinstance(item.get(k), str) and item[k].strip()
                      for k in ("question", "answer")))
        if not ok:
            raise UserError(f"FAQ file {p}: entry {i} ({str(item)[:80]}) lacks a non-empty "
                            f"string 'question' or 'answer'; {fix}")
        pairs.append(QAPair(item["question"].strip(), item["answer"].strip()))
    return pairs


def format_prompt(question: str) -> str:
    """What the model is given at generation time: ``<human>: q`` newline ``<assistant>:``."""
    return f"{HUMAN} {question.strip()}\n{ASSISTANT}"


def lab_format_example(question: str, answer: str) -> str:
    """The lab's training text, exactly: no end-of-sequence token."""
    return f"{format_prompt(question)} {answer.strip()}"


def format_example(question: str, answer: str, eos_token: str = BLOOM_EOS) -> str:
    """The training text with ``eos_token`` appended, so that the model learns to stop."""
    if not eos_token:
        raise ValueError("eos_token must be a non-empty string (the tokenizer's eos_token)")
    return lab_format_example(question, answer) + eos_token


def format_faq(pairs: list[QAPair], eos_token: str = BLOOM_EOS) -> list[str]:
    return [format_example(p.question, p.answer, eos_token) for p in pairs]


def length_table(pairs: list[QAPair]) -> pd.DataFrame:
    """Per example: characters, words and UTF-8 bytes of the training text (EOS excluded).

    BLOOM's tokenizer is a byte-level BPE: every token covers at least one byte, so
    ``bytes + 1`` (the EOS token) is an upper bound on the number of BLOOM tokens. The real
    count needs the tokenizer, which cannot be downloaded here.
    """
    rows = []
    for p in pairs:
        text = lab_format_example(p.question, p.answer)
        rows.append({
            "question chars": len(p.question), "answer chars": len(p.answer),
            "chars": len(text), "words": len(text.split()),
            "utf-8 bytes": len(text.encode("utf-8")),
            "token upper bound": len(text.encode("utf-8")) + 1,
        })
    return pd.DataFrame(rows)


def length_summary(pairs: list[QAPair]) -> pd.DataFrame:
    """min / median / mean / max of each length column of :func:`length_table`."""
    df = length_table(pairs)
    rows = []
    for col in df.columns:
        values = df[col].tolist()
        rows.append({"measure": col, "min": min(values), "median": statistics.median(values),
                     "mean": statistics.fmean(values), "max": max(values)})
    return pd.DataFrame(rows)


# --- token ids for training ------------------------------------------------------------------

def encode_faq(tokenizer, pairs: Sequence[QAPair], max_length: int) -> tuple[list[dict], int]:
    """Token ids of each formatted example, ending with the tokenizer's EOS id.

    Returns the examples and how many were truncated (the EOS is kept even then).
    """
    eos_id = tokenizer.eos_token_id
    if eos_id is None or not tokenizer.eos_token:
        raise UserError("the tokenizer has no eos_token; the FAQ examples need one to end with")
    examples, truncated = [], 0
    for p in pairs:
        ids = tokenizer(format_example(p.question, p.answer, tokenizer.eos_token),
                        add_special_tokens=False)["input_ids"]
        if not ids or ids[-1] != eos_id:
            raise UserError(f"the tokenizer does not map its eos_token {tokenizer.eos_token!r} "
                            f"to id {eos_id}; use a tokenizer whose EOS is a special token")
        if len(ids) > max_length:
            ids = ids[: max_length - 1] + [eos_id]
            truncated += 1
        examples.append({"input_ids": ids})
    return examples, truncated


class CausalLMCollator:
    """Right-pads a batch; labels are the ids, -100 on padding only (the EOS stays a target).

    ``DataCollatorForLanguageModeling`` masks every position equal to ``pad_token_id``; with the
    common ``pad_token = eos_token`` that would also mask the EOS the model must learn.
    """

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for i, f in enumerate(features):
            n = len(f["input_ids"])
            ids[i, :n] = torch.tensor(f["input_ids"])
            mask[i, :n] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
