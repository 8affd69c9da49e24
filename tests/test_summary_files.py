"""One damaged summary file (a probe, a fill-mask record) is set aside by name; the others are
read, and the chapter's tables still build (issue: one bad file must not take down the book)."""

from __future__ import annotations

import json
import shutil

import pytest

from finetune_lab.book import fill_mask, probe_report
from finetune_lab.config import paths

DAMAGE = {
    "cut.json": '{"name": "cut", "init": "pretr',
    "list.json": "[]",
    "nan.json": None,  # a copy whose accuracy is NaN
    "missing.json": None,  # a copy without its probes
}


@pytest.fixture
def probes(tmp_path):
    src = paths().summaries / "probes"
    folder = tmp_path / "probes"
    shutil.copytree(src, folder)
    good = json.loads((src / "random.json").read_text())
    for name, text in DAMAGE.items():
        if name == "nan.json":
            bad = json.loads(json.dumps(good))
            bad["probes"]["<s>"]["test_accuracy"] = float("nan")
            text = json.dumps(bad)  # Python writes NaN, which strict JSON refuses
        elif name == "missing.json":
            text = json.dumps({k: v for k, v in good.items() if k != "probes"})
        (folder / name).write_text(text)
    return folder, len(list(src.glob("*.json")))


def test_damaged_probes_are_set_aside_by_name_and_the_table_keeps_the_rest(probes):
    folder, n_good = probes
    bad: list[str] = []
    table = probe_report.probe_table(folder, set_aside=bad)
    assert len(table) == n_good
    assert [line.split("`")[1] for line in bad] == sorted(DAMAGE)
    by_name = {line.split("`")[1]: line for line in bad}
    assert "cannot be read as JSON" in by_name["cut.json"]
    assert "holds a list, not a record" in by_name["list.json"]
    assert "NaN is not a number JSON allows" in by_name["nan.json"]
    assert "lacks probes.<s>.test_accuracy" in by_name["missing.json"]


def test_a_damaged_fill_mask_record_is_set_aside_and_the_others_read(tmp_path):
    src = fill_mask.fill_mask_dir()
    folder = tmp_path / "fill-mask"
    shutil.copytree(src, folder)
    good = json.loads(next(iter(sorted(src.glob("*.json")))).read_text())
    good["predictions"][2]["probability"] = "high"
    (folder / "odd.json").write_text(json.dumps({**good, "name": "odd"}))
    (folder / "empty.json").write_text("")
    bad: list[str] = []
    found = fill_mask.recorded_fill_masks(folder, set_aside=bad)
    assert sorted(found) == sorted(p.stem for p in src.glob("*.json"))
    assert bad[0].startswith("`empty.json` cannot be read as JSON")
    assert bad[1] == ("`odd.json` has a prediction (item 2) that has probability = 'high', "
                      "not a finite number")


def test_a_probe_of_other_splits_and_answers_out_of_range_are_set_aside(tmp_path):
    """Fault trial 3: a probe of a 12-review `cls.books` became a row of the probe table, and
    a fill-mask record with a probability of 7.5 and a rank of 0 was read as any other."""
    src = paths().summaries / "probes"
    folder = tmp_path / "probes"
    shutil.copytree(src, folder)
    small = json.loads((src / "random.json").read_text())
    small["sizes"] = {"train": 12, "valid": 12, "test": 12}
    (folder / "small.json").write_text(json.dumps({**small, "name": "small"}))
    bad: list[str] = []
    table = probe_report.probe_table(folder, set_aside=bad)
    assert "small" not in set(table["weights"]) and len(table) == len(list(src.glob("*.json")))
    assert bad == ["`small.json` probed splits of {'train': 12, 'valid': 12, 'test': 12} "
                   "reviews, not CLS-Books' (1800 train, 200 valid, 2000 test)"]

    fm_src = fill_mask.fill_mask_dir()
    fm = tmp_path / "fill-mask"
    shutil.copytree(fm_src, fm)
    good = json.loads(next(iter(sorted(fm_src.glob("*.json")))).read_text())
    for name, key, value in (("p.json", "probability", 7.5), ("r.json", "rank", 0)):
        record = json.loads(json.dumps(good))
        record["predictions"][0][key] = value
        (fm / name).write_text(json.dumps({**record, "name": name[0]}))
    bad = []
    assert sorted(fill_mask.recorded_fill_masks(fm, set_aside=bad)) == sorted(
        p.stem for p in fm_src.glob("*.json"))
    assert bad == ["`p.json` has a prediction (item 0) that has probability = 7.5, outside 0 to 1",
                   "`r.json` has a prediction (item 0) that has rank = 0, outside 1 to 5"]


def test_a_record_copied_under_another_name_or_not_a_count_is_set_aside(tmp_path):
    """Fault trial 4, f31-f33: a probe copied as cpu-zcopy.json showed its weights twice; a
    fill-mask record copied and edited replaced the committed answers of the name it carries;
    an accuracy of 74.37 % (no count of 2,000 reviews gives it) was shown."""
    src = paths().summaries / "probes"
    folder = tmp_path / "probes"
    shutil.copytree(src, folder)
    shutil.copy2(src / "cpu-sinpos1-bow.json", folder / "cpu-zcopy.json")
    odd = json.loads((src / "cpu-long.json").read_text())
    odd["probes"]["mean"]["test_accuracy"] = 74.37
    (folder / "cpu-long.json").write_text(json.dumps(odd))
    bad: list[str] = []
    table = probe_report.probe_table(folder, set_aside=bad)
    assert sorted(table["weights"]) == sorted(p.stem for p in src.glob("*.json")
                                              if p.stem != "cpu-long")
    assert [line.split("`")[1] for line in bad] == ["cpu-long.json", "cpu-zcopy.json"]
    assert "which no count of 2000 test reviews gives" in bad[0]
    assert "is the record of 'cpu-sinpos1-bow'" in bad[1]

    fm_src = fill_mask.fill_mask_dir()
    fm = tmp_path / "fill-mask"
    shutil.copytree(fm_src, fm)
    shutil.copy2(fm_src / "cpu-sinpos1.json", fm / "zz-copy.json")
    bad = []
    found = fill_mask.recorded_fill_masks(fm, set_aside=bad)
    assert sorted(found) == sorted(p.stem for p in fm_src.glob("*.json"))
    assert bad == ["`zz-copy.json` is the record of 'cpu-sinpos1' (a copy under another name?): "
                   "a record is kept as NAME.json"]
