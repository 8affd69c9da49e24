"""``finetune-lab reproduce`` runs the documented commands in a resumable order."""

from __future__ import annotations

import pytest

from finetune_lab import reproduce
from finetune_lab.errors import UserError


def test_with_a_checkpoint_the_tokenizer_is_adopted_not_retrained():
    steps = reproduce.plan(from_scratch=False, gpu=False, have_checkpoint=True,
                           pretrain_minutes=None)
    assert ["adopt-tokenizer"] in steps and ["train-tokenizer"] not in steps
    assert not any(s[0] == "pretrain" for s in steps)
    hf = next(s for s in steps if s[:2] == ["finetune", "transformers"])
    assert "random" not in hf  # random-init Transformers runs only with a GPU
    lora = next(s for s in steps if s[:2] == ["finetune", "lora"])
    # LoRA's full fine-tuning row is the Transformers pretrained runs, made one step earlier
    assert "full" not in lora and {"lora-qv", "lora-attn"} <= set(lora)
    assert "qlora-qv" in lora  # bitsandbytes' CPU kernels: no GPU needed
    assert steps.index(hf) < steps.index(lora)


def test_from_scratch_pretrains_with_the_budget_before_fine_tuning():
    steps = reproduce.plan(from_scratch=True, gpu=True, have_checkpoint=True,
                           pretrain_minutes=8)
    names = [s[0] if s[0] != "finetune" else f"finetune {s[1]}" for s in steps]
    assert names.index("train-tokenizer") < names.index("prepare-pretrain") \
        < names.index("pretrain") < names.index("finetune fairseq")
    assert ["pretrain", "--overwrite", "--minutes", "8"] in steps


def test_adopting_copies_the_checkpoint_tokenizer_once(tmp_path):
    ckpt, tok = tmp_path / "ckpt", tmp_path / "tok"
    ckpt.mkdir()
    (ckpt / "sentencepiece.bpe.model").write_bytes(b"spm")
    (ckpt / "dict.txt").write_text("a 1\n")
    assert reproduce.adopt_checkpoint_tokenizer(ckpt, tok) is True
    assert (tok / "spm.model").read_bytes() == b"spm" and (tok / "dict.txt").read_text() == "a 1\n"
    assert reproduce.adopt_checkpoint_tokenizer(ckpt, tok) is False


def test_adopting_from_an_incomplete_checkpoint_is_an_error(tmp_path):
    with pytest.raises(UserError, match="lacks"):
        reproduce.adopt_checkpoint_tokenizer(tmp_path, tmp_path / "tok")


def test_jobs_reach_the_fairseq_grid_only_when_asked():
    def grid(jobs: int) -> list[str]:
        steps = reproduce.plan(from_scratch=False, gpu=False, have_checkpoint=True,
                               pretrain_minutes=None, jobs=jobs)
        return next(s for s in steps if s[:2] == ["finetune", "fairseq"])

    assert grid(3)[-2:] == ["--jobs", "3"]
    assert "--jobs" not in grid(1)
    from finetune_lab.cli import build_parser

    assert build_parser().parse_args(["reproduce", "--jobs", "2"]).jobs == 2
