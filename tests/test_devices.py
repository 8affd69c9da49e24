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
    assert call.full_runs == sum(j["job"].startswith(("fairseq-", "transformers-"))
                                 for j in meta["jobs"])
    gpu = devices.runs_by_device("fairseq").query("device == 'GPU'")
    in_call = gpu[gpu["seed"].isin(call.seeds)]
    assert len(in_call) == 6 and set(in_call["device name"]) == {f"1× {meta['device']['name']}"}


def _call(tmp_path, stamp: str, parts: list[str], seeds: list[int], failed=()) -> None:
    """A device call's record, as gpu-unpack keeps it."""
    jobs = [{"job": j, "exit_code": 1 if j in failed else 0}
            for j in (["convert-hf"] if "transformers" in parts else [])
            + [f"{p}-{i}-seed{s}" for p in parts for i in ("pretrained", "random")
               for s in seeds]]
    folder = tmp_path / CALL_RECORDS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stamp}.json").write_text(json.dumps({
        "plan": {"steps": ["lab"], "lab_parts": parts, "seeds": seeds, "checkpoint": None,
                 "tiny": False},
        "jobs": jobs, "wall_s": 100.0, "timings_s": {"install": 5, "data": 5, "runs": 90},
        "products": [f"data/runs/{p}-gpu" for p in parts],
        "device": {"name": "GPU X", "count": 1, "torch": "2.0"}}))


def test_later_calls_add_seeds_and_the_sentence_says_how_many_each_row_has(tmp_path):
    _call(tmp_path, "20260101T000000Z", ["fairseq", "transformers", "lora"], [0, 1, 2])
    assert devices.seed_calls(tmp_path) == [] and devices.seed_calls_sentence([], (0, 1, 2)) == ""
    broken = ["convert-hf", *(f"transformers-pretrained-seed{s}" for s in (3, 4, 5))]
    _call(tmp_path, "20260102T000000Z", ["fairseq", "transformers"], [3, 4, 5], failed=broken)
    calls = devices.seed_calls(tmp_path)
    assert [c.seeds for c in calls] == [(3, 4, 5)] and calls[0].failed == tuple(broken)
    text = devices.seed_calls_sentence(calls, (0, 1, 2))
    assert text.startswith("A later command ran the fairseq and Transformers grids with seeds "
                           "3 to 5 as well") and "a CPU row seeds 0 to 2" in text
    _call(tmp_path, "20260103T000000Z", ["transformers"], [3, 4, 5])
    text = devices.seed_calls_sentence(devices.seed_calls(tmp_path), (0, 1, 2))
    assert text.startswith("Two later commands") and "has seeds 0 to 5" in text
    call = devices.latest_call(tmp_path)  # still the call that ran the whole lab
    assert call.name == "20260101T000000Z" and call.seeds == (0, 1, 2) and call.full_runs == 12
    # a call that pretrained, then fine-tuned its own weights (seeds 6, 7 into a candidate
    # experiment) added no seed to the grids
    _call(tmp_path, "20260104T000000Z", ["fairseq"], [6, 7])
    record = tmp_path / CALL_RECORDS / "20260104T000000Z.json"
    meta = json.loads(record.read_text())
    meta["plan"].update(steps=["pretrain", "lab"], then_finetune=True)
    record.write_text(json.dumps(meta))
    assert [c.name for c in devices.seed_calls(tmp_path)] == ["20260102T000000Z",
                                                              "20260103T000000Z"]
    assert "has seeds 0 to 5" in devices.seed_calls_sentence(devices.seed_calls(tmp_path),
                                                             (0, 1, 2))


def test_fine_tuning_flops_follow_the_data_and_the_epochs():
    tok = {"train": {"tokens": 1000, "reviews": 10}, "valid": {"tokens": 300, "reviews": 3},
           "test": {"tokens": 0, "reviews": 0}}
    one = devices.finetune_flops(tok, 1)
    assert devices.finetune_flops(tok, 5) == pytest.approx(5 * one)
    more = {**tok, "train": {"tokens": 2000, "reviews": 20}}  # same length, twice the reviews
    assert devices.finetune_flops(more, 1) == pytest.approx(one * (2000 + 100) / (1000 + 100))


def test_the_gpu_gaps_read_the_committed_gpu_runs_once_per_side():
    """The Transformers chapter's random means come from one computation: the libraries' gap
    from random weights and each library's pretrained − random use the same GPU runs."""
    from scipy import stats

    from finetune_lab.book import answers

    rnd = answers.random_init_by_library()
    hf, fs = (answers.init_gap_on_gpu(f) for f in ("transformers", "fairseq"))
    assert (rnd.mean_a, rnd.mean_b) == (hf.mean_b, fs.mean_b)
    table = devices.runs_by_device("transformers")
    gpu = table[table["device"] == "GPU"]
    a, b = (gpu.loc[gpu["group"] == g, "test"] for g in ("pretrained", "random"))
    assert (hf.n_a, hf.n_b) == (len(a), len(b)) >= (2, 2)
    assert hf.diff == pytest.approx(a.mean() - b.mean())
    assert hf.p_value == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
