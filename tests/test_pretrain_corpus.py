"""The pretraining corpus: split by novel, encoded and binarized for masked_lm."""

from __future__ import annotations

import pytest
from data_fixtures import TINY_NOVELS, data_root, pretrain_bin, tiny_tokenizer
from fairseq.data import Dictionary, data_utils

from finetune_lab.data import eltec
from finetune_lab.data import pretrain_corpus as pc
from finetune_lab._files import read_json
from finetune_lab.errors import DataRootError, UserError


def test_split_by_novel_is_disjoint_complete_and_seeded():
    novels = eltec.list_novels(data_root())
    assert len(novels) == 438 and len({d.name for d in novels}) == 438
    train, valid = eltec.split_novels(novels)
    assert not {d.name for d in train} & {d.name for d in valid}
    assert len(train) + len(valid) == len(novels) and len(valid) == round(0.02 * 438)
    assert eltec.split_novels(novels) == (train, valid)
    assert eltec.split_novels(novels, seed=2)[1] != valid


def test_books_reviews_never_enter_the_corpus_unless_asked():
    docs = eltec.corpus_documents(data_root(), with_reviews=True)
    names = [d.name for ds in docs.values() for d in ds]
    assert not any("/books/" in n for n in names)
    assert {n for n in names if n.startswith("webis")} == {
        "webis-cls-10/fr/dvd/train.review", "webis-cls-10/fr/music/train.review"}
    assert not any(n.startswith("webis") for n in (d.name for d in docs["valid"]))
    no_reviews = eltec.corpus_documents(data_root(), with_reviews=False)
    assert not any(d.name.startswith("webis") for ds in no_reviews.values() for d in ds)


def test_task_adaptive_texts_are_the_lab_training_split_only():
    from finetune_lab.data.cls_books import read_reviews, stratified_split

    doc = eltec.task_reviews(data_root(), repeat=3)
    assert doc.name == "webis-cls-10/fr/books/train.review" and doc.repeat == 3
    everything = read_reviews(doc.path)
    train, valid = stratified_split(everything)
    assert len(doc.keep) == len(train) == 1800
    # never a validation review (and the test file is another file)
    assert not doc.keep & {r.position - 1 for r in valid}
    texts = list(eltec.paragraphs(doc))
    assert texts == [r.text for r in train]
    with pytest.raises(UserError, match="--task-repeat"):
        eltec.task_reviews(data_root(), repeat=0)


@pytest.fixture(scope="module")
def with_reviews(tmp_path_factory):
    """A general corpus of 2 novels and the dvd/music reviews written 3 times, 10 held out:
    built once for the two tests that read it (issue 36)."""
    return pc.prepare_pretrain(data_root(), tiny_tokenizer(), tmp_path_factory.mktemp("pb"),
                               max_novels=2, review_repeat=3, review_valid=10)


def test_tapt_corpus_holds_reviews_only_with_the_same_valid_sets(tmp_path, with_reviews):
    out, _ = pc.prepare_pretrain(data_root(), tiny_tokenizer(), tmp_path / "tapt", max_novels=2,
                                 review_repeat=1, review_valid=10, task_repeat=2,
                                 train_novels=False)
    general = with_reviews[0]  # its reviews repeated 3 times: the held-out sets are the same
    manifest = read_json(out / "manifest.json")
    train_docs = manifest["parameters"]["documents"]["train"]
    assert train_docs == [f"webis-cls-10/fr/{d}/{f}.review" for d in ("dvd", "music")
                          for f in ("train", "test")] + ["webis-cls-10/fr/books/train.review"]
    assert manifest["counts"]["train"]["novels"] == 0
    assert manifest["counts"]["train"]["documents"] == 4 + 2  # the books split written twice
    assert manifest["parameters"]["task_repeat"] == 2
    for split in ("valid", "valid1"):  # the losses of both corpora compare
        assert (out / "bin" / f"{split}.bin").read_bytes() == \
            (general / "bin" / f"{split}.bin").read_bytes()
    with pytest.raises(UserError, match="without novels needs reviews"):
        pc.prepare_pretrain(data_root(), tiny_tokenizer(), tmp_path / "empty", max_novels=2,
                            with_reviews=False, train_novels=False)


def test_in_domain_reviews_hold_out_a_seeded_disjoint_slice():
    train, valid = eltec.in_domain_reviews(data_root(), seed=1, n_valid=400, repeat=20)
    assert [d.name for d in train] == [f"webis-cls-10/fr/{d}/{f}.review" for d in ("dvd", "music")
                                       for f in ("train", "test")]
    assert {d.repeat for d in train} == {20} and {d.repeat for d in valid} == {1}
    held = {(d.name, i) for d in valid for i in d.keep}
    kept = {(d.name, i) for d in train for i in d.keep}
    assert len(held) == 400 and not held & kept and len(held | kept) == 8000
    assert not any("/books/" in d.name for d in train + valid)
    again = eltec.in_domain_reviews(data_root(), seed=1, n_valid=400, repeat=20)
    assert again == (train, valid)
    assert eltec.in_domain_reviews(data_root(), seed=2, n_valid=400)[1] != valid
    first = valid[0]
    assert len(list(eltec.paragraphs(first))) == len(first.keep)


def test_bad_review_options_name_the_flag():
    with pytest.raises(UserError, match="--review-valid"):
        eltec.in_domain_reviews(data_root(), n_valid=8000)
    with pytest.raises(UserError, match="--review-repeat"):
        eltec.in_domain_reviews(data_root(), repeat=0)


def test_reviews_are_repeated_in_train_and_held_out_as_valid1(with_reviews):
    out, ran = with_reviews
    manifest = read_json(out / "manifest.json")
    counts = manifest["counts"]
    assert ran and counts["valid1"] == {**counts["valid1"], "novels": 0, "paragraphs": 10}
    # novels (1 train novel) + 4 review files written 3 times each
    assert counts["train"]["novels"] == 1 and counts["train"]["documents"] == 1 + 4 * 3
    assert "--validpref valid.spm,valid1.spm" in manifest["commands"][0]
    assert manifest["parameters"]["review_repeat"] == 3
    dictionary = Dictionary.load(str(out / "bin" / "dict.txt"))
    for split in ("train", "valid1"):
        dataset = data_utils.load_indexed_dataset(str(out / "bin" / split), dictionary)
        assert int(dataset.sizes.sum()) == counts[split]["tokens"] + len(dataset)


def test_binarized_corpus_matches_the_reported_counts():
    out = pretrain_bin()
    manifest = read_json(out / "manifest.json")
    dictionary = Dictionary.load(str(out / "bin" / "dict.txt"))
    assert len(dictionary) == len(Dictionary.load(str(tiny_tokenizer() / "dict.txt")))
    for split in ("train", "valid"):
        counts = manifest["counts"][split]
        dataset = data_utils.load_indexed_dataset(str(out / "bin" / split), dictionary)
        # one line per paragraph (+ </s>) and one empty line (just </s>) between documents
        assert len(dataset) == counts["paragraphs"] + counts["documents"] - 1
        assert int(dataset.sizes.sum()) == counts["tokens"] + len(dataset)
        assert counts["tokens"] > counts["words"] > 0
    assert manifest["counts"]["train"]["novels"] + manifest["counts"]["valid"]["novels"] == TINY_NOVELS
    assert manifest["commands"] == [
        "fairseq-preprocess --only-source --trainpref train.spm --validpref valid.spm "
        "--destdir bin --srcdict <tokenizer>/dict.txt --workers 2"]


def test_second_run_is_skipped_when_nothing_changed():
    out, ran = pc.prepare_pretrain(data_root(), tiny_tokenizer(), pretrain_bin(),
                                   max_novels=TINY_NOVELS, with_reviews=False)
    assert (out, ran) == (pretrain_bin(), False)


def test_missing_data_root(tmp_path):
    with pytest.raises(DataRootError):
        pc.prepare_pretrain(tmp_path / "nowhere", tiny_tokenizer(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_dapt_preset_reads_no_books_text(tmp_path, monkeypatch):
    """Issue 37: `--dapt` is the tapt corpus without the task's texts, and says so."""
    from finetune_lab.cli import main

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    args = ["prepare-pretrain", "--data-root", str(data_root()), "--tokenizer",
            str(tiny_tokenizer()), "--max-novels", "2", "--review-valid", "10", "--workers", "1"]
    assert main([*args, "--dapt"]) == 0
    out = pc.dapt_output()
    manifest = read_json(out / "manifest.json")
    assert manifest["parameters"]["documents"]["train"] == [
        f"webis-cls-10/fr/{d}/{f}.review" for d in ("dvd", "music") for f in ("train", "test")]
    assert manifest["parameters"]["review_repeat"] == 1 and "task_repeat" not in manifest["parameters"]
    record = pc.corpus_record(out / "bin")
    assert record["kind"] == "dapt" and record["task_repeat"] == 0
    assert record["train_sources"] == ["webis-cls-10/fr/dvd", "webis-cls-10/fr/music"]
    assert pc.corpus_record(tmp_path / "nowhere") is None
    assert main([*args, "--dapt", "--tapt"]) == 2
