"""The lab's two configurations (Tasks 6-8) as code, and Question 2's field tables read from peft.

The lab quantises BLOOM-560m to 4-bit NF4 with ``BitsAndBytesConfig`` and trains LoRA adapters
described by peft's ``LoraConfig``. Question 2 asks what each ``LoraConfig`` parameter means: the
answer is taken from peft itself (its dataclass fields carry ``metadata={"help": ...}``) and from
transformers' own docstring for ``BitsAndBytesConfig``, so the table follows the installed
versions instead of paraphrasing them.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from typing import Any

import pandas as pd

from finetune_lab.render_cache import per_render

# bitsandbytes (imported by transformers when installed) logs, on CPUs with AVX512-BF16, that
# an optional kernel package is missing; it changes nothing here, so keep it out of outputs.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)

LAB_LORA: dict[str, Any] = {
    "r": 16,
    "lora_alpha": 32,
    "target_modules": ["query_key_value"],
    "lora_dropout": 0.05,
    "bias": "none",
    "task_type": "CAUSAL_LM",
}
"""The lab's ``LoraConfig`` arguments (BLOOM's fused attention projection only)."""

LAB_BNB: dict[str, Any] = {
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
}
"""The lab's ``BitsAndBytesConfig`` arguments: 4-bit NF4, double quantisation, bf16 compute."""

DEMONSTRATED_FIELDS: tuple[str, ...] = (
    "task_type", "r", "lora_alpha", "target_modules", "lora_dropout", "bias",
    "use_rslora", "modules_to_save", "rank_pattern", "alpha_pattern", "init_lora_weights",
)
"""The ``LoraConfig`` fields the lab sets plus those the chapter demonstrates, in that order."""


FIELD_MEANING: dict[str, str] = {
    "task_type": "which peft wrapper class holds the model (its forward and generate); the "
                 "adapters are the same",
    "r": "rank of the update BA (A is r × k, B is d × r): the adapter's size grows linearly in r",
    "lora_alpha": "numerator of the scaling α / r that multiplies BAx",
    "target_modules": "which linear layers get an adapter, matched as suffixes of module names",
    "lora_dropout": "dropout on the adapter's input x, before A, in training only; the frozen "
                    "path W₀x never sees it",
    "bias": "which bias vectors are trained too: none, those of the adapted layers, or all",
    "use_rslora": "scale by α / √r instead of α / r",
    "modules_to_save": "whole modules trained in full, as a copy beside the frozen original",
    "rank_pattern": "r for the modules a regular expression matches",
    "alpha_pattern": "lora_alpha for the modules a regular expression matches",
    "init_lora_weights": "how A and B start: by default A random and B = 0, so the adapter "
                         "starts as a no-op",
}
"""What each field of :data:`DEMONSTRATED_FIELDS` does, in the book's words (one line each)."""


def lora_config(**overrides: Any):
    """peft's ``LoraConfig`` with the lab's values, any of them overridden by keyword."""
    from peft import LoraConfig

    kwargs = {**LAB_LORA, **overrides}
    if isinstance(kwargs.get("target_modules"), list):
        kwargs["target_modules"] = list(kwargs["target_modules"])
    return LoraConfig(**kwargs)


def bnb_config(**overrides: Any):
    """transformers' ``BitsAndBytesConfig`` with the lab's 4-bit NF4 settings.

    Building the config object needs no GPU and not even bitsandbytes; *loading* a model with it
    does (see :mod:`finetune_lab.train.lora_qa`).
    """
    import torch
    from transformers import BitsAndBytesConfig

    kwargs = {**LAB_BNB, **overrides}
    dtype = kwargs.get("bnb_4bit_compute_dtype")
    if isinstance(dtype, str):
        kwargs["bnb_4bit_compute_dtype"] = getattr(torch, dtype)
    return BitsAndBytesConfig(**kwargs)


# --- field tables -----------------------------------------------------------------------------

def _clean_help(text: str) -> str:
    """One line, no HTML tags, no Markdown-table-breaking pipes."""
    text = re.sub(r"<a href='([^']*)'>([^<]*)</a>", r"\2 (\1)", text or "")
    text = re.sub(r"<[^>]+>", "", text)
    text = " ".join(text.split())
    return text.replace("|", "\\|")


def first_sentence(text: str) -> str:
    """The help text up to its first full stop followed by a space (the gist of a long help)."""
    match = re.search(r"^(.+?[.!?])(\s|$)", text)
    return match.group(1) if match else text


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return None


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):  # enums
        return repr(value.value)
    return repr(value)


@per_render
def lora_field_table(fields: tuple[str, ...] | None = DEMONSTRATED_FIELDS) -> pd.DataFrame:
    """Each ``LoraConfig`` field: the lab's value, peft's default and peft's help text.

    ``fields=None`` lists every field of the installed peft, in declaration order; otherwise the
    named ones, in the order given (an unknown name is an error: peft renamed something).
    """
    from peft import LoraConfig

    by_name = {f.name: f for f in dataclasses.fields(LoraConfig)}
    names = list(by_name) if fields is None else list(fields)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise KeyError(f"peft's LoraConfig has no field(s) {unknown}")
    rows = []
    for name in names:
        field = by_name[name]
        rows.append({
            "field": name,
            "lab value": _show(LAB_LORA[name]) if name in LAB_LORA else "(default)",
            "peft default": _show(_field_default(field)),
            "what it does": FIELD_MEANING.get(name, ""),
            "peft help": _clean_help(field.metadata.get("help", "")),
        })
    return pd.DataFrame(rows)


@per_render
def other_lora_fields() -> pd.DataFrame:
    """The fields :func:`lora_field_table` leaves out, with the first sentence of their help."""
    df = lora_field_table(None)
    df = df[~df["field"].isin(DEMONSTRATED_FIELDS)].copy()
    df["peft help"] = df["peft help"].map(first_sentence)
    return df.drop(columns=["lab value", "what it does"]).reset_index(drop=True)


def _docstring_args(doc: str) -> dict[str, str]:
    """``{name: description}`` from a Google-style ``Args:`` section (transformers' format)."""
    out: dict[str, str] = {}
    current = None
    in_args = False
    for line in (doc or "").splitlines():
        if line.strip() == "Args:":
            in_args = True
            continue
        if not in_args:
            continue
        head = re.match(r"^\s{8}(\w+) \(", line)
        if head:
            current = head.group(1)
            out[current] = ""
        elif current and line.strip():
            out[current] = (out[current] + " " + line.strip()).strip()
    return out


def _dtype_name(value: Any) -> Any:
    """``torch.float32`` as ``'float32'``, the string the lab's config passes; else unchanged."""
    text = str(value)
    return text.removeprefix("torch.") if text.startswith("torch.") else value


@per_render
def bnb_field_table() -> pd.DataFrame:
    """The lab's ``BitsAndBytesConfig`` arguments: value, transformers' effective default and
    its doc.

    The default is what a ``BitsAndBytesConfig()`` holds after its constructor, which is not
    always the signature's: ``bnb_4bit_compute_dtype=None`` becomes ``torch.float32``. Where
    the two differ the cell says so.
    """
    from transformers import BitsAndBytesConfig

    sig = inspect.signature(BitsAndBytesConfig.__init__).parameters
    built = BitsAndBytesConfig()
    docs = _docstring_args(BitsAndBytesConfig.__doc__ or "")
    rows = []
    for name, value in LAB_BNB.items():
        declared = sig[name].default if name in sig else None
        effective = _dtype_name(getattr(built, name, declared))
        default = _show(effective)
        if _show(declared) != default:
            default += f" ({_show(declared)} in the signature)"
        rows.append({
            "argument": name,
            "lab value": _show(value),
            "transformers default": default,
            "transformers doc": _clean_help(docs.get(name, "")),
        })
    return pd.DataFrame(rows)
