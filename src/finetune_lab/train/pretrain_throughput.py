"""What a pretraining run's throughput means: tokens/s, model FLOPs per token and, on a known
GPU, the model-FLOPs utilisation against its dense bf16 peak, as the run's manifest records it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from finetune_lab.runs.fairseq_logs import log_rates, mean_tokens_per_update
from finetune_lab.train.pretrain_recipe import PretrainRecipe

# Dense bf16 tensor-core peaks (FLOP/s) used for model-FLOPs utilisation; matched by GPU name.
BF16_PEAK_FLOPS = {  # the first key found in the device name wins: variants before families
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM ("NVIDIA H100 80GB HBM3")
    "A100": 312e12,
    "A6000": 155e12,
    "L4": 121e12,
}


def model_flops_per_token(size: Any, context: int, mask_prob: float) -> float:
    """Training FLOPs per token of masked-LM pretraining: every matrix product, forward x 3.

    ``6 N`` (Kaplan et al. 2020) with N the weight matrices a token goes through: the encoder
    layers' (4 d² + 2 d ffn each) for every token, the LM head's dense layer and tied projection
    onto the vocabulary (d² + d V) only for the masked ``mask_prob`` of them (fairseq's
    ``RobertaLMHead`` projects only those), embedding lookups none; plus attention's scores and
    weighted sum, 12 L T d. Counting all 23 M parameters instead would overstate it 2.4 times.
    """
    d, layers = size.dim, size.layers
    encoder = layers * (4 * d * d + 2 * d * size.ffn)
    head = mask_prob * (d * d + d * size.vocab)
    return 6.0 * (encoder + head) + 12.0 * layers * context * d


def gpu_peak_flops(name: str | None) -> float | None:
    """The dense bf16 peak of the GPU called ``name`` (:data:`BF16_PEAK_FLOPS`); None: unknown."""
    for key, peak in BF16_PEAK_FLOPS.items():
        if name and key in name:
            return peak
    return None


def throughput_record(log_text: str, recipe: PretrainRecipe, device: dict[str, Any]) -> dict:
    """Tokens/s and (on a known GPU) model-FLOPs utilisation against its dense bf16 peak."""
    from finetune_lab.models import params  # heavy: pandas

    rates = log_rates(log_text)
    if not rates:
        return {}
    size = replace(params.SMALL, **{
        {"encoder_layers": "layers", "encoder_embed_dim": "dim", "encoder_ffn_embed_dim": "ffn",
         "encoder_attention_heads": "heads"}[k]: v for k, v in recipe.arch.items()
        if k in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
                 "encoder_attention_heads")
    })
    n = int(params.convention_table(size).iloc[3]["total"])  # encoder + LM head
    flops_token = model_flops_per_token(size, recipe.tokens_per_sample, recipe.mask_prob)
    out = {**rates, "model_flops_per_token": flops_token, "parameters": n,
           "achieved_flops": rates["tokens_per_s"] * flops_token,
           "tokens_per_update_measured": mean_tokens_per_update(log_text)}
    if device.get("type") == "cuda":
        peak = gpu_peak_flops(device.get("name"))
        if peak:
            out["peak_bf16_flops"] = peak
            out["mfu"] = out["achieved_flops"] / (peak * max(1, int(device.get("count") or 1)))
    return out

