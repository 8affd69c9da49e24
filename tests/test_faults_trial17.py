"""The sixteenth fault trial's last open defects and the seventeenth's, fixed by class: a run
that other runs or the packaged checkpoint are built on is never replaced, and a run built on
another run of the same name is rejected; the book reads no checkpoint folder outside the
project, and the folders its records name inside it are freeze inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError

RUNS = PROJECT_ROOT / "data" / "runs"


def test_a_run_others_are_built_on_is_not_overwritten():
    """O-1: `pretrain --run cpu-seed1 --overwrite` replaced the first run behind the packaged
    checkpoint; three chapters then advised a `git checkout` of an unchanged file."""
    from finetune_lab.train.pretrain import refuse_built_on
    from finetune_lab.train.pretrain_lineage import runs_built_on

    built = runs_built_on(RUNS / "pretrain" / "cpu-seed1", RUNS)
    assert built[0] == "the packaged checkpoint data/checkpoints/roberta-small-fr"
    assert {"run pretrain/cpu-seed1-c1", "run pretrain/cpu-sinpos1-bow",
            "run fairseq/pretrained-seed0"} <= set(built)
    assert "run pretrain/cpu-seed1" not in built
    with pytest.raises(UserError, match=r"cpu-seed1: the packaged checkpoint .* and \d+ more "
                                        "are built on this run"):
        refuse_built_on(RUNS / "pretrain" / "cpu-seed1", RUNS)
    assert runs_built_on(RUNS / "pretrain" / "cpu-long4", RUNS) == []
    refuse_built_on(RUNS / "pretrain" / "cpu-long4", RUNS)  # nothing cites it


def test_a_run_built_on_another_run_under_its_name_is_rejected(tmp_path):
    """O-1's registry side: a continued run whose lineage names a run that started after it
    (the first run replaced) is rejected, naming the replaced run."""
    from finetune_lab.runs.crosscheck import lineage_time_problems
    from finetune_lab.runs.registry import RunRecord

    def record(name: str, **edit) -> RunRecord:
        man = json.loads((RUNS / "pretrain" / name / "manifest.json").read_text())
        return RunRecord(tmp_path / name, "pretrain", name, {**man, **edit})

    child = record("cpu-seed1-c1")
    lineage_time_problems([child], [child, record("cpu-seed1")])
    assert child.problems == []
    replaced = record("cpu-seed1", start_time="2026-11-27T09:00:00+00:00")
    lineage_time_problems([child], [child, replaced])
    (said,) = child.problems
    assert said.startswith("extra.continued_from.lineage names pretrain/cpu-seed1, but the run "
                           "there started at 2026-11-27 09:00, after this run started")


def test_the_lineage_check_names_the_run_as_a_side_that_may_have_changed():
    """O-1: the package's lineage disagreeing with its run blamed only the package's manifest."""
    from finetune_lab.models.checkpoints import lineage_step_updates

    run = json.loads((RUNS / "pretrain" / "cpu-seed1" / "manifest.json").read_text())
    with pytest.raises(UserError) as err:
        lineage_step_updates({"run": "data/runs/pretrain/cpu-seed1", "updates": 2}, run)
    said = str(err.value)
    assert "another one under its name" in said and "data/runs/.superseded/" in said
    assert "git checkout -- data/checkpoints/roberta-small-fr/manifest.json" in said


def test_weights_outside_the_project_are_not_recorded_nor_read(tmp_path, monkeypatch):
    """CF-v2: `fill-mask --checkpoint /tmp/h/zzpk` was recorded; the book then read that folder,
    and whether it existed decided whether a damaged record was shown."""
    from finetune_lab.book import fill_mask as fm
    from finetune_lab.book.summary_files import read_records, weights_outside
    from finetune_lab.runs import manifest
    from finetune_lab.runs.manifest import outside_project, weights_record

    outside = tmp_path / "zzpk"
    outside.mkdir()
    (outside / "model.pt").write_bytes(b"weights")
    book_record = PROJECT_ROOT / "data" / "summaries" / "fill-mask" / "zzout.json"
    with pytest.raises(UserError, match="zzpk lies outside the project"):
        weights_record(outside, book_record)
    assert weights_record(outside, tmp_path / "zzout.json")["path"] == str(outside / "model.pt")
    with pytest.raises(UserError, match="lies outside the project"):
        fm.record_fill_mask(outside, "zz-never-written")
    assert not (book_record.parent / "zz-never-written.json").exists()
    assert outside_project(str(outside)) and outside_project("data/../../x")
    assert not outside_project("data/work/candidates/cpu-long/model.pt")
    record = json.loads((PROJECT_ROOT / "data" / "summaries" / "fill-mask" /
                         "cpu-sinpos1.json").read_text())
    moved = {**record, "checkpoint": {**record["checkpoint"], "path": str(outside / "model.pt")}}
    assert "names weights outside the project" in weights_outside(moved)
    assert weights_outside(record) is None
    # records kept outside the project are read as they are; the book's own are set aside
    # before any folder is read
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cpu-sinpos1.json").write_text(json.dumps(moved))
    kept, bad = read_records(elsewhere, fm.RECORD_FIELDS)
    assert len(kept) == 1 and bad == []
    project = tmp_path / "project"
    book = project / "data" / "summaries" / "fill-mask"
    book.mkdir(parents=True)
    (book / "cpu-sinpos1.json").write_text(json.dumps(moved))
    monkeypatch.setattr(manifest, "PROJECT_ROOT", project)
    kept, bad = read_records(book, fm.RECORD_FIELDS)
    (said,) = bad
    assert kept == [] and "names weights outside the project" in said


def test_the_folders_records_name_are_inputs_of_the_chapters_that_show_them(tmp_path):
    """CF-v2: a record's checkpoint folder inside the project was read by the book and hashed by
    no freeze record."""
    from finetune_lab.book.chapter_inputs import chapter_inputs
    from finetune_lab.runs.run_inputs import record_folders

    records = tmp_path / "data" / "summaries" / "fill-mask"
    records.mkdir(parents=True)
    for name, path in (("a", "data/work/candidates/zz/model.pt"), ("b", "/tmp/zzpk/model.pt"),
                       (".c", "data/work/candidates/hidden/model.pt")):
        (records / f"{name}.json").write_text(json.dumps({"checkpoint": {"path": path}}))
    (records / "d.json").write_text("{")
    assert record_folders(tmp_path) == ["data/work/candidates/zz/dict.txt",
                                        "data/work/candidates/zz/manifest.json"]
    inputs = chapter_inputs(PROJECT_ROOT, "chapters/standin-build.qmd")
    assert set(record_folders(PROJECT_ROOT)) <= set(inputs)
    assert all(Path(p).name in ("dict.txt", "manifest.json") for p in record_folders(PROJECT_ROOT))


def test_the_training_size_is_read_from_the_index_as_fairseq_reads_it(tiny_pipeline, tmp_path):
    """Issue 36: every fine-tuning launch imported fairseq (five seconds) to count the training
    reviews; the count is the index header's, the same as fairseq's own reader gives."""
    from finetune_lab.models.fairseq_compat import quiet_import
    from finetune_lab.train.finetune_fairseq import train_size

    quiet_import()
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    bin_dir = tiny_pipeline["cls_bin"]
    assert train_size(bin_dir) == len(MMapIndexedDataset(str(bin_dir / "label" / "train"))) > 0
    damaged = tmp_path / "bin" / "label"
    damaged.mkdir(parents=True)
    (damaged / "train.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(30))
    with pytest.raises(UserError, match=r"train.idx is no fairseq mmap index"):
        train_size(tmp_path / "bin")
    (damaged / "train.idx").unlink()
    with pytest.raises(UserError, match=r"train.idx cannot be read"):
        train_size(tmp_path / "bin")
