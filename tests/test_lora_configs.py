"""The lab's two configs as package code, and Question 2's field table read from peft."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from finetune_lab.models import lora_configs as lc


def test_lora_config_holds_the_labs_values():
    cfg = lc.lora_config()
    assert cfg.r == 16 and cfg.lora_alpha == 32 and cfg.lora_dropout == 0.05
    assert set(cfg.target_modules) == {"query_key_value"}
    assert cfg.bias == "none"
    assert str(getattr(cfg.task_type, "value", cfg.task_type)) == "CAUSAL_LM"


def test_lora_config_overrides_one_field_only():
    cfg = lc.lora_config(r=4)
    assert cfg.r == 4 and cfg.lora_alpha == 32


def test_bnb_config_is_4bit_nf4_double_quant_bf16():
    cfg = lc.bnb_config()
    assert cfg.load_in_4bit and not cfg.load_in_8bit
    assert cfg.bnb_4bit_quant_type == "nf4"
    assert cfg.bnb_4bit_use_double_quant is True
    assert cfg.bnb_4bit_compute_dtype == torch.bfloat16


def test_field_table_defaults_are_peft_defaults():
    from peft import LoraConfig

    table = lc.lora_field_table().set_index("field")
    default = LoraConfig()
    assert list(table.index) == list(lc.DEMONSTRATED_FIELDS)
    assert table.loc["r", "peft default"] == repr(default.r) == "8"
    assert table.loc["lora_alpha", "peft default"] == repr(default.lora_alpha)
    assert table.loc["bias", "peft default"] == "'none'"
    assert table.loc["r", "lab value"] == "16"
    assert table.loc["target_modules", "lab value"] == "['query_key_value']"
    assert table.loc["use_rslora", "lab value"] == "(default)"
    # the help text is peft's own metadata, not ours
    helps = {f.name: f.metadata.get("help") for f in dataclasses.fields(LoraConfig)}
    assert table.loc["r", "peft help"] == " ".join(helps["r"].split())
    assert all(table["peft help"].str.len() > 0)


def test_field_tables_cover_every_peft_field_once():
    from peft import LoraConfig

    every = [f.name for f in dataclasses.fields(LoraConfig)]
    shown = list(lc.lora_field_table()["field"]) + list(lc.other_lora_fields()["field"])
    assert sorted(shown) == sorted(every)
    assert "|" not in "".join(lc.other_lora_fields()["peft help"]).replace("\\|", "")


def test_unknown_field_is_an_error():
    with pytest.raises(KeyError, match="no_such_field"):
        lc.lora_field_table(("r", "no_such_field"))


def test_bnb_table_reads_transformers_docstring():
    table = lc.bnb_field_table().set_index("argument")
    assert table.loc["bnb_4bit_quant_type", "transformers default"] == "'fp4'"
    assert table.loc["bnb_4bit_quant_type", "lab value"] == "'nf4'"
    assert "nested quantization" in table.loc["bnb_4bit_use_double_quant", "transformers doc"]
    # the signature says None, but the constructor makes it float32: the effective default
    from transformers import BitsAndBytesConfig

    assert BitsAndBytesConfig().bnb_4bit_compute_dtype == torch.float32
    assert table.loc["bnb_4bit_compute_dtype", "transformers default"] == (
        "'float32' (None in the signature)")
    assert table.loc["bnb_4bit_compute_dtype", "lab value"] == "'bfloat16'"


def test_every_demonstrated_field_is_explained_in_the_books_words():
    table = lc.lora_field_table().set_index("field")
    assert set(lc.FIELD_MEANING) == set(lc.DEMONSTRATED_FIELDS)
    assert (table["what it does"].str.len() > 0).all()
    assert "before A" in table.loc["lora_dropout", "what it does"]


def test_first_sentence():
    assert lc.first_sentence("One thing. Two things.") == "One thing."
    assert lc.first_sentence("no stop") == "no stop"
