"""``finetune-lab lora-qa``: fallbacks, the EOS-preserving collator, and a CPU run end to end."""

from __future__ import annotations

import json

import pytest

from finetune_lab.book import lora_qa_report
from finetune_lab.data.qa_prompts import CausalLMCollator, QAPair, encode_faq, faq_path, load_faq
from finetune_lab.errors import UserError
from finetune_lab.models.bloom import make_tiny_bloom
from finetune_lab.models.four_bit import bitsandbytes_available
from finetune_lab.train import lora_qa


def test_plan_on_a_gpu_with_bitsandbytes_is_the_labs():
    plan = lora_qa.plan_run(cuda=True, bnb=True, bf16_ok=True)
    assert plan.use_4bit and plan.optim == "paged_adamw_8bit" and plan.mixed_precision == "bf16"
    assert plan.fallbacks == []


def test_plan_on_cpu_records_every_fallback():
    plan = lora_qa.plan_run(cuda=False, bnb=True, bf16_ok=False)
    assert not plan.use_4bit and plan.optim == "adamw_torch" and plan.mixed_precision == "no"
    assert len(plan.fallbacks) == 3
    assert any("no CUDA" in f and "4-bit" in f for f in plan.fallbacks)


def test_plan_without_bitsandbytes_and_flags():
    plan = lora_qa.plan_run(cuda=False, bnb=False, bf16_ok=False)
    assert not plan.use_4bit and plan.optim == "adamw_torch"
    assert any("bitsandbytes is not installed" in f for f in plan.fallbacks)
    with pytest.raises(UserError, match="QLoRA on a GPU needs bitsandbytes"):
        lora_qa.plan_run(cuda=True, bnb=False, bf16_ok=True)  # not a silent downgrade
    no4 = lora_qa.plan_run(cuda=True, bnb=False, bf16_ok=True, no_4bit=True)
    assert not no4.use_4bit and no4.optim == "adamw_torch" and no4.mixed_precision == "bf16"
    assert lora_qa.plan_run(cuda=False, bnb=True, bf16_ok=False, force_4bit=True).use_4bit
    assert not lora_qa.plan_run(cuda=True, bnb=True, bf16_ok=True, no_4bit=True).use_4bit
    with pytest.raises(UserError):
        lora_qa.plan_run(no_4bit=True, force_4bit=True)


def test_report_without_runs_says_so_and_shows_the_labs_recipe(tmp_path):
    assert lora_qa_report.cached_runs(tmp_path) is None
    assert lora_qa_report.runs_markdown(None).startswith("**This run has not been made** (@nte-bloom)")
    recipe = lora_qa_report.recipe_table().set_index("setting")["value"]
    assert recipe["max_steps"] == "80" and recipe["optim"] == "paged_adamw_8bit"
    assert recipe["generation: temperature"] == "0.7"
    # transformers 5 has no warmup_ratio: the lab's 0.05 is a float warmup_steps, rounded up
    assert "warmup_ratio" not in recipe.index
    assert recipe["warmup_steps"] == "0.05 (a ratio: 4 of the 80 updates)"


def test_collator_keeps_eos_as_a_target_when_pad_is_eos():
    eos = 2
    batch = CausalLMCollator(pad_id=eos)([{"input_ids": [5, 6, eos]},
                                          {"input_ids": [7, eos]}])
    assert batch["labels"].tolist() == [[5, 6, eos], [7, eos, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_bloom(tmp_path_factory.mktemp("tiny-bloom"))


def test_encode_faq_ends_every_example_with_eos(tiny_model):
    tok = lora_qa.load_tokenizer(str(tiny_model))
    assert tok.eos_token == "</s>" and tok.eos_token_id == 2  # BLOOM's ids
    pairs = load_faq()
    examples, truncated = encode_faq(tok, pairs, max_length=512)
    assert truncated == 0 and len(examples) == 79
    assert all(e["input_ids"][-1] == 2 and 2 not in e["input_ids"][:-1] for e in examples)
    short, truncated = encode_faq(tok, [QAPair("q " * 50, "a " * 50)], max_length=16)
    assert truncated == 1 and len(short[0]["input_ids"]) == 16 and short[0]["input_ids"][-1] == 2


def _check_run(run_dir, steps, questions=2):
    from finetune_lab.runs.registry import validate_run
    from finetune_lab.runs.tblogs import run_scalars

    rec = validate_run(run_dir)
    assert rec.valid, rec.problems
    man = rec.manifest
    assert man["status"] == "complete" and man["framework"] == "transformers"
    assert man["experiment"] == "lora-qa" and man["init"] == "random"
    assert man["inputs"]["data"][0]["path"].endswith("qa/ecommerce-faq.en.json")
    assert man["inputs"]["checkpoint"] is not None
    assert man["hyperparameters"]["training"]["max_steps"] == steps
    assert man["hyperparameters"]["lora"]["target_modules"] == ["query_key_value"]
    assert man["extra"]["trainable_params"] == 2 * 16 * (64 + 192)
    scalars = run_scalars(rec)
    loss = scalars[(scalars["subset"] == "train") & (scalars["tag"] == "loss")]
    assert sorted(loss["step"]) == list(range(1, steps + 1))
    assert {"learning_rate", "grad_norm"} <= set(scalars["tag"])
    gens = json.loads((run_dir / lora_qa.GENERATIONS_FILE).read_text())
    assert len(gens["before"]) == len(gens["after"]) == questions
    assert gens["before"][0]["question"] == load_faq()[0].question
    return man


@pytest.mark.slow
def test_lora_qa_runs_on_cpu_end_to_end(tiny_model, tmp_path):
    import torch

    from finetune_lab.cli import main

    steps = 2
    code = main(["lora-qa", "--model", str(tiny_model), "--runs-root", str(tmp_path),
                 "--max-steps", str(steps), "--max-new-tokens", "4", "--questions", "2",
                 "--run", "cpu-test", "--no-4bit", "--faq", str(faq_path())])
    assert code == 0
    man = _check_run(tmp_path / "lora-qa" / "cpu-test", steps)
    assert man["hyperparameters"]["quantization"] is None
    fallbacks = " ".join(man["extra"]["fallbacks"])
    assert "--no-4bit" in fallbacks and "max_steps 2" in fallbacks
    if not torch.cuda.is_available():
        assert man["hyperparameters"]["training"]["optim"] == "adamw_torch"
        assert "paged_adamw_8bit -> adamw_torch" in fallbacks
    # what the chapter shows of it
    loaded = lora_qa_report.cached_runs(tmp_path)
    row = lora_qa_report.runs_summary(loaded).iloc[0]
    assert row["run"] == "cpu-test" and row["steps"] == steps and not row["4-bit"]
    assert row["fallbacks"] == len(man["extra"]["fallbacks"])
    text = lora_qa_report.runs_markdown(loaded)
    assert text.startswith("1 valid run of `lora-qa` is recorded") and "- `cpu-test` (random-weight model): " in text
    gens = lora_qa_report.generations_table(loaded.used[0])
    assert gens["question"].tolist() == [p.question for p in load_faq()[:2]]


@pytest.mark.slow
@pytest.mark.skipif(not bitsandbytes_available(), reason="bitsandbytes missing")
def test_qlora_4bit_runs_on_cpu_with_bitsandbytes(tiny_model, tmp_path):
    steps = 1
    run_dir = lora_qa.run_lora_qa(str(tiny_model), run="qlora-cpu", runs_root=tmp_path,
                                  force_4bit=True, max_steps=steps, max_new_tokens=2,
                                  n_questions=1)
    man = _check_run(run_dir, steps, questions=1)
    assert man["hyperparameters"]["quantization"]["bnb_4bit_quant_type"] == "nf4"
    assert any("--force-4bit" in f for f in man["extra"]["fallbacks"])
