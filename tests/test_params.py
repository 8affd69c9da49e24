"""Question 1: every analytic count equals the real models' numel()."""

from __future__ import annotations

import json

import pytest

from finetune_lab.models import params
from finetune_lab.cli import main

# An odd size (f != d, small V) so that a swapped or missing term cannot hide.
ODD = params.RobertaSize(vocab=1003, dim=48, layers=3, ffn=80, heads=4, positions=34, classes=3)


@pytest.mark.parametrize("size", [params.SMALL, ODD], ids=["roberta_small", "odd"])
def test_every_component_matches_numel(size):
    check = params.component_check(size)
    mismatched = check[~check["equal"]]
    assert mismatched.empty, mismatched.to_string()
    model = params.fairseq_model(size)
    assert check["analytic"].sum() == params.numel(model)


def test_lab_equation_by_hand():
    V, d, L, f, P = 32000, 512, 4, 512, 258
    assert params.lab_total() == V * d + P * d + L * (4 * d * d + 2 * d * f)


def test_real_model_reproduces_each_writeup_answer():
    model = params.fairseq_model(params.SMALL, classification_head=False)
    counted = params.fairseq_component_counts(model)
    encoder = params.numel(model.encoder.sentence_encoder)
    weights_only = sum(counted[k] for k in ("tok_emb", "pos_emb", "attn_w", "ffn_w"))
    forgot = counted["tok_emb"] + counted["attn_w"]
    # The three answers of the writeups, each rebuilt from the real model's tensors.
    assert sorted([weights_only, encoder, forgot]) == sorted(params.WRITEUP_ANSWERS)
    conv = params.convention_table()
    assert list(conv["total"][:3]) == [weights_only, encoder, forgot]
    assert conv["writeup answer"].notna().sum() == 3


def test_counted_totals_match_conventions():
    conv = params.convention_table().set_index("convention")["total"]
    totals = params.counted_totals().set_index("model")["parameters"]
    enc, with_lm, with_cls = conv.iloc[1], conv.iloc[3], conv.iloc[4]
    assert totals["sentence encoder (encoder.sentence_encoder)"] == enc
    assert totals["RobertaModel with LM head"] == with_lm
    assert totals["RobertaModel with LM head + 2-class head"] == with_cls
    d = params.SMALL.dim
    cls_head = d * d + d + 2 * d + 2
    assert totals["2-class classification head alone"] == cls_head
    # Transformers adds a single token-type embedding row (type_vocab_size=1).
    assert totals["RobertaForMaskedLM"] == with_lm + d
    assert totals["RobertaForSequenceClassification (2 labels)"] == enc + d + cls_head


def test_hf_config_matches_course_release():
    cfg = params.hf_config()
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (32000, 512, 4)
    assert (cfg.num_attention_heads, cfg.intermediate_size) == (8, 512)
    assert (cfg.max_position_embeddings, cfg.type_vocab_size) == (258, 1)
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) == (1, 0, 2)


def test_memory_table_is_bytes_of_parameters():
    mem = params.memory_table()
    row = mem.iloc[0]
    assert row["fp32 (MiB)"] == pytest.approx(row["parameters"] * 4 / 2**20)
    assert row["bf16 (MiB)"] == pytest.approx(row["fp32 (MiB)"] / 2)


def test_part_shares_sum_to_one():
    shares = params.part_shares()
    assert shares["share"].sum() == pytest.approx(1.0)
    assert shares.iloc[0]["name"] == "token embeddings"


def test_params_json_cli(capsys):
    assert main(["params", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    totals = [c["total"] for c in report["conventions"]]
    assert totals == list(params.convention_table()["total"])
    assert {c["model"] for c in report["counted"]} >= {"RobertaForMaskedLM"}


def test_figure_labels_each_bar_with_its_own_share():
    ax = params.plot_part_shares()
    df = params.part_shares()
    widths = [patch.get_width() for patch in ax.patches]
    labels = [t.get_text() for t in ax.texts]
    assert widths == list(df["count"])
    assert labels == [params.share_label(s) for s in df["share"]]
    assert labels[0] == f"{100 * 16_384_000 / df['count'].sum():.2f} %"
