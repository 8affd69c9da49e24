"""Run speeds from manifests: device, threads, and whether times compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from finetune_lab.runs import runspeed
from finetune_lab.runs.registry import RunRecord

CPU = {"type": "cpu", "name": "Some CPU", "cpu": "Some CPU", "count": 1}


def _record(name: str, device: dict, wall: float = 600.0, rate: float | None = 1.25) -> RunRecord:
    manifest = {"framework": "fairseq", "init": "pretrained", "seed": int(name[-1]),
                "device": device, "wall_time_s": wall,
                "hyperparameters": {"total_updates": 1125}}
    if rate is not None:
        manifest["throughput"] = {"updates_per_s": rate}
    return RunRecord(path=Path(name), experiment="fairseq", name=name, manifest=manifest)


def test_speed_table_reads_device_threads_and_times():
    t = runspeed.speed_table([_record("pretrained-seed1", {**CPU, "threads": 1}, 1200.0),
                              _record("pretrained-seed0", {**CPU, "threads": 2}, rate=None)])
    assert t["run"].tolist() == ["pretrained-seed0", "pretrained-seed1"]  # sorted by seed
    assert t["threads"].tolist() == [2.0, 1.0]
    assert t["wall time (min)"].tolist() == [10.0, 20.0]
    assert np.isnan(t["updates/s"].iloc[0]) and t["updates/s"].iloc[1] == 1.25
    assert t["setting"].tolist() == ["Some CPU, 2 threads", "Some CPU, 1 thread"]
    assert not runspeed.comparable(t)
    assert "2 different settings" in runspeed.settings_sentence(t)


@pytest.mark.parametrize("device, label", [
    ({**CPU}, "Some CPU, threads not recorded"),
    ({"type": "cuda", "name": "NVIDIA H100", "count": 1, "threads": 16}, "1× NVIDIA H100"),
])
def test_setting_names_what_the_time_depends_on(device, label):
    t = runspeed.speed_table([_record("random-seed0", device), _record("random-seed1", device)])
    assert set(t["setting"]) == {label}
    assert runspeed.comparable(t)
    assert runspeed.settings_sentence(t) == f"all on one setting, {label}, so their times compare"


def test_threads_cell_reads_as_a_count_or_a_dash():
    assert runspeed.fmt_threads(2.0) == "2"
    assert runspeed.fmt_threads(np.nan) == "–"


def _timed(name: str, threads: int, start_min: float, wall_min: float,
           experiment: str = "fairseq") -> RunRecord:
    rec = _record(name, {**CPU, "threads": threads, "cpu_count": 2}, wall=wall_min * 60)
    t0 = np.datetime64("2026-01-01T00:00") + np.timedelta64(int(start_min * 60), "s")
    rec.manifest["start_time"] = str(t0)
    rec.manifest["end_time"] = str(t0 + np.timedelta64(int(wall_min * 60), "s"))
    rec.experiment = experiment
    return rec


def test_layouts_are_read_from_when_runs_ran_and_what_else_ran():
    """Two one-thread runs side by side (40 min each) against one two-thread run alone (20
    min): the same throughput; a run beside a pretraining is left out; a run barely touching
    another (less than half its time) counts as alone."""
    pair = [_timed("pretrained-seed0", 1, 0, 40), _timed("pretrained-seed1", 1, 1, 40)]
    alone = [_timed("pretrained-seed2", 2, 100, 20), _timed("random-seed0", 2, 119, 20)]
    mixed = _timed("random-seed1", 1, 200, 30)
    pretraining = _timed("cpu-long-seed0", 1, 195, 60, experiment="pretrain")
    runs = pair + alone + [mixed]
    t = runspeed.layout_table(runs, runs + [pretraining])
    assert t["layout"].tolist() == ["1 × 2 threads", "2 × 1 thread"]
    assert t["runs"].tolist() == [2, 2]  # the run beside the pretraining is not counted
    assert t["runs per hour (machine)"].tolist() == pytest.approx([3.0, 3.0])
    assert [len(runspeed.overlapping(r, runs)) for r in runs] == [1, 1, 0, 0, 0]
    s = runspeed.jobs_speedup(t)
    assert s["speed-up"].tolist() == pytest.approx([1.0]) and s["runs"].tolist() == [4]
    assert (s["side by side"].tolist(), s["alone"].tolist()) == ([2], [2])
    quicker = pair[:1] + [_timed("pretrained-seed1", 1, 1, 30)] + alone
    faster = runspeed.layout_table(quicker, quicker)
    assert runspeed.jobs_speedup(faster)["speed-up"].iloc[0] == pytest.approx(
        (2 * 60 / 35) / 3.0)  # median of 40 and 30 minutes
    assert runspeed.jobs_speedup(runspeed.layout_table(alone, alone)).empty
