"""The data chapter's statistics, the committed summary, and the chapter itself."""

from __future__ import annotations

import json

import pytest
from data_fixtures import cls_dir, work_dir

from finetune_lab.book import data_summary as ds
from finetune_lab.book import data_tables as dt
from finetune_lab.data.cls_books import read_split
from finetune_lab.data.cls_splits import SUMMARY_NAME, train_size
from finetune_lab.config import PROJECT_ROOT, WORK_DIR_ENV
from finetune_lab.errors import UserError
from finetune_lab.book.qmd import execute_chapter

CHAPTER = PROJECT_ROOT / "chapters" / "data.qmd"
COMMITTED = PROJECT_ROOT / "data" / "summaries" / SUMMARY_NAME


@pytest.fixture(scope="module")
def summary():
    return ds.compute_summary(work_dir())


def test_splits_and_balance(summary):
    table = dt.split_table(summary).set_index("split")
    assert table["reviews"].to_dict() == {"train": 1800, "valid": 200, "test": 2000}
    assert (table["positive"] == table["negative"]).all()
    assert (table["positive share"] == 0.5).all()


def test_corpus_reviews_follow_the_recorded_parameters():
    def reviews(params, valid1=None):
        counts = {"valid1": {"paragraphs": valid1}} if valid1 else {}
        return dt.corpus_reviews({"pretrain": {"parameters": params, "counts": counts}})

    upweighted = reviews({"with_reviews": True, "review_repeat": 20, "review_valid": 400},
                         valid1=400)
    assert (upweighted.included, upweighted.repeat, upweighted.held_out) == (True, 20, 400)
    assert upweighted.domains == ("dvd", "music")
    once = reviews({"with_reviews": True})  # summaries before upweighting
    assert (once.included, once.repeat, once.held_out) == (True, 0, 0)
    assert not reviews({"with_reviews": False}).included


def test_unknown_spans_become_code_that_shows_them():
    summary = {"cls": {"unknown_surfaces": [["€", 8], ["a`b", 2], ["\x85", 1]]}}
    assert dt.unknown_spans(summary, top=2) == [("€", 8), ("a`b", 2)]
    assert [dt.code_span(t) for t, _ in dt.unknown_spans(summary)] == [
        "`€`", "`` a`b ``", "U+0085"]


def test_a_control_character_among_the_unknown_text_is_named_as_the_mojibake_it_is():
    """U+009C (twice in the reviews) is cp1252's œ read as Latin-1; U+0081 is no cp1252 byte."""
    assert dt.unknown_sentence([("\x9c", 2)]) == (
        "The only review text for which the tokenizer has no piece is U+009C (2 times; a control "
        "character, probably a cp1252 `œ` decoded as Latin-1).")
    assert dt.unknown_sentence([("€", 8), ("\x81", 1)]) == (
        "The review text for which the tokenizer has no piece is, most frequent first with its "
        "count: `€` (8), U+0081 (1).")
    assert dt.unknown_sentence([]) == "The tokenizer has a piece for every character of the reviews."


def test_length_histogram_and_truncation_agree(summary):
    lengths = summary["lengths"]
    first_truncated_bin = lengths["max_positions"] // lengths["bin_width"]
    for split, hist in lengths["histogram"].items():
        stats = lengths["stats"][split]
        assert sum(hist) == {"train": 1800, "valid": 200, "test": 2000}[split]
        assert sum(hist[first_truncated_bin:]) == stats["truncated"]
        assert stats["median"] <= stats["p90"] <= stats["max"]
    assert 0 < dt.truncated_share(summary) < 1
    assert ds.length_histogram([1, 16, 17, 256, 257, 5000]) == (
        [2, 1] + [0] * 13 + [1, 1] + [0] * 47 + [1])


def test_tokenization_rates(summary):
    table = dt.tokenization_table(summary)
    assert set(table["corpus"]) == {"CLS-Books", "pretraining corpus"}
    assert (table["tokens per word"] > 1).all()
    assert ((table["<unk> rate"] >= 0) & (table["<unk> rate"] < 0.05)).all()
    assert dt.rate(summary, "cls", "tokens per word") > 1
    examples = dt.examples_table(summary)
    assert list(examples["sentence"]) == list(ds.EXAMPLES)


def test_duplicate_counts():
    counts = ds.duplicate_counts({"train": ["a", "b", "a"], "valid": ["c", "b"], "test": ["d"]})
    assert counts == {"within train": 1, "within valid": 0, "within test": 0,
                      "train and valid": 1, "train and test": 0, "valid and test": 0}


def test_load_prefers_prepared_data_then_committed_summary(summary, tmp_path):
    written = ds.write_summary(summary, tmp_path / "summaries" / "data.json")
    assert ds.load_summary(work_dir())["source"] == "prepared"
    fallback = ds.load_summary(tmp_path / "empty-work", committed=written)
    assert fallback["source"] == "committed"
    assert fallback["cls"]["splits"] == summary["cls"]["splits"]
    with pytest.raises(UserError, match="finetune-lab prepare-cls"):
        ds.load_summary(tmp_path / "empty-work", committed=tmp_path / "missing.json")


def test_committed_summary_is_aggregate_only():
    """data/summaries/data.json must not carry review text: no review's opening appears in it."""
    assert COMMITTED.is_file(), "run `finetune-lab data-summary` after the data commands"
    text = COMMITTED.read_text(encoding="utf-8")
    data = json.loads(text)
    assert [e["text"] for e in data["examples"]] == list(ds.EXAMPLES)
    for split in ("train", "valid", "test"):
        reviews, _ = read_split(cls_dir(), split)
        leaked = [r for r in reviews if len(r) >= 30 and r[:30] in text]
        assert not leaked, leaked[:3]
    assert data["tokenizer"]["parameters"]["embedding_rows"] == 32_000


def test_chapter_executes_from_prepared_data(monkeypatch):
    monkeypatch.setenv(WORK_DIR_ENV, str(work_dir()))
    nb = execute_chapter(CHAPTER)
    outputs = "\n".join(str(o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "computed from the prepared data" in outputs
    assert "| train " in outputs and "1,800" in outputs


def test_chapter_executes_from_committed_summary(monkeypatch, tmp_path):
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "no-prepared-data"))
    nb = execute_chapter(CHAPTER)
    outputs = "\n".join(str(o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "committed summary" in outputs and "finetune-lab prepare-cls" in outputs
    assert "fairseq-preprocess --only-source" in outputs


def test_cli_writes_the_summary(tmp_path, capsys):
    from finetune_lab import cli

    dest = tmp_path / "data.json"
    assert cli.main(["data-summary", "--work", str(work_dir()), "--out", str(dest)]) == 0
    assert json.loads(dest.read_text())["cls"]["splits"][0]["reviews"] == 1800
    assert cli.main(["data-summary", "--work", str(tmp_path / "none"), "--out", str(dest)]) == 2
    assert "finetune-lab prepare-cls" in capsys.readouterr().err


def test_train_size_reads_the_committed_summary(tmp_path):
    splits = json.loads(COMMITTED.read_text(encoding="utf-8"))["cls"]["splits"]
    assert train_size(COMMITTED) == train_size() == 1800 == next(
        s["reviews"] for s in splits if s["split"] == "train")
    with pytest.raises(UserError, match="finetune-lab data-summary"):
        train_size(tmp_path / "absent.json")
