"""QLoRA's 4-bit side: NF4 levels, what a ``Params4bit`` counts, and the memory budget.

The lab loads BLOOM-560m in 4-bit NF4 through bitsandbytes. Its parameter-count helper then
prints another total, because a quantised weight is stored as ``uint8`` elements holding two
4-bit codes each; :func:`params4bit_by_shape` measures that on real ``Params4bit`` tensors on
CPU, :func:`four_bit_totals` turns it into the printed totals, and :func:`memory_table` sets the
training state of each setup side by side. Where bitsandbytes is missing the counts fall back to
their formulas and say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pandas as pd

from finetune_lab.models.bloom import BLOOM_560M, BLOOM_LINEARS, BloomShape
from finetune_lab.models.lora_configs import LAB_LORA
from finetune_lab.render_cache import per_render

NF4_BITS = 4 + 8 / 64 + 32 / (64 * 256)
"""Bits per quantised weight with double quantisation: 4-bit code, an 8-bit absmax per block of
64, and an fp32 second-level constant per 256 first-level constants (QLoRA's 4.127 bits)."""

NF4_OFFSET = 0.9677083
"""The outermost quantile bitsandbytes uses, ``(1 - 1/(2*15) + 1 - 1/(2*16)) / 2``."""

GiB = 2 ** 30


@per_render
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


def keep_cpu_4bit_trainable(model) -> None:
    """Stop bitsandbytes repacking 4-bit weights for CPU inference at the first evaluation.

    On CPUs with AVX512-BF16, ``Linear4bit`` converts its weight to an inference-only layout the
    first time it runs in eval mode, after which a training step fails (in-place bias add on a
    view). Turning that optimisation off keeps the layer trainable; it changes no result, and on
    a GPU nothing.
    """
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


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
@per_render
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


@per_render
def four_bit_totals(config=None, measured: bool | None = None) -> dict[str, Any]:
    """Totals the lab's helper and peft print for the lab's QLoRA model on BLOOM-560m.

    ``numel()`` of a quantised weight is half its element count. With ``measured`` (default:
    when bitsandbytes imports) the halved numbers are those of real ``Params4bit`` tensors of
    each shape; otherwise the analytic ``n / 2``. ``measured`` in the result says which.
    """
    shape = BloomShape.of(config)
    lora = shape.lora(LAB_LORA["r"], LAB_LORA["target_modules"])
    if measured is None:
        measured = bitsandbytes_available()
    if measured:
        per = params4bit_by_shape(shape.d)
        packed = shape.layers * int(per["numel (Params4bit)"].sum())
    else:
        packed = shape.linear_weights // 2
    lab_total = shape.total - shape.linear_weights + packed + lora
    peft_total = shape.total + lora  # peft multiplies a Params4bit's numel by 2 x its item size
    return {
        "trainable": lora, "full total": shape.total + lora, "quantised weights": shape.linear_weights,
        "packed numel": packed, "lab helper total": lab_total, "peft total": peft_total,
        "lab helper %": 100 * lora / lab_total, "peft %": 100 * lora / peft_total,
        "measured": measured,
    }


# --- memory ----------------------------------------------------------------------------------

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

def nf4_codebook(offset: float = NF4_OFFSET) -> list[float]:
    """The 16 NF4 levels from quantiles of N(0, 1), built as bitsandbytes' ``create_normal_map``
    builds them (QLoRA's idealised formula, read literally, would put a level at −∞).

    8 positive levels ``Φ⁻¹(p)`` for ``p`` evenly spaced from ``offset`` towards 1/2 in 8 steps,
    7 negative ones ``−Φ⁻¹(p)`` from ``offset`` towards 1/2 in 7 steps, and an exact 0; all
    divided by the largest, ``Φ⁻¹(offset)``, so they span [−1, 1].
    """
    import numpy as np
    from scipy.stats import norm

    pos = norm.ppf(np.linspace(offset, 0.5, 9)[:-1])
    neg = -norm.ppf(np.linspace(offset, 0.5, 8)[:-1])
    levels = np.sort(np.concatenate([pos, [0.0], neg]))
    return (levels / np.abs(levels).max()).tolist()


@per_render
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


@per_render
def nf4_matches_bitsandbytes(tolerance: float = 1e-6) -> bool | None:
    """Whether :func:`nf4_codebook` equals bitsandbytes' table to ``tolerance``; ``None`` when
    bitsandbytes is not installed (nothing to compare with)."""
    if not bitsandbytes_available():
        return None
    df = nf4_table()
    diff = (df["NF4 (from N(0,1) quantiles)"] - df["NF4 (bitsandbytes)"]).abs().max()
    return bool(diff < tolerance)


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
