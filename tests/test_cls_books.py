"""CLS-Books preparation on the real Webis-CLS-10 XML: sizes, balance, determinism, bad input."""

from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from data_fixtures import BOOKS, cls_dir, data_root

from finetune_lab import cli
from finetune_lab._files import read_json, sha256_tree
from finetune_lab.data.cls_books import (
    ClsDataError,
    label_for_rating,
    prepare_cls,
    read_reviews,
    read_split,
    single_line,
    stratified_split,
)
from finetune_lab.errors import DataRootError, UserError


def test_split_sizes_and_class_balance():
    folder = cls_dir()
    expected = {"train": (1800, 900), "valid": (200, 100), "test": (2000, 1000)}
    for split, (n, per_class) in expected.items():
        reviews, labels = read_split(folder, split)
        assert len(reviews) == len(labels) == n
        assert labels.count(0) == labels.count(1) == per_class
    counts = read_json(folder / "manifest.json")["counts"]
    assert counts == {"train": {"0": 900, "1": 900}, "valid": {"0": 100, "1": 100},
                      "test": {"0": 1000, "1": 1000}}


def test_valid_is_a_slice_of_train_and_test_keeps_xml_order():
    root = data_root()
    source = read_reviews(root / BOOKS / "train.review")
    train, _ = read_split(cls_dir(), "train")
    valid, _ = read_split(cls_dir(), "valid")
    # every train item lands on exactly one side (the corpus repeats a few texts, so compare
    # multisets, and check disjointness on item positions)
    assert Counter(train) + Counter(valid) == Counter(r.text for r in source)
    kept, held = stratified_split(source)
    assert not {r.position for r in kept} & {r.position for r in held}
    assert [r.text for r in kept] == train and [r.text for r in held] == valid
    for part in (kept, held):  # both parts keep XML order
        assert [r.position for r in part] == sorted(r.position for r in part)
    test, labels = read_split(cls_dir(), "test")
    xml_test = read_reviews(root / BOOKS / "test.review")
    assert test == [r.text for r in xml_test]
    assert labels == [r.label for r in xml_test]


def test_labels_follow_the_xml_ratings():
    root = data_root()
    items = ET.parse(root / BOOKS / "test.review").getroot().findall("item")
    _, labels = read_split(cls_dir(), "test")
    ratings = [float(item.findtext("rating")) for item in items]
    assert labels == [1 if r > 3 else 0 for r in ratings]
    assert label_for_rating(4.0) == 1 and label_for_rating(2.0) == 0
    with pytest.raises(ValueError):
        label_for_rating(3.0)


def test_newlines_inside_reviews_are_removed():
    root = data_root()
    raw = ET.parse(root / BOOKS / "train.review").getroot().findall("item")
    with_newline = [item.findtext("text") for item in raw if "\n" in item.findtext("text")]
    assert with_newline, "the real data has multi-line reviews"
    train, _ = read_split(cls_dir(), "train")
    valid, _ = read_split(cls_dir(), "valid")
    written = set(train + valid)
    for text in with_newline[:50]:
        assert single_line(text) in written
    assert single_line("Bof.\n Après la rentrée,\n\nrien.") == "Bof. Après la rentrée, rien."


def test_same_seed_same_output_other_seed_other_valid(tmp_path):
    root = data_root()
    again = prepare_cls(root, tmp_path / "again")
    # the same files, and the same manifest but for how long the preparation took
    assert sha256_tree(again, exclude=["manifest.json"]) == sha256_tree(
        cls_dir(), exclude=["manifest.json"])
    untimed = [{k: v for k, v in read_json(folder / "manifest.json").items() if k != "timings_s"}
               for folder in (again, cls_dir())]
    assert untimed[0] == untimed[1] and untimed[0]["outputs"]
    other = prepare_cls(root, tmp_path / "other", seed=2)
    assert (other / "valid.review").read_bytes() != (cls_dir() / "valid.review").read_bytes()
    assert (other / "test.review").read_bytes() == (cls_dir() / "test.review").read_bytes()


def test_manifest_records_inputs_outputs_and_seed():
    manifest = read_json(cls_dir() / "manifest.json")
    assert set(manifest["inputs"]) == {f"{BOOKS}/train.review", f"{BOOKS}/test.review"}
    assert manifest["outputs"] == sha256_tree(cls_dir(), exclude=["manifest.json"])
    assert manifest["seed"] == 1 and manifest["parameters"]["valid_fraction"] == 0.1
    assert "sentencepiece" in manifest["tool_versions"]


# --- bad input --------------------------------------------------------------------------------

def _fake_root(tmp_path: Path, edit_train=None) -> Path:
    """A data root holding the real books XML, with ``edit_train`` applied to train.review."""
    root = tmp_path / "root"
    (root / BOOKS).mkdir(parents=True)
    real = data_root() / BOOKS
    shutil.copyfile(real / "test.review", root / BOOKS / "test.review")
    text = (real / "train.review").read_text(encoding="utf-8")
    if edit_train:
        text = edit_train(text)
    (root / BOOKS / "train.review").write_text(text, encoding="utf-8")
    return root


def _replace_in_item(n: int, pattern: str, repl: str):
    """Edit the n-th (1-based) <item> only."""
    def edit(text: str) -> str:
        starts = [m.start() for m in re.finditer("<item>", text)]
        start, end = starts[n - 1], starts[n]
        item, count = re.subn(pattern, repl, text[start:end], count=1)
        assert count == 1
        return text[:start] + item + text[end:]
    return edit


@pytest.mark.parametrize(
    ("pattern", "repl", "message"),
    [
        (r"<rating>[^<]*</rating>", "<rating>3.0</rating>", "rating 3.0 is neither positive"),
        (r"<rating>[^<]*</rating>", "", "missing <rating>"),
        (r"<rating>[^<]*</rating>", "<rating>five</rating>", "is not a number"),
        (r"<text>.*?</text>", "<text>  \n </text>", "empty review"),
        (r"<text>.*?</text>", "", "missing <text>"),
    ],
)
def test_bad_item_names_file_and_item_and_writes_nothing(tmp_path, pattern, repl, message):
    root = _fake_root(tmp_path, _replace_in_item(7, pattern, repl))
    out = tmp_path / "out" / "cls.books"
    with pytest.raises(ClsDataError) as info:
        prepare_cls(root, out)
    text = str(info.value)
    assert str(root / BOOKS / "train.review") in text
    assert "item 7" in text and message in text
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_malformed_xml_names_the_file_and_line(tmp_path):
    root = _fake_root(tmp_path, lambda text: text[: len(text) // 2])
    with pytest.raises(ClsDataError, match=r"train\.review: not well-formed XML at line \d+"):
        prepare_cls(root, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failure_keeps_the_previous_complete_output(tmp_path):
    out = prepare_cls(data_root(), tmp_path / "cls.books")
    before = sha256_tree(out)
    root = _fake_root(tmp_path, _replace_in_item(1, r"<rating>[^<]*</rating>", "<rating>3</rating>"))
    with pytest.raises(ClsDataError):
        prepare_cls(root, out)
    assert sha256_tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cls.books", "root"]


def test_missing_data_root(tmp_path, capsys):
    with pytest.raises(DataRootError, match="does not exist"):
        prepare_cls(tmp_path / "nowhere", tmp_path / "out")
    assert cli.main(["prepare-cls", "--data-root", str(tmp_path / "nowhere"),
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "finetune-lab prepare-cls: error: data root" in err and "FINETUNE_LAB_DATA_ROOT" in err
    assert not (tmp_path / "out").exists()


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="cannot create the output folder"):
        prepare_cls(data_root(), blocker / "cls.books")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_output_folder(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        with pytest.raises(UserError, match="not writable"):
            prepare_cls(data_root(), parent / "cls.books")
    finally:
        parent.chmod(0o755)


def test_review_and_label_files_of_different_lengths(tmp_path):
    folder = tmp_path / "cls.books"
    shutil.copytree(cls_dir(), folder)
    lines = (folder / "valid.label").read_text().splitlines()[:-1]
    (folder / "valid.label").write_text("".join(f"{x}\n" for x in lines))
    with pytest.raises(ClsDataError, match=r"valid\.review has 200 lines but .*valid\.label has 199"):
        read_split(folder, "valid")


def test_cli_prepare_cls(tmp_path, capsys):
    assert cli.main(["prepare-cls", "--data-root", str(data_root()),
                     "--out", str(tmp_path / "c")]) == 0
    assert "train 1800, valid 200, test 2000" in capsys.readouterr().out


# --- issue 35 item 11: ratings CLS-Books cannot hold; a data root of the wrong kind ----------


@pytest.mark.parametrize("rating", ["6.0", "0", "0.0", "4.5", "-1", "nan", "inf"])
def test_a_rating_out_of_range_names_file_and_item(tmp_path, rating):
    """Ratings 6.0 and 0 were accepted silently and labelled 1 and 0; the data has ratings
    1, 2, 4 and 5 only."""
    root = _fake_root(tmp_path, _replace_in_item(5, r"<rating>[^<]*</rating>",
                                                 f"<rating>{rating}</rating>"))
    with pytest.raises(ClsDataError) as info:
        prepare_cls(root, tmp_path / "out" / "cls.books")
    text = str(info.value)
    assert str(root / BOOKS / "train.review") in text and "item 5" in text
    assert f"rating {rating} is not one of the ratings CLS-Books holds (1, 2, 4, 5)" in text
    assert not (tmp_path / "out").exists()


def test_a_data_root_that_is_a_file_says_so(tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    root.write_text("not a folder")
    with pytest.raises(SystemExit) as stopped:  # --data-root: refused as it is read
        cli.main(["prepare-cls", "--data-root", str(root), "--out", str(tmp_path / "out")])
    assert stopped.value.code == 2 and f"{root} is a file, not a folder" in capsys.readouterr().err
    monkeypatch.setenv("FINETUNE_LAB_DATA_ROOT", str(root))  # the environment's: when used
    assert cli.main(["prepare-cls", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"data root {root} is a file, not a folder" in err and "does not exist" not in err


def test_a_review_file_that_is_a_folder_says_so(tmp_path, capsys):
    root = _fake_root(tmp_path)
    (root / BOOKS / "train.review").unlink()
    (root / BOOKS / "train.review").mkdir()
    assert cli.main(["prepare-cls", "--data-root", str(root), "--out",
                     str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "train.review is a folder, not a review file" in err and "does not exist" not in err
