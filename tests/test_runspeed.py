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
    assert t["setting"].tolist() == ["Some CPU, 2 thread(s)", "Some CPU, 1 thread(s)"]
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
