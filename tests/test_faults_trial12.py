"""The twelfth fault trial, fixed by class: a file writer's ``--force`` never replaces a file
of the project outside its scratch and records (a data summary overwrote a source file and a
test, directly or through a link); a work folder pointed into the project is no scratch there (a
package and the chapters were deleted); a new folder goes nowhere in the run store, the records
or the data root; no record is written through a link; a fill-mask record is checked as a probe
record is (its start after its weights were made, its device); a median is a length or the mean
of two."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError


@pytest.mark.parametrize("target", ["src/finetune_lab/cli.py", "chapters/data.qmd", "README.md",
                                    "tests/conftest.py"])
def test_data_summary_never_overwrites_a_file_of_the_project(target, tmp_path):
    """A21, A37: `data-summary --out <a source file> --force`, and the same through a link."""
    from finetune_lab.book.data_summary import check_summary_dest

    link = tmp_path / "lnf"
    os.symlink(PROJECT_ROOT / target, link)
    for dest in (PROJECT_ROOT / target, link):
        with pytest.raises(UserError) as err:
            check_summary_dest(dest, force=True)
        assert "lies in the project" in str(err.value) and "--force included" in str(err.value)


def test_a_work_folder_in_the_project_makes_nothing_there_scratch(monkeypatch):
    """A29, A30: FINETUNE_LAB_WORK_DIR=src, then `adopt-tokenizer --out src/finetune_lab
    --force`, deleted the package."""
    from finetune_lab._files import check_replaceable

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(PROJECT_ROOT / "src"))
    with pytest.raises(UserError) as err:
        check_replaceable(PROJECT_ROOT / "src" / "finetune_lab", "adopt-tokenizer", force=True)
    assert "exists and was not made by" in str(err.value) and "--force" not in str(err.value)


@pytest.mark.parametrize("where, said", [("runs", "lies in the run store"),
                                         ("summaries/probes", "lies in the records' folder")])
def test_a_new_folder_goes_nowhere_in_the_stores(cache, where, said):
    """A43, A45: a new --out in the run store or the records was written (a run listed BAD)."""
    from finetune_lab._files import check_replaceable

    base = cache if where == "runs" else PROJECT_ROOT / "data" / where
    with pytest.raises(UserError) as err:
        check_replaceable(base / "zz-new", "adopt-tokenizer")
    assert said in str(err.value) and not (base / "zz-new").exists()


def test_no_record_is_written_through_a_link(tmp_path):
    """L4, L5: a link at fill-mask's record path wrote into cli.py or another record."""
    from finetune_lab.config import check_new_record

    other = tmp_path / "cpu-long.json"
    other.write_text("{}")
    link = tmp_path / "zz13.json"
    os.symlink(other, link)
    with pytest.raises(UserError) as err:
        check_new_record(link, "a record", force=True)
    assert str(err.value) == (f"{link} is a link (to {other}): a record is a file of its own; "
                              "remove the link or choose another --name")


@pytest.mark.parametrize("change, said", [
    (lambda r: r.update(wall_time_s=99999.0), "before its weights were made at"),       # FM12
    (lambda r: r["device"].update(type="cuda"), "says device type 'cuda' named 'AMD EPYC'"),
])
def test_a_fill_mask_record_is_checked_as_a_probe_record_is(tmp_path, change, said):
    from finetune_lab.book import fill_mask

    records = tmp_path / "fill-mask"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "fill-mask", records)
    record = json.loads((records / "cpu-sinpos1.json").read_text())
    change(record)
    (records / "cpu-sinpos1.json").write_text(json.dumps(record))
    aside: list[str] = []
    assert "cpu-sinpos1" not in fill_mask.recorded_fill_masks(records, set_aside=aside)
    assert len(aside) == 1 and said in aside[0], aside


def test_a_median_is_a_length_or_the_mean_of_two():
    """D32: a median of 110.3 was printed."""
    from finetune_lab.data.cls_splits import count_contradiction, read_summary

    record = read_summary()
    record["lengths"]["stats"]["train"]["median"] = 110.3
    assert count_contradiction(record) == "lengths.stats.train.median 110.3 is no length, nor " \
        "the mean of two"
