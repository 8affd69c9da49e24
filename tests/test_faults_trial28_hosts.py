"""Fault trial 28's defects of what a run's hashed files record of it, fixed by class: a run's
host is the one its event files' names hold, not its manifest's say-so (M-m2, M-m6's second
case: a CPU run's hostname renamed or emptied with its torch or its cores escaped the runs
beside it), a CPU run that names no host or no comparable times is refused rather than taken
for one with nothing beside it, and a Trainer's run is held to the seed its arguments, written
into its event file, hold (M-m1). Each test damages a private copy of the committed run store
(the ``cache`` fixture) and asks the registry.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.runs.file_facts import event_hosts, file_fact_problems
from finetune_lab.runs.manifest import event_files
from finetune_lab.runs.registry import discover_runs


def _edit(manifest: Path, change: Callable[[dict[str, Any]], None]) -> None:
    man = json.loads(manifest.read_text())
    change(man)
    manifest.write_text(json.dumps(man, indent=2))


def _judged(cache: Path, key: str):
    return {r.key: r for r in discover_runs(cache)}[key]


def _environment(hostname: str, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(man: dict[str, Any]) -> None:
        man["environment"]["hostname"] = hostname
        for package, version in changes.pop("packages", {}).items():
            man["environment"]["packages"][package] = version
        man["device"].update(changes)
    return change


@pytest.mark.parametrize(("key", "hostname", "changes"), [
    # M-m2's three cases: the fairseq chapter would print "CPU runs, which used torch 2.13.0, 2.5.0"
    ("fairseq/random-seed0", "lab-box", {"packages": {"torch": "2.5.0+cpu"}}),
    ("fairseq/random-seed2", "box", {"packages": {"torch": "2.4.1+cpu"}}),
    ("fairseq/random-seed1", "", {"packages": {"torch": "2.6.0+cpu"}}),
    # M-m6's second case: cores beside which 3 runs on vm record 2
    ("fairseq/pretrained-seed1", "box", {"cpu_count": 4}),
    # the same class in the other experiments, CPU and GPU (the call records hold no hostname)
    ("lora/lora-qv-seed1", "lab-box", {"packages": {"transformers": "5.23.0"}}),
    ("transformers/pretrained-seed0", "lab-box", {}),
    ("pretrain/cpu-docbow1", "lab-box", {}),
    ("fairseq-gpu/random-seed0", "gpu-box", {}),
])
def test_a_runs_host_is_the_one_its_event_files_name(cache, key, hostname, changes):
    _edit(cache / key / "manifest.json", _environment(hostname, **changes))
    rec = _judged(cache, key)
    assert not rec.valid
    assert f"environment.hostname {hostname!r}, but its event files were written on vm" \
        in rec.reason, rec.reason


def test_a_cpu_run_whose_event_files_name_no_host_is_refused(cache):
    """Event files renamed without their host (the manifest's list of them changed to match):
    no host to hold the run to the runs beside it, which is a problem, not a pass."""
    run = cache / "fairseq" / "random-seed0"
    man = json.loads((run / "manifest.json").read_text())
    outputs = {}
    for rel, digest in man["outputs"].items():
        old = run / rel
        new = old.with_name(old.name.split(".vm.")[0])  # events.out.tfevents.<time>
        old.rename(new)
        outputs[new.relative_to(run).as_posix()] = digest
    man["outputs"] = outputs
    man["environment"]["packages"]["torch"] = "2.5.0+cpu"
    (run / "manifest.json").write_text(json.dumps(man, indent=2))
    rec = _judged(cache, "fairseq/random-seed0")
    assert not rec.valid
    assert "name no one host: it cannot be checked" in rec.reason, rec.reason


@pytest.mark.parametrize("key", ["lora/lora-qv-seed1", "fairseq/random-seed1"])
def test_a_cpu_run_without_comparable_times_is_refused(cache, key):
    """An end far past every time (year 9999, which no time can be compared with): the checks
    of its times had nothing to compare, and the runs beside it none either."""
    _edit(cache / key / "manifest.json",
          lambda m: m.__setitem__("end_time", "9999-11-25T18:52:41+00:00"))
    rec = _judged(cache, key)
    assert not rec.valid
    assert "its start_time or end_time is no time" in rec.reason, rec.reason


@pytest.mark.parametrize(("source", "seed"), [
    ("transformers/pretrained-seed2", 7),  # M-m1: the per-seed tables listed seed 7
    ("lora/lora-qv-seed2", 5),
    ("transformers-gpu/random-seed3", 13),
])
def test_a_trainer_run_is_the_seed_its_arguments_hold(cache, source, seed):
    experiment, run = source.split("/")
    old = int(run.rsplit("seed", 1)[1])
    target = f"{run.rsplit('seed', 1)[0]}seed{seed}"
    shutil.move(cache / source, cache / experiment / target)

    def relabel(man: dict[str, Any]) -> None:
        man.update(run=target, seed=seed)
        command = [str(c) for c in man["command"]]
        command[command.index("--seeds") + 1] = str(seed)
        man["command"] = command

    _edit(cache / experiment / target / "manifest.json", relabel)
    rec = _judged(cache, f"{experiment}/{target}")
    assert not rec.valid
    assert f"seed {seed}, but the Trainer that wrote its event file ran with seed {old}" \
        in rec.reason, rec.reason


def test_every_committed_run_records_the_host_and_seed_its_files_hold():
    """The rule holds across the committed store (fairseq, transformers, lora, pretrain, the
    candidates and the -gpu experiments): none of its runs contradicts its own files."""
    runs = sorted((PROJECT_ROOT / "data" / "runs").glob("*/*/manifest.json"))
    assert len(runs) >= 100
    for manifest in runs:
        man = json.loads(manifest.read_text())
        assert file_fact_problems(man, event_files(manifest.parent)) == [], manifest


def test_the_host_is_the_last_launchs_and_may_hold_dots():
    """A continued run records its last launch's environment; a host name may hold dots."""
    names = ["events.out.tfevents.1795319833.lab.example.org.7677.2",
             "events.out.tfevents.1795400000.vm.81.0", "events.out.tfevents.1795300000"]
    assert event_hosts([Path(n) for n in names]) == ("vm",)
    assert event_hosts([Path(names[0])]) == ("lab.example.org",)
    assert event_hosts([Path(names[2])]) == ()
