"""The seventh fault trial, fixed by class: the book reads only the event files the registry
lists, and a logged accuracy that is no percentage or an event file without times rejects its
run; an experiment.json keeps every value it pins; ..."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from finetune_lab._files import sha256_file
from finetune_lab.errors import UserError
from finetune_lab.runs.eventfiles import strict_events
from finetune_lab.runs.registry import discover_runs


def _rewrite_events(path: Path, change) -> None:
    """Write ``path`` again with ``change(event)`` applied to each event (TensorBoard's own
    record writer), and put its new sha256 in the run's manifest, as a careful forger would."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    events = list(strict_events(path))
    path.unlink()  # hard-linked to the committed file: a new inode, never the original's bytes
    with open(path, "wb") as out:
        writer = RecordWriter(out)
        for event in events:
            change(event)
            writer.write(event.SerializeToString())
    run = next(p for p in path.parents if (p / "manifest.json").is_file())
    man = json.loads((run / "manifest.json").read_text())
    man["outputs"][path.relative_to(run).as_posix()] = sha256_file(path)
    (run / "manifest.json").write_text(json.dumps(man))


def _set_tag(tag: str, value: float, step: int | None = None):
    def change(event):
        for v in event.summary.value:
            if v.tag == tag and (step is None or event.step == step):
                if v.HasField("simple_value"):
                    v.simple_value = value
                else:
                    from tensorboard.util import tensor_util

                    v.tensor.CopyFrom(tensor_util.make_tensor_proto(value))
    return change


def _results(experiment: str = "fairseq"):
    from finetune_lab.book import fairseq_report as fr

    return fr.seed_summary(fr.load_results(experiment=experiment)).to_dict("records")


# --- E1, E2: files beside the listed event files ---------------------------------------------


def test_a_foreign_event_file_or_a_linked_folder_in_a_run_changes_no_number(cache):
    """E1: another run's test log beside a run's own, under a name the registry does not list,
    moved the random mean from 69.07 to 72.47; E2: a linked folder inside a subset did the
    same. The book now reads exactly the event files the registry lists and hashes."""
    before = _results()
    other = next((cache / "fairseq" / "pretrained-seed0" / "test").iterdir())
    test = cache / "fairseq" / "random-seed0" / "test"
    (test / "from-pretrained.tfevents").write_bytes(other.read_bytes())
    os.symlink("../../pretrained-seed1/test", cache / "fairseq" / "random-seed1" / "test" / "more")
    assert {r.key: r.valid for r in discover_runs(cache, ["fairseq"])}["fairseq/random-seed0"]
    assert _results() == before


# --- E3, E4, E5: what an event file logs ----------------------------------------------------


@pytest.mark.parametrize("run, tag, value", [
    ("fairseq/random-seed2/test", "accuracy", math.nan),       # E3: n=3 over two values
    ("transformers/pretrained-seed1", "test/accuracy", 101.5),  # E4: 76.67 -> 84.77
    ("fairseq/random-seed2/valid", "best_accuracy", -3.0),
])
def test_a_logged_accuracy_that_is_no_percentage_rejects_its_run(cache, run, tag, value):
    path = next(p for p in (cache / run).iterdir() if p.name.startswith("events.out"))
    _rewrite_events(path, _set_tag(tag, value))
    experiment, name = run.split("/")[:2]
    rec = {r.key: r for r in discover_runs(cache, [experiment])}[f"{experiment}/{name}"]
    assert not rec.valid and f"{tag} at update" in rec.reason and "not a percentage" in rec.reason


def test_event_files_without_wall_clock_times_reject_their_run(cache):
    """E5: wall times set to 0 left the end time unchecked (the speed table moved 10 min)."""
    run = cache / "fairseq" / "random-seed0"
    path = next((run / "valid").iterdir())

    def no_time(event):
        event.wall_time = 0
    _rewrite_events(path, no_time)
    rec = {r.key: r for r in discover_runs(cache, ["fairseq"])}["fairseq/random-seed0"]
    assert not rec.valid and "records no wall-clock time" in rec.reason


# --- D1: a user's files under the names a run writes -----------------------------------------


def test_a_users_train_log_in_a_folder_of_a_failed_run_is_moved_aside_not_deleted(tmp_path):
    """D1: `analysis/train.log` and `analysis/manifest.json` (a user's notes) passed for a
    run's own files, by name, and the re-run deleted them."""
    from finetune_lab.runs.recording import set_aside

    run = tmp_path / "pretrain-gpu" / "gpu2"
    (run / "train").mkdir(parents=True)
    (run / "train" / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    (run / "train.log").write_text("the run's log")
    (run / "manifest.json").write_text(json.dumps({"status": "failed", "outputs": {}}))
    (run / "analysis").mkdir()
    (run / "analysis" / "train.log").write_text("my notes on why gpu2 died")
    (run / "analysis" / "manifest.json").write_text('{"mine": true}')
    moved = set_aside(run)
    assert moved is not None and not run.exists()
    assert (moved / "analysis" / "train.log").read_text() == "my notes on why gpu2 died"
    assert json.loads((moved / "analysis" / "manifest.json").read_text()) == {"mine": True}


# --- S8: a manifest field against another of the same record ---------------------------------


def test_more_threads_than_the_machine_has_cores_rejects_the_run(cache):
    """S8: `device.threads` 1 -> 64 on a 2-core machine added a row to the layout table."""
    path = cache / "fairseq" / "random-seed0" / "manifest.json"
    man = json.loads(path.read_text())
    man["device"]["threads"] = 64
    path.write_text(json.dumps(man))
    rec = {r.key: r for r in discover_runs(cache, ["fairseq"])}["fairseq/random-seed0"]
    assert not rec.valid and "device.threads 64 is more than its device.cpu_count 2" in rec.reason


# --- S2, S3, S12, S16: a device call's record ------------------------------------------------

from finetune_lab.config import PROJECT_ROOT  # noqa: E402
from finetune_lab.runs import crosscheck, gpu_archive, gpu_calls  # noqa: E402

LAB_CALL = PROJECT_ROOT / "data" / "summaries" / "gpu-lab" / "20261126T041935Z.json"


@pytest.mark.parametrize("change, says", [
    (lambda m: m["timings_s"].update(install=-100.0), "says its timings_s.install took -100 s"),
    (lambda m: m["timings_s"].update(install=120.0),
     "its phases one after another (install, data, runs) took 361 s"),
], ids=["negative", "parts-add-up-to-more"])
def test_call_timings_that_cannot_be_are_set_aside(change, says):
    """S2: "-69 s of it setup"; S3: 151 s of setup beside 210 s of runs in a 250 s call."""
    meta = json.loads(LAB_CALL.read_text())
    assert gpu_archive.call_record_problem(meta, LAB_CALL.stem) is None
    change(meta)
    assert says in gpu_archive.call_record_problem(meta)


def _record_with_samples(folder) -> None:
    """The lab call's record and its nvidia-smi samples, which hold its clock, in ``folder``."""
    (folder / LAB_CALL.name).write_text(LAB_CALL.read_text())
    samples = LAB_CALL.with_name(f"{LAB_CALL.stem}-nvidia-smi.csv")
    (folder / samples.name).write_text(samples.read_text())


def test_a_copy_of_a_call_record_under_a_later_name_is_set_aside(tmp_path):
    """S12: the copy became the latest call and two sentences of the chapter went."""
    from finetune_lab.book import devices

    folder = tmp_path / gpu_archive.CALL_RECORDS
    folder.mkdir(parents=True)
    _record_with_samples(folder)
    (folder / "20261127T000000Z.json").write_text(LAB_CALL.read_text())
    assert devices.latest_call(tmp_path).name == LAB_CALL.stem
    assert "is the record of call 20261126T041935Z" in devices.call_records_set_aside(tmp_path)
    assert [c.start.day for c in gpu_calls.call_devices(tmp_path)] == [26]


def test_a_gpu_run_longer_than_its_job_in_the_call_is_rejected(cache):
    """S16: 100 s added to three runs' end, wall and timed part moved the device table's
    minutes; their jobs in the call's record took 157 to 163 s."""
    path = cache / "transformers-gpu" / "pretrained-seed0" / "manifest.json"
    man = json.loads(path.read_text())
    import pandas as pd

    man["end_time"] = (pd.Timestamp(man["end_time"]) + pd.Timedelta(seconds=100)).isoformat()
    man["wall_time_s"] += 100
    man["extra"]["time_s"] += 100
    path.write_text(json.dumps(man))
    rec = {r.key: r for r in discover_runs(cache)}["transformers-gpu/pretrained-seed0"]
    # its own event files' span says so first (22b's M-e8), else the call's record
    assert not rec.valid and ("but its job transformers-pretrained-seed0 in the device call"
                              in rec.reason or "between its event files' first and last events"
                              in rec.reason), rec.reason


# --- S13, S18: what a run or probe says it started from -----------------------------------


def test_a_run_crediting_other_weights_than_it_loaded_is_rejected(cache):
    """S13: checkpoint_source.run moved to cpu-clean-general1 took cpu-clean-bow1's row."""
    for seed in (0, 1, 2):
        path = cache / "fairseq-candidate-11" / f"pretrained-seed{seed}" / "manifest.json"
        man = json.loads(path.read_text())
        man["extra"]["checkpoint_source"]["run"] = "data/runs/pretrain/cpu-clean-general1"
        path.write_text(json.dumps(man))
    recs = [r for r in discover_runs(cache, ["fairseq-candidate-11"])]
    assert recs and all(not r.valid and "the weights of cpu-clean-bow1" in r.reason for r in recs)


def test_a_probe_called_random_that_probed_weights_is_set_aside(tmp_path):
    """S18: `init` "pretrained" -> "random" paired cpu-long's probe with the grid's random runs."""
    from finetune_lab.book import probe_report

    probes = tmp_path / "probes"
    probes.mkdir()
    record = json.loads((PROJECT_ROOT / "data/summaries/probes/cpu-long.json").read_text())
    record["init"] = "random"
    (probes / "cpu-long.json").write_text(json.dumps(record))
    aside: list[str] = []
    table = probe_report.probe_table(probes, set_aside=aside)
    assert table.empty and "says init 'random' with seed None" in aside[0]


# --- T7, D2: where a command writes ----------------------------------------------------------


def test_a_file_where_a_calls_folder_goes_is_one_line_and_nothing_moves(tmp_path):
    there = tmp_path / "device"
    (there / "data" / "runs" / "zzf-gpu" / "r-seed0").mkdir(parents=True)
    (there / "data" / "runs" / "zzf-gpu" / "r-seed0" / "manifest.json").write_text("{}")
    gpu_archive.pack([there / "data" / "runs" / "zzf-gpu"], tmp_path / "files", root=there,
                     extra={"products": ["data/runs/zzf-gpu"]})
    home = tmp_path / "home"
    (home / "data" / "runs").mkdir(parents=True)
    (home / "data" / "runs" / "zzf-gpu").write_text("my notes, not an experiment")
    with pytest.raises(UserError, match="zzf-gpu is a file where the call's data/runs/zzf-gpu "
                                        "goes: move it away; nothing was unpacked"):
        gpu_archive.unpack(tmp_path / "files", root=home)
    assert (home / "data" / "runs" / "zzf-gpu").read_text() == "my notes, not an experiment"


def test_packaging_onto_the_packaged_checkpoint_needs_force(tmp_path, monkeypatch, capsys):
    """D2: `package-checkpoint --dest data/checkpoints/roberta-small-fr` replaced the manifest
    the book cites (its lineage) without --force."""
    from finetune_lab.cli import main
    from finetune_lab.models import checkpoints

    dest = checkpoints.packaged_dir()
    before = (dest / "manifest.json").read_bytes()
    copy = tmp_path / "m.pt"
    copy.write_bytes(b"not read: refused before")
    assert main(["package-checkpoint", str(copy), "--trust", "--dest", str(dest)]) == 2
    assert "holds the packaged checkpoint the book reads" in capsys.readouterr().err
    assert (dest / "manifest.json").read_bytes() == before


def test_a_fairseq_run_without_the_test_log_its_command_asks_for_is_rejected(cache):
    """E7: a run whose test events were removed (and unlisted) counted as six runs over five
    test values in the device table."""
    run = cache / "fairseq-gpu" / "random-seed3"
    man = json.loads((run / "manifest.json").read_text())
    for name in [k for k in man["outputs"] if k.startswith("test/")]:
        (run / name).unlink()
        del man["outputs"][name]
    (run / "manifest.json").write_text(json.dumps(man))
    rec = {r.key: r for r in discover_runs(cache, ["fairseq-gpu"])}["fairseq-gpu/random-seed3"]
    assert not rec.valid and "evaluates test (--valid-subset valid,test)" in rec.reason, rec.reason


# --- P1 (tests/test_gpu_pretrain_call.py), P4: a recipe an experiment.json rejects ----------


def test_a_fine_tuning_its_experiment_json_rejects_is_refused_before_any_run(tiny_pipeline,
                                                                             tmp_path):
    """P4: `finetune fairseq --experiment lora` ran into an experiment whose experiment.json
    pins the LoRA recipe: hours of training for a run the registry then rejects."""
    from conftest import TINY_ARCH

    from finetune_lab.runs.experiments import RecipeConflict
    from finetune_lab.train import finetune_fairseq as ff

    exp = tmp_path / "runs" / "lora"
    exp.mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps(
        {"hyperparameters": {"lr": 5e-4, "method": "lora-qv"}, "varying": []}))
    with pytest.raises(RecipeConflict, match="pins another recipe .*differs in .*lr"):
        ff.finetune_grid(("random",), (7,), bin_dir=tiny_pipeline["cls_bin"], arch=TINY_ARCH,
                         runs_root=tmp_path / "runs", experiment="lora", log=False)
    assert sorted(p.name for p in exp.iterdir()) == ["experiment.json"]


# --- S10: what a pretraining run read --------------------------------------------------------


def test_a_corpus_kind_edited_to_dapt_does_not_hide_the_task_texts_a_run_read(cache):
    """S10: `extra.corpora` of kind "dapt" on the runs that read pretrain-tapt-bin made the
    book say the packaged weights never read a CLS-Books text."""
    from finetune_lab.book import standin

    for run in ("cpu-docbow1", "cpu-sinpos1-bow"):
        path = cache / "pretrain" / run / "manifest.json"
        man = json.loads(path.read_text())
        man.setdefault("extra", {})["corpora"] = [{
            "kind": "dapt", "path": "data/work/pretrain-tapt-bin/bin", "phase": "dapt"}]
        path.write_text(json.dumps(man))
    assert standin.task_adaptive_steps() == ["cpu-docbow1", "cpu-sinpos1-bow"]
    texts = standin.lineage_table().set_index("run")["texts"]
    assert texts["`cpu-sinpos1-bow`"].startswith("CLS-Books training texts")


def test_a_gpu_run_holding_more_memory_than_its_calls_gpu_ever_did_is_rejected(cache):
    """S9: 200 GiB on an H200 whose nvidia-smi samples peak at 26,837 MiB for all 21 runs (on
    every seed, so that the seeds agree: one run alone is its recipe's minority, trial 22)."""
    for seed in (0, 1, 2):
        path = cache / "lora-gpu" / f"lora-qv-seed{seed}" / "manifest.json"
        man = json.loads(path.read_text())
        man["extra"]["peak_memory"]["bytes"] = 200 * 2**30
        path.write_text(json.dumps(man))
    rec = {r.key: r for r in discover_runs(cache, ["lora-gpu"])}["lora-gpu/lora-qv-seed0"]
    assert not rec.valid and "never held more than 26,837 MiB" in rec.reason, rec.reason


def test_a_lora_trainable_count_its_recipe_does_not_give_is_rejected_on_every_seed(cache):
    """S15: 394,754 -> 1,000 on all three seeds of lora-qv passed the seeds' majority vote."""
    for seed in (0, 1, 2):
        path = cache / "lora" / f"lora-qv-seed{seed}" / "manifest.json"
        man = json.loads(path.read_text())
        man["extra"]["parameters"]["trainable"] = 1000
        path.write_text(json.dumps(man))
    recs = {r.key: r for r in discover_runs(cache, ["lora"])}
    for seed in (0, 1, 2):
        rec = recs[f"lora/lora-qv-seed{seed}"]
        assert not rec.valid and "trains 394,754" in rec.reason, rec.reason
    assert recs["lora/lora-attn-seed0"].valid  # 525,826: four adapted projections


def test_a_call_record_naming_another_gpu_than_all_its_runs_is_set_aside_not_them(tmp_path,
                                                                                  monkeypatch):
    """S17: one edited line of the lab call's record (H200 -> H100) rejected its 21 runs,
    which all agree, and the chapter named the H100."""
    import shutil

    from finetune_lab.book import devices
    from finetune_lab.config import RUNS_DIR_ENV

    from conftest import link_events

    root = tmp_path / "project"
    shutil.copytree(PROJECT_ROOT / "data" / "runs", root / "data" / "runs",
                    copy_function=link_events)
    shutil.copytree(LAB_CALL.parent, root / gpu_archive.CALL_RECORDS)
    record = root / gpu_archive.CALL_RECORDS / LAB_CALL.name
    meta = json.loads(record.read_text())
    meta["device"]["name"] = "NVIDIA H100 80GB HBM3"
    record.write_text(json.dumps(meta))
    monkeypatch.setenv(RUNS_DIR_ENV, str(root / "data" / "runs"))
    monkeypatch.setattr(crosscheck, "call_devices", lambda: gpu_calls.call_devices(root))
    recs = {r.key: r for r in discover_runs(root / "data" / "runs", ["lora-gpu"])}
    assert all(r.valid for r in recs.values()), [r.reason for r in recs.values() if not r.valid]
    assert "names the NVIDIA H100 80GB HBM3 but the 21 runs it made name the NVIDIA H200" \
        in devices.call_records_set_aside(root)
    assert devices.latest_call(root) is None  # the only call that ran the whole lab


# --- M1, T5, P7: what a command prints and writes --------------------------------------------


def test_a_run_folder_named_with_a_newline_and_an_escape_prints_one_bad_line(tmp_path, capsys):
    from finetune_lab.cli import main

    (tmp_path / "fairseq" / "x\x1b[31mRED\nok  fairseq/fake-seed9").mkdir(parents=True)
    main(["runs", "--root", str(tmp_path), "--no-inputs"])
    out = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("ok") for line in out) and "\x1b" not in "".join(out)
    assert out[0].startswith("BAD fairseq/x\\x1b[31mRED\\nok  fairseq [")


def test_an_atomic_write_names_the_file_it_cannot_replace_and_keeps_a_users_link(tmp_path):
    from finetune_lab._files import write_json_atomic

    shared = tmp_path / "shared.json"
    shared.write_text("{}")
    link = tmp_path / "exp" / "experiment.json"
    link.parent.mkdir()
    link.symlink_to(shared)
    write_json_atomic(link, {"a": 1})  # P7: the link was replaced by a file
    assert link.is_symlink() and json.loads(shared.read_text()) == {"a": 1}
    target = tmp_path / "ro" / "experiment.json"
    target.parent.mkdir()
    target.mkdir()  # a folder where the file goes: os.replace fails, as on a read-only file
    with pytest.raises(OSError) as err:
        write_json_atomic(target, {"a": 1})
    assert err.value.filename == str(target)  # T5: it named a scratch file that was gone
    assert [p.name for p in target.parent.iterdir()] == ["experiment.json"]


def test_a_chapter_saved_with_a_byte_order_mark_keeps_its_declared_inputs(tmp_path):
    """F4: a BOM hid the front matter, so the chapter recorded no declared data inputs."""
    from finetune_lab.book.qmd import front_matter

    qmd = tmp_path / "lora.qmd"
    qmd.write_text("\ufeff---\ninputs:\n  - data/runs/lora/**\n---\n\n# LoRA\n", encoding="utf-8")
    assert front_matter(qmd) == {"inputs": ["data/runs/lora/**"]}


@pytest.mark.parametrize("change, says", [
    (lambda d: d["lengths"]["stats"]["train"].update(max=50), "train's lengths are not in order"),
    (lambda d: d["cls"]["duplicates"].update({"within valid": 500}),
     "has 500 duplicates within valid, more than the reviews there"),
])
def test_a_data_summary_whose_lengths_or_duplicates_cannot_be_is_refused(change, says, tmp_path):
    """S4: a maximum length under the mean, and 500 duplicates among 200 reviews, were shown."""
    from finetune_lab.data import cls_splits

    record = json.loads((PROJECT_ROOT / "data" / "summaries" / "data.json").read_text())
    assert cls_splits.summary_contradiction(record) is None
    change(record)
    assert says in cls_splits.summary_contradiction(record)


# --- P5, P6: what a refused pretraining leaves ------------------------------------------------


def test_a_refused_pretraining_leaves_no_experiment_json_and_a_long_run_refuses_experiment(
        tmp_path, monkeypatch, capsys):
    """P6: a --package-to refused at once still left data/runs/zzx/experiment.json; P5: a long
    run (--tokens) went to pretrain/ whatever --experiment said."""
    from finetune_lab.cli import main

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))  # as in a fresh clone
    data = tmp_path / "corpus"  # checked for its files before the run: never read
    monkeypatch.setattr("finetune_lab.train.pretrain_fairseq.check_corpus", lambda folder: None)
    data.mkdir()
    for name in ("dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx"):
        (data / name).write_text("")
    (tmp_path / "work" / "tokenizer").mkdir(parents=True)
    for name in ("spm.model", "dict.txt"):
        (tmp_path / "work" / "tokenizer" / name).write_text("")
    user = tmp_path / "u"
    user.mkdir()
    (user / "notes.txt").write_text("notes")
    assert main(["pretrain", "--max-update", "1", "--run", "zz12", "--experiment", "zzx",
                 "--data", str(data), "--package-to", str(user)]) == 2
    assert "was not made by" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "zzx").exists() and (user / "notes.txt").read_text() == "notes"
    assert main(["pretrain", "--tokens", "1e6", "--run", "zz11", "--experiment", "myexp"]) == 2
    assert "a long run (--tokens N) always goes to pretrain/" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_users_copy_of_a_call_record_under_another_name_is_set_aside_not_a_traceback(tmp_path):
    """Trial 8's G2: `old-20261126T041935Z.json` (a backup) made every chapter that reads the
    calls raise a ValueError from the name's date."""
    from finetune_lab.book import devices

    folder = tmp_path / gpu_archive.CALL_RECORDS
    folder.mkdir(parents=True)
    _record_with_samples(folder)
    (folder / f"old-{LAB_CALL.name}").write_text(LAB_CALL.read_text())
    assert devices.latest_call(tmp_path).name == LAB_CALL.stem
    assert "`old-20261126T041935Z.json` is kept as" in devices.call_records_set_aside(tmp_path)
    assert devices.seed_calls(tmp_path) == []
