"""The eighth fault trial, fixed by class: a fine-tuning run logs every evaluated accuracy once
per epoch; what a manifest derives (tokens per update, parameter totals, a floor on peak memory)
is counted again; runs that shared a host at one time agree on its machine; and a link in the
run cache is listed, never read through."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_faults_trial7 import _rewrite_events

from finetune_lab.runs.registry import discover_runs


def _drop(tag: str, step: int):
    """Remove ``tag``'s value at update ``step`` from each event (the other tags stay)."""
    def change(event):
        if event.step == step:
            keep = [v for v in event.summary.value if v.tag != tag]
            del event.summary.value[:]
            event.summary.value.extend(keep)
    return change


def _record(cache: Path, key: str):
    experiment = key.split("/")[0]
    return {r.key: r for r in discover_runs(cache, [experiment])}[key]


def _edit(cache: Path, key: str, change) -> None:
    path = cache / key / "manifest.json"
    man = json.loads(path.read_text())
    change(man)
    path.write_text(json.dumps(man))


# --- E8, E10, E12: an accuracy missing at one epoch -------------------------------------------


@pytest.mark.parametrize("key, folder, tag, step, said", [
    ("fairseq/random-seed0", "test", "accuracy", 900, "its test accuracy is logged 4 times at 4 updates"),
    ("fairseq/random-seed0", "valid", "accuracy", 450, "its valid accuracy is logged 4 times at 4"),
    ("transformers/pretrained-seed0", "", "test/accuracy", 450, "its test accuracy is logged"),
    ("transformers/pretrained-seed0", "", "eval/accuracy", 450, "its eval accuracy is logged"),
])
def test_an_accuracy_missing_at_one_epoch_rejects_the_run(cache, key, folder, tag, step, said):
    """E8 (fairseq test), E10 (Transformers test), E12 (validation: another best epoch was
    chosen): the seed tables printed n = 3 over two values, and the run passed."""
    assert _record(cache, key).valid
    path = next(p for p in (cache / key / folder).iterdir() if p.name.startswith("events.out"))
    _rewrite_events(path, _drop(tag, step))
    rec = _record(cache, key)
    assert not rec.valid and said in rec.reason and "5 epochs" in rec.reason, rec.reason


def test_an_evaluation_logged_at_another_update_rejects_the_run(cache):
    key = "transformers/pretrained-seed1"
    path = next(p for p in (cache / key).iterdir() if p.name.startswith("events.out"))

    def move(event):
        if event.step == 675 and any(v.tag == "test/accuracy" for v in event.summary.value):
            event.step = 676
    _rewrite_events(path, move)
    rec = _record(cache, key)
    # rejected: the moved value comes after update 676's events, and the file then goes back
    assert not rec.valid and ("logged at different updates" in rec.reason
                              or "goes back from update 676 to 675" in rec.reason), rec.reason


# --- S19: a machine its neighbours do not share -----------------------------------------------


def test_a_core_count_no_run_beside_it_records_rejects_the_run(cache):
    """S19: 16 cores and 16 threads on one seed of a grid whose seeds before and after it ran on
    a 2-core machine: the layout table gained a row, and the run passed (threads ≤ cores held)."""
    def edit(man):
        man["device"]["cpu_count"], man["device"]["threads"] = 16, 16
    _edit(cache, "fairseq/random-seed0", edit)
    records = {r.key: r for r in discover_runs(cache)}
    rec = records["fairseq/random-seed0"]
    assert not rec.valid and "with 16 cores" in rec.reason and "with 2 cores" in rec.reason
    assert records["fairseq/random-seed1"].valid and records["fairseq/random-seed2"].valid


# --- S20, S21, S22, S23: numbers a manifest derives -------------------------------------------


def test_a_gpu_peak_below_the_runs_own_weights_rejects_it(cache):
    """S20: 1 MiB of GPU memory for 23 M parameters."""
    for seed in range(3):
        _edit(cache, f"lora-gpu/lora-qv-seed{seed}",
              lambda m: m["extra"]["peak_memory"].update(bytes=1_048_576))
    rec = _record(cache, "lora-gpu/lora-qv-seed0")
    assert not rec.valid and "is less than its own parameters take" in rec.reason


@pytest.mark.parametrize("key", ["pretrain/cpu-long2", "pretrain/cpu-long3"])
def test_tokens_per_update_is_its_batch_times_sample_times_frequency(cache, key):
    """S21 (a complete run) and S22 (a paused one, which the plateau table shows as unfinished):
    8,192 tokens per update where 16 × 256 × 1 is 4,096 moved "tokens behind" by 20 M."""
    before = _record(cache, key)
    assert before.valid or before.unfinished
    _edit(cache, key, lambda m: m["hyperparameters"].update(tokens_per_update=8192))
    rec = _record(cache, key)
    assert not rec.valid and not rec.unfinished
    assert "tokens_per_update 8,192 but its batch_size 16 × tokens_per_sample 256 × " \
           "update_freq 1 is 4,096" in rec.reason


def test_a_lora_total_its_model_does_not_give_rejects_every_seed(cache):
    """S23: the total doubled on all three seeds (the vote saw no minority): the LoRA chapter's
    trainable share went from 1.68 % to 0.84 %."""
    for seed in range(3):
        _edit(cache, f"lora/lora-qv-seed{seed}",
              lambda m: m["extra"]["parameters"].update(total=46_976_008))
    records = {r.key: r for r in discover_runs(cache, ["lora"])}
    assert all(not records[f"lora/lora-qv-seed{s}"].valid for s in range(3))
    assert "its model_size gives 23,488,004" in records["lora/lora-qv-seed0"].reason
    assert records["lora/lora-attn-seed0"].valid


def test_the_total_a_run_is_held_to_is_the_real_models_and_peft_adds_the_trainable():
    """The analytic total against Transformers' model and peft's count, at the lab's size."""
    from peft import LoraConfig, get_peft_model
    from transformers import RobertaForSequenceClassification

    from finetune_lab.models.params import SMALL, hf_config
    from finetune_lab.runs.derived_counts import roberta_classifier_total

    model = RobertaForSequenceClassification(hf_config(SMALL))
    base = sum(p.numel() for p in model.parameters())
    size = {k: getattr(SMALL, k) for k in ("vocab", "dim", "ffn", "heads", "layers",
                                           "positions", "classes")}
    assert roberta_classifier_total(size) == base == 23_093_250
    lora = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=16,
                                            target_modules=["query", "value"]))
    trainable, total = lora.get_nb_trainable_parameters()
    assert total == base + trainable


# --- L1: links in the run cache ---------------------------------------------------------------


def test_a_link_in_the_run_cache_is_listed_and_never_read_through(cache):
    """L1: `fairseq/loop -> ..` made the registry read every run a second time through it; the
    paused pretraining runs were then taken for copies of themselves, and the machine-layout
    table counted runs twice."""
    from finetune_lab.book import fairseq_report as fr

    before = {r.key: (r.valid, r.unfinished) for r in discover_runs(cache)}
    layout = fr.layout_speeds(fr.load_results(), cache).to_dict("records")
    os.symlink("..", cache / "fairseq" / "loop")
    os.symlink("fairseq", cache / "fairseq-shortcut")
    after = {r.key: r for r in discover_runs(cache)}
    assert {k: (r.valid, r.unfinished) for k, r in after.items() if k in before} == before
    assert "is a link (to ..)" in after["fairseq/loop"].reason
    assert "is a link (to fairseq)" in after["fairseq-shortcut/(link)"].reason
    assert fr.layout_speeds(fr.load_results(), cache).to_dict("records") == layout


# --- G1, G4: a device call's record against itself --------------------------------------------


def _call_record() -> dict:
    from finetune_lab.config import PROJECT_ROOT

    return json.loads((PROJECT_ROOT / "data" / "summaries" / "gpu-lab" /
                       "20261126T041935Z.json").read_text())


def test_a_call_record_listing_a_job_twice_or_a_part_it_did_not_plan_is_set_aside():
    """G1: two jobs listed twice made "23 runs side by side" of 21 and grew the MFU by 14/12;
    G4: lora dropped from the plan's lab_parts while its 9 jobs stayed: the chapter said no GPU
    was ever lent."""
    from finetune_lab.runs.gpu_archive import call_record_problem

    meta = _call_record()
    assert call_record_problem(meta, "20261126T041935Z") is None
    twice = {**meta, "jobs": meta["jobs"] + [j for j in meta["jobs"]
                                             if j["job"] == "fairseq-pretrained-seed0"]}
    assert "lists job fairseq-pretrained-seed0 more than once" in call_record_problem(twice)
    unplanned = {**meta, "plan": {**meta["plan"], "lab_parts": ["fairseq", "transformers"]}}
    assert "ran lora jobs but its plan's lab_parts are" in call_record_problem(unplanned)


# --- P8: a run sent into an experiment of another kind ----------------------------------------


def _experiment_with_a_run(tmp_path: Path, hp: dict) -> Path:
    exp = tmp_path / "transformers"
    (exp / "pretrained-seed0").mkdir(parents=True)
    (exp / "pretrained-seed0" / "manifest.json").write_text(json.dumps({"hyperparameters": hp}))
    return exp


def test_a_lora_run_is_refused_by_the_full_fine_tunings_experiment_before_any_work(tmp_path):
    """P8: `finetune lora --experiment transformers` trained for 4 minutes, then wrote an
    experiment.json pinning its LoRA recipe: the 3 committed Transformers runs turned BAD and
    the LoRA run became the chapter's only "Transformers" run."""
    from finetune_lab.runs.experiments import RecipeConflict, refuse_other_recipe

    exp = _experiment_with_a_run(tmp_path, {"epochs": 5, "lr": 1e-5})
    with pytest.raises(RecipeConflict, match="holds full fine-tuning runs .pretrained-seed0.: a "
                                             "run of LoRA fine-tuning does not belong there"):
        refuse_other_recipe(exp, {"epochs": 1, "lr": 1e-4, "lora": {"r": 16}})
    refuse_other_recipe(exp, {"epochs": 1, "lr": 1e-4})  # the same kind: experiment.json decides
    assert sorted(p.name for p in exp.iterdir()) == ["pretrained-seed0"]


def test_a_first_experiment_json_that_would_reject_a_run_there_is_not_written(tmp_path):
    from finetune_lab.runs.experiments import RecipeConflict, write_new_config

    exp = _experiment_with_a_run(tmp_path, {"epochs": 5, "lr": 1e-5})
    config = {"hyperparameters": {"epochs": 1, "lr": 1e-5}, "varying": []}
    with pytest.raises(RecipeConflict, match="its run pretrained-seed0 was made with another "
                                             "recipe .it differs in epochs."):
        write_new_config(exp, config)
    assert not (exp / "experiment.json").exists()
    write_new_config(exp, config, skip="pretrained-seed0")  # the run it is pinned from
    assert json.loads((exp / "experiment.json").read_text()) == config


# --- R1, W5: folders given for the runs root ---------------------------------------------------


def test_runs_given_an_experiment_folder_for_the_root_says_what_to_give(cache, capsys):
    """R1: every subset folder of six valid runs was listed BAD, with advice to delete it."""
    from finetune_lab.cli import main

    assert main(["runs", "--root", str(cache / "fairseq"), "--no-inputs"]) == 2
    err = capsys.readouterr().err
    assert f"is an experiment folder (pretrained-seed0/manifest.json), not the runs root: give " \
           f"--root {cache} --experiment fairseq" in err and "delete" not in err


def test_a_runs_root_inside_another_commands_output_is_refused(tmp_path):
    """W5: `--runs-root data/work/cls.books` recorded a run inside the prepared data, and 33
    runs that read that folder turned BAD for a file they never saw."""
    from finetune_lab import _files
    from finetune_lab.errors import UserError
    from finetune_lab.runs.recording import run_dir_for

    prepared = tmp_path / "cls.books"
    prepared.mkdir()
    (prepared / _files.OUTPUT_MARKER).write_text(json.dumps(
        {"command": "prepare-cls", "entries": []}))
    with pytest.raises(UserError, match="which `finetune-lab prepare-cls` made"):
        run_dir_for("transformers-1ep", "random-seed7", prepared)
    with pytest.raises(UserError, match="is inside"):
        run_dir_for("x", "random-seed7", prepared / "deeper")
    assert run_dir_for("x", "random-seed7", tmp_path / "runs") == tmp_path / "runs" / "x" / \
        "random-seed7"
    assert sorted(p.name for p in prepared.iterdir()) == [_files.OUTPUT_MARKER]


# --- P9: Ctrl-C before a long run's first save ------------------------------------------------


def _failed_long_run(tmp_path: Path, last_step: int) -> tuple[Path, Path]:
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    run = tmp_path / "runs" / "pretrain" / "zz1"
    (run / "train_inner").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"status": "failed", "run": "zz1"}))
    with open(run / "train_inner" / "events.out.tfevents.1.vm.1.0", "wb") as out:
        writer = RecordWriter(out)  # as every writer does: the file's version first
        writer.write(event_pb2.Event(wall_time=1.0, file_version="brain.Event:2")
                     .SerializeToString())
        event = event_pb2.Event(step=last_step, wall_time=1.0)
        event.summary.value.add(tag="loss", simple_value=9.0)
        writer.write(event.SerializeToString())
    state = tmp_path / "pretrain-checkpoints" / "zz1"
    state.mkdir(parents=True)
    return run, state


def test_a_long_run_stopped_before_its_first_save_starts_over(tmp_path, capsys):
    """P9: the same command again refused, saying the state "is not on this machine", on the
    machine that ran it, for a run that never saved anything."""
    from finetune_lab.train.pretrain_long import start_over_unsaved

    run, state = _failed_long_run(tmp_path, 20)
    start_over_unsaved(run, state, 250)
    assert not run.exists() and "stopped at update 20, before its first save" in \
        capsys.readouterr().out


@pytest.mark.parametrize("case", ["saved-elsewhere", "paused", "state-here"])
def test_an_unfinished_long_run_that_saved_is_never_started_over(tmp_path, case):
    from finetune_lab.errors import UserError
    from finetune_lab.train.pretrain_long import start_over_unsaved

    run, state = _failed_long_run(tmp_path, 600 if case == "saved-elsewhere" else 20)
    if case == "paused":
        (run / "manifest.json").write_text(json.dumps({"status": "paused", "run": "zz1"}))
    if case == "state-here":
        (state / "checkpoint_1_250.pt").write_bytes(b"x")
    with pytest.raises(UserError, match="is not on this machine. It cannot resume"):
        start_over_unsaved(run, state, 250)
    assert (run / "manifest.json").is_file()


# --- K1: other weights where runs found theirs ------------------------------------------------


def test_packaging_where_recorded_runs_found_their_weights_needs_force(cache, tmp_path, capsys):
    """K1: `package-checkpoint --dest data/work/candidates/cpu-long3-u2750` (absent on a clone)
    filled the folder two committed candidate runs name with other weights: both turned BAD."""
    from finetune_lab.cli import main
    from finetune_lab.config import PROJECT_ROOT

    dest = PROJECT_ROOT / "data" / "work" / "candidates" / "cpu-long3-u2750"
    weights = tmp_path / "m.pt"
    weights.write_bytes(b"not read: refused before")
    existed = dest.exists()
    assert main(["package-checkpoint", str(weights), "--trust", "--dest", str(dest)]) == 2
    assert "is where run fairseq-candidate-5/pretrained-seed0 and 1 more found the weights" in \
        capsys.readouterr().err
    assert dest.exists() == existed
