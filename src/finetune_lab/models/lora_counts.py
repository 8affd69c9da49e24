"""Question 2, live: what each ``LoraConfig`` parameter does to BLOOM-560m, counted by peft.

The model is built from its published configuration on PyTorch's ``meta`` device
(:mod:`finetune_lab.models.bloom`: shapes, no storage, instant), wrapped with peft, and counted
with peft's own ``get_nb_trainable_parameters()``. Every count is also derived analytically from
the configuration (:class:`~finetune_lab.models.bloom.BloomShape`);
``tests/test_lora_counts.py`` asserts the two agree. The 4-bit side (``Params4bit`` counts,
NF4, memory) is :mod:`finetune_lab.models.four_bit`.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import pandas as pd

from finetune_lab.models.bloom import BloomShape, bloom_config, meta_bloom, tiny_bloom_config
from finetune_lab.models.lora_configs import LAB_LORA, lora_config
from finetune_lab.render_cache import per_render

TARGET_SETS: dict[str, list[str]] = {
    "query_key_value (the lab)": ["query_key_value"],
    "and the attention output (dense)": ["query_key_value", "dense"],
    "and the MLP (dense_h_to_4h, dense_4h_to_h)": ["query_key_value", "dense", "dense_h_to_4h",
                                             "dense_4h_to_h"],
}
RANKS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


def _quiet_peft(model, cfg):
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft warns about meta tensors and fan_in_fan_out
        return get_peft_model(model, cfg)


def peft_bloom(config=None, base=None, **lora_overrides: Any):
    """The lab's LoRA (any field overridden) applied to a fresh meta-device BLOOM."""
    model = base if base is not None else meta_bloom(config)
    return _quiet_peft(model, lora_config(**lora_overrides))


@per_render
def peft_counts(config=None, **lora_overrides: Any) -> tuple[int, int]:
    """``(trainable, total)`` as peft's ``get_nb_trainable_parameters()`` reports them."""
    return tuple(int(x) for x in peft_bloom(config, **lora_overrides)
                 .get_nb_trainable_parameters())  # type: ignore[return-value]


# --- sweeps (one fresh meta model per row) ---------------------------------------------------

def _pct(a: int, b: int) -> float:
    return 100 * a / b


@lru_cache(maxsize=2)
def rank_sweep(ranks: tuple[int, ...] = RANKS) -> pd.DataFrame:
    """Trainable parameters against ``r`` for the lab's target (peft's count and the formula)."""
    shape = BloomShape.of()
    rows = []
    for r in ranks:
        trainable, total = peft_counts(r=r, lora_alpha=2 * r)
        rows.append({"r": r, "trainable (peft)": trainable,
                     "analytic": shape.lora(r, LAB_LORA["target_modules"]),
                     "all params (peft)": total, "trainable %": _pct(trainable, total)})
    return pd.DataFrame(rows)


@lru_cache(maxsize=2)
def target_sweep(r: int = LAB_LORA["r"]) -> pd.DataFrame:
    """Trainable parameters as more of each block's Linear layers are adapted."""
    shape = BloomShape.of()
    rows = []
    for label, targets in TARGET_SETS.items():
        trainable, total = peft_counts(target_modules=list(targets), r=r)
        rows.append({"target_modules": label, "trainable (peft)": trainable,
                     "analytic": shape.lora(r, targets), "trainable %": _pct(trainable, total)})
    return pd.DataFrame(rows)


@lru_cache(maxsize=1)
@per_render
def bias_sweep() -> pd.DataFrame:
    """``bias`` none / lora_only / all: which bias vectors become trainable besides A and B."""
    shape = BloomShape.of()
    targets = LAB_LORA["target_modules"]
    lora = shape.lora(LAB_LORA["r"], targets)
    extra = {"none": 0, "lora_only": shape.lora_only_biases(targets), "all": shape.biases}
    rows = []
    for bias, biases in extra.items():
        trainable, _ = peft_counts(bias=bias)
        rows.append({"bias": bias, "trainable (peft)": trainable, "LoRA A, B": lora,
                     "biases made trainable": biases, "analytic": lora + biases})
    return pd.DataFrame(rows)


LAYER0_QKV = r"h\.0\.self_attention\.query_key_value"
"""A ``rank_pattern``/``alpha_pattern`` key: peft matches it as a regex against module names."""


@lru_cache(maxsize=1)
@per_render
def pattern_table() -> pd.DataFrame:
    """``modules_to_save``, ``rank_pattern`` and ``alpha_pattern`` next to the lab's config.

    Shows, from the wrapped model itself, the rank and scaling of block 0's and block 1's
    adapter, the trainable count and the total (a ``modules_to_save`` copy adds to it).
    """
    shape = BloomShape.of()
    base_lora = shape.lora(LAB_LORA["r"], LAB_LORA["target_modules"])
    d = shape.d
    cases: list[tuple[str, dict[str, Any], int, int]] = [
        ("the lab's config", {}, base_lora, 0),
        ("modules_to_save=['ln_f']", {"modules_to_save": ["ln_f"]}, base_lora + 2 * d, 2 * d),
        ("modules_to_save=['word_embeddings']", {"modules_to_save": ["word_embeddings"]},
         base_lora + shape.vocab * d, shape.vocab * d),
        ("rank_pattern={block 0 qkv: 64}", {"rank_pattern": {LAYER0_QKV: 64}},
         base_lora + (64 - 16) * 4 * d, 0),
        ("alpha_pattern={block 0 qkv: 128}", {"alpha_pattern": {LAYER0_QKV: 128}}, base_lora, 0),
    ]
    rows = []
    for label, overrides, analytic, copy in cases:
        model = peft_bloom(**overrides)
        trainable, total = (int(x) for x in model.get_nb_trainable_parameters())
        blocks = model.base_model.model.transformer.h
        l0, l1 = (blocks[i].self_attention.query_key_value for i in (0, 1))
        rows.append({
            "config": label,
            "block 0: r, scaling": f"{l0.r['default']}, {l0.scaling['default']:g}",
            "block 1: r, scaling": f"{l1.r['default']}, {l1.scaling['default']:g}",
            "trainable (peft)": trainable, "analytic": analytic,
            "all params (peft)": total, "added copy": copy,
        })
    return pd.DataFrame(rows)


@lru_cache(maxsize=1)
@per_render
def task_type_table() -> pd.DataFrame:
    """``task_type`` picks the ``PeftModel`` subclass; the adapted weights do not change.

    The last row is the exception worth knowing: on a sequence-classification model,
    ``SEQ_CLS`` also puts the new classification head (``score``) in ``modules_to_save``.
    """
    import torch
    from transformers import BloomForSequenceClassification

    rows = []
    for task in ("CAUSAL_LM", None, "FEATURE_EXTRACTION"):
        model = peft_bloom(task_type=task)
        trainable, total = (int(x) for x in model.get_nb_trainable_parameters())
        rows.append({"model": "BloomForCausalLM", "task_type": repr(task),
                     "peft wrapper": type(model).__name__, "trainable (peft)": trainable,
                     "all params (peft)": total})
    with torch.device("meta"):
        cls_model = BloomForSequenceClassification(bloom_config(num_labels=2))
    model = _quiet_peft(cls_model, lora_config(task_type="SEQ_CLS"))
    trainable, total = (int(x) for x in model.get_nb_trainable_parameters())
    rows.append({"model": "BloomForSequenceClassification (2 labels)", "task_type": "'SEQ_CLS'",
                 "peft wrapper": type(model).__name__, "trainable (peft)": trainable,
                 "all params (peft)": total})
    return pd.DataFrame(rows)


# --- the scaling alpha / r, checked numerically ----------------------------------------------

SCALING_CASES: tuple[tuple[int, int, bool], ...] = (
    (16, 32, False), (8, 32, False), (64, 32, False), (16, 16, False), (16, 32, True),
)


@per_render
def scaling_check(cases: Sequence[tuple[int, int, bool]] = SCALING_CASES,
                  seed: int = 0) -> pd.DataFrame:
    """peft's ``scaling`` and the adapter's real output, against ``(alpha / r) B A x``.

    On a tiny random BLOOM (CPU), for each ``(r, alpha, use_rslora)``: the output change of
    block 0's ``query_key_value`` at initialisation (B = 0, so exactly 0), then with a random B,
    compared with ``scaling * x A^T B^T``. ``use_rslora`` makes the scaling ``alpha / sqrt(r)``.
    """
    import torch
    from transformers import BloomForCausalLM

    rows = []
    for r, alpha, rslora in cases:
        torch.manual_seed(seed)
        model = peft_bloom(base=BloomForCausalLM(tiny_bloom_config()), r=r, lora_alpha=alpha,
                           use_rslora=rslora)
        model.eval()  # no dropout
        layer = model.base_model.model.transformer.h[0].self_attention.query_key_value
        x = torch.randn(5, layer.in_features)
        with torch.no_grad():
            at_init = (layer(x) - layer.base_layer(x)).abs().max().item()
            A = layer.lora_A["default"].weight
            B = layer.lora_B["default"].weight
            B.copy_(torch.randn_like(B) * 0.1)
            delta = layer(x) - layer.base_layer(x)
            expected = (alpha / (math.sqrt(r) if rslora else r)) * (x @ A.T @ B.T)
        rows.append({
            "r": r, "lora_alpha": alpha, "use_rslora": rslora,
            "formula": "alpha / sqrt(r)" if rslora else "alpha / r",
            "peft scaling": float(layer.scaling["default"]),
            "max |Δh| at init": at_init,
            "max |Δh − scaling·BAx|": (delta - expected).abs().max().item(),
        })
    return pd.DataFrame(rows)


# --- lora_dropout, checked numerically --------------------------------------------------------

@per_render
def dropout_check(p: float = LAB_LORA["lora_dropout"], seed: int = 0) -> dict[str, float]:
    """Where peft applies ``lora_dropout``, and that evaluation does not see it.

    On a tiny random BLOOM (CPU), block 0's ``query_key_value`` with the lab's LoRA and a random
    B (at initialisation B = 0 and dropout could change nothing). peft computes
    ``W0 x + scaling * B(A(dropout(x)))``: the dropout acts on the adapter's input only. Returned:
    the largest output difference between two training-mode passes on the same input; the
    largest difference from that formula replayed with the same random mask; the share of the
    adapter's input zeroed; and, in eval mode, the differences between two passes and from the
    same weights with ``lora_dropout = 0``.
    """
    import torch
    from transformers import BloomForCausalLM

    def layer_of(dropout: float):
        torch.manual_seed(seed)
        model = peft_bloom(base=BloomForCausalLM(tiny_bloom_config()), lora_dropout=dropout)
        return model, model.base_model.model.transformer.h[0].self_attention.query_key_value

    model, layer = layer_of(p)
    plain_model, plain = layer_of(0.0)
    with torch.no_grad():
        B = layer.lora_B["default"].weight
        B.copy_(torch.randn_like(B) * 0.1)
        plain.load_state_dict(layer.state_dict())
        x = torch.randn(64, layer.in_features)
        model.train()
        h1, h2 = layer(x), layer(x)
        torch.manual_seed(seed + 1)
        h = layer(x)
        torch.manual_seed(seed + 1)
        dropped = layer.lora_dropout["default"](x)
        replay = layer.base_layer(x) + layer.scaling["default"] * layer.lora_B["default"](
            layer.lora_A["default"](dropped))
        model.eval()
        plain_model.eval()
        e1, e2 = layer(x), layer(x)
        return {
            "p": float(layer.lora_dropout["default"].p),
            "train: max |h1 − h2|": (h1 - h2).abs().max().item(),
            "train: max |h − formula|": (h - replay).abs().max().item(),
            "train: share of x zeroed": (dropped == 0).float().mean().item(),
            "eval: max |h1 − h2|": (e1 - e2).abs().max().item(),
            "eval: max |h − h(dropout 0)|": (e1 - plain(x)).abs().max().item(),
        }


# --- printing trainable parameters -----------------------------------------------------------

def lab_print_trainable_parameters(model) -> str:
    """The lab's helper (from the QLoRA notebooks): ``numel()`` summed, nothing corrected."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return (f"trainable params: {trainable} || all params: {total} || "
            f"trainable%: {100 * trainable / total}")


def peft_print_trainable_parameters(model) -> str:
    """What ``PeftModel.print_trainable_parameters()`` prints (captured, not re-implemented)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        model.print_trainable_parameters()
    return buf.getvalue().strip()


@per_render
def lab_printout() -> dict[str, str]:
    """Both printouts for the lab's config on BLOOM-560m (full precision, meta device)."""
    model = peft_bloom()
    return {"lab helper": lab_print_trainable_parameters(model),
            "peft": peft_print_trainable_parameters(model)}
