"""Encoding + fairseq-preprocess of CLS-Books: layout, ids, idempotence, bad input."""

from __future__ import annotations

import shutil

import pytest
from data_fixtures import cls_bin, cls_dir, tiny_tokenizer
from fairseq.data import Dictionary, data_utils

from finetune_lab.data import tokenizer as tk
from finetune_lab._files import read_json, sha256_tree
from finetune_lab.data.binarize import binarize_cls, up_to_date
from finetune_lab.data.cls_books import ClsDataError, read_split
from finetune_lab.errors import UserError


def _dataset(folder, split):
    dictionary = Dictionary.load(str(folder / "dict.txt"))
    return dictionary, data_utils.load_indexed_dataset(str(folder / split), dictionary)


def test_layout_and_sizes():
    out = cls_bin()
    for sub in ("input0", "label"):
        for split, n in (("train", 1800), ("valid", 200), ("test", 2000)):
            _, dataset = _dataset(out / sub, split)
            assert len(dataset) == n, (sub, split)
    label_dict = Dictionary.load(str(out / "label" / "dict.txt"))
    symbols = {label_dict[i] for i in range(label_dict.nspecial, len(label_dict))}
    assert {s for s in symbols if not s.startswith("madeupword")} == {"0", "1"}


def test_binarized_ids_are_the_spm_ids_plus_eos():
    out = cls_bin()
    sp = tk.load_processor(tiny_tokenizer())
    reviews, labels = read_split(cls_dir(), "valid")
    _, inputs = _dataset(out / "input0", "valid")
    label_dict, label_ds = _dataset(out / "label", "valid")
    for i in (0, 57, 199):
        assert inputs[i].tolist() == sp.encode(reviews[i]) + [2]
        assert label_dict[label_ds[i][0].item()] == str(labels[i])


def test_manifest_and_commands():
    manifest = read_json(cls_bin() / "manifest.json")
    assert manifest["commands"][0].startswith(
        "fairseq-preprocess --only-source --trainpref spm/train.spm.review "
        "--validpref spm/valid.spm.review --testpref spm/test.spm.review --destdir input0 "
        "--srcdict <tokenizer>/dict.txt --workers")
    assert "--destdir label" in manifest["commands"][1] and "--srcdict" not in manifest["commands"][1]
    assert manifest["counts"]["train"]["reviews"] == 1800
    assert manifest["counts"]["test"]["tokens"] > manifest["counts"]["test"]["words"]
    assert set(manifest["inputs"]) >= {"cls.books/train.review", "tokenizer/dict.txt"}


def test_the_same_data_built_at_another_path_gives_the_same_run_inputs(tmp_path):
    """fairseq-preprocess writes the dictionary's absolute path into its log: a checkout at
    another path must still see the committed runs' data as unchanged (issue 19)."""
    from finetune_lab.runs.manifest import input_record

    elsewhere = tmp_path / "another" / "checkout"
    shutil.copytree(tiny_tokenizer(), elsewhere / "tokenizer")
    shutil.copytree(cls_dir(), elsewhere / "cls.books")
    out, ran = binarize_cls(elsewhere / "cls.books", elsewhere / "tokenizer", elsewhere / "bin")
    assert ran
    here, there = cls_bin() / "input0" / "preprocess.log", out / "input0" / "preprocess.log"
    assert str(elsewhere) in there.read_text() and here.read_text() != there.read_text()
    assert input_record(out)["sha256"] == input_record(cls_bin())["sha256"]
    assert "input0/train.bin" in input_record(out)["sha256"]


def test_idempotent_skip_and_rebuild_on_change(tmp_path):
    cls_copy = tmp_path / "cls.books"
    shutil.copytree(cls_dir(), cls_copy)
    out = tmp_path / "bin"
    shutil.copytree(cls_bin(), out)
    # a copy of an up-to-date output with the same inputs is skipped (no fairseq run)
    inputs_before = sha256_tree(out)
    assert binarize_cls(cls_copy, tiny_tokenizer(), out) == (out, False)
    assert sha256_tree(out) == inputs_before
    # a changed input is rebuilt
    lines = (cls_copy / "test.review").read_text(encoding="utf-8").splitlines()
    lines[0] = "Un livre magnifique."
    (cls_copy / "test.review").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    assert binarize_cls(cls_copy, tiny_tokenizer(), out) == (out, True)
    assert (out / "input0" / "test.bin").read_bytes() != (cls_bin() / "input0" / "test.bin").read_bytes()
    assert (out / "input0" / "train.bin").read_bytes() == (cls_bin() / "input0" / "train.bin").read_bytes()
    # a tampered output no longer counts as up to date
    manifest = read_json(out / "manifest.json")
    assert up_to_date(out, manifest["inputs"], manifest["parameters"])
    (out / "label" / "valid.bin").write_bytes(b"junk")
    assert not up_to_date(out, manifest["inputs"], manifest["parameters"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "cls.books"]


def test_review_and_label_length_mismatch_writes_nothing(tmp_path):
    cls_copy = tmp_path / "cls.books"
    shutil.copytree(cls_dir(), cls_copy)
    with open(cls_copy / "train.label", "a") as handle:
        handle.write("1\n")
    with pytest.raises(ClsDataError, match=r"train\.review has 1800 lines but .*train\.label has 1801"):
        binarize_cls(cls_copy, tiny_tokenizer(), tmp_path / "bin")
    assert not (tmp_path / "bin").exists()


def test_empty_review_line_is_refused(tmp_path):
    cls_copy = tmp_path / "cls.books"
    shutil.copytree(cls_dir(), cls_copy)
    lines = (cls_copy / "valid.review").read_text(encoding="utf-8").splitlines()
    lines[4] = "   "
    (cls_copy / "valid.review").write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    with pytest.raises(ClsDataError, match=r"valid\.review: line 5: empty review"):
        binarize_cls(cls_copy, tiny_tokenizer(), tmp_path / "bin")
    assert not (tmp_path / "bin").exists()


def test_missing_inputs_say_which_command_to_run(tmp_path):
    with pytest.raises(UserError, match="prepare-cls"):
        binarize_cls(tmp_path / "none", tiny_tokenizer(), tmp_path / "bin")
    with pytest.raises(UserError, match="train-tokenizer"):
        binarize_cls(cls_dir(), tmp_path / "no-tokenizer", tmp_path / "bin")


def test_cli_reports_up_to_date(capsys):
    from finetune_lab import cli

    code = cli.main(["binarize-cls", "--cls", str(cls_dir()), "--tokenizer", str(tiny_tokenizer()),
                     "--out", str(cls_bin())])
    assert code == 0
    assert "up to date, skipped" in capsys.readouterr().out
