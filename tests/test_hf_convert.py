"""fairseq RoBERTa -> Transformers: the mapping is numerically exact, and a bad mapping is caught."""

from __future__ import annotations

import pytest

from finetune_lab.models import conversion_record, hf_convert
from finetune_lab.models.params import fairseq_model


@pytest.fixture(scope="module")
def tiny():
    size = hf_convert.tiny_size()
    fs = fairseq_model(size, classification_head=True)
    hf_convert.randomize_(fs, seed=1)
    return size, fs, fs.state_dict()


def _check(fs, state, size):
    return hf_convert.equivalence_table(
        fs, hf_convert.to_hf_masked_lm(state, size), hf_convert.to_hf_classifier(state, size),
        hf_convert.sample_inputs(size.vocab, seed=3, max_len=size.max_positions))


def test_hidden_states_mlm_and_classification_logits_agree(tiny):
    size, fs, state = tiny
    table = _check(fs, state, size)
    assert list(table["quantity"]) == [
        "hidden states, embeddings", "hidden states, layer 1", "hidden states, layer 2",
        "MLM logits", "classification logits"]
    assert table["equal"].all(), table.to_string()
    assert (table["max abs difference"] <= 1e-4).all()


def test_a_swapped_layernorm_is_detected(tiny):
    size, fs, state = tiny
    bad = dict(state)
    a = "encoder.sentence_encoder.layers.0.self_attn_layer_norm.bias"
    b = "encoder.sentence_encoder.layers.0.final_layer_norm.bias"
    bad[a], bad[b] = state[b], state[a]
    table = _check(fs, bad, size)
    assert not table.set_index("quantity").loc["hidden states, layer 1", "equal"]


def test_a_wrong_classifier_head_is_detected(tiny):
    size, fs, state = tiny
    bad = dict(state)
    key = f"classification_heads.{hf_convert.HEAD}.out_proj.bias"
    bad[key] = state[key] + 1e-2
    table = _check(fs, bad, size).set_index("quantity")
    assert table.loc["MLM logits", "equal"]
    assert not table.loc["classification logits", "equal"]


def test_token_types_are_zero_and_decoder_is_tied(tiny):
    size, _, state = tiny
    mlm = hf_convert.to_hf_masked_lm(state, size)
    assert float(mlm.roberta.embeddings.token_type_embeddings.weight.detach().abs().max()) == 0.0
    assert mlm.lm_head.decoder.weight.data_ptr() == mlm.roberta.embeddings.word_embeddings.weight.data_ptr()
    cfg = mlm.config
    assert (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id, cfg.type_vocab_size) == (1, 0, 2, 1)


def test_size_is_read_from_the_state_dict(tiny):
    size, _, state = tiny
    assert hf_convert.size_from_state_dict(state, heads=size.heads) == size


def test_an_unknown_fairseq_tensor_is_refused(tiny):
    from finetune_lab.errors import UserError

    size, _, state = tiny
    with pytest.raises(UserError, match="no Transformers counterpart"):
        hf_convert.convert_state_dict({**state, "encoder.extra.weight": state["encoder.lm_head.bias"]},
                                      size.layers)


def test_the_course_config_matches_the_brief():
    from finetune_lab.models.params import SMALL

    cfg = hf_convert.hf_model_config(SMALL)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.intermediate_size, cfg.max_position_embeddings, cfg.layer_norm_eps) == (
        32000, 512, 4, 8, 512, 258, 1e-5)
    assert cfg.classifier_dropout == 0.0  # fairseq's pooler_dropout


def test_convert_checkpoint_writes_a_loadable_folder(tmp_path, tiny, monkeypatch):
    """The CLI path: a checkpoint file -> folder; reloaded, it still matches fairseq."""
    import argparse

    import torch
    from transformers import RobertaForMaskedLM

    from finetune_lab.models import trust
    from finetune_lab.models.hf_tokenizer import FairseqIdTokenizer

    size, fs, state = tiny
    ckpt = tmp_path / "model.pt"
    # heads cannot be read off tensors: the checkpoint's args carry them, as fairseq's do
    torch.save({"model": {k: v.half() for k, v in state.items()},
                "args": argparse.Namespace(encoder_attention_heads=size.heads), "cfg": None}, ckpt)
    tokdir = tmp_path / "tok"
    _tiny_tokenizer(tokdir, size.vocab)
    monkeypatch.setenv(trust.TRUSTED_DIRS_ENV, str(tmp_path))
    out = hf_convert.convert_checkpoint(ckpt, tmp_path / "hf", tokdir)
    for name in ("config.json", "spm.model", "dict.txt", "fairseq_tokenizer.json", "conversion.json"):
        assert (out / name).is_file(), name
    reloaded = RobertaForMaskedLM.from_pretrained(out).eval()
    assert reloaded.config.num_attention_heads == size.heads
    fs16 = hf_convert.fairseq_model_from_state({k: v.half() for k, v in state.items()},
                                               hf_convert.size_from_state_dict(state, size.heads))
    table = hf_convert.equivalence_table(fs16, reloaded, hf_convert.to_hf_classifier(
        {k: v.half() for k, v in state.items()}, size), hf_convert.sample_inputs(size.vocab))
    assert table["equal"].all(), table.to_string()
    assert FairseqIdTokenizer.from_dir(out).vocab_size == size.vocab


def _tiny_tokenizer(folder, vocab):
    """A sentencepiece model whose dict gives exactly ``vocab`` ids (specials + pieces + <mask>)."""
    import sentencepiece as spm

    from finetune_lab.data import tokenizer as T

    folder.mkdir(parents=True)
    words = [f"mot{i} chose{i % 7} livre{i % 11}" for i in range(400)]
    T.train_spm(words, folder / "spm", vocab_size=vocab - 1)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    T.write_fairseq_dict(sp, folder / "dict.txt")


def test_conversion_is_exact_on_the_committed_checkpoint():
    """The issue's bar: hidden states, MLM logits and the classification path of the real,
    committed RoBERTa-small-fr agree between fairseq and Transformers within 1e-4."""
    from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir

    ckpt = packaged_dir() / MODEL_FILE
    assert ckpt.is_file(), f"{ckpt} is committed; it should be in every checkout"
    table = hf_convert.checkpoint_check(ckpt)
    assert table["equal"].all(), table
    assert {"MLM logits", "classification logits", "hidden states, layer 4"} <= set(table["quantity"])
    assert table["max abs difference"].max() <= 1e-4, table


def test_a_replaced_checkpoint_is_converted_again(tmp_path, tiny, monkeypatch):
    """Fine-tuning with Transformers reads the converted folder: after a new checkpoint is
    packaged, the old conversion must not be used under its name. Converted once, kept while the
    checkpoint is the same, converted again (and only then replaced) when it changes."""
    import argparse

    import torch

    from finetune_lab._files import sha256_file
    from finetune_lab.models import trust
    from finetune_lab.train import hf_finetune

    size, _, state = tiny
    package = tmp_path / "package"
    _tiny_tokenizer(package, size.vocab)
    ckpt = package / "model.pt"

    def save(weights):
        torch.save({"model": {k: v.half() for k, v in weights.items()},
                    "args": argparse.Namespace(encoder_attention_heads=size.heads), "cfg": None},
                   ckpt)

    save(state)
    out = tmp_path / "work" / "hf" / "roberta-small-fr"
    monkeypatch.setenv(trust.TRUSTED_DIRS_ENV, str(tmp_path))
    monkeypatch.setattr(hf_finetune, "packaged_dir", lambda: package)
    monkeypatch.setattr(hf_finetune, "default_hf_dir", lambda: out)
    assert hf_finetune.ensure_converted() == out
    assert conversion_record.converted_from(out) == sha256_file(ckpt)
    first = (out / "model.safetensors").stat().st_mtime_ns
    hf_finetune.ensure_converted()
    assert (out / "model.safetensors").stat().st_mtime_ns == first  # same weights: kept

    save({k: v + 1 if v.is_floating_point() else v for k, v in state.items()})
    hf_finetune.ensure_converted()
    assert conversion_record.converted_from(out) == sha256_file(ckpt)
    assert sorted(p.name for p in out.parent.iterdir()) == ["roberta-small-fr"]  # no temp left
