"""The pretraining corpus: split by novel, encoded and binarized for masked_lm."""

from __future__ import annotations

import pytest
from data_fixtures import TINY_NOVELS, data_root, pretrain_bin, tiny_tokenizer
from fairseq.data import Dictionary, data_utils

from finetune_lab import pretrain_corpus as pc
from finetune_lab._files import read_json
from finetune_lab.errors import DataRootError


def test_split_by_novel_is_disjoint_complete_and_seeded():
    novels = pc.list_novels(data_root())
    assert len(novels) == 438 and len({d.name for d in novels}) == 438
    train, valid = pc.split_novels(novels)
    assert not {d.name for d in train} & {d.name for d in valid}
    assert len(train) + len(valid) == len(novels) and len(valid) == round(0.02 * 438)
    assert pc.split_novels(novels) == (train, valid)
    assert pc.split_novels(novels, seed=2)[1] != valid


def test_books_reviews_never_enter_the_corpus():
    docs = pc.corpus_documents(data_root(), with_reviews=True)
    names = [d.name for ds in docs.values() for d in ds]
    assert not any("/books/" in n for n in names)
    assert {n for n in names if n.startswith("webis")} == {
        "webis-cls-10/fr/dvd/train.review", "webis-cls-10/fr/music/train.review"}
    assert not any(n.startswith("webis") for n in (d.name for d in docs["valid"]))
    no_reviews = pc.corpus_documents(data_root(), with_reviews=False)
    assert not any(d.name.startswith("webis") for ds in no_reviews.values() for d in ds)


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
