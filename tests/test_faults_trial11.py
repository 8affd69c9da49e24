"""The eleventh fault trial, fixed by class: ``--force`` never reaches into the project's stores
(it deleted the probe records, the packaged checkpoint, ``src/``) and no writer writes a run's
file through a link; a fine-tuning run logs validation and test accuracy at every epoch, and its
event files are held against its train.log whatever that log's bytes; a probe started after its
weights were made; the median and 90th percentile lie in their histogram bins; what is hidden
is read by no reader, as the freeze hashes none of it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from finetune_lab._files import sha256_file
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from test_faults_trial9 import _events_file, _record


@pytest.mark.parametrize("dest, said", [
    ("data/summaries/probes", "lies in the records' folder"),            # A11, A17
    ("data/checkpoints", "is or holds the checkpoints' folder"),         # A13, A17
])
def test_force_never_replaces_a_store_of_the_project(cache, dest, said):
    from finetune_lab._files import check_replaceable

    with pytest.raises(UserError) as err:
        check_replaceable(PROJECT_ROOT / dest, "package-checkpoint", force=True)
    assert said in str(err.value) and "no command writes there, --force included" in str(err.value)


def test_force_in_the_project_replaces_only_what_the_command_made(cache):
    """A14: `package-checkpoint --force --dest src` deleted the package's sources."""
    from finetune_lab._files import check_replaceable

    with pytest.raises(UserError) as err:
        check_replaceable(PROJECT_ROOT / "src", "package-checkpoint", force=True)
    said = str(err.value)
    assert said.startswith(f"{PROJECT_ROOT / 'src'} exists and was not made by")
    assert "--force" not in said  # it would not help
    # the packaged checkpoint, which package-checkpoint made, stays replaceable with --force
    from finetune_lab.models.checkpoints import packaged_output

    check_replaceable(PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr",
                      "package-checkpoint", force=True, earlier=packaged_output)


def test_data_summary_force_replaces_no_record(cache):
    """A15: `data-summary --out <a probe record> --force` replaced it."""
    from finetune_lab.book.data_summary import check_summary_dest

    probe = PROJECT_ROOT / "data" / "summaries" / "probes" / "cpu-long.json"
    for force in (False, True):
        with pytest.raises(UserError) as err:
            check_summary_dest(probe, force=force)
        assert str(err.value) == (f"{probe} exists and is not a data summary: it was left as it "
                                  "is; choose another --out")
    run = cache / "fairseq" / "random-seed0" / "manifest.json"
    with pytest.raises(UserError, match="lies in the run store"):
        check_summary_dest(run, force=True)


def test_no_writer_writes_a_runs_file_through_a_link(cache, tmp_path):
    """L3: `fill-mask --force` through a link at its record's path overwrote a run's manifest."""
    from finetune_lab._files import write_json_atomic
    from finetune_lab.config import check_new_record

    manifest = cache / "fairseq" / "random-seed0" / "manifest.json"
    before = manifest.read_bytes()
    link = tmp_path / "zz11.json"
    os.symlink(manifest, link)
    for write in (lambda: check_new_record(link, "a record", force=True),
                  lambda: write_json_atomic(link, {"name": "zz11"})):
        with pytest.raises(UserError) as err:
            write()
        assert f"(it links to {manifest})" in str(err.value) and "lies in the run store" in \
            str(err.value)
    assert manifest.read_bytes() == before and link.is_symlink()


@pytest.mark.parametrize("key, folder, tag, said", [
    ("transformers/pretrained-seed0", "", "test/accuracy", "its test accuracy"),       # E22
    ("fairseq-gpu/pretrained-seed7", "test", "accuracy", "its test accuracy"),          # E34
    ("transformers-gpu/pretrained-seed7", "", "eval/accuracy", "its eval accuracy"),    # E33
])
def test_a_fine_tuning_run_without_an_evaluated_accuracy_is_rejected(cache, key, folder, tag,
                                                                     said):
    """A renamed accuracy tag left a run counted in a table's n but not in its mean."""
    from test_faults_trial7 import _rewrite_events

    assert _record(cache, key).valid

    def rename(event):
        for v in event.summary.value:
            if v.tag == tag:
                v.tag = tag.replace("accuracy", "acc")
    _rewrite_events(_events_file(cache, key, folder), rename)
    rec = _record(cache, key)
    assert not rec.valid and f"no event file logs {said}" in rec.reason, rec.reason


def _forge_test_value(cache: Path) -> Path:
    """fairseq/random-seed0's test accuracy at its best epoch, 67.3 -> 80.0, rehashed."""
    from test_faults_trial7 import _rewrite_events, _set_tag

    run = cache / "fairseq" / "random-seed0"
    _rewrite_events(_events_file(cache, "fairseq/random-seed0", "test"),
                    _set_tag("accuracy", 80.0, 900))
    return run


def test_a_log_that_is_not_utf8_still_holds_the_event_values(cache):
    """N4: one byte that is not UTF-8 in train.log (rehashed) switched the check off."""
    run = _forge_test_value(cache)
    with open(run / "train.log", "ab") as log:
        log.write(b"\xe9\n")
    man = json.loads((run / "manifest.json").read_text())
    man["logs"]["train.log"] = sha256_file(run / "train.log")
    (run / "manifest.json").write_text(json.dumps(man))
    rec = _record(cache, "fairseq/random-seed0")
    assert not rec.valid and "its test accuracy at update 900 is 80" in rec.reason, rec.reason


def test_a_fairseq_run_whose_manifest_lists_no_train_log_is_rejected(cache):
    """N6: with `logs` removed from the manifest, 80.00 was printed beside a log saying 67.3."""
    run = _forge_test_value(cache)
    man = json.loads((run / "manifest.json").read_text())
    del man["logs"]
    (run / "manifest.json").write_text(json.dumps(man))
    rec = _record(cache, "fairseq/random-seed0")
    assert not rec.valid and "its manifest lists no train.log" in rec.reason, rec.reason


def test_a_probe_that_started_before_its_weights_were_made_is_set_aside(tmp_path):
    """PR12: cpu-tapt2's wall time 98.1 s -> 9810 s put its start before its weights' run
    ended, and the probe table printed 163.5 minutes."""
    from finetune_lab.book import probe_report

    records = tmp_path / "probes"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "probes", records)
    record = json.loads((records / "cpu-tapt2.json").read_text())
    record["wall_time_s"] = 9810.0
    (records / "cpu-tapt2.json").write_text(json.dumps(record))
    aside: list[str] = []
    table = probe_report.probe_table(records, set_aside=aside)
    assert "cpu-tapt2" not in set(table["weights"])
    assert len(aside) == 1 and aside[0].startswith("`cpu-tapt2.json` started at ") \
        and "before its weights were made at " in aside[0], aside


@pytest.mark.parametrize("key, value, said", [
    ("p90", 250, "lengths.stats.train.p90 250 is not in (272, 288]"),      # D19
    ("median", 150, "lengths.stats.train.median 150 is not in (96, 112]"),  # D23
])
def test_a_quantile_outside_its_histogram_bin_is_a_contradiction(key, value, said):
    from finetune_lab.data.cls_splits import count_contradiction, read_summary

    record = read_summary()
    assert count_contradiction(record) is None
    record["lengths"]["stats"]["train"][key] = value
    assert (count_contradiction(record) or "").startswith(said)


def test_what_is_hidden_is_read_by_no_reader(cache, tmp_path):
    """CF11, CF14: an event file in a run's hidden folder rejected the run, and a hidden record
    was set aside in the chapter, while check-freeze, which hashes nothing hidden, saw nothing."""
    from finetune_lab.book import probe_report
    from finetune_lab.book.chapter_inputs import _is_ignored

    run = cache / "transformers" / "pretrained-seed0"
    other = _events_file(cache, "transformers/pretrained-seed1")
    (run / ".x").mkdir()
    shutil.copyfile(other, run / ".x" / other.name)
    assert _record(cache, "transformers/pretrained-seed0").valid
    assert _is_ignored(Path("data/runs/transformers/pretrained-seed0/.x") / other.name)

    records = tmp_path / "probes"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "probes", records)
    shutil.copyfile(records / "cpu-tapt2.json", records / ".zz.json")
    aside: list[str] = []
    table = probe_report.probe_table(records, set_aside=aside)
    assert aside == [] and len(table) == len(list(records.glob("[!.]*.json")))


@pytest.mark.parametrize("field, value, said", [
    (("max_tokens",), 512, "reads 512 tokens of each review, which no model of 256 positions "
                           "reads"),                                                  # PR17
    (("device", "type"), "cuda", "says device type 'cuda' named 'AMD EPYC' on the processor "
                                 "'AMD EPYC'"),                                       # PR20
])
def test_a_probe_record_whose_device_or_length_cannot_be_is_set_aside(tmp_path, field, value,
                                                                      said):
    from finetune_lab.book import probe_report

    records = tmp_path / "probes"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "probes", records)
    record = json.loads((records / "cpu-tapt2.json").read_text())
    inner = record
    for key in field[:-1]:
        inner = inner[key]
    inner[field[-1]] = value
    (records / "cpu-tapt2.json").write_text(json.dumps(record))
    aside: list[str] = []
    probe_report.probe_table(records, set_aside=aside)
    assert len(aside) == 1 and aside[0].startswith(f"`cpu-tapt2.json` {said}"), aside


def test_a_damaged_event_file_is_one_reason_not_two(cache):
    """E31: an accuracy logged twice also drew "no event file logs an accuracy", which is false."""
    from test_faults_trial7 import _rewrite_events

    key = "lora/lora-qv-seed0"

    def twice(event):
        for v in [v for v in event.summary.value if v.tag == "eval/accuracy"
                  and event.step == 675]:
            copy = event.summary.value.add()
            copy.CopyFrom(v)
            copy.simple_value = 80.0
    _rewrite_events(_events_file(cache, key), twice)
    rec = _record(cache, key)
    assert not rec.valid and "logs eval/accuracy twice at update 675" in rec.reason
    assert "no event file logs" not in rec.reason, rec.reason
