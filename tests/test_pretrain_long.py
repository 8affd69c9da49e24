"""Issue 14: one long pretraining run in several launches, one schedule, and a final
task-adaptive phase; resuming is the same as not stopping."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import TINY_ARCH, needs_data_root, use_tiny_work_dir

from finetune_lab._files import sha256_file
from finetune_lab.errors import UserError
from finetune_lab.models.trust import fairseq_safe_globals
from finetune_lab.runs.measurements import log_time_problems
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.train import pretrain_long
from finetune_lab.train.pretrain_fairseq import echoing
from finetune_lab.train.pretrain_recipe import PretrainRecipe, state_dir, tapt_start
from finetune_lab.train.pretrain_resume import resume_point

TOTAL = 20  # updates: general 0-14, task-adaptive 14-20 (tapt_fraction 0.3)


def test_phases_split_the_budget():
    general, tapt = Path("g"), Path("t")
    assert pretrain_long.plan_phases(20, general, None, 0.3) == [
        pretrain_long.Phase("general", general, 0, 20)]
    assert pretrain_long.plan_phases(20, general, tapt, 0.3) == [
        pretrain_long.Phase("general", general, 0, 14), pretrain_long.Phase("tapt", tapt, 14, 20)]
    assert pretrain_long.plan_phases(20, general, tapt, 1.0) == [
        pretrain_long.Phase("tapt", tapt, 0, 20)]
    with pytest.raises(UserError, match="tapt-fraction"):
        pretrain_long.plan_phases(20, general, tapt, 1.5)
    with pytest.raises(UserError, match="less than one update"):
        pretrain_long.plan_phases(0, general, None, 0.0)



def test_tapt_start_reads_the_recorded_phases():
    general, tapt = Path("g"), Path("t")
    recorded = {fraction: {"phases": pretrain_long.phase_records(
        pretrain_long.plan_phases(20, general, tapt, fraction))} for fraction in (0.0, 0.3, 1.0)}
    assert tapt_start(recorded[0.0]) is None
    assert tapt_start(recorded[0.3]) == 14
    assert tapt_start(recorded[1.0]) == 0
    # a run from before phases were recorded had no task-adaptive phase
    assert tapt_start({"tapt_fraction": None}) is None

def test_progress_shows_tokens_rate_and_eta():
    line = "x | INFO | train_inner | epoch 001:  10 / 99 loss=9.1, wps=2000, ups=0.5, num_updates=250"
    shown = pretrain_long.progress_line(line, tokens_per_update=4096, total_updates=1000)
    assert shown == ("pretrain: 1.02 M of 4.10 M tokens (25.0 %), 2,000 tokens/s, 3.07 M left, "
                     "ETA 0.4 h")
    assert pretrain_long.progress_line("| valid | loss 9", 4096, 1000) is None
    # a GPU's rate, which fairseq writes with an exponent past a million
    gpu = line.replace("wps=2000", "wps=1.34e+06")
    assert "1,340,000 tokens/s" in pretrain_long.progress_line(gpu, 65536, 1000)


@pytest.fixture(scope="module")
def tapt_corpus(tiny_tapt_corpus):
    return tiny_tapt_corpus


def _long(tiny_pipeline, tapt, tmp_path, monkeypatch, run, **kw):
    use_tiny_work_dir(tiny_pipeline, tmp_path, monkeypatch)
    recipe = PretrainRecipe(tokens_per_sample=64, batch_size=8, validate_every=5,
                            log_interval=1, lr=1e-3, arch=TINY_ARCH, dropout=0.0,
                            attention_dropout=0.0)
    return pretrain_long.pretrain_long(
        run=run, tokens=TOTAL * 64 * 8, data_dir=tiny_pipeline["corpus"], tapt_dir=tapt,
        tapt_fraction=0.3, recipe=recipe, precision="fp32", quiet=True,
        package_to=tmp_path / f"pkg-{run}", **kw)


def _lrs(run_dir: Path) -> dict[int, float]:
    """update -> learning rate, from fairseq's train_inner lines (the last launch wins)."""
    out = {}
    for line in (run_dir / "train.log").read_text().splitlines():
        if "| train_inner |" in line:
            upd = int(re.search(r"num_updates=(\d+)", line).group(1))
            out[upd] = float(re.search(r"\blr=([0-9.e-]+)", line).group(1))
    return out


def _final_valid(pkg: Path) -> float:
    return json.loads((pkg / "manifest.json").read_text())["valid_loss_bits"]


@needs_data_root
@pytest.mark.slow
def test_an_interrupted_long_run_equals_an_uninterrupted_one(
        tiny_pipeline, tapt_corpus, tmp_path, monkeypatch):
    # two launches: 8 updates, then the rest (across the switch to the task-adaptive phase at
    # 14) in a launch that starts from a state the first one saved but did not record (killed
    # right after its save): its segment has no end, and the next launch says so
    run_dir = _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "cut", segment_updates=8)
    m = read_manifest(run_dir)
    assert m["status"] == "paused" and m["updates_done"] == 8
    assert [(s["updates_from"], s["updates_to"]) for s in m["segments"]] == [(0, 8)]
    assert not (tmp_path / "pkg-cut").exists()  # nothing packaged before the budget is spent
    launch = m["segments"][-1]["launch"]  # the plugin wrote it into the state fairseq saved
    assert resume_point(state_dir("cut"))["launch"] == launch
    m["segments"][-1] = {k: v for k, v in m["segments"][-1].items()
                         if k in ("start_time", "device", "updates_from", "launch")}
    m.update(status="running", updates_done=0)
    del m["resume_state"]
    # another launch's id (22b's W2-f1: another run's state, same folders, seed and score)
    m["segments"][-1]["launch"] = "0" * 16
    (run_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "cut")
    m["segments"][-1]["launch"] = launch  # the run's own: its log printed the save
    (run_dir / "manifest.json").write_text(json.dumps(m))
    _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "cut")
    m = read_manifest(run_dir)
    assert m["status"] == "complete" and m["updates_done"] == TOTAL
    assert [(s.get("updates_from"), s.get("updates_to"), s["ended"]) for s in m["segments"]] == [
        (0, 8, "killed"), (8, TOTAL, "complete")]
    # the killed launch's end is its log's last line: its time counts in the run's (M-j3)
    killed = m["segments"][0]
    assert killed["start_time"] < killed["end_time"] <= m["segments"][1]["start_time"]
    assert killed["wall_time_s"] > 0
    assert m["wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in m["segments"]))
    assert not log_time_problems(run_dir, m)
    assert m["segments"][-1]["launch"] != launch
    assert m["hyperparameters"]["warmup_updates"] == 1  # 6 % of the whole budget, once
    # the task-adaptive phase started once, from its corpus's beginning
    log = (run_dir / "train.log").read_text()
    assert log.count("'reset_dataloader': True") == 1

    # one launch, never interrupted
    whole = _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "whole")
    assert [s["ended"] for s in read_manifest(whole)["segments"]] == ["complete"]
    # one schedule: the learning rate at every update is the same, however the run was cut
    cut_lr, whole_lr = _lrs(run_dir), _lrs(whole)
    assert sorted(cut_lr) == list(range(1, TOTAL + 1)) and cut_lr == pytest.approx(whole_lr)
    assert cut_lr[9] < cut_lr[8]  # no second warm-up after a resume
    # and the same weights at the end (optimizer, data position and RNG restored)
    assert _final_valid(tmp_path / "pkg-cut") == pytest.approx(
        _final_valid(tmp_path / "pkg-whole"), abs=1e-3)
    lineage = json.loads((tmp_path / "pkg-cut" / "manifest.json").read_text())["lineage"]
    assert lineage[-1]["updates"] == TOTAL and lineage[-1]["tokens"] == TOTAL * 64 * 8


@needs_data_root
@pytest.mark.slow
def test_a_finished_or_lost_long_run_is_not_resumed(tiny_pipeline, tapt_corpus, tmp_path,
                                                    monkeypatch):
    import shutil

    run_dir = _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "lost", segment_updates=5)
    shutil.rmtree(state_dir("lost"))  # a new machine: the state is gone
    with pytest.raises(UserError, match="not on this machine"):
        _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "lost")
    assert read_manifest(run_dir)["status"] == "paused"


def test_progress_is_echoed_from_new_log_lines_only(tmp_path, capsys):
    import time

    log = tmp_path / "train.log"
    log.write_text("x | INFO | train_inner | epoch 001: num_updates=5, wps=10\n")  # a past launch
    with echoing(log, lambda line: pretrain_long.progress_line(line, 100, 20)):
        time.sleep(0.3)
        with open(log, "a") as fh:
            fh.write("x | INFO | train_inner | epoch 001: loss=9, wps=1000, num_updates=10\n")
        time.sleep(2.5)
    out = capsys.readouterr().out
    assert out == ("pretrain: 0.00 M of 0.00 M tokens (50.0 %), 1,000 tokens/s, 0.00 M left, "
                   "ETA 0.0 h\n")
    with echoing(log, None):  # quiet: nothing
        pass
    assert capsys.readouterr().out == ""


def test_sinusoidal_table_depends_on_distance_only():
    import torch

    from finetune_lab.models.position_init import sinusoidal_table

    table = sinusoidal_table(64, 32)
    assert table.shape == (64, 32)
    assert torch.allclose(table.norm(dim=1), torch.full((64,), 4.0, dtype=table.dtype))
    gram = table @ table.T
    # the dot product of rows p and p + k is the same for every p
    for k in (1, 5, 20):
        diagonal = torch.diagonal(gram, offset=k)
        assert float(diagonal.max() - diagonal.min()) < 1e-9
    assert float(gram[0, 1]) > float(gram[0, 20])  # near rows are more alike than far ones
    with pytest.raises(ValueError, match="even"):
        sinusoidal_table(8, 31)


@needs_data_root
@pytest.mark.slow
def test_a_long_run_can_start_from_sinusoidal_positions(tiny_pipeline, tapt_corpus, tmp_path,
                                                        monkeypatch):
    import torch

    from finetune_lab.models import position_init

    with pytest.raises(UserError, match="must be one of"):
        _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "sin-bad",
              continue_from=tiny_pipeline["packaged"], position_init="rotary")
    run_dir = _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "sin",
                    continue_from=tiny_pipeline["packaged"], position_init="sinusoidal",
                    segment_updates=3)
    m = read_manifest(run_dir)
    assert m["hyperparameters"]["position_init"] == "sinusoidal"
    record = m["extra"]["position_init"]
    assert record["neighbour_cosine_before"] < 0.5 < 0.9 < record["neighbour_cosine_after"]
    # the weights the run started from: the parent's, but for the position rows
    init = state_dir("sin") / "init_model.pt"
    assert record["sha256"] == sha256_file(init)
    with fairseq_safe_globals():
        parent = torch.load(tiny_pipeline["packaged"] / "model.pt", weights_only=True)["model"]
        started = torch.load(init, weights_only=True)["model"]
    key = position_init.POSITIONS_KEY
    assert all(torch.equal(parent[k], started[k]) for k in parent if k != key)
    rows = started[key][2:].double()
    expected = position_init.sinusoidal_table(rows.shape[0], rows.shape[1])
    scale = record["row_norm"] / (rows.shape[1] / 2) ** 0.5
    assert torch.allclose(rows, expected * scale, atol=1e-2 * scale)
    assert torch.equal(started[key][:2], parent[key][:2])  # padding rows untouched
    # a resumed launch keeps the first launch's record and does not rewrite the table again
    _long(tiny_pipeline, tapt_corpus, tmp_path, monkeypatch, "sin",
          continue_from=tiny_pipeline["packaged"], position_init="sinusoidal")
    m = read_manifest(run_dir)
    assert m["status"] == "complete" and m["extra"]["position_init"] == record


def test_position_init_is_refused_outside_a_long_run(capsys):
    from finetune_lab.cli import main

    assert main(["pretrain", "--max-update", "5", "--position-init", "sinusoidal"]) == 2
    assert "--position-init needs a long run" in capsys.readouterr().err
