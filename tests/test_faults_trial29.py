"""Fault trial 29 and what trial 28 left: children that outlive a killed command (P-m3); a
run's recipe against the configuration fairseq printed (R-11 to R-14); lineages that leave a
run out or add one (R-15 to R-17)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.runs.log_config import config_problems
from finetune_lab.runs.registry import discover_runs

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="PR_SET_PDEATHSIG is Linux's")

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
"""A child that names itself in a file, then works for two minutes: a stand-in for a long one."""

LAUNCHERS = {
    # fairseq-preprocess, as binarize starts it
    "binarize": """
        from finetune_lab.data import binarize
        binarize._preprocess_executable = lambda: [sys.executable, "-c", SLEEPER, PIDFILE]
        binarize.run_preprocess([], Path("."))
    """,
    # a --jobs launcher, as run_parallel starts it
    "jobs": """
        from finetune_lab.runs import jobs
        job = jobs.Job("one", [sys.executable, "-c", SLEEPER, PIDFILE], Path(PIDFILE + ".log"))
        jobs.run_parallel([job], 1, say=lambda s: None)
    """,
    # sentencepiece's trainer, in a forked child
    "in_child": """
        from finetune_lab.data import child
        def work():
            open(PIDFILE, "w").write(str(os.getpid()))
            time.sleep(120)
        child.in_child(work)
    """,
}


@linux_only
@pytest.mark.parametrize("how", sorted(LAUNCHERS))
def test_a_child_dies_with_its_killed_command(tmp_path, how):
    """Trial 28's P-m3: a SIGKILLed `binarize-cls` left `fairseq-preprocess` running (a
    trainer already died with its launcher). Every long child of a command now gets the
    parent-death signal: `fairseq-preprocess`, a `--jobs` launcher, sentencepiece's forked
    trainer, a pretraining run's calibration."""
    pidfile = tmp_path / "child.pid"
    script = (f"import os, sys, time\nfrom pathlib import Path\nSLEEPER = {SLEEPER!r}\n"
              f"PIDFILE = {str(pidfile)!r}\n" + textwrap.dedent(LAUNCHERS[how]))
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()):
            assert parent.poll() is None, f"the launcher ended first (exit {parent.returncode})"
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.1)
        child = psutil.Process(int(pidfile.read_text()))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        try:
            child.wait(timeout=10)
        except psutil.TimeoutExpired:
            child.kill()
            pytest.fail(f"{how}: the child outlived its killed command")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()



# --- trial 29's R-11 to R-14: the manifest against the configuration its train.log prints -------

def _edit(manifest: Path, change: Callable[[dict[str, Any]], None]) -> None:
    man = json.loads(manifest.read_text())
    change(man)
    manifest.write_text(json.dumps(man, indent=2))


def _set_flag(flag: str, value: str, key: str, hp_value: Any) -> Callable[[dict], None]:
    """Relabel a run's recipe value in its command and its hyperparameters alike."""
    def change(man: dict[str, Any]) -> None:
        man["command"][man["command"].index(flag) + 1] = value
        man["hyperparameters"][key] = hp_value
    return change


def _phases(general_until: int, share: float) -> Callable[[dict], None]:
    def change(man: dict[str, Any]) -> None:
        hp = man["hyperparameters"]
        hp["tapt_fraction"] = share
        hp["phases"] = [{"name": "general", "until_update": general_until},
                        {"name": "tapt", "until_update": hp["max_update"]}]
    return change


def _fp32(man: dict[str, Any]) -> None:
    man["hyperparameters"]["precision"] = "fp32"
    man["command"].remove("--bf16")


def _no_flag(flag: str, key: str, hp_value: Any) -> Callable[[dict], None]:
    """The flag dropped from the command (fairseq's default ran), the recipe relabelled."""
    def change(man: dict[str, Any]) -> None:
        i = man["command"].index(flag)
        del man["command"][i:i + 2]
        man["hyperparameters"][key] = hp_value
    return change


RELABELLED = {
    # the long run's task-adaptive share, 10.0 M tokens shown as 5.0 M
    "pretrain/cpu-long2": (_phases(3662, 0.25), "hyperparameters.phases"),
    # the ablation's dropout, 0.1 shown as 0.0
    "pretrain-ablation/fp32-dropout": (_set_flag("--dropout", "0.0", "dropout", 0.0),
                                       "configured with dropout=0.1"),
    # the ablation's precision, bf16 shown as fp32
    "pretrain-ablation/bf16": (_fp32, "configured for bf16"),
    # the packaged run's bag-of-words weight, 8.0 shown as 4.0
    "pretrain/cpu-sinpos1-bow": (_set_flag("--bow-weight", "4.0", "bow_weight", 4.0),
                                 "configured with bow_weight=8.0"),
    # the same class where the flag is gone: fairseq's default dropout is what ran
    "fairseq/pretrained-seed1": (_no_flag("--dropout", "dropout", 0.3),
                                 "configured with dropout=0.1"),
    # a phase on one corpus only, relabelled as two
    "pretrain/cpu-tapt3": (_phases(489, 0.5), "hyperparameters.phases"),
}


def test_a_recipe_relabelled_against_its_train_log_is_rejected(cache):
    """Trial 29's R-11 to R-14: each run relabelled consistently (command and recipe) stayed
    valid and changed a table of the pretraining chapter; fairseq printed what really ran."""
    for key, (change, _why) in RELABELLED.items():
        _edit(cache / key / "manifest.json", change)
    judged = {r.key: r for r in discover_runs(cache)}
    for key, (_change, why) in RELABELLED.items():
        assert not judged[key].valid, key
        assert any(why in p for p in judged[key].problems), (key, judged[key].problems)
    assert judged["pretrain/cpu-long"].valid and judged["pretrain-ablation/bf16-dropout"].valid


def test_every_committed_fairseq_run_agrees_with_its_printed_configuration():
    """The check holds for all 83 committed fairseq runs, their phases and launches included
    (a long run's processes differ in corpus, last update and plug-in folder only)."""
    runs = PROJECT_ROOT / "data" / "runs"
    checked = 0
    for manifest in sorted(runs.glob("*/*/manifest.json")):
        man = json.loads(manifest.read_text())
        if man.get("framework") == "fairseq":
            assert config_problems(manifest.parent, man) == [], manifest.parent.name
            checked += 1
    assert checked >= 80


# --- a copied lineage names every run behind the weights ---------------------------

def _drop_step(field: str, index: int) -> Callable[[dict], None]:
    def change(man: dict[str, Any]) -> None:
        del man["extra"][field]["lineage"][index]
    return change


def test_a_lineage_with_a_step_left_out_is_rejected(cache):
    """R-16, R-17: a continued run's lineage and two fine-tuning runs' with one step deleted
    made the candidate table's updates and tokens smaller, each remaining step agreeing with
    its run. Runs built on a run whose lineage lost a step are rejected with it (which of the
    two copies was changed the records cannot say)."""
    _edit(cache / "pretrain/cpu-tapt1/manifest.json", _drop_step("continued_from", 1))
    for seed in (0, 1):
        _edit(cache / f"fairseq-candidate-5/pretrained-seed{seed}/manifest.json",
              _drop_step("checkpoint_source", 1))
    judged = {r.key: r for r in discover_runs(cache)}
    for key in ("pretrain/cpu-tapt1", "fairseq-candidate-5/pretrained-seed0",
                "fairseq-candidate-5/pretrained-seed1"):
        assert not judged[key].valid
        assert any("lineage names" in p for p in judged[key].problems), judged[key].problems
    assert judged["pretrain/cpu-long2"].valid and judged["fairseq/pretrained-seed0"].valid


@pytest.mark.parametrize("change", [
    lambda m: m["lineage"].pop(1),  # 2.89 h of pretraining shown as 2.17 h
    lambda m: m["lineage"].insert(3, {"run": "data/runs/pretrain/cpu-tapt1",
                                      "tokens": 4001792, "updates": 977}),  # as 3.32 h
    lambda m: m["lineage"].pop(),  # ends before the package's own run
])
def test_a_package_lineage_with_a_step_left_out_or_added_is_damaged(package, change):
    """R-15: the packaged checkpoint's lineage with a step deleted or inserted changed the
    front page's cost of the stand-in; it is held to its run's own copy."""
    from finetune_lab.models.checkpoints import package_manifest

    package()
    assert package_manifest()["lineage"]
    package(change)
    with pytest.raises(UserError, match=r"manifest.json is damaged \(its lineage"):
        package_manifest()


# --- R-1: a run's minutes stretched inside the clocks' slack ----------------------------------

def _stretched(start: str, end: str, wall: float) -> Callable[[dict], None]:
    def change(man: dict[str, Any]) -> None:
        man["start_time"], man["end_time"], man["wall_time_s"] = start, end, wall
    return change


STRETCHED = {  # each run's start moved earlier and its end later, its wall time to match
    "transformers-gpu/pretrained-seed0": _stretched(  # 140.7 s as 160 s: 2.3 min as 2.4
        "2026-11-26T04:20:25+00:00", "2026-11-26T04:23:05+00:00", 160.0),
    "transformers/pretrained-seed0": _stretched(  # the CPU run by 56 s
        "2026-11-25T15:12:07+00:00", "2026-11-25T15:42:59+00:00", 1852.0),
}


def test_a_runs_wall_time_stretched_within_the_old_slack_is_rejected(cache):
    """Trial 29's R-1: 30 s allowed on each side of a Transformers run's events, and 20 % of
    its wall time outside its timed part, let a GPU run's time grow 14 % and the device
    table's minutes with it; the committed runs need 1.3 s, 2.4 s and 2 %."""
    for key, change in STRETCHED.items():
        _edit(cache / key / "manifest.json", change)
    judged = {r.key: r for r in discover_runs(cache)}
    for key in STRETCHED:
        assert not judged[key].valid, key
        assert any("start_time" in p or "time_s" in p for p in judged[key].problems), \
            judged[key].problems


# --- a device call's record that lost a product ------------------------------------------

def test_a_call_record_that_lost_a_product_is_set_aside_not_its_runs(tmp_path):
    """Trial 29's R-23: with `data/runs/transformers-gpu` gone from a call's products, the six
    runs its jobs made were rejected ("that call never ran ...") and the record was read on;
    the record contradicts its own jobs, which ended well, and is set aside by name."""
    import shutil

    from finetune_lab.book.devices import call_records_set_aside
    from finetune_lab.runs.gpu_archive import CALL_RECORDS

    stem = "20261127T163332Z"
    here, there = PROJECT_ROOT / CALL_RECORDS, tmp_path / CALL_RECORDS
    there.mkdir(parents=True)
    for name in (f"{stem}.json", f"{stem}-nvidia-smi.csv"):
        shutil.copy2(here / name, there / name)
    assert call_records_set_aside(tmp_path) == ""
    _edit(there / f"{stem}.json", lambda m: m["products"].remove("data/runs/transformers-gpu"))
    said = call_records_set_aside(tmp_path)
    assert f"{stem}.json" in said and "brought back no transformers experiment" in said
