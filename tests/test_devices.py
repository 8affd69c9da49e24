"""The lab's runs on the CPU and on a GPU side by side (book.devices, the status table)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from finetune_lab.book import devices
from finetune_lab.book.lora_cls_runs import full_baseline
from finetune_lab.book.status import by_device
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.runs.gpu_archive import CALL_RECORDS
from finetune_lab.runs.registry import RunRecord


def _runs(cpu: list[float], gpu: list[float], group: str = "pretrained") -> pd.DataFrame:
    rows = [{"group": group, "seed": i, "device": dev, "device name": dev, "test": acc,
             "best epoch": 3, "wall (s)": 60.0, "peak memory (bytes)": float("nan"),
             "tokens/s": float("nan")}
            for dev, accs in (("CPU", cpu), ("GPU", gpu)) for i, acc in enumerate(accs)]
    return pd.DataFrame(rows, columns=devices.COLUMNS)


def test_a_gpu_gap_is_welch_and_says_whether_the_seeds_tell_the_devices_apart():
    same = devices.device_gaps(_runs([78.0, 78.4, 77.9], [77.8, 78.3, 78.1]))
    assert len(same) == 1 and same[0].within_noise
    assert same[0].diff == pytest.approx((77.8 + 78.3 + 78.1 - 78.0 - 78.4 - 77.9) / 3)
    assert devices.gaps_sentence(same).startswith("GPU − CPU has a 95 % interval that contains 0 for pretrained")
    apart = devices.device_gaps(_runs([78.0, 78.4, 77.9], [70.1, 70.3, 70.2]))
    assert not apart[0].within_noise and apart[0].ci_high < 0
    assert "differs by more than the seeds explain for pretrained" in devices.gaps_sentence(apart)
    # one GPU run: no interval, no comparison
    assert devices.device_gaps(_runs([78.0, 78.4], [77.8])) == []


def test_the_device_table_keeps_the_devices_apart():
    table = devices.device_table(_runs([78.0, 78.4, 77.9], [77.8, 78.3]))
    assert list(table["device"]) == ["CPU", "GPU"] and list(table["runs"]) == [3, 2]
    assert table.loc[1, "test acc (%)"] == "78.0\u00a0±\u00a00.4"


def _record(experiment: str, device: dict) -> RunRecord:
    return RunRecord(path=Path("x"), experiment=experiment, name="r",
                     manifest={"device": device})


def test_the_status_table_says_which_runs_ran_where():
    cpu = {"type": "cpu", "cpu": "AMD EPYC"}
    gpu = {"type": "cuda", "name": "NVIDIA H200", "count": 1}
    assert by_device([_record("fairseq", cpu)] * 2) == "2 valid runs"
    assert by_device([_record("fairseq", cpu)] * 2 + [_record("fairseq-gpu", gpu)]) == \
        "3 valid runs: 2 on the CPU, 1 on 1× NVIDIA H200"
    assert by_device([_record("fairseq-gpu", gpu)]) == "1 valid run: 1 on 1× NVIDIA H200"


def test_a_gpu_lora_experiment_takes_its_full_row_from_the_gpu_transformers_runs():
    assert full_baseline("lora") == "transformers"
    assert full_baseline("lora-gpu") == "transformers-gpu"


def test_the_committed_call_record_gives_the_call_figures():
    records = [json.loads(p.read_text())
               for p in sorted((PROJECT_ROOT / CALL_RECORDS).glob("*Z.json"))]
    labs = [m for m in records if devices.lab_call(m)]
    if not labs:
        pytest.skip("no device call of the lab in the run cache")
    meta = labs[-1]
    # a later call of a candidate's seeds alone is not the lab's call
    assert all(not devices.lab_call(m) for m in records if m["plan"]["checkpoint"])
    call = devices.latest_call()
    assert call is not None and call.wall_s == meta["wall_s"]
    assert call.jobs == len([j for j in meta["jobs"] if j["job"] not in ("binarize-cls",
                                                                           "convert-hf")])
    assert call.setup_s == pytest.approx(meta["timings_s"]["install"] + meta["timings_s"]["data"])
    assert 0 < call.gpu_busy_mean <= 100
    gpu = devices.runs_by_device("fairseq").query("device == 'GPU'")
    assert len(gpu) == 6 and set(gpu["device name"]) == {f"1× {meta['device']['name']}"}


def test_fine_tuning_flops_follow_the_data_and_the_epochs():
    tok = {"train": {"tokens": 1000, "reviews": 10}, "valid": {"tokens": 300, "reviews": 3},
           "test": {"tokens": 0, "reviews": 0}}
    one = devices.finetune_flops(tok, 1)
    assert devices.finetune_flops(tok, 5) == pytest.approx(5 * one)
    more = {**tok, "train": {"tokens": 2000, "reviews": 20}}  # same length, twice the reviews
    assert devices.finetune_flops(more, 1) == pytest.approx(one * (2000 + 100) / (1000 + 100))
