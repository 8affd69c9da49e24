"""Question 2's counts on BLOOM-560m (meta device): peft's own numbers against the formulas."""

from __future__ import annotations

import pytest

from finetune_lab.models import bloom, four_bit
from finetune_lab.models import lora_counts as lc

SHAPE = bloom.BloomShape.of()
needs_bnb = pytest.mark.skipif(not four_bit.bitsandbytes_available(), reason="bitsandbytes missing")


def test_published_config_total_matches_the_built_model():
    model = bloom.meta_bloom()
    assert all(p.is_meta for p in model.parameters())
    numel = sum(p.numel() for p in model.parameters())
    assert numel == SHAPE.total == 559_214_592
    assert SHAPE.embedding_share == 250_880 * 1024 / 559_214_592  # the tied token embedding


def test_quantised_and_bias_counts_match_the_model():
    import torch

    model = bloom.meta_bloom()
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and n != "lm_head")
    biases = sum(p.numel() for n, p in model.named_parameters() if "bias" in n)
    assert linear == SHAPE.linear_weights
    assert biases == SHAPE.biases


def test_labs_config_trainable_count_is_r_times_din_plus_dout_per_layer():
    d, L, r = 1024, 24, 16
    expected = L * r * (d + 3 * d)  # A: r x d_in, B: d_out x r, on query_key_value (d -> 3d)
    trainable, total = lc.peft_counts()
    assert trainable == expected == SHAPE.lora(16, ["query_key_value"]) == 1_572_864
    assert total == SHAPE.total + expected


def test_rank_sweep_is_linear_in_r_and_matches_peft():
    df = lc.rank_sweep()
    assert (df["trainable (peft)"] == df["analytic"]).all()
    assert (df["trainable (peft)"] == df["r"] * 98_304).all()


def test_target_and_bias_sweeps_match_peft():
    targets = lc.target_sweep()
    assert (targets["trainable (peft)"] == targets["analytic"]).all()
    assert targets["trainable (peft)"].is_monotonic_increasing
    bias = lc.bias_sweep().set_index("bias")
    assert (bias["trainable (peft)"] == bias["analytic"]).all()
    assert bias.loc["lora_only", "biases made trainable"] == 24 * 3 * 1024
    assert bias.loc["all", "biases made trainable"] == SHAPE.biases


def test_patterns_and_modules_to_save():
    df = lc.pattern_table().set_index("config")
    assert (df["trainable (peft)"] == df["analytic"]).all()
    # the frozen original stays; A, B and any modules_to_save copy come on top of it
    assert (df["all params (peft)"] == SHAPE.total + df["trainable (peft)"]).all()
    assert df.loc["rank_pattern={block 0 qkv: 64}", "block 0: r, scaling"] == "64, 0.5"
    assert df.loc["rank_pattern={block 0 qkv: 64}", "block 1: r, scaling"] == "16, 2"
    assert df.loc["alpha_pattern={block 0 qkv: 128}", "block 0: r, scaling"] == "16, 8"
    emb = df.loc["modules_to_save=['word_embeddings']"]
    assert emb["all params (peft)"] == SHAPE.total + SHAPE.lora(16, ["query_key_value"]) + emb["added copy"]


def test_task_type_only_changes_the_wrapper_on_a_causal_lm():
    df = lc.task_type_table()
    causal = df[df["model"] == "BloomForCausalLM"]
    assert causal["trainable (peft)"].nunique() == 1
    assert list(causal["peft wrapper"]) == ["PeftModelForCausalLM", "PeftModel",
                                           "PeftModelForFeatureExtraction"]
    seq = df[df["task_type"] == "'SEQ_CLS'"].iloc[0]
    assert seq["trainable (peft)"] == 1_572_864 + 1024 * 2  # + the score head, saved


def test_scaling_is_alpha_over_r_and_b_starts_at_zero():
    df = lc.scaling_check()
    expected = [a / (r ** 0.5 if rs else r) for r, a, rs in lc.SCALING_CASES]
    assert df["peft scaling"].tolist() == pytest.approx(expected)
    assert (df["max |Δh| at init"] == 0).all()
    assert (df["max |Δh − scaling·BAx|"] < 1e-5).all()


def test_lora_dropout_acts_on_the_adapter_input_in_training_only():
    d = lc.dropout_check()
    assert d["p"] == 0.05
    assert d["train: max |h1 − h2|"] > 1e-3  # a new mask per pass
    assert d["train: max |h − formula|"] < 1e-6  # W0 x + scaling · B(A(dropout(x)))
    assert 0.0 < d["train: share of x zeroed"] < 0.1
    assert d["eval: max |h1 − h2|"] == 0 and d["eval: max |h − h(dropout 0)|"] == 0


def test_labs_printout_is_reproduced():
    out = lc.lab_printout()
    assert out["lab helper"] == ("trainable params: 1572864 || all params: 560787456 || "
                                 "trainable%: 0.2804741766549072")
    assert out["peft"] == "trainable params: 1,572,864 || all params: 560,787,456 || trainable%: 0.2805"


def test_four_bit_total_analytic():
    t = four_bit.four_bit_totals(measured=False)
    assert t["packed numel"] == SHAPE.linear_weights // 2
    assert t["lab helper total"] == 559_214_592 - 301_989_888 // 2 + 1_572_864 == 409_792_512
    assert t["peft total"] == 560_787_456
    assert t["measured"] is False


@needs_bnb
def test_four_bit_totals_measured_equal_analytic():
    assert four_bit.four_bit_totals(measured=True)["lab helper total"] == \
        four_bit.four_bit_totals(measured=False)["lab helper total"]
    per = four_bit.params4bit_by_shape()
    assert (per["numel (Params4bit)"] * 2 == per["numel (full)"]).all()
    assert per["bits per weight"].between(four_bit.NF4_BITS, four_bit.NF4_BITS + 0.01).all()


@needs_bnb
def test_real_4bit_load_on_cpu_matches_the_formula(tmp_path):
    """A tiny BLOOM loaded with the lab's BitsAndBytesConfig: both printouts, as predicted."""
    import torch
    from transformers import BloomForCausalLM

    from finetune_lab.models.lora_configs import bnb_config, lora_config

    cfg = bloom.tiny_bloom_config()
    torch.manual_seed(0)
    BloomForCausalLM(cfg).save_pretrained(tmp_path)
    q = BloomForCausalLM.from_pretrained(tmp_path, quantization_config=bnb_config(),
                                         device_map="cpu")
    model = lc._quiet_peft(q, lora_config())
    shape = bloom.BloomShape.of(cfg)
    lora = shape.lora(16, ["query_key_value"])
    lab = lc.lab_print_trainable_parameters(model)
    assert f"all params: {shape.total - shape.linear_weights // 2 + lora} " in lab
    assert model.get_nb_trainable_parameters() == (lora, shape.total + lora)


def test_memory_table_totals():
    sym = four_bit.memory_symbols()
    N, Q, P = sym["N"], sym["Q"], sym["P"]
    rows = {r.setup: r for r in four_bit.memory_rows()}
    totals = {k: sum(v for _, v in (r.weights, r.adapter, r.gradients, r.optimizer))
              for k, r in rows.items()}
    assert totals["full fine-tuning, fp32, AdamW"] == 16 * N
    assert totals["full fine-tuning, bf16 mixed precision, AdamW"] == 16 * N
    assert totals["LoRA, bf16 base, AdamW"] == 2 * N + 16 * P
    qlora = totals["QLoRA, NF4 base, paged 8-bit AdamW (the lab)"]
    assert qlora == pytest.approx(Q * 4.127 / 8 + 2 * (N - Q) + 10 * P, rel=1e-4)
    table = four_bit.memory_table()
    assert table["total (GiB)"].iloc[0] == pytest.approx(16 * N / 2**30)


def test_nf4_codebook_properties():
    levels = four_bit.nf4_codebook()
    assert len(levels) == 16 and levels[0] == -1 and levels[-1] == 1 and 0.0 in levels
    assert levels == sorted(levels)


@needs_bnb
def test_nf4_codebook_equals_bitsandbytes():
    assert four_bit.nf4_codebook() == pytest.approx(four_bit.bnb_nf4_codebook(), abs=1e-6)
    assert four_bit.nf4_matches_bitsandbytes() is True
    assert four_bit.nf4_matches_bitsandbytes(tolerance=0.0) is False  # float32 vs float64 levels
    # and to the function bitsandbytes builds its table with: 8 positive and 7 negative
    # normal quantiles from the offset 0.9677083, plus 0 (241 padding zeros in its 256 slots)
    import numpy as np
    from bitsandbytes.functional import create_normal_map

    built = np.unique(create_normal_map(offset=four_bit.NF4_OFFSET).numpy())
    assert len(built) == 16 and (built > 0).sum() == 8 and (built < 0).sum() == 7
    assert four_bit.nf4_codebook() == pytest.approx(built.tolist(), abs=1e-6)
