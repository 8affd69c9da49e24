"""The sentencepiece tokenizer and its fairseq dict: 32,000 embedding rows, aligned ids, seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import sentencepiece as spm
from data_fixtures import TINY_VOCAB, data_root, tiny_tokenizer
from fairseq.data import Dictionary

from finetune_lab.data import eltec
from finetune_lab.data import tokenizer as tk
from finetune_lab._files import read_json
from finetune_lab.errors import UserError


def _fairseq_rows(dict_path: Path) -> Dictionary:
    """What fairseq's masked_lm / sentence_prediction tasks build from dict.txt."""
    dictionary = Dictionary.load(str(dict_path))
    dictionary.add_symbol("<mask>")
    return dictionary


def _real_sentences(n: int) -> list[str]:
    root = data_root()
    novels = eltec.list_novels(root)[:4]
    paragraphs = [p for doc in novels for p in eltec.paragraphs(doc)]
    return tk.sample_sentences([s for p in paragraphs for s in tk.split_sentences(p)], n, seed=1)


def test_size_arithmetic():
    assert tk.DEFAULT_VOCAB_SIZE == tk.spm_vocab_size() == 31_999
    assert tk.embedding_rows(tk.DEFAULT_VOCAB_SIZE - 4) == tk.EMBEDDING_ROWS == 32_000
    assert tk.spm_vocab_size(500) == 499


def test_real_32k_model_gives_exactly_32000_embedding_rows(tmp_path):
    """A full-size model (trained on 20k real sentences: about a second) through the real path."""
    tk.train_spm(_real_sentences(20_000), tmp_path / "spm")
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    assert sp.get_piece_size() == 31_999
    rows = tk.write_fairseq_dict(sp, tmp_path / "dict.txt")
    dictionary = _fairseq_rows(tmp_path / "dict.txt")
    assert rows == len(dictionary) == 32_000
    assert dictionary.index("<mask>") == 31_999
    # ids agree: spm id == fairseq index for every piece
    assert all(dictionary.index(sp.id_to_piece(i)) == i for i in range(4, 31_999))


def test_tiny_tokenizer_folder(tmp_path):
    folder = tiny_tokenizer()
    sp = tk.load_processor(folder)
    assert sp.get_piece_size() == TINY_VOCAB
    assert [sp.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    dictionary = _fairseq_rows(folder / "dict.txt")
    assert len(dictionary) == TINY_VOCAB + 1
    text = "Ce livre est une merveille, je le recommande !"
    ids = sp.encode(text)
    line = " ".join(sp.id_to_piece(ids))
    assert dictionary.encode_line(line, append_eos=False, add_if_not_exist=False).tolist() == ids
    counts = [int(line.rsplit(" ", 1)[1]) for line in (folder / "dict.txt").read_text().splitlines()]
    assert sum(counts) > 0  # counts come from encoding the training sample


def test_manifest_reports_time_and_corpus_size():
    manifest = read_json(tiny_tokenizer() / "manifest.json")
    assert manifest["timings_s"]["spm_train"] > 0
    corpus = manifest["corpus"]
    assert corpus["sample_sentences"] == 5000 <= corpus["sentences"]
    assert corpus["words"] > corpus["sample_words"] > 0
    assert manifest["parameters"]["embedding_rows"] == TINY_VOCAB + 1
    # only the train side: held-out novels and the books reviews are never in the inputs
    assert not set(manifest["parameters"]["held_out_novels"]) & set(manifest["inputs"])
    assert not any("books" in name for name in manifest["inputs"])
    assert any("/dvd/" in name for name in manifest["inputs"])


def test_same_seed_same_tokenizer_other_seed_other_sample(tmp_path):
    root = data_root()
    kwargs = dict(vocab_size=400, sample_size=2000, max_novels=3, with_reviews=False)
    a = tk.train_tokenizer(root, tmp_path / "a", seed=7, **kwargs)
    b = tk.train_tokenizer(root, tmp_path / "b", seed=7, **kwargs)
    c = tk.train_tokenizer(root, tmp_path / "c", seed=8, **kwargs)
    for name in ("spm.model", "spm.vocab", "dict.txt"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "dict.txt").read_bytes() != (c / "dict.txt").read_bytes()
    sentences = _real_sentences(0)
    assert tk.sample_sentences(sentences, 100, 7) == tk.sample_sentences(sentences, 100, 7)
    assert tk.sample_sentences(sentences, 100, 7) != tk.sample_sentences(sentences, 100, 8)


def test_dict_refuses_a_model_with_other_specials(tmp_path):
    import sentencepiece as spm_mod

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(_real_sentences(2000)), encoding="utf-8")
    spm_mod.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "m"),
                                       vocab_size=300, model_type="bpe", minloglevel=2)
    sp = spm_mod.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    with pytest.raises(UserError, match="specials"):
        tk.write_fairseq_dict(sp, tmp_path / "dict.txt")


def test_missing_tokenizer_says_how_to_build_it(tmp_path):
    with pytest.raises(UserError, match="finetune-lab train-tokenizer"):
        tk.require_tokenizer(tmp_path)
