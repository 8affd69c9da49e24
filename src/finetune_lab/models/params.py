"""Question 1: the parameter count of RoBERTa-small-fr, by hand and by ``numel()``.

Writeups of the lab disagree (22,807,552 / 20,578,304 / 22,829,056) because they count different
things. This module derives every component analytically, builds the real fairseq and
HuggingFace models, counts their tensors, and names the convention behind each answer. The
analytic numbers are asserted equal to the counted ones in ``tests/test_params.py``
(the nanoGPT ``transformer_sizing`` approach).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from functools import lru_cache

import pandas as pd

from finetune_lab.models.fairseq_compat import quiet_import
from finetune_lab.models.sizing import (  # the analytic count, which the runs' checks share
    CLS_HEAD,
    ENCODER_ALL,
    ENCODER_WEIGHTS,
    LM_HEAD,
    SMALL,
    RobertaSize,
    components,
)
from finetune_lab.render_cache import per_render

WRITEUP_ANSWERS: tuple[int, ...] = (22_807_552, 22_829_056, 20_578_304)
"""Totals found in students' writeups of this lab (inputs to explain, not results)."""


@dataclass(frozen=True)
class Convention:
    """A way of counting: which components it includes, and what it leaves out."""

    name: str
    includes: tuple[str, ...]
    leaves_out: str


CONVENTIONS: tuple[Convention, ...] = (
    Convention("lab convention: weight matrices of embeddings, positions and layers",
               ENCODER_WEIGHTS, "biases, LayerNorms, LM head (as the lab asks)"),
    Convention("whole encoder (weights + biases + LayerNorms)", ENCODER_ALL,
               "LM head and classification head"),
    Convention("token embeddings + attention projections only", ("tok_emb", "attn_w"),
               "learned positions and the feed-forward block (an error, not a convention)"),
    Convention("encoder + LM head (the pretraining model)", ENCODER_ALL + LM_HEAD,
               "classification head; tied decoder counted once"),
    Convention("encoder + LM head + 2-class head (fairseq fine-tuning model)",
               ENCODER_ALL + LM_HEAD + CLS_HEAD, "nothing"),
)


def component_table(size: RobertaSize = SMALL) -> pd.DataFrame:
    """Analytic count of every component, in model order."""
    return pd.DataFrame([asdict(c) for c in components(size)])


def convention_table(size: RobertaSize = SMALL) -> pd.DataFrame:
    """Each convention's total, and which writeup answer (if any) it reproduces."""
    counts = {c.key: c.count for c in components(size)}
    rows = []
    for conv in CONVENTIONS:
        total = sum(counts[k] for k in conv.includes)
        rows.append({
            "convention": conv.name,
            "includes": ", ".join(conv.includes),
            "leaves out": conv.leaves_out,
            "total": total,
            "writeup answer": total if total in WRITEUP_ANSWERS else None,
        })
    df = pd.DataFrame(rows)
    df["writeup answer"] = df["writeup answer"].astype("Int64")
    return df


def lab_total(size: RobertaSize = SMALL) -> int:
    """The count the lab asks for: ``V d + P d + L (4 d^2 + 2 d f)``."""
    return int(convention_table(size).loc[0, "total"])


# --- the real models -----------------------------------------------------------------------

def _fairseq_args(size: RobertaSize) -> argparse.Namespace:
    from finetune_lab.models.fairseq_user_dir import roberta_small_architecture  # heavy: fairseq

    args = argparse.Namespace(
        encoder_layers=size.layers, encoder_embed_dim=size.dim,
        encoder_ffn_embed_dim=size.ffn, encoder_attention_heads=size.heads,
        max_positions=size.max_positions,
    )
    roberta_small_architecture(args)
    return args


def _dictionary(vocab: int):
    """A fairseq Dictionary of exactly ``vocab`` rows: 4 specials, symbols, and ``<mask>``."""
    quiet_import()
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(vocab - len(d) - 1):
        d.add_symbol(f"piece{i}")
    d.add_symbol("<mask>")
    assert len(d) == vocab
    return d


def fairseq_model(size: RobertaSize = SMALL, classification_head: bool = True):
    """The real fairseq ``RobertaModel`` with the project's ``roberta_small`` architecture."""
    import torch

    quiet_import()
    from fairseq.models.roberta import RobertaEncoder, RobertaModel

    torch.manual_seed(0)
    args = _fairseq_args(size)
    model = RobertaModel(args, RobertaEncoder(args, _dictionary(size.vocab)))
    if classification_head:
        model.register_classification_head("sentence_classification_head",
                                           num_classes=size.classes)
    return model


@per_render
def fairseq_model_text(size: RobertaSize = SMALL) -> str:
    """The fine-tuning model as fairseq prints it (its module tree), for the chapter."""
    return str(fairseq_model(size))


def hf_config(size: RobertaSize = SMALL):
    """The Transformers config equivalent to the course model (as its HF release)."""
    from transformers import RobertaConfig

    return RobertaConfig(
        vocab_size=size.vocab, hidden_size=size.dim, num_hidden_layers=size.layers,
        num_attention_heads=size.heads, intermediate_size=size.ffn,
        max_position_embeddings=size.positions, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5, num_labels=size.classes,
    )


def numel(module) -> int:
    """Distinct parameters of a module (a tied tensor is counted once, as ``parameters()`` does)."""
    return sum(p.numel() for p in module.parameters())


# Parameter-name patterns of fairseq's RoBERTa, mapped to component keys.
_FAIRSEQ_NAMES: tuple[tuple[str, str], ...] = (
    ("embed_tokens.", "tok_emb"),
    ("embed_positions.", "pos_emb"),
    ("layernorm_embedding.", "emb_ln"),
    ("self_attn_layer_norm.", "layer_ln"),
    ("final_layer_norm.", "layer_ln"),
    ("self_attn.", "attn"),
    ("fc1.", "ffn"),
    ("fc2.", "ffn"),
    ("lm_head.dense.", "lm_dense"),
    ("lm_head.layer_norm.", "lm_ln"),
    ("lm_head.bias", "lm_bias"),
    ("classification_heads.sentence_classification_head.dense.", "cls_dense"),
    ("classification_heads.sentence_classification_head.out_proj.", "cls_out"),
)


def fairseq_component_counts(model) -> dict[str, int]:
    """``numel()`` of the real fairseq model, grouped into :func:`components` keys."""
    out: dict[str, int] = {}
    for name, p in model.named_parameters():  # tied lm_head.weight is not listed again
        for pattern, key in _FAIRSEQ_NAMES:
            if pattern in name:
                if key in ("attn", "ffn"):
                    key += "_w" if name.endswith("weight") else "_b"
                out[key] = out.get(key, 0) + p.numel()
                break
        else:
            raise KeyError(f"unmapped fairseq parameter {name}")
    return out


@per_render
def component_check(size: RobertaSize = SMALL) -> pd.DataFrame:
    """Analytic count next to the real model's ``numel()``, component by component."""
    counted = fairseq_component_counts(fairseq_model(size, classification_head=True))
    df = component_table(size)[["key", "name", "part", "formula", "count"]]
    df = df.rename(columns={"count": "analytic"})
    df["numel()"] = df["key"].map(counted).fillna(0).astype(int)
    df["equal"] = df["analytic"] == df["numel()"]
    return df


@lru_cache(maxsize=4)
@per_render
def counted_totals(size: RobertaSize = SMALL) -> pd.DataFrame:
    """Exact ``numel()`` totals of the real fairseq and Transformers models."""
    from transformers import RobertaForMaskedLM, RobertaForSequenceClassification

    fs = fairseq_model(size, classification_head=True)
    enc = fs.encoder.sentence_encoder
    lm_head_extra = numel(fs.encoder.lm_head) - fs.encoder.lm_head.weight.numel()
    cls_head = numel(fs.classification_heads)
    cfg = hf_config(size)
    rows = [
        ("fairseq", "sentence encoder (encoder.sentence_encoder)", numel(enc)),
        ("fairseq", "RobertaModel with LM head", numel(enc) + lm_head_extra),
        ("fairseq", "RobertaModel with LM head + 2-class head", numel(fs)),
        ("fairseq", "2-class classification head alone", cls_head),
        ("transformers", "RobertaForMaskedLM", numel(RobertaForMaskedLM(cfg))),
        ("transformers", "RobertaForSequenceClassification (2 labels)",
         numel(RobertaForSequenceClassification(cfg))),
    ]
    return pd.DataFrame(rows, columns=["framework", "model", "parameters"])


def memory_table(size: RobertaSize = SMALL) -> pd.DataFrame:
    """Bytes to hold the parameters alone (no gradients, optimizer or activations)."""
    totals = counted_totals(size)
    out = totals[["framework", "model", "parameters"]].copy()
    out["fp32 (MiB)"] = out["parameters"] * 4 / 2**20
    out["bf16 (MiB)"] = out["parameters"] * 2 / 2**20
    return out


def part_shares(size: RobertaSize = SMALL) -> pd.DataFrame:
    """Where the parameters of the fine-tuning model live, by component (for the figure)."""
    df = component_table(size)[["name", "part", "count"]]
    df = df.assign(share=df["count"] / df["count"].sum())
    return df.sort_values("count", ascending=False, ignore_index=True)


def share_label(share: float) -> str:
    """Percent with two decimals; shares below 0.01 % say so instead of printing 0.00 %."""
    return "< 0.01 %" if share < 1e-4 else f"{100 * share:.2f} %"


def plot_part_shares(size: RobertaSize = SMALL, ax=None):
    """Horizontal bars (log scale) of the components' sizes, coloured by part, each labelled
    with its share of the fine-tuning model."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Patch

    df = part_shares(size)
    parts = list(dict.fromkeys(df["part"]))
    palette = dict(zip(parts, sns.color_palette("colorblind", len(parts))))
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    rows = range(len(df))
    ax.barh(rows, df["count"], color=[palette[p] for p in df["part"]])
    ax.set_yticks(list(rows), df["name"])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("parameters (log scale)")
    for row, (count, share) in enumerate(zip(df["count"], df["share"])):
        ax.annotate(share_label(share), (count, row), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.legend(handles=[Patch(color=palette[p], label=p) for p in parts], loc="lower right",
              fontsize=8, frameon=False)
    sns.despine(ax=ax)
    return ax


def params_report(size: RobertaSize = SMALL) -> dict:
    """Everything ``finetune-lab params --json`` prints: conventions, components, real totals."""
    conv = convention_table(size)
    return {
        "size": asdict(size),
        "conventions": json.loads(conv.to_json(orient="records")),
        "components": json.loads(component_table(size).to_json(orient="records")),
        "counted": json.loads(counted_totals(size).to_json(orient="records")),
    }


def add_parser(sub) -> None:
    p = sub.add_parser("params", help="Question 1: parameter counts by convention and by numel()")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    report = params_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    conv = pd.DataFrame(report["conventions"])[["convention", "total", "writeup answer"]]
    print(conv.to_string(index=False))
    print()
    print(pd.DataFrame(report["counted"]).to_string(index=False))
    return 0
