"""The pretraining chapter's numbers for a continued checkpoint: tokens add up over its lineage."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from finetune_lab import pretrain_report as pr

LINEAGE = [{"run": "data/runs/pretrain/cpu-seed1", "updates": 1600, "tokens": 6_553_600},
           {"run": "data/runs/pretrain/cpu-seed1-c1", "updates": 400, "tokens": 1_638_400}]


def _facts(lineage):
    return {"run": "pretrain/cpu-seed1-c1", "device": "CPU: x (2 cores)", "updates": 400,
            "tokens_seen": 1_638_400, "wall_time_min": 30.0, "valid_loss_bits": 8.0,
            "valid_reviews_loss_bits": 9.0, "corpus_blocks": 3_200, "tokens_per_sample": 256,
            "samples_seen": 6_400, "unigram_bits": 10.0, "lineage": lineage,
            "tokens_total": sum(s["tokens"] for s in lineage)}


def test_training_text_counts_every_run_behind_the_weights():
    text = pr.training_text(_facts(LINEAGE))
    assert "continued from the weights of `data/runs/pretrain/cpu-seed1` (1,600 updates)" in text
    assert "8.2 M tokens in all" in text
    assert "2.00 passes over its training corpus (3,200 samples of 256 tokens" in text
    assert "perplexity of 256" in text and "reviews it is 9.00 bits (perplexity 512)" in text
    assert "scores 10.00 bits" in text and "the context is worth 2.00 bits" in text
    single = pr.training_text(_facts(LINEAGE[1:]))
    assert "continued" not in single and "2.00 passes" in single
    assert "No pretraining run" in pr.training_text({})


def test_corpus_size_is_read_from_the_run_log_and_matches_the_counts():
    """The committed first run's log against the counts of the corpus it read (before the
    reviews were upweighted): masked_lm cuts blocks of 255 tokens + <s>."""
    from finetune_lab.config import paths
    from finetune_lab.registry import validate_run

    rec = validate_run(paths().runs / "pretrain" / "cpu-seed1", check_inputs=False)
    assert pr.corpus_blocks(rec) == 211_196
    counts = {"tokens": 52_733_579, "paragraphs": 1_120_857, "documents": 431}
    assert pr.expected_blocks(counts, 256) == 211_196
    assert pr.expected_blocks({**counts, "tokens": counts["tokens"] + 255}, 256) == 211_197
    # the continued run read the corpus the committed summary describes (reviews upweighted)
    summary = json.loads((paths().summaries / "data.json").read_text(encoding="utf-8"))
    rec = validate_run(paths().runs / "pretrain" / "cpu-seed1-c1", check_inputs=False)
    assert pr.corpus_blocks(rec) == pr.expected_blocks(summary["pretrain"]["counts"]["train"], 256)
    assert pr.corpus_blocks(rec) == 304_952


def _table(ci_low, n=2):
    import pandas as pd

    row = {"weights": "packaged checkpoint", "run": "`pretrain/a`", "updates (all runs)": 1600,
           "tokens (M, all runs)": 6.6, "valid loss, novels (bits)": 8.93,
           "valid loss, reviews (bits)": None, "n fine-tuned": 3, "test acc. (%)": "66.03",
           "minus random (points)": -3.0, "ci_low": -6.3, "ci_high": 0.2,
           "minus packaged (points)": None, "pk_low": None, "pk_high": None}
    cand = {**row, "weights": "candidate (not packaged)", "run": "`pretrain/b`",
            "updates (all runs)": 3900, "tokens (M, all runs)": 16.0,
            "valid loss, novels (bits)": 8.5, "valid loss, reviews (bits)": 9.1,
            "n fine-tuned": n, "test acc. (%)": "70.00", "minus random (points)": 1.0,
            "ci_low": ci_low, "ci_high": 5.0, "minus packaged (points)": 4.0, "pk_low": 1.5,
            "pk_high": 6.5}
    return pd.DataFrame([row, cand])


def test_candidate_text_packages_only_weights_that_beat_random():
    not_better = pr.candidate_text(_table(-2.0))
    assert "`pretrain/b` continued the weights for 2,300 more updates" in not_better
    assert "8.50 bits on the held-out novels, against 8.93" in not_better
    assert "9.10 bits on the held-out reviews" in not_better
    assert "+1.0 points against random" in not_better and "It is not packaged yet" in not_better
    assert "packaged checkpoint's fine-tuning it is +4.0 points (95 % Welch CI 1.5 to 6.5)" in not_better
    assert "a better starting point than the packaged checkpoint" in not_better
    worse = _table(-2.0)
    worse.loc[1, "pk_low"] = -0.5
    assert "margin over neither" in pr.candidate_text(worse, "2 runs")
    assert "(2 runs)" in pr.candidate_text(worse, "2 runs")
    bumped = _table(-2.0)
    bumped["first valid"] = [None, (250, 9.03)]
    bumped["started at"] = [None, 8.93]
    assert ("first validation (update 250), after a fresh warm-up to the peak learning rate, "
            "read 9.03 bits, against the 8.93 its weights started from; the rest of the run had "
            "to win that back") in pr.candidate_text(bumped)
    assert "first valid" not in pr.candidate_display(bumped).columns
    better = pr.candidate_text(_table(0.5))  # +1.0 points, interval above 0
    assert "beats random by a margin the seeds show, but by less than the 5 points" in better
    assert "more pretraining comes first" in better and "is the next step" not in better
    winner = _table(0.5)
    winner.loc[1, "minus random (points)"] = 6.0
    assert "and by at least 5 points: packaging it" in pr.candidate_text(winner)
    assert "not been fine-tuned yet" in pr.candidate_text(_table(None, n=0))
    assert "no other weights" in pr.candidate_text(_table(0.5).iloc[0:0])
    shown = pr.candidate_display(_table(-2.0)).set_index("weights")
    assert shown.loc["candidate (not packaged)", "minus random (points)"] == "+1.00 (CI -2.00 to 5.00)"
    assert shown.loc["packaged checkpoint", "valid loss, reviews (bits)"] == "n/a"
    assert shown.loc["packaged checkpoint", "minus packaged (points)"] == "n/a"


def test_a_continued_run_is_drawn_after_its_ancestors():
    assert pr.update_offset({"extra": {"continued_from": {"lineage": LINEAGE}}}) == 2000
    assert pr.update_offset({"extra": {"calibration": None}}) == 0


def test_unigram_entropy_of_a_dictionary(tmp_path):
    (tmp_path / "dict.txt").write_text("a 2\nb 1\nc 1\n", encoding="utf-8")
    assert pr.unigram_bits(tmp_path / "dict.txt") == 1.5  # -(1/2 log 1/2 + 2 * 1/4 log 1/4)
    assert pr.unigram_bits(tmp_path / "missing.txt") is None


def test_replacement_cost_counts_the_runs_built_on_the_checkpoint():
    from types import SimpleNamespace as NS

    runs = [NS(experiment="fairseq", manifest={"wall_time_s": 1800}),
            NS(experiment="lora", manifest={"wall_time_s": 3600}),
            NS(experiment="lora", manifest={"wall_time_s": 1800})]
    assert pr.replacement_cost(runs) == "3 runs: 1 fairseq, 2 lora; 2.0 h of recorded run time"


def test_the_committed_runs_on_the_checkpoint_are_the_pretrained_ones():
    """fairseq pretrained, Transformers pretrained and LoRA runs; never random, never pretraining."""
    recs = pr.runs_on_checkpoint()
    assert recs and all(r.init != "random" for r in recs)
    assert {r.experiment for r in recs} <= {"fairseq", "transformers", "lora"}


def test_each_candidate_has_its_own_experiment(tmp_path):
    """``fairseq-candidate``, then ``-2``, ``-3``…: never a folder of an earlier candidate, and
    never a look-alike (``fairseq-candidates``, ``fairseq-candidate-old``)."""
    from finetune_lab.finetune_fairseq import (candidate_experiments, candidate_index,
                                               next_candidate_experiment)

    assert next_candidate_experiment(tmp_path) == "fairseq-candidate"
    for name in ("fairseq-candidate-10", "fairseq-candidate", "fairseq-candidate-2",
                 "fairseq-candidates", "fairseq-candidate-old", "fairseq"):
        (tmp_path / name).mkdir()
    assert candidate_experiments(tmp_path) == [
        "fairseq-candidate", "fairseq-candidate-2", "fairseq-candidate-10"]
    assert next_candidate_experiment(tmp_path) == "fairseq-candidate-11"
    assert [candidate_index(n) for n in ("fairseq", "fairseq-candidate-old")] == [None, None]
    text = pr.candidate_text(_table(None, n=0), runs_root=tmp_path)
    assert "--experiment fairseq-candidate-11`" in text


def test_throughput_table_names_each_runs_precision_and_updates_done():
    table = pr.throughput_table(pr.load_pretrain_runs()).set_index("run")
    assert table.loc["cpu-seed1", "precision"] == "fp32"
    assert table.loc["cpu-seed1", "updates"] == 1600 and table.loc["cpu-seed1-c1", "updates"] == 2299


def test_the_committed_ablations_compare_at_equal_wall_time():
    """The recorded ablations (data/runs/pretrain-ablation): one row per config, in the configs'
    order, the first the baseline; what the chapter reads from them."""
    from finetune_lab.pretrain_ablations import ABLATIONS

    table = pr.ablation_table(pr.load_ablations())
    assert table["ablation"].tolist() == list(ABLATIONS)
    assert (table["minus fp32-dropout, reviews"].iloc[0], table["threads"].max()) == (0.0, 1.0)
    # same training time: the wall times (validation included) agree within a minute and a half
    assert table["wall time (min)"].max() - table["wall time (min)"].min() < 1.5
    rows = table.set_index("ablation")
    assert rows.loc["bf16-dropout", "tokens/s"] > 1.2 * rows.loc["fp32-dropout", "tokens/s"]
    reading = pr.ablation_reading(table)
    ratio = rows.loc["bf16-dropout", "tokens/s"] / rows.loc["fp32-dropout", "tokens/s"]
    assert f"bf16 ran {ratio:.2f} times as fast as fp32" in reading
    assert f"is `{pr.best_ablation(table)}`'s" in reading
    shown = pr.ablation_display(table)
    assert shown.loc[0, "minus fp32-dropout, novels"] == "+0.000"
    assert "no ablation run yet" in pr.ablation_display(pr.ablation_table(None)).iloc[0, 0]


def test_the_committed_long_run_is_one_curve_over_its_launches():
    """`pretrain/cpu-long` ran in several launches, killed in between: the chapter reads it as
    one run with one learning-rate schedule (one warm-up) and each update once."""
    runs = pr.load_pretrain_runs()
    rec = {r.name: r for r in pr.long_runs(runs)}["cpu-long"]
    assert rec.valid, rec.reason
    launches = pr.segments_table(rec)
    assert len(launches) >= 2 and launches["ended"].iloc[-1] == "complete"
    assert "interrupted" in launches["ended"].tolist()
    curves = pr.curves(runs)
    lr = curves[(curves["run"] == rec.name) & (curves["tag"] == "lr")].sort_values("step")
    every = rec.manifest["hyperparameters"]["log_interval"]
    assert lr["step"].is_unique and lr["step"].diff().dropna().eq(every).all()
    assert 0 <= rec.manifest["updates_done"] - lr["step"].iloc[-1] < every
    warmup = rec.manifest["hyperparameters"]["warmup_updates"]
    after = lr[lr["step"] > warmup]["value"]
    assert (after.diff().dropna() <= 1e-12).all()  # decays only: no second warm-up
    text = pr.long_run_markdown(runs)
    assert "It is complete" in text and "are task-adaptive" in text
    assert "{#tbl-long-run-launches}" in text


def test_accuracy_against_tokens_draws_every_fine_tuned_weights():
    import matplotlib

    matplotlib.use("Agg")
    runs = pr.load_pretrain_runs()
    table = pr.candidate_table(runs)
    tuned = table[table["acc mean"].notna()]
    fig = pr.plot_accuracy_vs_tokens(table, pr.random_accuracy())
    ax = fig.axes[0]
    drawn = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert sum(len(c.lines[0].get_xdata()) for c in drawn) == len(tuned) >= 2
    mean, std, n = pr.random_accuracy()
    assert n == 3 and 60 < mean < 80 and std > 0
    assert "yes: saw the CLS-Books training texts" in table["task-adaptive"].tolist()


def _tb_run(root, experiment, name, losses, manifest, reviews=None):
    """A run folder with real TensorBoard files, as fairseq writes them (one folder a subset)."""
    from torch.utils.tensorboard import SummaryWriter

    from finetune_lab.registry import RunRecord

    path = root / experiment / name
    for subset, values in (("valid", losses), ("valid1", reviews or {})):
        if values:
            with SummaryWriter(str(path / subset)) as w:
                for step, value in values.items():
                    w.add_scalar("loss", value, step)
    problems = [] if manifest["status"] == "complete" else [f"status is {manifest['status']!r}"]
    return RunRecord(path, experiment, name, manifest, problems)


def test_plateau_table_puts_tokens_over_the_lineage_and_finds_the_escape(tmp_path):
    cpu = _tb_run(tmp_path, "pretrain", "cpu-c1", {250: 9.0, 500: 8.9},
                  {"status": "complete", "hyperparameters": {"tokens_per_update": 4096, "lr": 5e-4},
                   "extra": {"continued_from": {"lineage": LINEAGE}}},
                  reviews={250: 9.5, 500: 9.4})
    gpu = _tb_run(tmp_path, "pretrain-gpu", "gpu2", {1000: 8.7, 2000: 5.3, 3000: 4.1},
                  {"status": "failed", "error": "interrupted (signal 15)",
                   "hyperparameters": {"tokens_per_update": 65536, "num_workers": 10}})
    running = _tb_run(tmp_path, "pretrain", "long", {250: 9.2},
                      {"status": "running", "hyperparameters": {"tokens_per_update": 4096}})
    curves = pr.token_curves([cpu, gpu])
    mine = curves[curves["run"] == "pretrain/cpu-c1"]
    assert mine["tokens"].tolist() == [8_192_000 + 250 * 4096, 8_192_000 + 500 * 4096]
    table = pr.plateau_table([cpu, gpu, running], unigram=10.0).set_index("run")
    assert table.loc["`pretrain/cpu-c1`", "weights"] == "kept"
    assert pd.isna(table.loc["`pretrain/cpu-c1`", "left the plateau at (M tokens)"])
    assert table.loc["`pretrain/cpu-c1`", "reviews (bits)"] == pytest.approx(9.4)
    # 5.3 is the first loss 3 bits under the unigram entropy: at update 2000
    assert table.loc["`pretrain-gpu/gpu2`", "left the plateau at (M tokens)"] == pytest.approx(
        2000 * 65536 / 1e6)
    assert table.loc["`pretrain-gpu/gpu2`", "weights"] == "lost"
    assert table.loc["`pretrain-gpu/gpu2`", "status"] == "failed: interrupted (signal 15)"
    assert table.loc["`pretrain-gpu/gpu2`", "loaders"] == 10
    assert table.loc["`pretrain/long`", "weights"] == "in progress"
    shown = pr.plateau_display(table.reset_index()).set_index("run")
    assert shown.loc["`pretrain/cpu-c1`", "left the plateau at (M tokens)"] == "not yet"
    assert shown.loc["`pretrain-gpu/gpu2`", "left the plateau at (M tokens)"] == "131"
