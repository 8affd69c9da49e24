"""Fault trial 23 and check 22b's W2-f1: each defect's class, on real small inputs."""

from __future__ import annotations

import json
import os

import pytest

from conftest import needs_data_root

from finetune_lab.errors import UserError

MINE, THEIRS = "a1b2c3d4e5f60718", "0f1e2d3c4b5a6978"


@pytest.mark.parametrize("segments", [
    [{"launch": THEIRS}], [{"launch": MINE}], [{}], [{"launch": ["x"]}], "damaged"])
def test_a_killed_run_resumes_only_a_state_one_of_its_launches_saved(tmp_path, segments):
    """22b's W2-f1: another run of the same name, in a run store at the same path (a checkout
    at the same path on another machine), saved at the same update, in the same folders, at
    the same score (lr 1e-7); the run, killed 0.1 s after its own save, resumed that state."""
    import torch

    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zR"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"
    run = tmp_path / "runs" / "zR"
    run.mkdir(parents=True)
    torch.save({"optimizer_history": [{"num_updates": 2}],
                "extra_state": {"val_loss": 15.111, "launch": THEIRS},
                "cfg": {"common": {"seed": 1, "tensorboard_logdir": str(run)},
                        "optimization": {"lr": [1e-7]}, "task": {"tokens_per_sample": 64},
                        "checkpoint": {"save_dir": str(save)}}}, last)
    (run / "manifest.json").write_text(json.dumps({
        "status": "running", "seed": 1, "updates_done": 0, "hyperparameters": {"lr": 1e-7},
        "segments": segments if segments == "damaged" else [{"launch": MINE}, *segments]}))
    (run / "train.log").write_text(
        f"{{'common': {{'tensorboard_logdir': '{run}'}}}}\n"
        "2026-11-28 12:00:00 | INFO | fairseq.checkpoint_utils | Saved checkpoint "
        f"{save}/checkpoint_1_2.pt (epoch 1 @ 2 updates, score 15.111) (writing took 0.1 s)\n")
    made = resume_point(save)
    assert made["launch"] == THEIRS
    if segments == [{"launch": THEIRS}]:  # one of the run's own launches saved it
        check_own_state(run, last, 2, made=made)
        return
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 2, made=made)
    del made["launch"]  # a state saved by code before launches were named
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 2, made=made)


def test_the_plugin_names_the_launch_in_every_state_fairseq_saves(monkeypatch):
    """The mark a killed run's state is recognised by: fairseq's own trainer state, with the
    launch's id beside fairseq's keys, and nothing added without a launch."""
    from fairseq.trainer import Trainer

    from finetune_lab.models import fairseq_compat

    saved = {"extra_state": {"previous_training_time": 1.5}}
    monkeypatch.setattr(Trainer, "state_dict", lambda self: {
        k: dict(v) for k, v in saved.items()})
    monkeypatch.delenv(fairseq_compat.LAUNCH_ENV, raising=False)
    fairseq_compat.install_launch_mark()
    assert Trainer.state_dict(None) == saved
    monkeypatch.setenv(fairseq_compat.LAUNCH_ENV, MINE)
    fairseq_compat.install_launch_mark()
    fairseq_compat.install_launch_mark()  # once only, however often the plugin is imported
    assert Trainer.state_dict(None) == {
        "extra_state": {"previous_training_time": 1.5, "launch": MINE}}


@pytest.mark.parametrize("manifest, message", [
    ({"inputs": {"webis-cls-10/fr/books/train.review": "test"}, "parameters": {}},
     "records Webis-CLS-10's books test file as its webis-cls-10/fr/books/train.review"),
    ([], "is not a corpus manifest"),
    ({"inputs": {"webis-cls-10/fr/books/train.review": "train"}, "parameters": {}}, None)])
def test_a_corpus_made_from_the_books_test_file_is_refused_by_pretraining(tmp_path, manifest,
                                                                          message):
    """22b's R-D-e3: a corpus made before every file was checked, whose manifest records the
    books test file's sha256 as the books training file, was pretrained on."""
    from finetune_lab.data.cls_books import BOOKS_SHA256
    from finetune_lab.data.pretrain_corpus import corpus_record

    if isinstance(manifest, dict):
        manifest["inputs"] = {k: BOOKS_SHA256[v] for k, v in manifest["inputs"].items()}
    (tmp_path / "bin").mkdir()
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    if message is None:
        assert corpus_record(tmp_path / "bin")["train_sources"] == []
        return
    with pytest.raises(UserError, match=message):
        corpus_record(tmp_path / "bin")


@needs_data_root
def test_another_corpus_is_compared_with_the_published_test_file_only(tmp_path):
    """22b's D-f6: with --other-corpus, the test reviews were compared with whatever the data
    root held as the books test file; put the training file there, and the test reviews, read
    as another corpus, passed the text check. (A root of another data set, whose training file
    is not Webis-CLS-10's either, is compared with its own test file.)"""
    import shutil

    from finetune_lab.config import default_data_root
    from finetune_lab.data import eltec
    from finetune_lab.data.cls_books import BOOKS_DIR

    real = default_data_root()
    (tmp_path / BOOKS_DIR).mkdir(parents=True)
    shutil.copyfile(real / BOOKS_DIR / "train.review", tmp_path / BOOKS_DIR / "test.review")
    os.symlink(real / BOOKS_DIR / "train.review", tmp_path / BOOKS_DIR / "train.review")
    disguised = tmp_path / "mine.review"  # the test reviews, one byte from the published file
    disguised.write_bytes((real / BOOKS_DIR / "test.review").read_bytes() + b"\n")
    mine = eltec.Document("mine.review", disguised)
    with pytest.raises(UserError, match="test.review is not Webis-CLS-10's books test file, "
                                        "which another corpus is compared with, though the "
                                        "training file beside it is Webis-CLS-10's: restore it"):
        eltec.check_documents(tmp_path, [mine], other_corpus=True)
    (tmp_path / BOOKS_DIR / "test.review").unlink()  # the published file: the text check
    os.symlink(real / BOOKS_DIR / "test.review", tmp_path / BOOKS_DIR / "test.review")
    with pytest.raises(UserError, match=r"shares 2000 of its 2000 reviews with"):
        eltec.check_documents(tmp_path, [mine], other_corpus=True)


@needs_data_root
@pytest.mark.parametrize("split, n", [("train", 40), ("valid", 20)])
def test_test_reviews_written_into_a_prepared_split_are_not_binarized(tmp_path, split, n):
    """Trial 23's D-g: a cls.books folder whose training split was the first 40 test reviews
    (and labels) was binarized and fine-tuned on, and the run was valid."""
    from data_fixtures import cls_dir, tiny_tokenizer

    from finetune_lab.data.binarize import binarize_cls

    def lines(part: str, kind: str) -> list[str]:
        return (cls_dir() / f"{part}.{kind}").read_text(encoding="utf-8").splitlines(True)

    mine = tmp_path / "cls.books"  # a few reviews of each split, and test reviews as one
    mine.mkdir()
    for kind in ("review", "label"):
        parts = {"train": lines("train", kind)[:30], "valid": lines("valid", kind)[:30],
                 "test": lines("test", kind)[:n + 30]}
        parts[split] = lines("test", kind)[:n]
        for part, text in parts.items():
            (mine / f"{part}.{kind}").write_text("".join(text), encoding="utf-8")
    with pytest.raises(UserError, match=rf"{split}.review shares {n} of its {n} reviews with .*"
                                        "test.review: the test reviews would be trained on; "
                                        "prepare the splits again"):
        binarize_cls(mine, tiny_tokenizer(), tmp_path / "bin")
    assert not (tmp_path / "bin").exists()


def _moved(when: str, seconds: float) -> str:
    from datetime import datetime, timedelta

    return (datetime.fromisoformat(when) + timedelta(seconds=seconds)).isoformat()


def _peak3(m: dict) -> None:
    m["extra"]["peak_memory"]["bytes"] = float(m["extra"]["peak_memory"]["bytes"] * 3)


@pytest.mark.parametrize("run, edit, reason", [
    # M-f1: the peak written as a float, which the group left out
    ("transformers-gpu/pretrained-seed9", _peak3, r"disagree on their peak memory"),
    # M-f2, M-f3: a field nothing checked, which made a group of one
    ("transformers-gpu/pretrained-seed9", lambda m: (_peak3(m), m["device"].update(threads=2)),
     r"disagree on their peak memory"),
    ("transformers-gpu/pretrained-seed9",
     lambda m: (_peak3(m), m["extra"].update(method="full")), r"disagree on their peak memory"),
    # M-g1: a fairseq run 5 minutes longer, its start moved with it, within the event bounds
    ("fairseq/pretrained-seed0", lambda m: m.update(
        start_time=_moved(m["start_time"], -300), wall_time_s=m["wall_time_s"] + 300),
     r"wall_time_s \d+\.?\d* s is not the 1647 s between its train\.log's first and last"),
    ("fairseq/pretrained-seed0", lambda m: m.update(
        end_time=_moved(m["end_time"], 25), wall_time_s=m["wall_time_s"] + 25),
     r"wall_time_s 1675\.\d+ s is not the 1647 s"),
    # M-g4: a Transformers CPU run, its start 115 s earlier and its end 100 s later
    ("transformers/pretrained-seed0", lambda m: m.update(
        start_time=_moved(m["start_time"], -115), end_time=_moved(m["end_time"], 100),
        wall_time_s=m["wall_time_s"] + 215), r"start_time .* is 11\d s before its event files'"),
])
def test_a_measurement_moved_through_an_unchecked_field_or_the_clock_slack_is_rejected(
        cache, run, edit, reason):
    """Trial 23's M-f (a peak memory tripled, as a float, or with a field nothing checks, was
    compared with no other run) and M-g (a run's minutes grown within the clocks' slack)."""
    import re

    from finetune_lab.runs.registry import discover_runs, validate_run

    path = cache / run / "manifest.json"
    man = json.loads(path.read_text(encoding="utf-8"))
    edit(man)
    path.write_text(json.dumps(man, indent=1), encoding="utf-8")
    rec = validate_run(path.parent)  # its own checks first (0.1 s), then beside the others (3 s)
    if rec.valid or not re.search(reason, rec.reason):
        (rec,) = [r for r in discover_runs(cache) if r.key == run]
    assert not rec.valid and re.search(reason, rec.reason), rec.reason


def test_packaging_the_same_weights_again_keeps_the_old_folder_and_its_lineage(tmp_path):
    """Trial 23's A-f1: `package-checkpoint <a copy of model.pt> --dest <the packaged
    checkpoint> --force --trust` rewrote its manifest in place (lineage null, a new date) and
    kept nothing: the same weights were not counted as a replacement."""
    import shutil

    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.models import checkpoints

    committed = PROJECT_ROOT / "data" / "checkpoints" / checkpoints.CHECKPOINT_NAME
    dest = tmp_path / checkpoints.CHECKPOINT_NAME
    shutil.copytree(committed, dest)
    source = shutil.copyfile(committed / checkpoints.MODEL_FILE, tmp_path / "m.pt")
    before = json.loads((dest / checkpoints.MANIFEST_FILE).read_text())
    assert before["lineage"]
    checkpoints.package_checkpoint(source, dest / checkpoints.SPM_FILE, dest / checkpoints.DICT_FILE,
                                   dest, trust=True, force=True)
    (kept,) = tmp_path.glob(f"{checkpoints.CHECKPOINT_NAME}.replaced-*")
    assert json.loads((kept / checkpoints.MANIFEST_FILE).read_text()) == before
    assert json.loads((dest / checkpoints.MANIFEST_FILE).read_text())["trusted_by"]


def test_the_h100_runs_edited_alike_are_compared_with_the_h200_runs_of_their_row(cache):
    """23b's M-h1: the three H100 pretrained runs' peaks tripled alike were a group of their
    own, though the device table's GPU row mixes them with nine H200 runs."""
    from finetune_lab.runs.registry import discover_runs

    for seed in (9, 10, 11):
        path = cache / "transformers-gpu" / f"pretrained-seed{seed}" / "manifest.json"
        man = json.loads(path.read_text(encoding="utf-8"))
        _peak3(man)
        path.write_text(json.dumps(man), encoding="utf-8")
    bad = [r for r in discover_runs(cache) if not r.valid and r.experiment == "transformers-gpu"]
    assert len(bad) == 12 and all("the 12 runs of its recipe on GPUs" in r.reason for r in bad)


def _launch_longer(index: int, seconds: float, end_too: bool):
    def edit(m: dict) -> None:
        seg = m["segments"][index]
        seg["wall_time_s"] += seconds
        m["wall_time_s"] += seconds
        if end_too:
            seg["end_time"] = _moved(seg["end_time"], seconds)
            later = [s for s in m["segments"][index + 1:] if s.get("start_time")]
            for s in later:  # the launches after it, moved along
                s["start_time"] = _moved(s["start_time"], seconds)
                if s.get("end_time"):
                    s["end_time"] = _moved(s["end_time"], seconds)
            m["end_time"] = _moved(m["end_time"], seconds)
    return edit


@pytest.mark.parametrize("run, edit, reason", [
    # M-h2: a fine-tuning run given a segments list, 540 s longer, its start moved along
    ("fairseq/pretrained-seed0", lambda m: m.update(
        segments=[{"device": m["device"]}], start_time=_moved(m["start_time"], -540),
        wall_time_s=m["wall_time_s"] + 540), r"wall_time_s \d+\.?\d* s is not the 1647 s"),
    # M-h3: a one-launch pretraining run 600 s longer, its end and its launch's moved along
    ("pretrain/cpu-docbow1", _launch_longer(0, 600, True), r"wall_time_s \d+\.?\d* s is not"),
    # M-h4: one launch of three 3000 s longer, and the run along with it
    ("pretrain/cpu-clean-general1", _launch_longer(0, 3000, False),
     r"segments\[0\]\.wall_time_s 6314\.\d+ s is not the 3314 s from its start to its end"),
    ("pretrain/cpu-clean-general1", _launch_longer(0, 3000, True),
     r"segments\[0\] ran from .* but its train\.log's lines of that time do not begin and end"),
])
def test_a_launch_or_a_run_with_launches_made_longer_is_rejected(cache, run, edit, reason):
    """23b's M-h: the train.log check skipped any run with a `segments` list, and a launch's
    own wall time was tied to nothing: a fine-tuning run +540 s, a pretraining run +600 s, and
    one launch +3000 s (94.1 to 144.1 min in the book) passed."""
    test_a_measurement_moved_through_an_unchecked_field_or_the_clock_slack_is_rejected(
        cache, run, edit, reason)


@needs_data_root
def test_a_split_with_train_and_test_swapped_is_neither_binarized_nor_fine_tuned(tmp_path):
    """23b's D-h: train and test swapped in a prepared cls.books passed binarize-cls (each
    split compared with the folder's own test split), and `finetune transformers --cls-dir`
    read a folder with no check at all."""
    from data_fixtures import cls_dir, tiny_tokenizer

    from finetune_lab.data.binarize import binarize_cls
    from finetune_lab.train.hf_finetune import load_splits

    mine = tmp_path / "cls.books"
    mine.mkdir()
    for kind in ("review", "label"):
        for part, source in (("train", "test"), ("valid", "valid"), ("test", "train")):
            text = (cls_dir() / f"{source}.{kind}").read_text(encoding="utf-8")
            (mine / f"{part}.{kind}").write_text(text, encoding="utf-8")
    message = r"train\.review shares 2000 of its 2000 reviews with .*books/test\.review"
    with pytest.raises(UserError, match=message):
        binarize_cls(mine, tiny_tokenizer(), tmp_path / "bin")
    with pytest.raises(UserError, match=message):
        load_splits(mine, tok=None)  # refused before anything is tokenized
