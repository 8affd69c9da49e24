"""The sixth fault trial, fixed by class: an unfinished run's folder holding a user's files is
moved aside, not deleted; a device call's record is held against the runs it made; a run's
times against its event files' clocks; and every damaged text file is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.runs import crosscheck, gpu_archive, gpu_calls
from finetune_lab.runs.registry import discover_runs

CALLS = PROJECT_ROOT / "data" / "summaries" / "gpu-lab"
LAB_CALL = CALLS / "20261126T041935Z.json"


# --- data loss: D2 --------------------------------------------------------------------------


def _failed_run(root: Path) -> Path:
    run = root / "exp" / "r-seed7"
    (run / "train").mkdir(parents=True)
    (run / "train" / "events.out.tfevents.1.host.1.0").write_bytes(b"")
    (run / "manifest.json").write_text(json.dumps({"status": "failed", "outputs": {}}))
    return run


def test_an_unfinished_run_holding_a_users_files_is_moved_aside_not_deleted(tmp_path, capsys):
    """D2: a re-run deleted why-it-failed.txt and mydata/a.txt from a failed run's folder."""
    from finetune_lab.runs.recording import set_aside

    run = _failed_run(tmp_path)
    (run / "why-it-failed.txt").write_text("my notes")
    (run / "mydata").mkdir()
    (run / "mydata" / "a.txt").write_text("mine")
    moved = set_aside(run)
    assert moved is not None and not run.exists()
    assert (moved / "why-it-failed.txt").read_text() == "my notes"
    assert (moved / "mydata" / "a.txt").read_text() == "mine"
    assert "held a failed run" in capsys.readouterr().out
    # what a run alone wrote is moved aside too: no run is deleted (trial 14's W1)
    plain = _failed_run(tmp_path / "again")
    assert set_aside(plain).is_dir() and not plain.exists()


# --- silent wrong results: S1, S3, S4, S5, S6, S9, S10 ---------------------------------------


def _shift_end(man: dict, seconds: float) -> None:
    import pandas as pd

    man["end_time"] = (pd.Timestamp(man["end_time"]) + pd.Timedelta(seconds=seconds)).isoformat()
    man["wall_time_s"] += seconds


def test_an_end_time_moved_past_the_last_event_rejects_the_run(cache):
    """S1: ten minutes added to a run's end and wall time moved every speed table."""
    path = cache / "fairseq" / "random-seed1" / "manifest.json"
    man = json.loads(path.read_text())
    _shift_end(man, 600)
    path.write_text(json.dumps(man))
    rec = {r.key: r for r in discover_runs(cache)}["fairseq/random-seed1"]
    assert not rec.valid and "s after its event files' last event" in rec.reason, rec.reason


def test_a_transformers_start_moved_before_its_trainer_opened_its_event_file_rejects_it(cache):
    """S2: a Transformers run's start 150 s earlier (its wall time to match) passed the bound
    set for fairseq, whose runs load their corpus before their first event."""
    import pandas as pd

    path = cache / "transformers" / "pretrained-seed0" / "manifest.json"
    man = json.loads(path.read_text())
    man["start_time"] = (pd.Timestamp(man["start_time"]) - pd.Timedelta(seconds=150)).isoformat()
    man["wall_time_s"] += 150
    path.write_text(json.dumps(man))
    rec = {r.key: r for r in discover_runs(cache)}["transformers/pretrained-seed0"]
    assert not rec.valid and "s before its event files' first event" in rec.reason, rec.reason


def _calls_with(**change):
    calls = gpu_calls.call_devices()
    first = calls[0]._replace(**change)
    return lambda: [first, *calls[1:]]


@pytest.mark.parametrize(("change", "key", "says"), [
    # S3: the chapter said "2× NVIDIA H200" while every run of the call recorded one GPU
    ({"count": 2}, "lora-gpu/lora-qv-seed0", "device.count 1 but the device call"),
    # S4: a job marked failed whose run is complete: the chapter said "1 failed"
    ({"exits": {"fairseq-pretrained-seed0": 1}}, "fairseq-gpu/pretrained-seed0",
     "its job fairseq-pretrained-seed0 in the device call"),
])
def test_a_call_record_and_the_runs_it_made_must_agree(cache, monkeypatch, change, key, says):
    if "exits" in change:
        change = {"exits": {**gpu_calls.call_devices()[0].exits, **change["exits"]}}
    monkeypatch.setattr(crosscheck, "call_devices", _calls_with(**change))
    records = {r.key: r for r in discover_runs(cache)}
    assert not records[key].valid and says in records[key].reason, records[key].reason
    assert records["fairseq-gpu/pretrained-seed3"].valid  # a later call's run


def test_a_call_record_whose_plan_names_seeds_its_jobs_never_ran_is_set_aside():
    """S6: plan.seeds 0 to 5 on a call whose jobs ran 0 to 2 dropped the chapter's sentence
    on the later calls' seeds."""
    meta = json.loads(LAB_CALL.read_text())
    assert gpu_archive.call_record_problem(meta) is None
    meta["plan"]["seeds"] = [0, 1, 2, 3, 4, 5]
    assert "but its jobs ran seeds [0, 1, 2]" in gpu_archive.call_record_problem(meta)


def test_gpu_samples_that_cannot_be_right_are_not_read(tmp_path):
    """S5: a utilisation of 250 % became "a kernel running 250 % of the time"."""
    from finetune_lab.book.devices import gpu_use

    from datetime import datetime, timezone

    smi = LAB_CALL.with_name(LAB_CALL.stem + "-nvidia-smi.csv")
    call = (datetime(2026, 11, 26, 4, 19, 35, tzinfo=timezone.utc), 249.6)
    busy, mem = gpu_use(smi, *call)
    assert 0 < busy <= 100 and mem > 0
    lines = smi.read_text().splitlines()
    edited = tmp_path / "smi.csv"
    edited.write_text("\n".join([lines[0], *(ln.replace(" 0 %", " 250 %").replace(
        " 100 %", " 250 %") for ln in lines[1:])]) + "\n")
    assert gpu_use(edited, *call) == (None, None)
    edited.write_text("not, a\ntable")
    assert gpu_use(edited, *call) == (None, None)
    assert gpu_use(tmp_path / "none.csv", *call) == (None, None)
    # trial 7's S11: another call's samples (07:29 to 07:31) under this call's name
    later = LAB_CALL.with_name("20261126T072936Z-nvidia-smi.csv")
    assert gpu_use(later, *call) == (None, None)


def test_a_corpus_record_with_fewer_tokens_than_words_is_not_read(tmp_path, monkeypatch):
    """S10: halving the prepared corpus's token count doubled the passes over it."""
    from finetune_lab.book import pretrain_budget as pb

    committed = json.loads((PROJECT_ROOT / "data" / "summaries" / "data.json").read_text())
    assert pb.counts_agree(committed["pretrain"])
    prepared = tmp_path / "corpus"
    prepared.mkdir()
    halved = json.loads(json.dumps(committed["pretrain"]))
    halved["counts"]["train"]["tokens"] //= 2
    assert not pb.counts_agree(halved)
    (prepared / "manifest.json").write_text(json.dumps(halved))
    monkeypatch.setattr(pb, "default_corpus", lambda: prepared)
    assert pb._corpus_record()["counts"] == committed["pretrain"]["counts"]


# --- one line, not a traceback: T5, T6, T9, T15, T16, M1 -------------------------------------


def test_a_faq_nested_too_deep_is_one_line(tmp_path):
    """T5: lora-qa --faq with a 200,000-deep FAQ ended in a ValueError traceback."""
    from finetune_lab.data.qa_prompts import load_faq

    faq = tmp_path / "faq.json"
    faq.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(UserError) as raised:
        load_faq(faq)
    assert str(faq) in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("name", "text", "says"), [
    ("valid.review", b"bon\n\xff\xfe livre\n", "valid.review is not UTF-8 text (byte 4)"),
    ("valid.label", b"1\n0\nmaybe\n", "label 'maybe' is not 0 or 1: regenerate"),
])
def test_a_split_file_that_is_no_text_or_no_label_is_one_line_with_its_fix(tmp_path, name,
                                                                          text, says):
    """T6, T15: non-UTF-8 bytes in valid.review gave a UnicodeDecodeError traceback in
    data-summary and probe; T16: a label 'maybe' named no fix."""
    from finetune_lab.data.cls_books import read_split

    for kind, body in (("review", b"bon\nmauvais\nmoyen\n"), ("label", b"1\n0\n1\n")):
        (tmp_path / f"valid.{kind}").write_bytes(body)
    (tmp_path / name).write_bytes(text)
    with pytest.raises(UserError) as raised:
        read_split(tmp_path, "valid")
    assert says in str(raised.value) and "prepare-cls" in str(raised.value)


def test_a_checkpoint_whose_dictionary_is_damaged_is_one_line(tmp_path):
    """T9: a dict.txt with bytes that are not UTF-8 gave fairseq's 56-line traceback."""
    from finetune_lab.models import checkpoints

    folder = tmp_path / "pk"
    folder.mkdir()
    for name in (checkpoints.MANIFEST_FILE, checkpoints.DICT_FILE, checkpoints.SPM_FILE):
        shutil.copy(checkpoints.packaged_dir() / name, folder / name)
    checkpoints.check_listed_files(folder)  # the committed files pass
    dictionary = folder / checkpoints.DICT_FILE
    dictionary.write_bytes(dictionary.read_bytes() + b"\xff 1\n")
    with pytest.raises(UserError, match="dict.txt is not UTF-8 text"):
        checkpoints.check_listed_files(folder)
    dictionary.write_text(dictionary.read_bytes()[:-4].decode() + "x 1\n")
    with pytest.raises(UserError, match="dict.txt is not the file its manifest lists"):
        checkpoints.check_listed_files(folder)


def test_a_damaged_record_of_a_chapters_inputs_is_said_damaged_not_missing(tmp_path):
    """M1: a record of bytes FF FE was reported as "frozen without a record"."""
    from test_freeze import _frozen_book

    from finetune_lab.book import freeze as fz

    root = _frozen_book(tmp_path)
    fz.record_path(root, "chapters/c.qmd").write_bytes(b"\xff\xfe")
    (stale,) = fz.check_freeze(root)
    assert "record of its inputs' hashes" in stale.describe() and "is damaged" in stale.describe()
