"""The data chapter's statistics, the committed summary, and the chapter itself."""

from __future__ import annotations

import json

import pytest
from data_fixtures import cls_dir, work_dir

from finetune_lab import data_summary as ds
from finetune_lab.cls_books import read_split
from finetune_lab.config import PROJECT_ROOT, WORK_DIR_ENV
from finetune_lab.errors import UserError
from finetune_lab.qmd import execute_chapter

CHAPTER = PROJECT_ROOT / "chapters" / "data.qmd"
COMMITTED = PROJECT_ROOT / "data" / "summaries" / ds.SUMMARY_NAME


@pytest.fixture(scope="module")
def summary():
    return ds.compute_summary(work_dir())


def test_splits_and_balance(summary):
    table = ds.split_table(summary).set_index("split")
    assert table["reviews"].to_dict() == {"train": 1800, "valid": 200, "test": 2000}
    assert (table["positive"] == table["negative"]).all()
    assert (table["positive share"] == 0.5).all()


def test_pretrain_reviews_text_follows_the_recorded_parameters():
    def text(params, valid1=None):
        counts = {"valid1": {"paragraphs": valid1}} if valid1 else {}
        return ds.pretrain_reviews_text({"pretrain": {"parameters": params, "counts": counts}})

    assert "written 20 times" in text({"with_reviews": True, "review_repeat": 20,
                                       "review_valid": 400}, valid1=400)
    assert "400 of them" in text({"with_reviews": True, "review_repeat": 20}, valid1=400)
    assert "training reviews" in text({"with_reviews": True})  # summaries before upweighting
    assert "left out" in text({"with_reviews": False})


def test_length_histogram_and_truncation_agree(summary):
    lengths = summary["lengths"]
    first_truncated_bin = lengths["max_positions"] // lengths["bin_width"]
    for split, hist in lengths["histogram"].items():
        stats = lengths["stats"][split]
        assert sum(hist) == {"train": 1800, "valid": 200, "test": 2000}[split]
        assert sum(hist[first_truncated_bin:]) == stats["truncated"]
        assert stats["median"] <= stats["p90"] <= stats["max"]
    assert 0 < ds.truncated_share(summary) < 1
    assert ds.length_histogram([1, 16, 17, 256, 257, 5000]) == (
        [2, 1] + [0] * 13 + [1, 1] + [0] * 47 + [1])


def test_tokenization_rates(summary):
    table = ds.tokenization_table(summary)
    assert set(table["corpus"]) == {"CLS-Books", "pretraining corpus"}
    assert (table["tokens per word"] > 1).all()
    assert ((table["<unk> rate"] >= 0) & (table["<unk> rate"] < 0.05)).all()
    assert ds.rate(summary, "cls", "tokens per word") > 1
    examples = ds.examples_table(summary)
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
    committed = PROJECT_ROOT / "data" / "summaries" / ds.SUMMARY_NAME
    splits = json.loads(committed.read_text(encoding="utf-8"))["cls"]["splits"]
    assert ds.train_size(committed) == 1800 == next(
        s["reviews"] for s in splits if s["split"] == "train")
    with pytest.raises(UserError, match="finetune-lab data-summary"):
        ds.train_size(tmp_path / "absent.json")
