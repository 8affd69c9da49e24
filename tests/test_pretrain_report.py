"""The pretraining chapter's numbers for a continued checkpoint: tokens add up over its lineage."""

from __future__ import annotations

from finetune_lab import pretrain_report as pr

LINEAGE = [{"run": "data/runs/pretrain/cpu-seed1", "updates": 1600, "tokens": 6_553_600},
           {"run": "data/runs/pretrain/cpu-seed1-c1", "updates": 400, "tokens": 1_638_400}]


def _facts(lineage):
    return {"run": "pretrain/cpu-seed1-c1", "device": "CPU: x (2 cores)", "updates": 400,
            "tokens_seen": 1_638_400, "wall_time_min": 30.0, "valid_loss_bits": 8.0,
            "lineage": lineage, "tokens_total": sum(s["tokens"] for s in lineage)}


def test_training_text_counts_every_run_behind_the_weights():
    summary = {"pretrain": {"counts": {"train": {"tokens": 4_096_000}}}}
    text = pr.training_text(_facts(LINEAGE), summary)
    assert "continued from the weights of `data/runs/pretrain/cpu-seed1` (1,600 updates)" in text
    assert "8.2 M tokens in all" in text
    assert "2.00 passes over the training corpus" in text  # 8,192,000 / 4,096,000
    assert "perplexity of 256" in text
    single = pr.training_text(_facts(LINEAGE[1:]), summary)
    assert "continued" not in single and "0.40 passes" in single
    assert "No pretraining run" in pr.training_text({}, None)


def test_a_continued_run_is_drawn_after_its_ancestors():
    assert pr.update_offset({"extra": {"continued_from": {"lineage": LINEAGE}}}) == 2000
    assert pr.update_offset({"extra": {"calibration": None}}) == 0
