"""Fault trial 27's defects of a GPU run against the device call it ran in, fixed by class: a
run that started within a call is one of that call's jobs' runs (R-m5), and one outside every
call is refused where its experiment's runs come from calls; a run's environment agrees with its
call's record (M-m1), and a CPU run's with the runs beside it on its machine; an experiment's
runs share one kind of device (R-m2). Each test damages a private copy of the committed run
store (the ``cache`` fixture) and asks the registry.
"""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import pytest

from finetune_lab.runs import crosscheck, gpu_calls
from finetune_lab.runs.registry import discover_runs


def _edit(manifest: Path, change: Callable[[dict[str, Any]], None]) -> None:
    man = json.loads(manifest.read_text())
    change(man)
    manifest.write_text(json.dumps(man, indent=2))


def _refile(cache: Path, source: str, target: str) -> str:
    """Move a run to ``target`` (``experiment/run``), its manifest's names, seed and command
    changed to match, as a hand-made copy would be: the key it is filed under."""
    experiment, run = target.split("/")
    old_experiment = source.split("/")[0]
    dest = cache / target
    dest.parent.mkdir(exist_ok=True)
    shutil.move(cache / source, dest)
    seed = int(run.rsplit("seed", 1)[1])

    def change(man: dict[str, Any]) -> None:
        man.update(experiment=experiment, run=run, seed=seed)
        command = [str(c).replace(old_experiment, experiment) for c in man["command"]]
        command[command.index("--seeds") + 1] = str(seed)
        man["command"] = command

    _edit(dest / "manifest.json", change)
    return target


def _judged(cache: Path, key: str):
    return {r.key: r for r in discover_runs(cache)}[key]


@pytest.mark.parametrize(("source", "target", "call"), [
    # R-m5: seed 4 of the call 20261126T072936Z (seeds 3, 4, 5) filed as seed 12
    ("transformers-gpu/pretrained-seed4", "transformers-gpu/pretrained-seed12",
     "20261126T072936Z"),
    ("transformers-gpu/random-seed5", "transformers-gpu/random-seed13", "20261126T072515Z"),
    # the same class: a call's run filed under an experiment the call never brought back
    ("transformers-gpu/random-seed3", "transformers-gpu2/random-seed3", "20261126T072515Z"),
])
def test_a_gpu_run_within_a_call_is_one_of_its_jobs_runs(cache, source, target, call):
    rec = _judged(cache, _refile(cache, source, target))
    assert not rec.valid
    if "but the Trainer that wrote its event file ran with seed" in rec.reason:
        # trial 28's M-m1: a new seed contradicts its Trainer's arguments first; the call
        # rule, which the registry applies to runs valid so far, is asked on its own
        rec.manifest, rec.problems = rec.rejected, []
        crosscheck.call_device_problems([rec], gpu_calls.call_devices())
    assert f"the device call {call}, but that call never ran {target}" in rec.reason, rec.reason


def test_a_gpu_run_within_no_call_is_refused_where_its_experiment_comes_from_calls(cache):
    """A copy given a start between two calls: no call's job, though the experiment's runs
    all come from calls. The pretraining GPU runs made before the first record stay valid."""
    records = {r.key: r for r in discover_runs(cache)}
    assert records["pretrain-gpu/gpu"].valid  # 2026-11-22, before the calls' records
    rec = records["transformers-gpu/pretrained-seed4"]
    start = gpu_calls.call_devices()[2].start + timedelta(hours=1)  # between calls
    rec.manifest = {**rec.manifest, "start_time": start.isoformat()}
    rec.problems = []
    crosscheck.call_device_problems([rec], gpu_calls.call_devices())
    assert any("within none of the device calls" in p for p in rec.problems), rec.problems


@pytest.mark.parametrize(("key", "torch"), [
    ("fairseq-gpu/pretrained-seed0", "2.4.0+cu121"),  # M-m1: its call says 2.11.0+cu130
    ("fairseq-gpu/random-seed1", "2.6.0+cu124"),
    ("transformers-gpu/pretrained-seed9", "2.11.0+cu121"),  # the release right, not the build
])
def test_a_gpu_runs_torch_is_its_calls(cache, key, torch):
    _edit(cache / key / "manifest.json",
          lambda m: m["environment"]["packages"].__setitem__("torch", torch))
    rec = _judged(cache, key)
    assert not rec.valid
    assert f"environment.packages.torch '{torch}' but the device call" in rec.reason, rec.reason


@pytest.mark.parametrize(("key", "package", "version"), [
    ("fairseq/random-seed0", "torch", "2.5.0+cpu"),  # M-m1's CPU half
    ("lora/lora-qv-seed1", "transformers", "5.23.0"),
])
def test_a_cpu_runs_packages_are_those_of_the_runs_beside_it(cache, key, package, version):
    _edit(cache / key / "manifest.json",
          lambda m: m["environment"]["packages"].__setitem__(package, version))
    rec = _judged(cache, key)
    assert not rec.valid
    assert f"environment.packages.{package} '{version}', but" in rec.reason, rec.reason


def test_a_gpu_run_filed_under_a_cpu_experiment_is_refused(cache):
    """R-m2: what `finetune transformers --init random --seeds 3` writes on a GPU machine
    without --experiment; the CPU chapter gained a GPU "random" row."""
    key = _refile(cache, "transformers-gpu/random-seed3", "transformers/random-seed3")
    records = {r.key: r for r in discover_runs(cache)}
    assert not records[key].valid
    assert "device.type 'cuda', but experiment 'transformers' holds runs of another device" \
        in records[key].reason, records[key].reason
    assert all(records[f"transformers/pretrained-seed{s}"].valid for s in range(3))
