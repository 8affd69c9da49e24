"""The eighth fault trial's summary rows, fixed by class.

D1, D2, D3: every count the data chapter prints is held against the counts that bound it in the
same ``data/summaries/data.json`` (``unk ≤ tokens``, ``words ≤ tokens``, the tokenizer's sizes
against its ``dict.txt`` count, totals against their parts, fractions in range), and a
contradiction is refused where the file is read, in one line.

C2: the tokens (and updates) a lineage step of the packaged checkpoint went through are taken
from its run's own registry-checked record; the copy the package's manifest keeps is only held
against it, and a disagreement is one line naming the manifest, the step and both values.
"""

from __future__ import annotations

import json

import pytest

from finetune_lab.book import data_summary as ds
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.data import cls_splits
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints

COMMITTED = PROJECT_ROOT / "data" / "summaries" / "data.json"
PACKAGE = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr" / "manifest.json"


def _committed() -> dict:
    return json.loads(COMMITTED.read_text(encoding="utf-8"))


def _set(record: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for key in parents:
        record = record[int(key)] if isinstance(record, list) else record[key]
    if isinstance(record, list):
        record[int(last)] = value
    elif value is _DROP:
        del record[last]
    else:
        record[last] = value


_DROP = object()


# --- D1, D2, D3: the data summary's counts ----------------------------------------------------


def test_the_committed_summary_is_accepted_by_every_reader(tmp_path):
    record = cls_splits.read_summary(COMMITTED)
    # as a fresh clone reads it: no prepared data
    loaded = ds.load_summary(work=tmp_path / "nowork", committed=COMMITTED)
    assert loaded["source"] == "committed"
    assert loaded["tokenizer"]["parameters"]["embedding_rows"] == 32_000
    assert cls_splits.summary_contradiction(record) is None
    assert cls_splits.count_contradiction(record) is None
    assert cls_splits.tokenizer_contradiction(record) is None
    # the relations the checks rest on, as the real file gives them
    tok = record["tokenizer"]
    assert tok["parameters"]["embedding_rows"] == 4 + tok["dict_entries"] + 1
    assert tok["parameters"]["vocab_size"] == tok["dict_entries"] + 4
    for counts in (record["pretrain"]["counts"], record["cls"]["tokenization"]):
        for split in counts.values():
            assert split["unk"] <= split["tokens"] and split["words"] <= split["tokens"]


EDITS = [
    # D1 exactly as the trial made it: more unknown pieces than pieces (and fewer pieces than words)
    ({"pretrain.counts.train.tokens": 30_000_000, "pretrain.counts.train.unk": 40_000_000},
     "pretrain.counts.train.unk 40000000 is more than pretrain.counts.train.tokens 30000000"),
    ({"pretrain.counts.train.tokens": 30_000_000},
     "pretrain.counts.train.words 54368313 is more than pretrain.counts.train.tokens 30000000"),
    ({"pretrain.counts.valid1.unk": 68_575},
     "pretrain.counts.valid1.unk 68575 is more than pretrain.counts.valid1.tokens 68574"),
    ({"pretrain.counts.valid.unk": -1}, "pretrain.counts.valid.unk is -1, not a count"),
    ({"pretrain.counts.valid.tokens": 1.5e6}, "pretrain.counts.valid.tokens is 1500000.0, not a count"),
    ({"pretrain.counts.valid.novels": 10},
     "pretrain.counts.valid.novels 10 is more than pretrain.counts.valid.documents 9"),
    ({"pretrain.counts.valid.novels": 8, "pretrain.counts.valid.documents": 8},
     "pretrain.counts.valid.novels is 8 but pretrain.valid_documents"),
    ({"pretrain.counts.valid1.paragraphs": 500},
     "pretrain.counts.valid1.paragraphs is 500 but pretrain.parameters.review_valid gives 400"),
    ({"pretrain.counts.train.unk": _DROP}, "it lacks pretrain.counts.train.unk"),
    ({"pretrain.parameters.valid_fraction": 2.0},
     "pretrain.parameters.valid_fraction is 2.0, not a fraction"),
    ({"pretrain.timings_s.total": 10.0}, "pretrain.timings_s.total 10.0 is less than the sum"),
    # D2: more unknown pieces than the split's pieces
    ({"cls.tokenization.valid.unk": 50_000},
     "cls.tokenization.valid.unk 50000 is more than cls.tokenization.valid.tokens 27980"),
    ({"cls.tokenization.train.words": 300_000},
     "cls.tokenization.train.words 300000 is more than cls.tokenization.train.tokens 261860"),
    ({"cls.unknown_surfaces": [["\x9c", 5]]},
     "cls.unknown_surfaces counts 5 unknown pieces, more than the 2"),
    ({"cls.tokenization.train.unk": 5},  # trial 10's D13: 7 printed beside a list adding to 2
     "cls.unknown_surfaces, shorter than 10 and so every span, counts 2 unknown pieces, but "
     "cls.tokenization's unk (all splits) is 7"),
    ({"cls.valid_fraction": 0}, "cls.valid_fraction is 0, not a fraction"),
    # D3: the tokenizer's sizes against its dict.txt count
    ({"tokenizer.parameters.embedding_rows": 64_000, "tokenizer.parameters.vocab_size": 63_999},
     "tokenizer.parameters.embedding_rows is 64000 but tokenizer.dict_entries 31995"),
    ({"tokenizer.parameters.vocab_size": 63_999},
     "tokenizer.parameters.vocab_size is 63999 but tokenizer.dict_entries 31995"),
    ({"tokenizer.dict_entries": 63_995}, "tokenizer.parameters.embedding_rows is 32000"),
    ({"tokenizer.parameters.special_ids.unk_id": 0}, "tokenizer.parameters.special_ids is"),
    ({"tokenizer.corpus.sample_sentences": 3_000_000},
     "tokenizer.corpus.sample_sentences 3000000 is more than tokenizer.corpus.sentences 2199361"),
    ({"tokenizer.corpus.words": 300_000_000},
     "tokenizer.corpus.words 300000000 is more than tokenizer.corpus.characters 223459351"),
    ({"tokenizer.timings_s.total": 20.0}, "tokenizer.timings_s.total 20.0 is less than the sum"),
    # the lengths and the examples, printed beside them
    ({"lengths.stats.train.truncated": 230},
     "lengths.stats.train.truncated is 230 but lengths.histogram.train's bins above"),
    ({"lengths.stats.valid.max": 1900}, "lengths.stats.valid.max 1900 is not in"),
    ({"examples.0.ids.0": 40_000}, "examples.0.ids holds 40000, not an id below"),
]


@pytest.mark.parametrize(("edits", "said"), EDITS)
def test_a_summary_count_its_bounds_contradict_is_one_line_where_it_is_read(tmp_path, edits, said):
    record = _committed()
    for field, value in edits.items():
        _set(record, field, value)
    edited = tmp_path / "data.json"
    edited.write_text(json.dumps(record), encoding="utf-8")
    for read in (cls_splits.read_summary, cls_splits.split_sizes,
                 lambda p: ds.load_summary(work=tmp_path / "nowork", committed=p)):
        with pytest.raises(UserError) as err:
            read(edited)
        message = str(err.value)
        assert said in message and str(edited) in message and "\n" not in message
        assert "git checkout -- data/summaries/data.json" in message
        assert "finetune-lab data-summary" in message
    assert said in (cls_splits.count_contradiction(record) or "")


def test_an_adopted_tokenizers_record_is_checked_where_data_summary_copies_it(tmp_path,
                                                                             monkeypatch):
    """``data-summary`` copies the tokenizer's record from the committed summary when the
    tokenizer was adopted from the checkpoint: the same check, before it is copied."""
    assert ds.tokenizer_training({})["parameters"]["embedding_rows"] == 32_000
    record = _committed()
    _set(record, "tokenizer.parameters.embedding_rows", 64_000)
    edited = tmp_path / "data.json"
    edited.write_text(json.dumps(record), encoding="utf-8")
    monkeypatch.setattr(ds, "summary_path", lambda: edited)  # where it is read, not how
    with pytest.raises(UserError) as err:
        ds.tokenizer_training({})
    message = str(err.value)
    assert str(edited) in message and "embedding_rows is 64000" in message
    assert "git checkout" in message and "\n" not in message


def test_prepared_data_whose_counts_contradict_is_refused_before_it_is_printed(tmp_path):
    """The same bounds on the counts the prepared data's manifests give (the chapter prints
    them when the data is there, and ``data-summary`` would commit them)."""
    from data_fixtures import work_dir

    source = work_dir()
    work = tmp_path / "work"
    work.mkdir()
    folders = ds.work_folders(source)
    for key, folder in folders.items():
        if key != "pretrain":
            (work / folder.name).symlink_to(folder)
    pretrain = work / folders["pretrain"].name
    pretrain.mkdir()
    manifest = json.loads((folders["pretrain"] / "manifest.json").read_text(encoding="utf-8"))
    assert ds.compute_summary(source)["pretrain"]["counts"] == manifest["counts"]
    tokens = manifest["counts"]["train"]["tokens"]
    manifest["counts"]["train"]["unk"] = tokens + 1
    (pretrain / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(UserError) as err:
        ds.compute_summary(work)
    message = str(err.value)
    assert str(pretrain / "manifest.json") in message and "\n" not in message
    assert f"pretrain.counts.train.unk {tokens + 1} is more than" in message
    assert "finetune-lab prepare-pretrain --force" in message


# --- C2: the packaged checkpoint's lineage against its runs -----------------------------------


def _run_manifest(run: str) -> dict:
    return json.loads((PROJECT_ROOT / run / "manifest.json").read_text(encoding="utf-8"))


def test_the_committed_lineage_agrees_with_its_runs():
    package = checkpoints.package_manifest()
    for step in package["lineage"]:
        updates = checkpoints.lineage_step_updates(step, _run_manifest(step["run"]), package)
        assert updates == step["updates"]


@pytest.mark.parametrize(("field", "value", "want"), [
    ("tokens", 65_536_000, "records tokens 65536000 but the run's own manifest gives 6553600"),
    ("updates", 16_000, "records updates 16000 but the run's own manifest gives 1600"),
    ("updates", "1600", "records updates '1600'"),
])
def test_an_edited_lineage_step_of_the_committed_package_is_one_line(field, value, want):
    package = checkpoints.package_manifest()
    step = {**package["lineage"][0], field: value}
    with pytest.raises(UserError) as err:
        checkpoints.lineage_step_updates(step, _run_manifest(step["run"]), package)
    message = str(err.value)
    assert want in message and "data/runs/pretrain/cpu-seed1" in message
    assert str(PACKAGE) in message and "\n" not in message
    assert "git checkout -- data/checkpoints/roberta-small-fr/manifest.json" in message


def test_the_book_takes_each_steps_tokens_from_its_run_and_refuses_an_edited_copy(package):
    from finetune_lab.book import answers, standin

    package()
    table = standin.lineage_table().set_index("run")
    assert table.loc["`cpu-seed1`", "tokens (M)"] == "6.6"
    cost = answers.standin_cost()
    assert round(cost["tokens_m"], 1) == 26.6

    # C2 as the trial made it: lineage[0].tokens 6,553,600 → 65,536,000
    manifest = package(lambda d: d["lineage"][0].update(tokens=65_536_000))
    for read in (standin.lineage_table, answers.standin_cost):
        with pytest.raises(UserError) as err:
            read()
        message = str(err.value)
        assert str(manifest) in message and "cpu-seed1" in message and "\n" not in message
        assert "65536000" in message and "6553600" in message
        assert "package the checkpoint again" in message

    # the step's updates, the other figure the lineage copies of its run, alike
    package(lambda d: d["lineage"][1].update(updates=1977))
    with pytest.raises(UserError, match="cpu-docbow1 records updates 1977 .* gives 977"):
        answers.standin_cost()

    # a copy without the figures: the run's own record gives them
    package(lambda d: [s.update(tokens=None, updates=None) for s in d["lineage"]])
    assert round(answers.standin_cost()["tokens_m"], 1) == 26.6


def test_weights_packaged_on_the_way_count_the_updates_they_went_through(package):
    """The last step may stop before its run ended (a checkpoint saved on the way): fewer
    updates, the package's own num_updates, and their tokens."""
    from finetune_lab.book import answers

    def on_the_way(d):
        d["num_updates"] = 500
        d["lineage"][-1].update(updates=500, tokens=500 * 4096)
    package(on_the_way)
    assert answers.standin_cost()["tokens_m"] == pytest.approx((26_558_464 - 477 * 4096) / 1e6)

    def not_the_last(d):  # only the packaged run's own step can stop early
        d["lineage"][0].update(updates=500, tokens=500 * 4096)
    package(not_the_last)
    with pytest.raises(UserError, match="cpu-seed1 records updates 500"):
        answers.standin_cost()


def test_a_step_its_run_does_not_name_makes_the_package_damaged(package):
    """A step inserted before the package's own lineage (a run not in the cache) once kept the
    total from being claimed; since trial 29's R-15 the lineage is held to its run's own, and
    such a package is damaged, read nowhere."""
    from finetune_lab.book import answers, standin

    package(lambda d: d["lineage"].insert(0, {"run": "data/runs/pretrain/no-such-run",
                                              "tokens": 999, "updates": 1}))
    for read in (standin.lineage_records, answers.standin_cost):
        with pytest.raises(UserError, match="its lineage names"):
            read()
