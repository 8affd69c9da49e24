"""Fault trial 24: each defect's class, on real small inputs."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import needs_data_root

from finetune_lab.errors import UserError
from test_faults_trial23 import _moved, \
    test_a_measurement_moved_through_an_unchecked_field_or_the_clock_slack_is_rejected as rejected


def _inside_the_first(m: dict) -> None:
    """M-i1: a fine-tuning run given two launches, the second inside the first, 540 s more."""
    first = {k: m[k] for k in ("device", "start_time", "end_time", "wall_time_s")}
    inside = {"device": m["device"], "start_time": _moved(m["start_time"], 600),
              "end_time": _moved(m["start_time"], 1140), "wall_time_s": 540.0}
    m.update(segments=[first, inside], start_time=_moved(m["start_time"], -540),
             wall_time_s=m["wall_time_s"] + 540)


def _second_launch_inside(m: dict) -> None:
    """M-i2: a one-launch long run given a second launch inside the first, 485 s more."""
    seg = m["segments"][0]
    m["segments"].append({**seg, "start_time": _moved(seg["start_time"], 1300),
                          "end_time": _moved(seg["start_time"], 1785), "wall_time_s": 485.0,
                          "updates_from": seg["updates_to"]})
    m.update(start_time=_moved(m["start_time"], -520), wall_time_s=m["wall_time_s"] + 485)
    seg["start_time"] = m["start_time"]


def _end_dropped(missing):
    """M-i4, M-i4b: a launch's end deleted (or null), its wall time 3000 s longer."""
    def edit(m: dict) -> None:
        seg = m["segments"][1]
        if missing:
            del seg["end_time"]
        else:
            seg["end_time"] = None
        seg["wall_time_s"] += 3000
        m["wall_time_s"] += 3000
    return edit


@pytest.mark.parametrize("run, edit, reason", [
    ("fairseq/pretrained-seed0", _inside_the_first, r"only a long pretraining run"),
    ("pretrain/cpu-docbow1", _second_launch_inside,
     r"segments\[1\] starts at .*, not after the launch before it ended"),
    ("pretrain/cpu-clean-general1", _end_dropped(True),
     r"segments\[1\] records no end_time \(a launch that was killed ends at its"),
    ("pretrain/cpu-clean-general1", _end_dropped(False), r"segments\[1\] records no end_time"),
    # a launch's wall time dropped instead: the run's total is still the sum of what is known
    ("pretrain/cpu-clean-general1", lambda m: (m["segments"][1].update(
        end_time=None, wall_time_s=None), m.update(wall_time_s=m["wall_time_s"] + 3000)),
     r"wall_time_s \d+\.?\d* s is not the sum of its launches' wall times"),
    ("pretrain/cpu-clean-general1", lambda m: m["segments"][2].update(updates_from=1000),
     r"segments\[2\] starts at update 1000, not where the launch before it stopped \(1250\)"),
])
def test_a_runs_launches_are_one_timeline(cache, run, edit, reason):
    """Trial 24's M-i1, M-i2, M-i4: launches were checked one by one, so a launch placed inside
    another (on a fine-tuning run too) or one whose end was deleted made the run longer:
    27.5 to 36.5 min, 43.5 to 51.6 min, 94.1 to 144.1 min in the book."""
    rejected(cache, run, edit, reason)


def test_one_line_stamped_with_no_time_does_not_turn_the_log_check_off(cache):
    """Trial 24's M-i10: an appended line stamped hour 24 emptied the list of stamps, and a
    fine-tuning run 540 s longer passed (27.5 to 36.5 min)."""
    log = cache / "fairseq" / "pretrained-seed0" / "train.log"
    with open(log, "ab") as fh:
        fh.write(b"2026-11-25 24:39:12 | INFO | fairseq_cli.train | done training\n")
    digest = hashlib.sha256(log.read_bytes()).hexdigest()

    def edit(m: dict) -> None:
        m["logs"]["train.log"] = digest
        m.update(start_time=_moved(m["start_time"], -540), wall_time_s=m["wall_time_s"] + 540)
    rejected(cache, "fairseq/pretrained-seed0", edit,
             r"train\.log has a line stamped '2026-11-25 24:39:12', which is no time")


def test_gpu_unpack_refuses_a_hard_link_before_extracting(tmp_path):
    """Trial 24's G-i1: an archive member hard-linked to a name the archive lacks was a
    KeyError traceback from tarfile; a hard link to a member it holds was extracted."""
    import os

    from finetune_lab.errors import UserError
    from finetune_lab.runs import gpu_archive

    there = tmp_path / "device"
    run = there / "data" / "runs" / "fairseq-gpu" / "random-seed0"
    run.mkdir(parents=True)
    (run / "train.log").write_text("x\n")
    os.link(run / "train.log", run / "copy.log")  # tar stores the second as a link
    files, project = tmp_path / "files", tmp_path / "project"
    gpu_archive.pack([there / "data" / "runs" / "fairseq-gpu"], files, root=there,
                     extra={"products": ["data/runs/fairseq-gpu"]})
    (project / "data").mkdir(parents=True)
    with pytest.raises(UserError, match=r"cannot be unpacked safely \('.*\.log' is a link"):
        gpu_archive.unpack(files, root=project)
    assert [p.name for p in (project / "data").iterdir()] == []


def test_a_recorded_state_that_another_runs_launch_saved_is_not_resumed(tmp_path):
    """Trial 24's W-i2: two stores' launches of one run name saved into one folder; the run's
    record held the sha256 of the state the other launch saved there, and would resume it."""
    import torch

    from finetune_lab._files import sha256_file
    from finetune_lab.errors import UserError
    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zK"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"
    run = tmp_path / "runs" / "zK"
    run.mkdir(parents=True)
    for launch in ("0f1e2d3c4b5a6978", "a1b2c3d4e5f60718"):
        torch.save({"optimizer_history": [{"num_updates": 2}],
                    "extra_state": {"val_loss": 15.1, "launch": launch},
                    "cfg": {"common": {"seed": 1}, "optimization": {"lr": [1e-7]},
                            "task": {"tokens_per_sample": 64},
                            "checkpoint": {"save_dir": str(save)}}}, last)
        (run / "manifest.json").write_text(json.dumps({
            "status": "paused", "seed": 1, "updates_done": 2, "hyperparameters": {"lr": 1e-7},
            "resume_state": {"updates": 2, "sha256": sha256_file(last)},
            "segments": [{"launch": "a1b2c3d4e5f60718"}]}))
        if launch == "0f1e2d3c4b5a6978":  # the other store's launch saved it
            with pytest.raises(UserError, match="last recorded of its own: launch 0f1e2d3c4b5a6978, none of"):
                check_own_state(run, last, 2, made=resume_point(save))
        else:  # its own
            check_own_state(run, last, 2, made=resume_point(save))


def test_a_second_launch_into_a_save_folder_in_use_is_refused(tmp_path, monkeypatch):
    """Trial 24's W-i1: the run lock is per run store, so a launch of the same run name from
    another store, into the same work folder's save folder, ran beside the first."""
    from finetune_lab.errors import UserError
    from finetune_lab.runs.runlock import run_lock
    from finetune_lab.train.pretrain_long import pretrain_long
    from finetune_lab.train.pretrain_recipe import state_dir

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs-b"))
    with run_lock(state_dir("zK")):  # a launch from another store, running
        with pytest.raises(UserError, match=r"pretrain-checkpoints/zK is being written by pid"):
            pretrain_long(run="zK", tokens=1024)
    assert not (tmp_path / "runs-b").exists()


def _leaky_split(folder, n: int = 40):
    """A cls.books whose training split is the first ``n`` test reviews (and labels)."""
    from data_fixtures import cls_dir

    folder.mkdir(parents=True)
    for kind in ("review", "label"):
        lines = {part: (cls_dir() / f"{part}.{kind}").read_text(encoding="utf-8").splitlines(True)
                 for part in ("train", "valid", "test")}
        parts = {"train": lines["test"][:n], "valid": lines["valid"][:30],
                 "test": lines["test"][n:n + 40]}
        for part, text in parts.items():
            (folder / f"{part}.{kind}").write_text("".join(text), encoding="utf-8")
    return folder


def _swapped(folder):
    """23b's D-h1 folder: the book's split with train and test swapped (train = the 2000 test
    reviews)."""
    from data_fixtures import cls_dir

    folder.mkdir()
    for kind in ("review", "label"):
        for part, source in (("train", "test"), ("valid", "valid"), ("test", "train")):
            (folder / f"{part}.{kind}").write_bytes((cls_dir() / f"{source}.{kind}").read_bytes())
    return folder


@needs_data_root
def test_a_split_is_checked_whatever_its_own_manifest_says(tmp_path):
    """Trial 24's D-i1: check_split skipped every comparison for a folder whose files matched
    its own manifest.json's outputs, four lines anyone can write: binarize-cls and finetune
    transformers then read 40 test reviews as the training split."""
    from data_fixtures import tiny_tokenizer

    from finetune_lab._files import sha256_file
    from finetune_lab.data.binarize import binarize_cls
    from finetune_lab.train.hf_finetune import load_splits

    mine = _leaky_split(tmp_path / "cls.books")
    (mine / "manifest.json").write_text(json.dumps({"outputs": {
        f.name: sha256_file(f) for f in mine.iterdir()}}))
    with pytest.raises(UserError, match=r"train\.review shares 40 of its 40 reviews"):
        binarize_cls(mine, tiny_tokenizer(), tmp_path / "bin")
    with pytest.raises(UserError, match=r"train\.review shares 40 of its 40 reviews"):
        load_splits(mine, tok=None)


@needs_data_root
@pytest.mark.parametrize("root", ["empty", "crlf"])
def test_a_split_needs_the_published_test_file_and_finds_it_re_saved(tmp_path, monkeypatch,
                                                                       root):
    """Trial 24's D-i2, D-i2b: with no books test file in the data root, or a copy of it with
    CRLF line ends (another sha256), a split was compared with its own test split only, and
    23b's swapped folder (train = the 2000 test reviews) was binarized."""
    from data_fixtures import tiny_tokenizer

    from finetune_lab.config import DATA_ROOT_ENV, default_data_root
    from finetune_lab.data.binarize import binarize_cls
    from finetune_lab.data.cls_books import BOOKS_DIR

    swapped = _swapped(tmp_path / "cls.books")
    data_root = tmp_path / "root"
    (data_root / BOOKS_DIR).mkdir(parents=True)
    if root == "crlf":
        published = (default_data_root() / BOOKS_DIR / "test.review").read_bytes()
        (data_root / BOOKS_DIR / "test.review").write_bytes(published.replace(b"\n", b"\r\n"))
    monkeypatch.setenv(DATA_ROOT_ENV, str(data_root))
    message = (r"is not the book's split, .* which is not here" if root == "empty"
               else r"train\.review shares 2000 of its 2000 reviews with .*books/test\.review")
    with pytest.raises(UserError, match=message):
        binarize_cls(swapped, tiny_tokenizer(), tmp_path / "bin")
    assert not (tmp_path / "bin").exists()


@needs_data_root
def test_the_probe_is_fitted_on_no_test_review(tmp_path):
    """Trial 24's D-i3: `probe --cls-dir` fitted its classifier on a training split of 40 test
    reviews and wrote the record beside the committed ones."""
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.models import checkpoints
    from finetune_lab.train.linear_probe import run_probe

    mine = _leaky_split(tmp_path / "cls.books")
    with pytest.raises(UserError, match=r"train\.review shares 40 of its 40 reviews"):
        run_probe(PROJECT_ROOT / "data" / "checkpoints" / checkpoints.CHECKPOINT_NAME,
                  name="random-x7", random_init=True, seed=7, cls_dir=mine,
                  out_dir=tmp_path / "probes")
    assert not (tmp_path / "probes" / "random-x7.json").exists()


def _test_files_as(folder, name: str):
    """A copy of the binarized book split whose test files are also its ``name`` files."""
    import shutil

    from data_fixtures import cls_bin

    shutil.copytree(cls_bin(), folder)
    for part in ("input0", "label"):
        for ext in ("bin", "idx"):
            shutil.copyfile(folder / part / f"test.{ext}", folder / part / f"{name}.{ext}")
    return folder


@needs_data_root
def test_binarized_test_reviews_copied_over_the_training_files_are_not_fine_tuned(tmp_path):
    """Trial 24's D-i4: `finetune fairseq --data` read the binarized files as they were; with
    the test split's input0 and label files copied over the training split's, a 250-update run
    started on the 2000 test reviews."""

    from data_fixtures import cls_bin, cls_dir

    from finetune_lab.data.binarized import reviews_back
    from finetune_lab.data.cls_books import read_split
    from finetune_lab.train.finetune_fairseq import finetune_grid

    # the texts fairseq reads, decoded: 198 of 200 word for word (a character outside the
    # tokenizer's pieces, such as "~", is lost)
    decoded = reviews_back(cls_bin(), "valid")
    written = [" ".join(r.split()) for r in read_split(cls_dir(), "valid")[0]]
    assert sum(a == b for a, b in zip(decoded, written)) == 198 and len(decoded) == 200
    mine = _test_files_as(tmp_path / "bin", "train")
    with pytest.raises(UserError, match=r"input0/train\.bin shares 2000 of its 2000 reviews"):
        finetune_grid(("random",), (99,), bin_dir=mine, runs_root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def test_an_execution_option_of_quarto_makes_every_chapter_stale(tmp_path, capsys):
    """Trial 24's F-i2: `_quarto.yml`'s HTML `fig-format` changed from svg to png left
    check-freeze "up to date", and Quarto's own freeze executes nothing again for it; 24b's
    F-j: so did that option in a folder's `_metadata.yml`, at the top of `_quarto.yml`, in a
    metadata file or in a profile."""
    from test_freeze_env import _project, _render_all

    from finetune_lab.cli import main

    root = _project(tmp_path)
    config = root / "_quarto.yml"
    config.write_text("project:\n  type: book\nformat:\n  html:\n    fig-format: svg\n"
                      "    toc: true\n")
    _render_all(root)
    assert main(["check-freeze", "--project", str(root)]) == 0
    config.write_text(config.read_text().replace("toc: true", "toc: false"))  # no execution
    assert main(["check-freeze", "--project", str(root)]) == 0
    capsys.readouterr()
    config.write_text(config.read_text().replace("svg", "png"))
    assert main(["check-freeze", "--project", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.count("option _quarto.yml: format.html.fig-format (changed)") == 2  # both
    _render_all(root)
    # 24b's F-j: the same option where Quarto also reads it, for the chapters it applies to
    (root / "chapters" / "_metadata.yml").write_text("format:\n  html:\n    fig-format: svg\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert "option chapters/_metadata.yml: format.html.fig-format (new)" in \
        capsys.readouterr().err
    _render_all(root)
    config.write_text(config.read_text() + "fig-dpi: 300\nmetadata-files: [more.yml]\n")
    (root / "more.yml").write_text("execute:\n  echo: false\n")
    (root / "_quarto-wide.yml").write_text("fig-width: 12\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    err = capsys.readouterr().err
    for new in ("_quarto.yml: fig-dpi", "more.yml: execute", "_quarto-wide.yml: fig-width"):
        assert err.count(f"option {new} (new)") == 2, new


def test_a_data_root_error_inside_an_output_folder_keeps_its_message(tmp_path):
    """Found by this trial's rehearsal: a missing data root raised while `gpu-bundle` filled its
    folder printed "[Errno None] None: <folder>", the output's name put into the error."""
    from finetune_lab._files import atomic_dir
    from finetune_lab.errors import DataRootError

    with pytest.raises(DataRootError) as raised:
        with atomic_dir(tmp_path / "out", "gpu-bundle"):
            raise DataRootError("data root /x does not exist. Set FINETUNE_LAB_DATA_ROOT")
    assert str(raised.value) == "data root /x does not exist. Set FINETUNE_LAB_DATA_ROOT"
    assert not (tmp_path / "out").exists()


# --- check 24b: new members of trial 24's classes ---


@needs_data_root
def test_a_shard_beside_the_binarized_training_files_is_checked_too(tmp_path):
    """24b's D-j2: fairseq loads `train1` beside `train` (and trains on both); the test
    split's files copied there were fine-tuned on, 1,800 + 2,000 reviews."""


    from finetune_lab.data.binarized import check_binarized

    mine = _test_files_as(tmp_path / "bin", "train1")
    with pytest.raises(UserError, match=r"input0/train1\.bin shares 2000 of its 2000 reviews"):
        check_binarized(mine)


@needs_data_root
def test_the_books_test_file_compared_with_must_be_webis_cls_10s(tmp_path, monkeypatch):
    """24b's D-j3: with the dvd test file where the books one goes, the split checks compared
    the training reviews with dvd reviews, and train = the 2000 books test reviews passed."""
    from data_fixtures import tiny_tokenizer

    from finetune_lab.config import DATA_ROOT_ENV, default_data_root
    from finetune_lab.data.binarize import binarize_cls
    from finetune_lab.data.cls_books import BOOKS_DIR

    root = tmp_path / "root"
    (root / BOOKS_DIR).mkdir(parents=True)
    dvd = default_data_root() / "webis-cls-10" / "fr" / "dvd" / "test.review"
    (root / BOOKS_DIR / "test.review").write_bytes(dvd.read_bytes())
    (root / BOOKS_DIR / "train.review").symlink_to(default_data_root() / BOOKS_DIR / "train.review")
    monkeypatch.setenv(DATA_ROOT_ENV, str(root))
    swapped = _swapped(tmp_path / "cls.books")
    with pytest.raises(UserError, match=r"books/test\.review does not hold Webis-CLS-10's books "
                                        r"test reviews, though the training file beside it"):
        binarize_cls(swapped, tiny_tokenizer(), tmp_path / "bin")


def test_a_short_pretraining_launch_into_a_save_folder_in_use_is_refused(tmp_path, monkeypatch):
    """24b's W-j1: two `pretrain --max-update` launches of one run name from two run stores
    sharing a work folder both ran in its save folder, and the second's weights replaced the
    first's under the first's record."""
    from finetune_lab.runs.runlock import run_lock
    from finetune_lab.train.pretrain import pretrain
    from finetune_lab.train.pretrain_recipe import state_dir

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs-b"))
    # the lock is what is tested: the corpus's files are empty, so its decoding is left out
    monkeypatch.setattr("finetune_lab.train.pretrain_fairseq.check_corpus", lambda folder: None)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("train.bin", "train.idx", "valid.bin", "valid.idx", "dict.txt"):
        (corpus / name).write_bytes(b"")
    with run_lock(state_dir("zS")):  # a launch from another store, running
        with pytest.raises(UserError, match=r"pretrain-checkpoints/zS is being written by pid"):
            pretrain(max_update=2, run="zS", data_dir=corpus, package=False)
    assert not (tmp_path / "work" / "pretrain-checkpoints" / "zS").exists()


def _killed_end_moved(i: int, seconds: int):
    """24b's M-j3: a killed launch's end, the last train.log line of its time, moved."""
    def edit(m: dict) -> None:
        seg = m["segments"][i]
        seg["end_time"] = _moved(seg["end_time"], seconds)
        seg["wall_time_s"] += seconds
        m["wall_time_s"] += seconds
    return edit


def _old_killed(m: dict) -> None:
    """24b's M-j3: the killed launches recorded no end and no time, and the run's time left
    them out (the committed cpu-long showed 51.1 min for 76)."""
    for seg in m["segments"][:2]:
        seg.update(end_time=None, wall_time_s=None, ended="interrupted")
    m["wall_time_s"] = m["segments"][2]["wall_time_s"]


@pytest.mark.parametrize("edit, reason", [
    (_old_killed, r"segments\[0\] records no end_time"),
    (_killed_end_moved(1, 300), r"segments\[1\] ran from .* do not begin and end with it"),
    (_killed_end_moved(0, -120), r"train.log has \d+ lines, stamped .* outside every launch"),
])
def test_a_killed_launchs_time_is_its_logs_and_counts_in_the_runs(cache, edit, reason):
    """Check 24b's M-j3: a launch that was killed recorded no end, so its minutes were left out
    of the run's; its end is now its train.log's last line (recorded by the next launch), and
    no line of the log lies outside every launch."""
    rejected(cache, "pretrain/cpu-long", edit, reason)


def _binarized(prefix, texts, tok) -> None:
    """``texts`` as ``fairseq-preprocess`` binarizes them: the tokenizer's pieces, their ids in
    its ``dict.txt`` (unknown ones ``<unk>``), an end of sentence each."""
    import numpy as np
    import sentencepiece
    import torch
    from fairseq.data import indexed_dataset

    from finetune_lab.data.tokenizer import encode_pieces

    ids = {line.split(" ", 1)[0]: i + 4 for i, line in
           enumerate((tok / "dict.txt").read_text(encoding="utf-8").splitlines())}
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tok / "spm.model"))
    builder = indexed_dataset.MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for pieces in encode_pieces(sp, texts):
        builder.add_item(torch.IntTensor([ids.get(p, 3) for p in pieces] + [2]))
    builder.finalize(f"{prefix}.idx")


@needs_data_root
@pytest.mark.parametrize("shard", ["train", "train1"])
def test_a_pretraining_corpus_that_holds_the_test_reviews_is_not_pretrained_on(
        tiny_pipeline, tmp_path, monkeypatch, shard):
    """24b's D-j5, D-j6: a corpus's train.bin replaced by the binarized books test reviews was
    pretrained on, and the run listed valid: only the corpus's inputs had been compared with
    them. The files fairseq loads are decoded now (a shard beside train.bin too). With the
    tiny tokenizer's 400 pieces, a third of the test reviews hold a character it cannot spell,
    and their pieces no longer read as they do; the packaged checkpoint's finds 1,913 of the
    1,914 it looks for."""
    import shutil

    from finetune_lab.config import default_data_root
    from finetune_lab.data.binarized import check_corpus
    from finetune_lab.data.cls_books import BOOKS_DIR, read_reviews
    from finetune_lab.train.pretrain import pretrain

    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_pipeline["corpus"] / "bin", corpus)
    check_corpus(corpus)  # novels only: no test review
    test = [r.text for r in read_reviews(default_data_root() / BOOKS_DIR / "test.review")]
    _binarized(corpus / shard, test, tiny_pipeline["tok"])
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    with pytest.raises(UserError, match=rf"{shard}\.bin holds 1\d\d\d of Webis-CLS-10's "
                                        r"books test reviews .*prepare-pretrain --force"):
        pretrain(max_update=2, run="leak", data_dir=corpus, package=False)
    assert not (tmp_path / "runs").exists()


@needs_data_root
def test_the_training_texts_a_corpus_shares_with_the_test_file_are_allowed(tiny_pipeline,
                                                                          tmp_path):
    """The books training file shares 51 reviews with the test file (word for word, as the
    corpus check compares them): a task-adaptive corpus holds them and is pretrained on."""
    import shutil

    from finetune_lab.config import default_data_root
    from finetune_lab.data.binarized import _texts, check_corpus
    from finetune_lab.data.split_checks import text_keys
    from finetune_lab.data.cls_books import BOOKS_DIR, read_reviews

    books = default_data_root() / BOOKS_DIR
    test = {k for r in read_reviews(books / "test.review") for k in text_keys(r.text)}
    shared = [r.text for r in read_reviews(books / "train.review")
              if set(text_keys(r.text)) & test]
    assert len({k for text in shared for k in text_keys(text)}) == 51  # 55 reviews, a few twice
    corpus = tmp_path / "corpus"
    shutil.copytree(tiny_pipeline["corpus"] / "bin", corpus)
    _binarized(corpus / "train", shared, tiny_pipeline["tok"])
    decoded = {k for text in _texts(corpus / "train", corpus / "dict.txt", "")
               for k in text_keys(text)}
    assert len(decoded & test) >= 30  # found as test reviews (the tiny tokenizer spells 34)
    check_corpus(corpus)
