"""The fifth fault trial and the minor defects left from the fourth, fixed by class: a committed
record whose facts disagree with each other is refused in one line naming it, before a chapter
computes from it."""

from __future__ import annotations

import json
import shutil

import pytest
from test_faults_registry import lora_chapter

from finetune_lab.book.data_summary import load_summary
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.data import cls_splits
from finetune_lab.errors import UserError
from finetune_lab.runs.registry import discover_runs

COMMITTED = PROJECT_ROOT / "data" / "summaries" / "data.json"


def test_the_committed_data_summary_agrees_with_itself():
    record = cls_splits.read_summary(COMMITTED)
    assert cls_splits.summary_contradiction(record) is None
    assert cls_splits.split_sizes(COMMITTED) == {"train": 1800, "valid": 200, "test": 2000}


def _set(record: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for key in parents:
        record = record[int(key)] if isinstance(record, list) else record[key]
    if isinstance(record, list):
        record[int(last)] = value
    else:
        record[last] = value


@pytest.mark.parametrize(("field", "value", "said"), [
    # f22 of trial 4: a tenth of the tokens moved the GPU's MFU from 0.44 % to 0.14 %
    ("cls.tokenization.train.tokens", 26186, "tokens over 1800 reviews"),
    ("cls.tokenization.test.reviews", 1999, "cls.tokenization's reviews"),
    ("cls.splits.0.reviews", 1700, "by positive + negative"),
    ("lengths.histogram.valid.3", 0, "histogram"),
    ("lengths.stats.test.mean", 150.0, "mean length"),
    ("lengths.stats.train.truncated", 1801, "truncated"),
    ("cls.tokenization", [], "lacks the splits' counts"),
])
def test_a_data_summary_that_contradicts_itself_is_one_line(tmp_path, field, value, said):
    record = json.loads(COMMITTED.read_text(encoding="utf-8"))
    _set(record, field, value)
    edited = tmp_path / "data.json"
    edited.write_text(json.dumps(record), encoding="utf-8")
    for read in (cls_splits.read_summary, cls_splits.split_sizes,
                 lambda p: load_summary(work=tmp_path / "none", committed=p)):
        with pytest.raises(UserError) as err:
            read(edited)
        message = str(err.value)
        assert said in message and str(edited) in message and "git checkout" in message
        assert "\n" not in message


def test_an_untouched_copy_reads_the_same(tmp_path):
    shutil.copy(COMMITTED, tmp_path / "data.json")
    assert cls_splits.read_summary(tmp_path / "data.json") == json.loads(COMMITTED.read_text())


# --- trial 4, f04: one recorded fact edited in every seed of a method --------------------------

@pytest.mark.parametrize(("key", "lr"), [("lora/lora-qv", 0.001), ("fairseq/pretrained", 2e-5),
                                         ("transformers/pretrained", 1.1e-5)])
def test_a_learning_rate_edited_in_every_seed_is_held_against_the_logged_one(
        cache, tmp_path, key, lr):
    """The three seeds agreed with each other, so nothing but the event files records the rate:
    the LoRA table's "peak lr" showed 0.001. Each run's logged schedule now gives its peak."""
    experiment, prefix = key.split("/")
    before = lora_chapter(cache)
    edited = sorted((cache / experiment).glob(f"{prefix}-seed*/manifest.json"))
    assert len(edited) >= 3
    for path in edited:
        man = json.loads(path.read_text())
        path.write_text(json.dumps({**man, "hyperparameters": {**man["hyperparameters"],
                                                               "lr": lr}}))
    records = {r.key: r for r in discover_runs(cache)}
    for path in edited:
        rec = records[f"{experiment}/{path.parent.name}"]
        assert not rec.valid and "disagrees with its event files" in rec.reason, rec.reason
    others = [r for k, r in records.items() if not k.startswith(key)]
    assert all(r.valid or r.unfinished for r in others)
    if experiment == "lora":
        after = lora_chapter(cache)
        assert after != before and "lora/lora-qv-seed" not in after["used"]


# --- trial 5: a manifest field against what else records it ----------------------------------

PACKAGED_SHA = "c69384227de10b2759af62f52a080125618eba0a18ca0ce84e426718b03ae785"


def _edit_manifest(run, how) -> None:
    path = run / "manifest.json"
    man = json.loads(path.read_text())
    how(man)
    path.write_text(json.dumps(man))


def _total_updates(man):
    man["hyperparameters"]["total_updates"] = 1126


def _packaged_sha(man):
    man["inputs"]["checkpoint"]["sha256"] = {".": PACKAGED_SHA}


def _h100(man):
    man["device"] = {**man["device"], "name": "NVIDIA H100 80GB HBM3",
                     "names": ["NVIDIA H100 80GB HBM3"]}


EDITS = {
    # S1: the stand-in's tables showed 1500 updates and 6.1 M tokens
    "pretrain/cpu-sinpos1-bow": (lambda m: m.update(updates_done=1500),
                                 "updates_done 1500 but its event files end at update 977"),
    # S2: the recipe table showed lr 0.001 while the command said --lr 0.0005
    "pretrain/cpu-tapt1": (lambda m: m["hyperparameters"].update(lr=0.001),
                           "hyperparameters.lr 0.001 contradicts its command line (--lr 0.0005)"),
    # S4: both seeds' schedule edited alike; the layout table lost a row
    "fairseq-candidate-2/pretrained-seed0": (_total_updates, "(--total-num-update 1125)"),
    "fairseq-candidate-2/pretrained-seed1": (_total_updates, "(--total-num-update 1125)"),
    # S13: "AMD EPYC (64 cores)" while the one launch said 2
    "pretrain/cpu-docbow1": (lambda m: m["device"].update(cpu_count=64),
                             "none of its launches' devices"),
    # S14: a candidate tried in November 22nd named the packaged weights of November 25th
    "fairseq-candidate-3/pretrained-seed0": (_packaged_sha, "after this run started"),
    "fairseq-candidate-3/pretrained-seed1": (_packaged_sha, "after this run started"),
}


def test_fields_that_contradict_their_command_launches_or_lineage_reject_the_run(cache):
    for key, (how, _) in EDITS.items():
        _edit_manifest(cache / key, how)
    records = {r.key: r for r in discover_runs(cache)}
    for key, (_, says) in EDITS.items():
        assert not records[key].valid and says in records[key].reason, records[key].reason
    others = [r for k, r in records.items() if k not in EDITS]
    assert others and all(r.valid or r.unfinished for r in others)


def test_a_gpu_run_names_the_gpu_of_the_call_it_ran_in(cache):
    """S6: every LoRA GPU run said H100 while the call's record said H200; the chapter said
    H100. The runs of the pretraining GPU call of November 22nd, which no record covers, stay."""
    edited = sorted((cache / "lora-gpu").glob("*/manifest.json"))
    for path in edited:
        _edit_manifest(path.parent, _h100)
    records = {r.key: r for r in discover_runs(cache)}
    for path in edited:
        rec = records[f"lora-gpu/{path.parent.name}"]
        # the GPU its own peak memory names says so first (22b's M-e3), else the call's record
        assert not rec.valid and ("ran on the NVIDIA H200" in rec.reason or
                                  "extra.peak_memory.gpu 'NVIDIA H200' is not its device"
                                  in rec.reason), rec.reason
    assert records["pretrain-gpu/gpu"].valid  # an H100, before any record


def test_a_call_record_whose_parts_outlast_it_is_set_aside():
    """S7: wall_s 249.6 → 24.96 made the chapter say the call took 0.4 min."""
    from finetune_lab.runs.gpu_archive import call_record_problem

    record = PROJECT_ROOT / "data" / "summaries" / "gpu-lab" / "20261126T041935Z.json"
    meta = json.loads(record.read_text())
    assert call_record_problem(meta) is None
    meta["wall_s"] = 24.96
    assert "its timings_s.runs took 209.7 s" in call_record_problem(meta)


def _copy_probes(tmp_path):
    folder = tmp_path / "probes"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "probes", folder)
    return folder


def test_a_probe_of_weights_made_after_it_is_set_aside(tmp_path):
    """S8: cpu-long's probe given the packaged weights' sha moved the probe table's
    fine-tuned value from 72.50 (n=2) to 78.13 (n=3)."""
    from finetune_lab.book.probe_report import probe_table

    folder = _copy_probes(tmp_path)
    before = probe_table(folder)
    record = json.loads((folder / "cpu-long.json").read_text())
    record["checkpoint"]["sha256"] = PACKAGED_SHA
    (folder / "cpu-long.json").write_text(json.dumps(record))
    bad: list[str] = []
    after = probe_table(folder, set_aside=bad)
    assert len(after) == len(before) - 1 and len(bad) == 1
    # set aside by the first check it fails: the weights another run packaged (trial 16's W3-v),
    # before the time check that once caught it
    assert bad[0].startswith("`cpu-long.json` is named after the pretraining run cpu-long, but "
                             "holds other weights") and "packaged by cpu-sinpos1-bow" in bad[0]
    # the same record under the packaged run's own name: its time is older than those weights
    (folder / "cpu-long.json").unlink()
    record["name"] = "cpu-sinpos1-bow"
    record["checkpoint"]["path"] = "data/checkpoints/roberta-small-fr/model.pt"
    (folder / "cpu-sinpos1-bow.json").write_text(json.dumps(record))
    bad = []
    after = probe_table(folder, set_aside=bad)
    assert len(bad) == 1 and bad[0].startswith("`cpu-sinpos1-bow.json` started at") \
        and "was edited" in bad[0]


@pytest.mark.parametrize("how", ["another sentence", "a rank twice", "rising probability",
                                 "probabilities above one"])
def test_a_fill_mask_record_that_is_no_answer_to_the_books_sentences_is_set_aside(tmp_path, how):
    """S15: a sentence the book never asked, and two rank-1 answers, were shown as recorded."""
    from finetune_lab.book.fill_mask import recorded_fill_masks

    folder = tmp_path / "fill-mask"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "fill-mask", folder)
    path = folder / "cpu-sinpos1.json"
    record = json.loads(path.read_text())
    first, second = record["predictions"][0], record["predictions"][1]
    if how == "another sentence":
        for row in record["predictions"]:
            if row["sentence"] == first["sentence"]:
                row["sentence"] = row["sentence"].replace("livre", "film")
    elif how == "a rank twice":
        second["rank"] = first["rank"]
    elif how == "probabilities above one":  # trial 6, S9: ranks in order, a sum of 1.3
        first["probability"], second["probability"] = 0.7, 0.6
    else:
        second["probability"] = first["probability"] + 0.1
    path.write_text(json.dumps(record))
    bad: list[str] = []
    kept = recorded_fill_masks(folder, set_aside=bad)
    assert "cpu-sinpos1" not in kept and "cpu-sinpos1-bow" in kept
    assert len(bad) == 1 and bad[0].startswith("`cpu-sinpos1.json` does not"), bad


# --- trial 5: what a chapter depends on without declaring it ---------------------------------


def test_a_module_brings_the_data_it_reads_into_its_chapters_inputs():
    """S12: a duplicated test review changed the data chapter's duplicate counts while
    check-freeze called it current (it declared only the prepared data's manifests)."""
    from finetune_lab.book.chapter_inputs import chapter_inputs

    data = chapter_inputs(PROJECT_ROOT, "chapters/data.qmd")
    assert "data/work/cls.books/*" in data and "data/work/cls-books-bin/**" in data
    for chapter in ("chapters/lora.qmd", "chapters/transformers.qmd", "index.qmd"):
        inputs = chapter_inputs(PROJECT_ROOT, chapter)
        assert "data/summaries/gpu-lab/*" in inputs and "data/runs/pretrain/*/manifest.json" \
            in inputs, chapter
    # a chapter that does not import the module does not get its data (every chapter with
    # code now ends with its provenance, so every one reads the registry's)
    assert "data/work/pretrain-bin/manifest.json" in data
    for chapter in ("chapters/architecture.qmd", "chapters/fairseq.qmd", "index.qmd"):
        assert "data/work/pretrain-bin/manifest.json" not in chapter_inputs(PROJECT_ROOT,
                                                                            chapter), chapter


def test_tables_drawn_by_tabulate_make_it_a_package_of_every_chapter_with_pandas():
    """M2: a changed tabulate left the data chapter current; pandas loads it on demand."""
    from finetune_lab.book.chapter_inputs import chapter_inputs
    from finetune_lab.book.freeze_env import chapter_packages

    chapter = "chapters/data.qmd"
    packages = chapter_packages(PROJECT_ROOT, chapter, chapter_inputs(PROJECT_ROOT, chapter))
    assert "package tabulate" in packages and "package pandas" in packages


# --- trial 5: damaged files of other shapes, each one line -----------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_json_nested_too_deep_is_a_damaged_file_not_a_recursion_error(tmp_path):
    """T13-T16: a freeze record, a call record, a checkpoint manifest and a probe record
    nested 100,000 deep each ended in a RecursionError traceback."""
    from finetune_lab._files import DamagedFileError, read_json
    from finetune_lab.book.freeze import read_record
    from finetune_lab.book.summary_files import read_json_files
    from finetune_lab.models import trust
    from finetune_lab.runs.gpu_archive import read_result

    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(DamagedFileError, match="nested too deeply"):
        read_json(path)
    with pytest.raises(UserError, match="nested too deeply") as raised:
        read_result(path)
    assert "\n" not in str(raised.value)
    assert read_record(path) is None
    good, bad = read_json_files(tmp_path, lambda r: None)
    assert good == [] and "nested too deeply" in bad[0]
    assert trust.manifest_hashes([path]) == set()


def test_a_chapter_that_is_not_utf8_or_whose_front_matter_is_broken_is_one_line(tmp_path,
                                                                              capsys):
    """T17: a chapter starting with the bytes FF FE gave a UnicodeDecodeError traceback; T18:
    an unclosed list in the front matter gave PyYAML's 8-line message."""
    from finetune_lab.book.qmd import FrontMatterError, front_matter

    chapter = tmp_path / "c.qmd"
    chapter.write_bytes(b"\xff\xfe---\ninputs: []\n---\n")
    with pytest.raises(FrontMatterError, match="is not UTF-8 text") as raised:
        front_matter(chapter)
    chapter.write_text("---\ninputs: [unclosed\n---\n# x\n")
    with pytest.raises(FrontMatterError, match="not valid YAML") as yaml_error:
        front_matter(chapter)
    for err in (raised, yaml_error):
        assert "\n" not in str(err.value) and str(chapter) in str(err.value)


def test_a_manifest_that_is_no_regular_file_is_said_so(tmp_path):
    """M4: a manifest.json that is a FIFO was reported as missing."""
    import os

    from finetune_lab.runs import manifest as mf

    run = tmp_path / "exp" / "run"
    run.mkdir(parents=True)
    os.mkfifo(run / "manifest.json")
    with pytest.raises(mf.ManifestError, match="manifest.json is not a regular file"):
        mf.read_manifest(run)
