"""Issue 14: whole-line samples and the ``<s>`` bag-of-words objective (the user dir's
``doc_objective``), on real tensors and in real fairseq runs on the tiny corpus."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import TINY_ARCH, needs_data_root, use_tiny_work_dir

from finetune_lab.train import pretrain_long
from finetune_lab.train.pretrain_fairseq import fairseq_args
from finetune_lab.train.pretrain_recipe import PretrainRecipe


def test_bag_of_words_counts_kept_tokens_per_row():
    from finetune_lab.models.fairseq_user_dir.doc_objective import bag_of_words

    keep = torch.ones(8, dtype=torch.bool)
    keep[[0, 1, 2]] = False  # <s>, <pad>, </s>
    tokens = torch.tensor([[0, 5, 6, 6, 2, 1], [0, 2, 1, 1, 1, 1]])
    bag = bag_of_words(tokens, 8, keep)
    assert bag[0].tolist() == pytest.approx([0, 0, 0, 0, 0, 1 / 3, 2 / 3, 0])
    assert bag[1].sum() == 0  # an empty line has no bag (and no weight in the loss)


def test_whole_lines_and_the_bag_reach_fairseq(tmp_path):
    plain = fairseq_args(tmp_path, tmp_path, PretrainRecipe(), seed=1, device="cpu",
                         precision="fp32")
    assert plain[plain.index("--task") + 1] == "masked_lm"
    assert plain[plain.index("--criterion") + 1] == "masked_lm"
    assert plain[plain.index("--batch-size") + 1] == "16" and "--max-tokens" not in plain
    docs = fairseq_args(tmp_path, tmp_path, PretrainRecipe(sample_break_mode="eos", bow_weight=4),
                        seed=1, device="cpu", precision="fp32")
    assert docs[docs.index("--task") + 1] == "masked_lm_docs"
    assert docs[docs.index("--criterion") + 1] == "masked_lm_bow"
    assert docs[docs.index("--sample-break-mode") + 1] == "eos"
    assert docs[docs.index("--max-tokens") + 1] == str(256 * 16)
    assert docs[docs.index("--bow-weight") + 1] == "4"


def test_the_bag_needs_whole_lines(capsys):
    from finetune_lab.cli import main

    assert main(["pretrain", "--tokens", "1e4", "--run", "x", "--bow-weight", "4"]) == 2
    assert "--bow-weight needs --sample-break-mode eos" in capsys.readouterr().err


def _first_losses(run_dir: Path) -> dict[str, float]:
    """``loss`` and ``bow_loss`` of the first ``train_inner`` line (update 1, before any step)."""
    for line in (run_dir / "train.log").read_text().splitlines():
        if "| train_inner |" in line:
            return {k: float(v) for k, v in re.findall(r"\b(loss|bow_loss)=([0-9.]+)", line)}
    raise AssertionError("no train_inner line")


def _run(tiny_pipeline, corpus, tmp_path, monkeypatch, run, **recipe_kw):
    use_tiny_work_dir(tiny_pipeline, tmp_path, monkeypatch)
    recipe = PretrainRecipe(tokens_per_sample=64, batch_size=8, validate_every=10,
                            log_interval=1, lr=1e-3, arch=TINY_ARCH, dropout=0.0,
                            attention_dropout=0.0, **recipe_kw)
    return pretrain_long.pretrain_long(
        run=run, tokens=20 * 64 * 8, data_dir=corpus, recipe=recipe, precision="fp32",
        quiet=True, package_to=tmp_path / f"pkg-{run}")


@needs_data_root
@pytest.mark.slow
def test_the_bag_trains_s_and_leaves_the_logged_loss_the_masked_lms(
        tiny_pipeline, tiny_tapt_corpus, tmp_path, monkeypatch):
    corpus = tiny_tapt_corpus  # reviews only: many are longer than the 64-token samples
    bag = _run(tiny_pipeline, corpus, tmp_path, monkeypatch, "bag", sample_break_mode="eos",
               bow_weight=4.0)
    lines = _run(tiny_pipeline, corpus, tmp_path, monkeypatch, "lines", sample_break_mode="eos")
    log = (bag / "train.log").read_text()
    # every review is kept, cut after its <s> to the sample length (none dropped as too long)
    assert "invalid sizes" not in log and "skipped" not in log
    first_bag, first_lines = _first_losses(bag), _first_losses(lines)
    # same seed, same first batch: the logged loss is the masked LM's alone, not the sum
    assert "bow_loss" in first_bag and "bow_loss" not in first_lines
    assert first_bag["loss"] == pytest.approx(first_lines["loss"], rel=0.02)
    # the bag's loss falls as the run goes (tiny model, 20 updates: a tenth of a bit)
    bows = [float(v) for v in re.findall(r"\| train_inner \|.*?\bbow_loss=([0-9.]+)", log)]
    assert len(bows) == 20 and sum(bows[-5:]) / 5 < sum(bows[:5]) / 5 - 0.05
