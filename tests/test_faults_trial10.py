"""The tenth fault trial, fixed by class: a Transformers run's fractional epoch follows its
updates (doubled, it moved the best epoch the book prints); no package file is opened unless it is
a regular file (a pipe for ``dict.txt`` hung ``fill-mask``); no ``--force`` replaces the run store
or what holds it (``package-checkpoint --force --dest data/runs`` deleted every run); a probe
record's fields agree with each other; a complete list of unknown spans adds up to the unknown
pieces."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from finetune_lab.errors import UserError
from test_faults_trial9 import _events_file, _record, _returns, _scale


def test_a_doubled_fractional_epoch_rejects_the_run(cache):
    """E13: every train/epoch doubled; the best epoch of seed 0 had moved from 2.0 to 4.0."""
    from test_faults_trial7 import _rewrite_events

    key = "transformers/pretrained-seed0"
    assert _record(cache, key).valid
    _rewrite_events(_events_file(cache, key), _scale("train/epoch", 2.0))
    rec = _record(cache, key)
    assert not rec.valid and "its train/epoch at update 25 is 0.222222, but 25 updates of 225 " \
        "per epoch are epoch 0.111111" in rec.reason, rec.reason


def test_a_pipe_in_a_package_is_one_line_and_never_opened(tmp_path):
    """FF11: a pipe for the package's dict.txt hung `fill-mask --checkpoint`."""
    from finetune_lab._files import sha256_file
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.models.checkpoints import check_listed_files

    folder = tmp_path / "roberta-small-fr"
    folder.mkdir()
    for name in ("manifest.json", "sentencepiece.bpe.model"):
        shutil.copyfile(PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr" / name,
                        folder / name)
    os.mkfifo(folder / "dict.txt")
    with pytest.raises(UserError) as err:
        _returns(lambda: check_listed_files(folder))
    assert str(err.value).startswith(f"{folder / 'dict.txt'} is not a regular file (a pipe, ")
    with pytest.raises(OSError):
        _returns(lambda: sha256_file(folder / "dict.txt"))


@pytest.mark.parametrize("where", ["", "..", "fairseq", "fairseq/random-seed0"])
def test_no_force_replaces_the_run_store_or_what_holds_it(cache, where):
    """A10: `package-checkpoint --trust --force --dest data/runs` deleted every run, and with
    `--dest` a run folder it replaced that run; `--force` was meant for a user's own folder."""
    from finetune_lab._files import check_replaceable

    dest = (cache / where).resolve()
    before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    with pytest.raises(UserError) as err:
        check_replaceable(dest, "package-checkpoint", force=True)
    said = str(err.value)
    assert "no command writes there, --force included" in said and "\n" not in said
    assert (f"is or holds the run store {cache}" if where in ("", "..") else
            f"lies in the run store {cache}") in said
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == before


def test_force_still_replaces_a_users_folder_beside_the_stores(tmp_path):
    from finetune_lab._files import check_replaceable

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(UserError):
        check_replaceable(mine, "package-checkpoint")
    check_replaceable(mine, "package-checkpoint", force=True)  # refuses nothing


@pytest.mark.parametrize("field, value, said", [
    (("probes", "mean", "C"), 0.5, "has probes.mean.C = 0.5, not one of its C_grid "
                                   "[0.01, 0.1, 1.0]"),                         # PR6
    (("probes", "mean", "valid_accuracy"), 77.3,
     "has probes.mean.valid_accuracy = 77.3, which no count of 200 valid reviews gives"),  # PR7
    (("threads",), 4, "says threads 4 but device.threads 1"),                  # PR10
    (("sizes", "valid"), 100, "probed splits of {'test': 2000, 'train': 1800, 'valid': 100} "
                              "reviews, not CLS-Books' (1800 train, 200 valid, 2000 test)"),
])
def test_a_probe_record_that_contradicts_itself_is_set_aside(tmp_path, field, value, said):
    from finetune_lab.book import probe_report
    from finetune_lab.config import PROJECT_ROOT

    records = tmp_path / "probes"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "probes", records)
    path = records / "cpu-tapt2.json"
    record = json.loads(path.read_text())
    inner = record
    for key in field[:-1]:
        inner = inner[key]
    inner[field[-1]] = value
    path.write_text(json.dumps(record))
    aside: list[str] = []
    table = probe_report.probe_table(records, set_aside=aside)
    assert len(table) == len(list(records.glob("*.json"))) - 1
    assert aside == [f"`cpu-tapt2.json` {said}"], aside


def test_the_committed_probes_agree_with_themselves():
    from finetune_lab.book import probe_report

    aside: list[str] = []
    table = probe_report.probe_table(set_aside=aside)
    assert aside == [] and len(table) == len(list(Path(probe_report.probe_dir()).glob("*.json")))


def test_pretrain_never_packages_onto_weights_the_book_or_runs_cite(cache, tmp_path, capsys):
    """Trial 9's W1: `pretrain` (its default --package-to) would have replaced the book's packaged
    checkpoint, setting aside every run built on it, where package-checkpoint asks for --force."""
    from finetune_lab.cli import main
    from finetune_lab.models import checkpoints

    dest = checkpoints.packaged_dir()
    before = (dest / "manifest.json").read_bytes()
    assert main(["pretrain", "--run", "zz-w1", "--max-update", "1"]) == 2
    said = capsys.readouterr().err.strip()
    assert said.endswith(f"{dest} holds the packaged checkpoint the book reads: replacing it sets "
                         "aside every run built on it; pass --package-to another folder "
                         "(`package-checkpoint --force` can replace it later), or --no-package")
    assert (dest / "manifest.json").read_bytes() == before
    assert not (cache / "pretrain" / "zz-w1").exists()
    # a candidate's folder whose weights a recorded run fine-tuned is refused the same way
    run = next(cache.glob("fairseq-candidate*/pretrained-seed0"))
    man = json.loads((run / "manifest.json").read_text())
    weights = Path(man["inputs"]["checkpoint"]["path"])
    assert main(["pretrain", "--run", "zz-w1", "--max-update", "1",
                 "--package-to", str(weights.parent)]) == 2
    assert f"{weights.parent} is where run " in capsys.readouterr().err
