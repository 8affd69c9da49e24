"""The pretraining chapter's facts: tokens add up over a continued checkpoint's lineage, the
ablations, long runs and plateau read from the run cache, and each candidate's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from finetune_lab.book import fill_mask as fm
from finetune_lab.book import pretrain_candidates as pc
from finetune_lab.book import pretrain_curves as pcu
from finetune_lab.book import pretrain_plateau as pp
from finetune_lab.book import pretrain_report as pr
from finetune_lab.book import pretrain_replacement as prl

LINEAGE = [{"run": "data/runs/pretrain/cpu-seed1", "updates": 1600, "tokens": 6_553_600},
           {"run": "data/runs/pretrain/cpu-seed1-c1", "updates": 400, "tokens": 1_638_400}]


def test_facts_count_every_run_behind_the_weights():
    runs = pr.load_pretrain_runs()
    rec = {r.name: r for r in runs.used}["cpu-seed1-c1"]
    facts = pr.facts_of(runs, rec, LINEAGE)
    assert facts["tokens_total"] == 8_192_000 and facts["tokens_seen"] == 2299 * 4096
    assert facts["samples_seen"] == 2299 * 16
    assert facts["passes"] == pytest.approx(2299 * 16 / 304_952)
    assert pr.facts_of(runs, rec, LINEAGE[1:])["tokens_total"] == 2299 * 4096
    packaged = pr.run_facts(runs)
    assert packaged["run"] == f"{runs.latest.experiment}/{runs.latest.name}"
    assert packaged["context_bits"] == pytest.approx(
        pr.unigram_bits() - packaged["valid_loss_bits"])
    assert 0 < packaged["context_bits"] < packaged["unigram_bits"]


def test_corpus_size_is_read_from_the_run_log_and_matches_the_counts():
    """The committed first run's log against the counts of the corpus it read (before the
    reviews were upweighted): masked_lm cuts blocks of 255 tokens + <s>."""
    from finetune_lab.config import paths
    from finetune_lab.runs.registry import validate_run

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
    row = {"weights": "packaged checkpoint", "run": "`pretrain/a`", "task-adaptive": "no",
           "updates (all runs)": 1600,
           "tokens (M, all runs)": 6.6, "valid loss, novels (bits)": 8.93,
           "valid loss, reviews (bits)": None, "n fine-tuned": 3, "test acc. (%)": "66.03",
           "minus random (points)": -3.0, "ci_low": -6.3, "ci_high": 0.2,
           "minus packaged (points)": None, "pk_low": None, "pk_high": None,
           "own updates": 1600, "continued": None, "first valid": None, "started at": None}
    cand = {**row, "weights": "candidate (not packaged)", "run": "`pretrain/b`",
            "updates (all runs)": 3900, "tokens (M, all runs)": 16.0,
            "valid loss, novels (bits)": 8.5, "valid loss, reviews (bits)": 9.1,
            "n fine-tuned": n, "test acc. (%)": "70.00", "minus random (points)": 1.0,
            "ci_low": ci_low, "ci_high": 5.0, "minus packaged (points)": 4.0, "pk_low": 1.5,
            "pk_high": 6.5, "own updates": 2300, "continued": "pretrain/a"}
    return pd.DataFrame([row, cand])


def test_only_weights_that_beat_random_by_the_margin_are_packaged():
    assert pc.candidate_verdict(_table(-2.0).iloc[1]) == "beats the packaged"
    worse = _table(-2.0)
    worse.loc[1, "pk_low"] = -0.5
    assert pc.candidate_verdict(worse.iloc[1]) == "neither"
    assert pc.candidate_verdict(_table(0.5).iloc[1]) == "below the bar"  # +1.0 points
    winner = _table(0.5)
    winner.loc[1, "minus random (points)"] = pc.PACKAGE_MARGIN
    assert pc.candidate_verdict(winner.iloc[1]) == "package"
    winner.loc[1, "minus random (points)"] = pc.PACKAGE_MARGIN - 0.1
    assert pc.candidate_verdict(winner.iloc[1]) == "below the bar"
    assert pc.candidate_verdict(_table(None, n=0).iloc[1]) == "not fine-tuned"
    assert pc.candidate_verdict(_table(None, n=1).iloc[1]) == "one seed"
    table = _table(-2.0).assign(**{"acc mean": [66.03, 70.0], "acc std": [0.5, 1.0],
                                   "task-adaptive": ["no", "yes: saw them"],
                                   "samples": ["256-token stretches", "whole lines"],
                                   "bag weight": [0.0, 8.0]})
    tuning = pc.candidate_tuning_display(table).set_index("run")
    assert tuning.loc["`b`", "− random (points, CI)"] == "+1.0 (-2.0 to 5.0)"
    assert tuning.loc["`b`", "verdict"] == "beats the packaged, not random"
    assert tuning.loc["`a`", "verdict"] == "packaged"
    assert tuning.loc["`a`", "− packaged (points, CI)"] == "–"
    weights = pc.candidate_weights_display(table).set_index("run")
    assert weights.loc["`a`", "reviews (bits)"] == "–"
    assert weights.loc["`b`", "pretraining"] == "`<s>` objective, task texts"
    assert weights.loc["`a`", "pretraining"] == "masked LM, no task texts"
    assert "no weights tried" in pc.candidate_tuning_display(table.iloc[0:0]).iloc[0, 0]


def test_a_fresh_warm_up_costs_what_the_first_validation_shows():
    def cost(first, ended=8.5):
        table = _table(-2.0)
        table["first valid"] = [None, first]
        table["started at"] = [None, 8.93]
        table.loc[1, "valid loss, novels (bits)"] = ended
        return pc.warmup_cost(table.iloc[1])

    assert cost((250, 9.03)) == "won back"  # worse at first, ended under 8.93
    assert cost((250, 9.03), ended=9.0) == "not won back"
    assert cost((250, 8.90)) == "none"
    assert pc.warmup_cost(_table(-2.0).iloc[1]) is None  # no first validation known
    tapt = _table(-2.0)
    tapt["first valid"], tapt["started at"] = [None, (250, 9.03)], [None, 8.93]
    tapt["all task-adaptive"] = [False, True]  # trains on reviews: its novels' loss rises
    assert pc.warmup_cost(tapt.iloc[1]) is None


def test_a_continued_run_is_drawn_after_its_ancestors():
    assert pcu.update_offset({"extra": {"continued_from": {"lineage": LINEAGE}}}) == 2000
    assert pcu.update_offset({"extra": {"calibration": None}}) == 0


def test_unigram_entropy_of_a_dictionary(tmp_path):
    (tmp_path / "dict.txt").write_text("a 2\nb 1\nc 1\n", encoding="utf-8")
    assert pr.unigram_bits(tmp_path / "dict.txt") == 1.5  # -(1/2 log 1/2 + 2 * 1/4 log 1/4)
    assert pr.unigram_bits(tmp_path / "missing.txt") is None


def test_replacement_cost_counts_the_runs_built_on_the_checkpoint():
    from types import SimpleNamespace as NS

    runs = [NS(experiment="lora", manifest={"wall_time_s": 3600}),
            NS(experiment="fairseq", manifest={"wall_time_s": 1800}),
            NS(experiment="lora", manifest={"wall_time_s": 1800})]
    cost = prl.replacement_cost(runs)
    assert (cost.runs, cost.hours) == (3, 2.0)
    assert list(cost.by_experiment.items()) == [("fairseq", 1), ("lora", 2)]


def test_the_committed_runs_on_the_checkpoint_are_the_pretrained_ones():
    """fairseq pretrained, Transformers pretrained and LoRA runs, on the CPU and on a GPU (their
    ``-gpu`` experiments); never random, never pretraining."""
    recs = prl.runs_on_checkpoint()
    assert recs and all(r.init != "random" for r in recs)
    lab = {"fairseq", "transformers", "lora"}
    assert {r.experiment for r in recs} <= lab | {f"{e}-gpu" for e in lab}


def test_each_candidate_has_its_own_experiment(tmp_path):
    """``fairseq-candidate``, then ``-2``, ``-3``…: never a folder of an earlier candidate, and
    never a look-alike (``fairseq-candidates``, ``fairseq-candidate-old``)."""
    from finetune_lab.train.finetune_fairseq import (
        candidate_experiments,
        candidate_index,
        next_candidate_experiment,
    )

    assert next_candidate_experiment(tmp_path) == "fairseq-candidate"
    for name in ("fairseq-candidate-10", "fairseq-candidate", "fairseq-candidate-2",
                 "fairseq-candidates", "fairseq-candidate-old", "fairseq"):
        (tmp_path / name).mkdir()
    assert candidate_experiments(tmp_path) == [
        "fairseq-candidate", "fairseq-candidate-2", "fairseq-candidate-10"]
    assert next_candidate_experiment(tmp_path) == "fairseq-candidate-11"
    assert [candidate_index(n) for n in ("fairseq", "fairseq-candidate-old")] == [None, None]


def test_throughput_table_names_each_runs_precision_and_updates_done():
    table = pcu.throughput_table(pr.load_pretrain_runs()).set_index("run")
    assert table.loc["cpu-seed1", "precision"] == "fp32"
    assert table.loc["cpu-seed1", "updates"] == 1600 and table.loc["cpu-seed1-c1", "updates"] == 2299
    # every committed run of the experiment ran on a CPU: no MFU column, which would say nothing
    assert "MFU (bf16 peak)" not in table
    from finetune_lab.runs.tblogs import load_experiments

    gpu = pr.PretrainRuns(loaded=load_experiments(["pretrain-gpu"]), checkpoint=None)
    assert pcu.throughput_table(gpu).set_index("run").loc["gpu", "MFU (bf16 peak)"] == "2.0 %"


def test_the_committed_ablations_compare_at_equal_wall_time():
    """The recorded ablations (data/runs/pretrain-ablation): one row per config, in the configs'
    order, the first the baseline; what the chapter reads from them."""
    from finetune_lab.train.pretrain_ablations import ABLATIONS

    table = pr.ablation_table(pr.load_ablations())
    assert table["ablation"].tolist() == list(ABLATIONS)
    assert (table["minus fp32-dropout, reviews"].iloc[0], table["threads"].max()) == (0.0, 1.0)
    # same training time: the wall times (validation included) agree within a minute and a half
    assert table["wall time (min)"].max() - table["wall time (min)"].min() < 1.5
    rows = table.set_index("ablation")
    assert rows.loc["bf16-dropout", "tokens/s"] > 1.2 * rows.loc["fp32-dropout", "tokens/s"]
    reading = pr.ablation_reading(table)
    assert reading.bf16_speedup == pytest.approx(
        rows.loc["bf16-dropout", "tokens/s"] / rows.loc["fp32-dropout", "tokens/s"])
    assert reading.bf16_token_ratio == pytest.approx(
        rows.loc["bf16-dropout", "tokens (M)"] / rows.loc["fp32-dropout", "tokens (M)"])
    reviews = table["valid loss, reviews (bits)"]
    assert (reading.held_out, reading.best) == ("reviews", pr.best_ablation(table))
    assert reading.best_bits == reviews.min() and reading.best == rows.index[reviews.argmin()]
    assert reading.spread_bits == pytest.approx(reviews.max() - reviews.min())
    assert reading.budgets_min == (8.0,) and reading.threads == 1.0
    assert reading.most_tokens_m == table["tokens (M)"].max()
    assert pr.ablation_reading(pr.ablation_table(None)) is None
    shown = pr.ablation_display(table)
    assert shown.loc[0, "minus fp32-dropout, novels"] == "+0.000"
    assert "no ablation run yet" in pr.ablation_display(pr.ablation_table(None)).iloc[0, 0]


def test_the_committed_long_run_is_one_curve_over_its_launches():
    """`pretrain/cpu-long` ran in several launches, killed in between: the chapter reads it as
    one run with one learning-rate schedule (one warm-up) and each update once."""
    runs = pr.load_pretrain_runs()
    rec = {r.name: r for r in pcu.long_runs(runs)}["cpu-long"]
    assert rec.valid, rec.reason
    launches = pcu.segments_table(rec)
    assert len(launches) >= 2 and launches["ended"].iloc[-1] == "complete"
    assert "killed" in launches["ended"].tolist()
    # the killed launches' minutes count in the run's (check 24b's M-j3: 51.1 min without them)
    walls = [s["wall_time_s"] for s in rec.manifest["segments"]]
    assert all(walls) and sum(walls) == pytest.approx(rec.manifest["wall_time_s"])
    speed = pcu.throughput_table(runs).set_index("run")
    assert float(speed.loc["cpu-long", "wall time (min)"]) == pytest.approx(sum(walls) / 60, abs=0.05)
    curves = pcu.curves(runs)
    lr = curves[(curves["run"] == rec.name) & (curves["tag"] == "lr")].sort_values("step")
    every = rec.manifest["hyperparameters"]["log_interval"]
    assert lr["step"].is_unique and lr["step"].diff().dropna().eq(every).all()
    assert 0 <= rec.manifest["updates_done"] - lr["step"].iloc[-1] < every
    warmup = rec.manifest["hyperparameters"]["warmup_updates"]
    after = lr[lr["step"] > warmup]["value"]
    assert (after.diff().dropna() <= 1e-12).all()  # decays only: no second warm-up
    facts = {f.name: f for f in pcu.long_run_facts(runs)}["pretrain/cpu-long"]
    assert (facts.status, facts.launches) == ("complete", len(launches))
    assert facts.budget_tokens == facts.updates * facts.tokens_per_update == facts.tokens_done
    assert facts.tapt_tokens == (facts.updates - facts.tapt_from) * facts.tokens_per_update > 0
    assert facts.tokens_before == 6_553_600  # the packaged weights it continues
    assert "no long run yet" in pcu.segments_table(None).iloc[0, 0]


def test_accuracy_against_tokens_draws_every_fine_tuned_weights():
    import matplotlib

    matplotlib.use("Agg")
    runs = pr.load_pretrain_runs()
    table = pc.candidate_table(runs)
    tuned = table[table["acc mean"].notna()]
    fig = pc.plot_accuracy_vs_tokens(table, pc.random_accuracy())
    ax = fig.axes[0]
    drawn = [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert sum(len(c.lines[0].get_xdata()) for c in drawn) == len(tuned) >= 2
    # each point is named, and no two names overlap (Figure A.3 named none)
    names = sorted(t.get_text() for t in ax.texts)
    assert "gpu4" in names and "cpu-long3 @2,750" in names and len(names) == len(tuned)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    mean, std, n = pc.random_accuracy()
    assert n == 3 and 60 < mean < 80 and std > 0
    assert "yes: saw the CLS-Books training texts" in table["task-adaptive"].tolist()
    # the run each row names is read from its manifest: cpu-tapt1 was all task-adaptive,
    # without dropout; cpu-long2 only in its second half
    row = table[table["run"].str.startswith("`pretrain/cpu-tapt1`")].iloc[0]
    assert (row["all task-adaptive"], row["dropout"]) == (True, 0.0)
    row = table[table["run"].str.startswith("`pretrain/cpu-long2`")].iloc[0]
    assert (row["task-adaptive"].startswith("yes"), row["all task-adaptive"]) == (True, False)
    # every candidate's verdict is one the chapter words
    verdicts = {pc.candidate_verdict(row) for _, row in table.iloc[1:].iterrows()}
    assert verdicts and verdicts <= {"not fine-tuned", "one seed", "package", "below the bar",
                                     "beats the packaged", "neither", "continued"}
    # the weights the packaged checkpoint went on from keep their row when a candidate
    # experiment fine-tuned them, marked as such; the packaged run itself is not a candidate
    lineage = {str(step["run"]).split("data/runs/")[-1] for step in runs.checkpoint["lineage"]}
    for _, row in table.iloc[1:].iterrows():
        run = row["run"].strip("`").split("`")[0]
        assert (row["weights"] == pc.CONTINUED) == (run in lineage)
        assert (pc.candidate_verdict(row) == "continued") == (run in lineage)
        assert run != f"{runs.latest.experiment}/{runs.latest.name}"
    tuned_behind = lineage & pc.fine_tuned_sources() - {
        f"{runs.latest.experiment}/{runs.latest.name}"}
    shown = {r.strip("`").split("`")[0] for r in table["run"]}
    assert tuned_behind and tuned_behind <= shown


def test_fill_mask_reading_counts_the_frequent_top_predictions(monkeypatch):
    monkeypatch.setattr(fm, "frequent_pieces", lambda n: {".", ",", "de"})
    a, b, c, d = ("Un <mask> de plus.", "La porte <mask>.", "Le <mask> de la porte.",
                  "Ce livre est <mask>.")
    df = pd.DataFrame({"sentence": [a, a, b, b, c, d], "rank": [1, 2, 1, 2, 1, 1],
                       "predicted piece": [".", "livre", "Porte", ",", "de", "livres"],
                       "probability": [0.1, 0.05, 0.2, 0.1, 0.3, 0.2]})
    # "de" repeats a word of its sentence and is frequent; "Porte" repeats one (case aside);
    # "livres" is not "livre"; "." is never a copy
    assert fm.fill_mask_reading(df, n=3) == {"sentences": 4, "frequent": 2, "n": 3, "copied": 2}
    wide = fm.fill_mask_wide(df).set_index("sentence")
    assert wide.loc[a, "top predictions (probability)"] == "`.` (0.10) · `livre` (0.05)"


def _tb_run(root, experiment, name, losses, manifest, reviews=None):
    """A run folder with real TensorBoard files, as fairseq writes them (one folder a subset)."""
    from torch.utils.tensorboard import SummaryWriter

    from finetune_lab.runs.registry import RunRecord

    path = root / experiment / name
    for subset, values in (("valid", losses), ("valid1", reviews or {})):
        if values:
            with SummaryWriter(str(path / subset)) as w:
                for step, value in values.items():
                    w.add_scalar("loss", value, step)
    problems = [] if manifest["status"] == "complete" else [f"status is {manifest['status']!r}"]
    return RunRecord(path, experiment, name, manifest, problems)


def test_plateau_table_puts_tokens_over_the_lineage_and_finds_the_escape(tmp_path, monkeypatch):
    cpu = _tb_run(tmp_path, "pretrain", "cpu-c1", {250: 9.0, 500: 8.9},
                  {"status": "complete", "hyperparameters": {"tokens_per_update": 4096, "lr": 5e-4},
                   "extra": {"continued_from": {"lineage": LINEAGE}}},
                  reviews={250: 9.5, 500: 9.4})
    gpu = _tb_run(tmp_path, "pretrain-gpu", "gpu2", {1000: 8.7, 2000: 5.3, 3000: 4.1},
                  {"status": "failed", "error": "interrupted (signal 15)",
                   "hyperparameters": {"tokens_per_update": 65536, "num_workers": 10}})
    running = _tb_run(tmp_path, "pretrain", "long", {250: 9.2},
                      {"status": "running", "hyperparameters": {"tokens_per_update": 4096}})
    elsewhere = _tb_run(tmp_path, "pretrain", "far", {250: 9.3},
                        {"status": "paused", "hyperparameters": {"tokens_per_update": 4096}})
    # both unfinished: said from the manifest alone, whatever state this machine holds (trial
    # 15's CF-n1: the page read data/work/pretrain-checkpoints, which no record hashes)
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    (tmp_path / "work" / "pretrain-checkpoints" / "long").mkdir(parents=True)
    (tmp_path / "work" / "pretrain-checkpoints" / "long" / "checkpoint_last.pt").write_bytes(b"x")
    assert pp.weights_state(elsewhere) == pp.weights_state(running) == pp.STRANDED
    curves = pp.token_curves([cpu, gpu])
    mine = curves[curves["run"] == "pretrain/cpu-c1"]
    assert mine["tokens"].tolist() == [8_192_000 + 250 * 4096, 8_192_000 + 500 * 4096]
    table = pp.plateau_table([cpu, gpu, running, elsewhere], unigram=10.0).set_index("run")
    assert table.loc["`pretrain/cpu-c1`", "weights"] == "kept"
    assert pd.isna(table.loc["`pretrain/cpu-c1`", "left the plateau at (M tokens)"])
    assert table.loc["`pretrain/cpu-c1`", "reviews (bits)"] == pytest.approx(9.4)
    # 5.3 is the first loss 3 bits under the unigram entropy: at update 2000
    assert table.loc["`pretrain-gpu/gpu2`", "left the plateau at (M tokens)"] == pytest.approx(
        2000 * 65536 / 1e6)
    assert table.loc["`pretrain-gpu/gpu2`", "weights"] == "lost"
    assert table.loc["`pretrain-gpu/gpu2`", "status"] == "failed: interrupted (signal 15)"
    assert table.loc["`pretrain-gpu/gpu2`", "loaders"] == 10
    assert table.loc["`pretrain/long`", "weights"] == pp.STRANDED
    shown = pp.plateau_display(table.reset_index()).set_index("run")
    assert shown.loc["`pretrain/cpu-c1`", "left the plateau at (M tokens)"] == "not reached"
    assert shown.loc["`pretrain-gpu/gpu2`", "left the plateau at (M tokens)"] == "131"
    seen = pp.plateau_facts(table.reset_index())
    assert (seen.runs, seen.stuck, seen.left, seen.left_lost) == (4, 3, 1, 1)
    assert seen.stuck_lowest_bits == pytest.approx(8.9)  # cpu-c1's last loss, under long's 9.2
    assert seen.stuck_most_tokens_m == pytest.approx((8_192_000 + 500 * 4096) / 1e6)
    assert seen.left_from_m == seen.left_to_m == pytest.approx(2000 * 65536 / 1e6)
    assert seen.left_best_bits == pytest.approx(4.1)
    assert seen.left_most_tokens_m == pytest.approx(3000 * 65536 / 1e6)
    assert seen.cpu_most_tokens_m == pytest.approx((8_192_000 + 500 * 4096) / 1e6)
    assert seen.stranded == ("pretrain/long", "pretrain/far")
    assert (seen.left_gpu, seen.left_cpu, seen.left_cpu_from_m) == (1, 0, None)
    assert seen.left_gpu_from_m == seen.left_gpu_to_m == pytest.approx(2000 * 65536 / 1e6)
    empty = pp.plateau_facts(pp.plateau_table([], unigram=10.0))
    assert (empty.runs, empty.left, empty.stuck_lowest_bits, empty.stranded) == (0, 0, None, ())


def test_a_run_in_progress_is_judged_by_the_checkpoint_that_was_fine_tuned(tmp_path):
    """A long run fine-tuned from a checkpoint it saved while still training: the candidate's
    tokens and losses are those of that checkpoint, read from the run's own event files."""
    long = _tb_run(tmp_path, "pretrain", "long3", {250: 8.9, 500: 6.6, 750: 6.2},
                   {"status": "paused", "hyperparameters": {"tokens_per_update": 4096}},
                   reviews={250: 9.3, 500: 7.6, 750: 7.2})
    facts = {"updates": 750, "lineage": [*LINEAGE, {"run": "x", "updates": 750}],
             "tokens_total": 0, "valid_loss_bits": 6.2}
    source = {"run": "data/runs/pretrain/long3", "valid_loss_bits": 6.6,
              "lineage": [*LINEAGE, {"run": "data/runs/pretrain/long3", "updates": 500,
                                     "tokens": 500 * 4096}]}
    at = pc._facts_at_checkpoint(pr.PretrainRuns(loaded=None, checkpoint=None), long, facts, source)
    assert at["updates"] == at["at_update"] == 500
    assert at["tokens_total"] == 6_553_600 + 1_638_400 + 500 * 4096
    assert at["valid_loss_bits"] == pytest.approx(6.6)
    assert at["valid_reviews_loss_bits"] == pytest.approx(7.6)
    assert at["valid_first"] == (250, pytest.approx(8.9))
    # a checkpoint saved after the run's last pause is read the same way
    ahead = pc._facts_at_checkpoint(pr.PretrainRuns(None, None), long,
                                    {**facts, "updates": 400}, source)
    assert (ahead["updates"], ahead["valid_loss_bits"]) == (500, pytest.approx(6.6))
    # a complete run whose final weights were fine-tuned: nothing to change
    done = _tb_run(tmp_path, "pretrain", "done", {750: 6.2},
                   {"status": "complete", "hyperparameters": {"tokens_per_update": 4096}})
    latest = {**source, "lineage": [*LINEAGE, {"run": "r", "updates": 750, "tokens": 1}]}
    assert pc._facts_at_checkpoint(pr.PretrainRuns(None, None), done, facts, latest) is facts


def test_whole_line_runs_count_their_passes_from_fairseqs_epochs():
    """Batches of whole lines are filled by tokens, so a pass is fairseq's epoch: the passes a
    whole-line run's facts give lie inside the last epoch its log began."""
    import re

    runs = pr.load_pretrain_runs()
    whole = [r for r in runs.used
             if r.manifest["hyperparameters"].get("sample_break_mode", "none") != "none"]
    assert whole
    for rec in whole:
        facts = pr.facts_of(runs, rec, [])
        begun = len(re.findall(r"begin training epoch", (rec.path / "train.log").read_text()))
        assert facts["whole_lines"] and begun - 1 < facts["passes"] <= begun, rec.name
        assert 0.5 * facts["tokens_per_update"] < facts["tokens_per_update_measured"] \
            < facts["tokens_per_update"]


def test_the_packaged_checkpoints_pretraining_is_said_next_to_its_results():
    """What sets the stand-in apart from the course's model comes from its run's manifest."""
    from finetune_lab.book import pretrain_budget as pb
    from finetune_lab.config import PROJECT_ROOT

    plain = pb.PretrainBudget(run="r", status="complete", updates=10, tokens_per_update=4,
                              wall_time_s=60.0, device="CPU", tokens_per_s=1.0,
                              corpus_words=100, corpus_tokens=200)
    assert pb.checkpoint_caveat(plain) == "" and pb.checkpoint_tag(plain) == ""
    assert plain.passes == pytest.approx(0.2)
    adapted = pb.PretrainBudget(**{**plain.__dict__, "task_adaptive": True, "tapt_passes": 2.5})
    assert adapted.passes == 2.5 and "task-adaptive" in pb.checkpoint_caveat(adapted)
    assert "`<s>`" not in pb.checkpoint_caveat(adapted)
    both = pb.PretrainBudget(**{**adapted.__dict__, "bow_weight": 8.0})
    assert "`<s>`" in pb.checkpoint_caveat(both) and pb.checkpoint_tag(both).count(",") == 1
    budget = pb.pretrain_budget()
    hp = json.loads((PROJECT_ROOT / budget.run / "manifest.json").read_text())["hyperparameters"]
    assert budget.task_adaptive == (hp.get("tapt_fraction", 0) >= 1)
    assert budget.bow_weight == hp.get("bow_weight", 0)
    assert (pb.checkpoint_caveat(budget) != "") == (
        budget.task_adaptive or budget.bow_weight > 0 or budget.sinusoids_in is not None)
    # the position table's restart is read from the run behind the weights that made it
    restarted = pb.PretrainBudget(**{**plain.__dict__, "sinusoids_in": "cpu-x"})
    assert "sinusoids partway (in `cpu-x`" in pb.checkpoint_caveat(restarted)
    lineage = json.loads((PROJECT_ROOT / "data/checkpoints/roberta-small-fr/manifest.json")
                         .read_text())["lineage"]
    wrote = [Path(step["run"]).name for step in lineage if json.loads(
        (PROJECT_ROOT / step["run"] / "manifest.json").read_text())["hyperparameters"].get(
        "position_init") == "sinusoidal"]
    assert budget.sinusoids_in == (wrote[-1] if wrote else None)


def test_packaged_weights_tried_first_are_found_and_compared_seed_by_seed():
    """The candidate experiment that fine-tuned the packaged file's very bytes, and how its
    seeds compare with the grid's runs of the packaged checkpoint."""
    from finetune_lab.book import fairseq_report as fr
    from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
    from finetune_lab.runs.run_inputs import cached_sha256, recorded_checkpoint_sha

    rehearsal = prl.packaged_rehearsal()
    assert rehearsal is not None
    tried = fr.load_results(None, rehearsal.experiment)
    sha = cached_sha256(packaged_dir() / MODEL_FILE)
    mine = [r for r in tried.loaded.runs if r.valid and recorded_checkpoint_sha(r.manifest) == sha]
    assert rehearsal.tried.endswith(f"(n={len(mine)})")
    grid = fr.load_results()
    ours = grid.best[grid.best["init"] == "pretrained"].set_index("seed")["test"]
    theirs = tried.best[tried.best["init"] == "pretrained"].set_index("seed")["test"]
    shared = sorted(set(ours.index) & set(theirs.index))
    assert rehearsal.shared_seeds == len(shared)
    if shared:
        assert rehearsal.max_diff == pytest.approx(max(abs(ours - theirs).loc[shared]))


def test_a_sinusoidal_position_run_is_compared_with_the_run_that_kept_the_table(tmp_path):
    hp = {"tokens_per_update": 4096, "lr": 5e-4, "sample_break_mode": "none",
          "tapt_fraction": 0.0, "dropout": 0.0}
    parent = {"continued_from": {"sha256": "aa", "lineage": LINEAGE,
                                 "run": "data/runs/pretrain/cpu-docbow1"}}
    sin = _tb_run(tmp_path, "pretrain", "sin", {250: 9.1, 500: 8.0, 750: 6.5},
                  {"status": "complete", "hyperparameters": {**hp, "position_init": "sinusoidal"},
                   "extra": parent})
    kept = _tb_run(tmp_path, "pretrain", "kept", {250: 9.0, 500: 8.9, 1000: 8.8},
                   {"status": "paused", "hyperparameters": hp, "extra": parent})
    shorter = _tb_run(tmp_path, "pretrain", "shorter", {250: 9.0},
                      {"status": "complete", "hyperparameters": hp, "extra": parent})
    other_lr = _tb_run(tmp_path, "pretrain", "lr", {250: 9.0, 500: 8.9, 750: 8.8, 1000: 8.7},
                       {"status": "complete", "hyperparameters": {**hp, "lr": 1e-3},
                        "extra": parent})
    other_parent = _tb_run(tmp_path, "pretrain", "far", {250: 9.0, 500: 8.9, 750: 8.8, 1000: 8.7},
                           {"status": "complete", "hyperparameters": hp,
                            "extra": {"continued_from": {"sha256": "bb"}}})
    other_seed = _tb_run(tmp_path, "pretrain", "seed", {250: 9.0, 500: 8.9, 750: 8.8, 1000: 8.7},
                         {"status": "complete", "hyperparameters": hp, "extra": parent, "seed": 4})
    for run in (sin, kept, shorter, other_lr, other_parent):
        run.manifest["seed"] = 3
    records = [sin, kept, shorter, other_lr, other_parent, other_seed]
    assert pp.position_init_runs(records) == [sin]
    assert pp.continued_run(sin) == "cpu-docbow1" and pp.continued_run(other_parent) is None
    # the same weights, batch, learning rate and samples, the table kept; the longest such run
    assert pp.position_control(sin, records) is kept
    assert pp.position_control(sin, [sin, other_lr, other_parent, other_seed]) is None
    table = pp.position_comparison(sin, kept)
    assert table["update"].tolist() == [250, 500]  # the updates both validated at
    assert table["tokens (M)"].tolist() == pytest.approx([250 * 4096 / 1e6, 500 * 4096 / 1e6])
    assert table["difference (bits)"].tolist() == pytest.approx([0.1, -0.9], abs=1e-5)
    assert table[pp.KEPT_BITS].tolist() == pytest.approx([9.0, 8.9])
    assert set(table["sinusoids"]) == {"`sin`"} and set(table["table kept"]) == {"`kept`"}
    # the plateau's by-device counts are of tables as trained; sinusoid starts are counted apart
    # a run that continues the sinusoid run's weights inherits its table's start
    after = _tb_run(tmp_path, "pretrain", "after", {250: 6.0},
                    {"status": "complete", "hyperparameters": hp, "seed": 4,
                     "extra": {"continued_from": {"sha256": "cc", "lineage": [
                         *LINEAGE, {"run": "data/runs/pretrain/sin", "tokens": 4096}]}}})
    # a lineage stored with an absolute path (a run cache outside the project) names it alike
    moved = _tb_run(tmp_path, "pretrain", "moved", {250: 6.0},
                    {"status": "complete", "hyperparameters": hp, "seed": 4,
                     "extra": {"continued_from": {"sha256": "dd", "lineage": [
                         *LINEAGE, {"run": "/elsewhere/runs/pretrain/sin", "tokens": 4096}]}}})
    # the runs of LINEAGE, behind every one of them, are read too: a table start is known only
    # when every run behind the weights is (trial 15's R2-n1)
    from finetune_lab.runs.registry import RunRecord

    behind = [RunRecord(tmp_path / n, "pretrain", n, {"hyperparameters": {}})
              for n in ("cpu-seed1", "cpu-seed1-c1")]
    plateau = pp.plateau_table([sin, kept, after, moved, *behind], unigram=10.0)
    assert plateau.set_index("run")[pp.POSITIONS].to_dict() == {
        "`pretrain/sin`": "sinusoidal", "`pretrain/kept`": "kept",
        "`pretrain/after`": "sinusoidal (sin)", "`pretrain/moved`": "sinusoidal (sin)"}
    plateau = plateau[plateau["run"] != "`pretrain/moved`"]
    seen = pp.plateau_facts(plateau)
    assert (seen.left, seen.left_cpu, seen.left_sinusoidal) == (2, 0, 2)
    assert seen.left_sinusoidal_from_m == pytest.approx((8_192_000 + 4096 + 250 * 4096) / 1e6)


def test_fine_tuned_sources_are_read_from_the_candidate_runs():
    tuned = pc.fine_tuned_sources()
    # cpu-long3 was fine-tuned from a checkpoint it saved on its way, cpu-long4 never was
    assert {"pretrain/cpu-long3", "pretrain/cpu-docbow1", "pretrain/cpu-sinpos1-bow"} <= tuned
    assert "pretrain/cpu-long4" not in tuned and "pretrain/cpu-sinpos1" not in tuned
