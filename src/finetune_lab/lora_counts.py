"""Question 2, live: what each ``LoraConfig`` parameter does to BLOOM-560m, counted by peft.

BLOOM-560m's weights cannot be downloaded here, and counting parameters does not need them: the
model is built from its published configuration on PyTorch's ``meta`` device (shapes, no
storage, instant), wrapped with peft, and counted with peft's own
``get_nb_trainable_parameters()``. Every count is also derived analytically from the
configuration; ``tests/test_lora_counts.py`` asserts the two agree. The 4-bit numbers use real
``bitsandbytes`` ``Params4bit`` tensors on CPU where bitsandbytes is installed.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pandas as pd

from finetune_lab.lora_configs import LAB_LORA, lora_config

BLOOM_560M: dict[str, Any] = {
    "vocab_size": 250_880,
    "hidden_size": 1024,
    "n_layer": 24,
    "n_head": 16,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "apply_residual_connection_post_layernorm": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "pretraining_tp": 1,
    "slow_but_exact": False,
    "use_cache": True,
    "tie_word_embeddings": True,
    "unk_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
}
"""The published configuration of ``bigscience/bloom-560m`` (its ``config.json``)."""

BLOOM_LINEARS: dict[str, tuple[int, int]] = {
    "query_key_value": (1, 3),
    "dense": (1, 1),
    "dense_h_to_4h": (1, 4),
    "dense_4h_to_h": (4, 1),
}
"""The ``nn.Linear`` layers of one BLOOM block: (in, out) features in multiples of the width."""

TARGET_SETS: dict[str, list[str]] = {
    "query_key_value (the lab)": ["query_key_value"],
    "and the attention output (dense)": ["query_key_value", "dense"],
    "and the MLP (dense_h_to_4h, dense_4h_to_h)": ["query_key_value", "dense", "dense_h_to_4h",
                                             "dense_4h_to_h"],
}
RANKS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


def bloom_config(**overrides: Any):
    """``BloomConfig`` of BLOOM-560m, any value overridden (e.g. a tiny one for tests)."""
    from transformers import BloomConfig

    return BloomConfig(**{**BLOOM_560M, **overrides})


def meta_bloom(config=None):
    """``BloomForCausalLM`` on the meta device: every tensor has its shape and no storage."""
    import torch
    from transformers import BloomForCausalLM

    with torch.device("meta"):
        return BloomForCausalLM(config if config is not None else bloom_config())


def _quiet_peft(model, cfg):
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft warns about meta tensors and fan_in_fan_out
        return get_peft_model(model, cfg)


def peft_bloom(config=None, base=None, **lora_overrides: Any):
    """The lab's LoRA (any field overridden) applied to a fresh meta-device BLOOM."""
    model = base if base is not None else meta_bloom(config)
    return _quiet_peft(model, lora_config(**lora_overrides))


def peft_counts(config=None, **lora_overrides: Any) -> tuple[int, int]:
    """``(trainable, total)`` as peft's ``get_nb_trainable_parameters()`` reports them."""
    return tuple(int(x) for x in peft_bloom(config, **lora_overrides)
                 .get_nb_trainable_parameters())  # type: ignore[return-value]


# --- analytic counts -----------------------------------------------------------------------

@dataclass(frozen=True)
class BloomShape:
    """The numbers of a BLOOM configuration that the formulas use."""

    vocab: int
    d: int
    layers: int

    @classmethod
    def of(cls, config=None) -> "BloomShape":
        cfg = config if config is not None else bloom_config()
        return cls(vocab=cfg.vocab_size, d=cfg.hidden_size, layers=cfg.n_layer)

    @property
    def total(self) -> int:
        """``V d + 4d + L (12 d^2 + 13 d)``: embeddings (tied with the LM head), the embedding
        and final LayerNorms, and per block four Linear layers with biases and two LayerNorms."""
        d = self.d
        return self.vocab * d + 4 * d + self.layers * (12 * d * d + 13 * d)

    @property
    def linear_weights(self) -> int:
        """``L \\cdot 12 d^2``: what 4-bit loading quantises (every block Linear's weight)."""
        return self.layers * 12 * self.d * self.d

    @property
    def biases(self) -> int:
        """Every tensor named ``bias``: Linear biases ``9d`` and two LayerNorms ``2d`` per block,
        plus the embedding and final LayerNorms."""
        return self.layers * (9 * self.d + 2 * self.d) + 2 * self.d

    def lora(self, r: int, targets: Iterable[str]) -> int:
        """``L \\sum r (d_in + d_out)``: A is r x d_in, B is d_out x r, per adapted Linear."""
        total = 0
        for name in targets:
            i, o = BLOOM_LINEARS[name]
            total += r * (i + o) * self.d
        return self.layers * total

    def lora_only_biases(self, targets: Iterable[str]) -> int:
        """``bias="lora_only"``: the biases of the adapted Linear layers only."""
        return self.layers * sum(BLOOM_LINEARS[t][1] * self.d for t in targets)


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


def tiny_bloom_config(vocab_size: int = 256, **overrides: Any):
    """A 2-block, width-64 BLOOM configuration (same architecture, tiny): for CPU checks."""
    return bloom_config(vocab_size=vocab_size, hidden_size=64, n_layer=2, n_head=4, **overrides)


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


def lab_printout() -> dict[str, str]:
    """Both printouts for the lab's config on BLOOM-560m (full precision, meta device)."""
    model = peft_bloom()
    return {"lab helper": lab_print_trainable_parameters(model),
            "peft": peft_print_trainable_parameters(model)}


# --- 4-bit ----------------------------------------------------------------------------------

def bitsandbytes_available() -> bool:
    """True when bitsandbytes imports (it quantises to 4-bit on CPU from version 0.48 on)."""
    try:
        _import_bnb()
    except Exception:  # ImportError, or a broken native library
        return False
    return True


def _import_bnb():
    import bitsandbytes  # its optional-kernel notice is filtered in finetune_lab/__init__.py

    return bitsandbytes


def _quant_state_bytes(state) -> int:
    """Bytes of a bitsandbytes ``QuantState``: absmax, code table, nested state, offset."""
    total = 0
    for name in ("absmax", "code", "offset"):
        t = getattr(state, name, None)
        if t is not None:
            total += t.numel() * t.element_size()
    if getattr(state, "state2", None) is not None:
        total += _quant_state_bytes(state.state2)
    return total


@lru_cache(maxsize=4)
def params4bit_by_shape(d: int = BLOOM_560M["hidden_size"], seed: int = 0) -> pd.DataFrame:
    """A real ``Linear4bit`` (NF4, double quantisation) per BLOOM block Linear, quantised on CPU.

    For each shape: the full-precision ``numel()``, the ``Params4bit``'s ``numel()`` (two 4-bit
    codes per uint8 element), and the bytes of the packed codes and of the quantisation state.
    Raises ``ImportError`` when bitsandbytes is missing.
    """
    import torch

    bnb = _import_bnb()
    torch.manual_seed(seed)
    rows = []
    for name, (i, o) in BLOOM_LINEARS.items():
        fan_in, fan_out = i * d, o * d
        layer = bnb.nn.Linear4bit(fan_in, fan_out, bias=True, compute_dtype=torch.bfloat16,
                                  quant_type="nf4", compress_statistics=True)
        weight = (torch.randn(fan_out, fan_in) * 0.02).to(torch.bfloat16)
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type="nf4",
                                         compress_statistics=True, blocksize=64)
        layer = layer.to("cpu")  # quantises
        w = layer.weight
        packed = w.numel() * w.element_size()
        state = _quant_state_bytes(w.quant_state)
        rows.append({
            "layer": name, "shape": f"{fan_out} x {fan_in}", "numel (full)": fan_out * fan_in,
            "numel (Params4bit)": w.numel(), "dtype": str(w.dtype).replace("torch.", ""),
            "packed bytes": packed, "state bytes": state,
            "bits per weight": 8 * (packed + state) / (fan_out * fan_in),
        })
    return pd.DataFrame(rows)


NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
"""Bits per quantised weight with double quantisation: 4-bit code, an 8-bit absmax per block of
64, and an fp32 second-level constant per 256 first-level constants (QLoRA's 4.127 bits)."""


def four_bit_totals(config=None, measured: bool | None = None) -> dict[str, Any]:
    """Totals the lab's helper and peft print for the lab's QLoRA model on BLOOM-560m.

    ``numel()`` of a quantised weight is half its element count. With ``measured`` (default:
    when bitsandbytes imports) the halved numbers are those of real ``Params4bit`` tensors of
    each shape; otherwise the analytic ``n / 2``. ``source`` says which.
    """
    shape = BloomShape.of(config)
    lora = shape.lora(LAB_LORA["r"], LAB_LORA["target_modules"])
    if measured is None:
        measured = bitsandbytes_available()
    if measured:
        per = params4bit_by_shape(shape.d)
        packed = shape.layers * int(per["numel (Params4bit)"].sum())
        source = "bitsandbytes Params4bit on CPU"
    else:
        packed = shape.linear_weights // 2
        source = "analytic (bitsandbytes not installed)"
    lab_total = shape.total - shape.linear_weights + packed + lora
    peft_total = shape.total + lora  # peft multiplies a Params4bit's numel by 2 x its item size
    return {
        "trainable": lora, "full total": shape.total + lora, "quantised weights": shape.linear_weights,
        "packed numel": packed, "lab helper total": lab_total, "peft total": peft_total,
        "lab helper %": _pct(lora, lab_total), "peft %": _pct(lora, peft_total), "source": source,
    }


# --- memory ----------------------------------------------------------------------------------

GiB = 2 ** 30


@dataclass(frozen=True)
class MemoryRow:
    """One training setup: bytes of each kind of state, with the formula that gives them."""

    setup: str
    weights: tuple[str, float]
    adapter: tuple[str, float]
    gradients: tuple[str, float]
    optimizer: tuple[str, float]


def memory_rows(config=None) -> list[MemoryRow]:
    """Weights, adapter, gradients and optimizer states of each setup, in bytes (no activations).

    N: all parameters; Q: the block Linear weights (what 4-bit loading quantises); P: LoRA's A
    and B for the lab's config. Adam keeps two moments per trained parameter (4 + 4 bytes in
    fp32, 1 + 1 byte for bitsandbytes' 8-bit AdamW). Mixed precision keeps an fp32 master copy of
    bf16 weights with the optimizer (the ZeRO paper's 16 bytes per parameter). peft keeps the
    adapter in fp32 even on a bf16 model (its ``autocast_adapter_dtype`` default).
    """
    shape = BloomShape.of(config)
    N, Q = shape.total, shape.linear_weights
    P = shape.lora(LAB_LORA["r"], LAB_LORA["target_modules"])
    nf4 = NF4_BITS / 8
    none = ("0", 0.0)
    return [
        MemoryRow("full fine-tuning, fp32, AdamW", ("4N", 4 * N), none, ("4N", 4 * N),
                  ("8N", 8 * N)),
        MemoryRow("full fine-tuning, bf16 mixed precision, AdamW", ("2N", 2 * N), none,
                  ("2N", 2 * N), ("(4+4+4)N", 12 * N)),
        MemoryRow("LoRA, bf16 base, AdamW", ("2N", 2 * N), ("4P", 4 * P), ("4P", 4 * P),
                  ("8P", 8 * P)),
        MemoryRow("QLoRA, NF4 base, paged 8-bit AdamW (the lab)",
                  (r"\tfrac{4.127}{8}Q + 2(N-Q)", nf4 * Q + 2 * (N - Q)), ("4P", 4 * P),
                  ("4P", 4 * P), ("2P", 2 * P)),
        MemoryRow("QLoRA after prepare_model_for_kbit_training (rest cast to fp32)",
                  (r"\tfrac{4.127}{8}Q + 4(N-Q)", nf4 * Q + 4 * (N - Q)), ("4P", 4 * P),
                  ("4P", 4 * P), ("2P", 2 * P)),
    ]


def memory_table(config=None, unit: int = GiB) -> pd.DataFrame:
    """:func:`memory_rows` as a table: each cell ``$formula$ = value`` (GiB), and the total."""
    out = []
    for row in memory_rows(config):
        cells = {"setup": row.setup}
        total = 0.0
        for col in ("weights", "adapter", "gradients", "optimizer"):
            formula, value = getattr(row, col)
            total += value
            cells[col] = "0" if value == 0 else f"${formula}$ = {value / unit:.3f}"
        cells["total (GiB)"] = total / unit
        out.append(cells)
    return pd.DataFrame(out).rename(columns={"optimizer": "optimizer states",
                                             "adapter": "adapter (A, B)"})


def memory_symbols(config=None) -> dict[str, int]:
    """The values of N, Q and P used by :func:`memory_table`."""
    shape = BloomShape.of(config)
    return {"N": shape.total, "Q": shape.linear_weights,
            "P": shape.lora(LAB_LORA["r"], LAB_LORA["target_modules"])}


# --- NF4 -------------------------------------------------------------------------------------

NF4_OFFSET = 0.9677083
"""The outermost quantile bitsandbytes uses, ``(1 - 1/(2*15) + 1 - 1/(2*16)) / 2``."""


def nf4_codebook(offset: float = NF4_OFFSET) -> list[float]:
    """The 16 NF4 levels from quantiles of N(0, 1), as QLoRA's appendix constructs them.

    8 positive levels from quantiles evenly spaced between ``offset`` and 1/2, 7 negative ones
    from ``offset`` to 1/2 in 8 steps (so that 0 is exact), then normalised to [-1, 1].
    """
    import numpy as np
    from scipy.stats import norm

    pos = norm.ppf(np.linspace(offset, 0.5, 9)[:-1])
    neg = -norm.ppf(np.linspace(offset, 0.5, 8)[:-1])
    levels = np.sort(np.concatenate([pos, [0.0], neg]))
    return (levels / np.abs(levels).max()).tolist()


def bnb_nf4_codebook() -> list[float]:
    """The NF4 table inside bitsandbytes (raises ``ImportError`` without it)."""
    _import_bnb()
    from bitsandbytes.functional import get_4bit_type

    return get_4bit_type("nf4", device="cpu").tolist()


def nf4_table() -> pd.DataFrame:
    """NF4 levels: computed here, from bitsandbytes when installed, and a uniform 16-level grid."""
    ours = nf4_codebook()
    df = pd.DataFrame({"index": range(16), "NF4 (from N(0,1) quantiles)": ours,
                       "uniform 4-bit": [-1 + 2 * i / 15 for i in range(16)]})
    try:
        df["NF4 (bitsandbytes)"] = bnb_nf4_codebook()
    except ImportError:
        pass
    return df


def quantisation_error(n: int = 1 << 16, seed: int = 0) -> pd.DataFrame:
    """Mean absolute error of NF4 and FP4 (bitsandbytes, block 64) on N(0, 1)-like weights."""
    import torch

    _import_bnb()
    import bitsandbytes.functional as F

    torch.manual_seed(seed)
    w = torch.randn(n) * 0.02
    rows = []
    for qt in ("nf4", "fp4"):
        for double in (False, True):
            q, st = F.quantize_4bit(w.to(torch.bfloat16), blocksize=64, quant_type=qt,
                                    compress_statistics=double)
            back = F.dequantize_4bit(q, st).float()
            rows.append({"data type": qt.upper(), "double quantisation": double,
                         "mean |w − ŵ| / mean |w|": ((back - w).abs().mean() / w.abs().mean()).item()})
    return pd.DataFrame(rows)


# --- figures ----------------------------------------------------------------------------------

def plot_rank_sweep(ax=None):
    """Trainable parameters against r for the three target sets (formula lines, peft points)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    shape = BloomShape.of()
    for label, targets in TARGET_SETS.items():
        ax.plot(RANKS, [shape.lora(r, targets) for r in RANKS], marker=".", label=label)
    peft_points = rank_sweep()
    ax.scatter(peft_points["r"], peft_points["trainable (peft)"], s=60, facecolors="none",
               edgecolors="black", label="peft's count (lab's target)", zorder=3)
    ax.axvline(LAB_LORA["r"], color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rank r")
    ax.set_ylabel("trainable parameters")
    ax.legend(fontsize=8)
    return ax


def plot_nf4(ax=None):
    """The 16 NF4 levels over the N(0, 1) density, next to the uniform 4-bit grid."""
    import matplotlib.pyplot as plt
    import numpy as np
    from scipy.stats import norm

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 2.8))
    df = nf4_table()
    scale = float(norm.ppf(NF4_OFFSET))  # NF4's outermost level, in standard deviations
    xs = np.linspace(-1.1, 1.1, 400)
    ax.plot(xs, norm.pdf(xs * scale), color="grey", lw=1, label="N(0, 1) density (rescaled)")
    ax.vlines(df["NF4 (from N(0,1) quantiles)"], 0, 0.45, color="C0", lw=1.2, label="NF4 levels")
    ax.vlines(df["uniform 4-bit"], -0.12, 0, color="C3", lw=1.2,
              label="uniform 4-bit levels")
    ax.set_yticks([])
    ax.set_xlabel("value / block absmax")
    ax.legend(fontsize=8, loc="upper right")
    return ax
