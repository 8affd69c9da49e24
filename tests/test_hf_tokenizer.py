"""The Transformers-side tokenizer gives fairseq's ids, review by review (Task 5, item 1)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from finetune_lab.models.hf_tokenizer import (EOS, FairseqIdTokenizer, fairseq_ids_from_text, pad_batch,
                                       read_fairseq_dict, token_id_check)
from finetune_lab.errors import UserError

from data_fixtures import BOOKS, data_root


@functools.cache
def _real_reviews() -> list[str]:
    from finetune_lab.data.cls_books import read_reviews

    root = data_root()
    return [r.text for split in ("train", "test")
            for r in read_reviews(root / BOOKS / f"{split}.review")]


@pytest.fixture(scope="module")
def review_tokenizer(tmp_path_factory) -> Path:
    """A 600-piece sentencepiece model trained here on real CLS-Books review text."""
    import sentencepiece as spm

    from finetune_lab.data import tokenizer as T

    folder = tmp_path_factory.mktemp("review-tok")
    T.train_spm(_real_reviews()[::4], folder / "spm", vocab_size=600)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    T.write_fairseq_dict(sp, folder / "dict.txt")
    return folder


@pytest.mark.parametrize("max_positions", [256, 48])
def test_every_real_review_gets_fairseqs_ids(review_tokenizer, max_positions):
    reviews = _real_reviews()
    tok = FairseqIdTokenizer.from_dir(review_tokenizer, max_positions=max_positions)
    ours = tok(reviews)
    ref = fairseq_ids_from_text(reviews, tok.spm_model, tok.dict_path, max_positions)
    assert len(reviews) == 4000
    mismatched = [i for i, (a, b) in enumerate(zip(ours, ref)) if a != b]
    assert not mismatched, f"{len(mismatched)} reviews differ, first {mismatched[:5]}"
    truncated = sum(len(r) == max_positions and r[-1] != EOS for r in ours)
    assert truncated > 0  # the truncation path is exercised, not only short reviews
    assert all(r[0] == 0 for r in ours)
    assert ours[0] == tok.encode(reviews[0])  # batch and single encoding agree


def test_unknown_characters_map_to_unk(review_tokenizer):
    tok = FairseqIdTokenizer.from_dir(review_tokenizer)
    text = "livre 漢字 ☃"
    ref = fairseq_ids_from_text([text], tok.spm_model, tok.dict_path)[0]
    assert tok.encode(text) == ref
    assert 3 in ref


def test_saved_folder_reproduces_ids(review_tokenizer, tmp_path):
    tok = FairseqIdTokenizer.from_dir(review_tokenizer, max_positions=64)
    again = FairseqIdTokenizer.from_dir(tok.save(tmp_path / "hf"))
    assert again.max_positions == 64
    sample = _real_reviews()[:50]
    assert again(sample) == tok(sample)


def test_project_data_every_cls_review():
    """All 4000 reviews of the prepared cls.books with the project's own tokenizer."""
    from finetune_lab.data.binarize import default_output as default_bin
    from finetune_lab.data.cls_books import default_output as default_cls
    from finetune_lab.data.tokenizer import default_output as default_tok

    cls_dir, tok_dir = default_cls(), default_tok()
    if not (cls_dir / "train.review").is_file() or not (tok_dir / "dict.txt").is_file():
        pytest.skip(f"prepared data absent ({cls_dir}, {tok_dir}): run `finetune-lab prepare-cls` "
                    "and `finetune-lab adopt-tokenizer` to run this check")
    tok = FairseqIdTokenizer.from_dir(tok_dir)
    bin_dir = default_bin()
    table = token_id_check(cls_dir, tok, bin_dir if bin_dir.is_dir() else None)
    assert table["reviews"].sum() == 4000
    assert table["all identical"].all(), table.to_string()


@pytest.mark.slow
def test_binarized_by_fairseq_preprocess_every_review():
    """Against ``fairseq-preprocess``'s own .bin files (the data fairseq trains on)."""
    from data_fixtures import cls_bin, cls_dir, tiny_tokenizer

    tok = FairseqIdTokenizer.from_dir(tiny_tokenizer())
    table = token_id_check(cls_dir(), tok, cls_bin())
    assert set(table["reference"]) == {"fairseq-preprocess (binarized input0)"}
    assert table["reviews"].sum() == 4000
    assert table["all identical"].all(), table.to_string()


def test_duplicate_dictionary_symbol_is_refused(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_text("▁a 3\n▁b 2\n▁a 1\n", encoding="utf-8")
    with pytest.raises(UserError, match="repeats the piece .▁a. without #fairseq:overwrite"):
        read_fairseq_dict(path)


def test_dictionary_ids_follow_fairseq(tmp_path):
    from finetune_lab.models.fairseq_compat import quiet_import

    quiet_import()
    from fairseq.data import Dictionary

    path = tmp_path / "dict.txt"
    path.write_text("▁a 3\n▁b 2\nc 1\n<s> 0 #fairseq:overwrite\n", encoding="utf-8")
    d = Dictionary.load(str(path))
    d.add_symbol("<mask>")
    assert read_fairseq_dict(path) == d.indices


def test_pad_batch_pads_with_fairseq_pad():
    batch = pad_batch([[0, 5, 2], [0, 2]])
    assert batch["input_ids"].tolist() == [[0, 5, 2], [0, 2, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
