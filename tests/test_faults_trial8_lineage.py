"""Fault trial 8's C2, C1 and D rows, fixed by class in the book's other readers.

C2: every reader of a copy of the runs behind some weights (the packaged checkpoint's
``lineage``; a continued pretraining run's ``extra.continued_from.lineage``; a fine-tuning run's
``extra.checkpoint_source.lineage``) takes each step's updates and tokens from the step's run's
own registry-checked manifest, and holds the copy against them: a disagreement is one line
naming the file that keeps the copy, the step, both values and the fix.

D1/D2: the pretraining budget reads ``data/summaries/data.json`` through the summary's one
checked reader; C1: the unigram entropy reads the packaged ``dict.txt`` through the book's one
checked reader of it (manifest first, fairseq's own line syntax).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from finetune_lab.book import answers, standin
from finetune_lab.book import pretrain_budget as pb
from finetune_lab.book import pretrain_candidates as pc
from finetune_lab.book import pretrain_curves as pcu
from finetune_lab.book import pretrain_plateau as pp
from finetune_lab.book import pretrain_report as pr
from finetune_lab.book.decomposition import decomposition_table
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints
from finetune_lab.runs.reading import one_reading, reads_once

PACKAGED = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr"
COMMITTED_SUMMARY = PROJECT_ROOT / "data" / "summaries" / "data.json"
ALL_RUNS_TOKENS = 26_558_464
"""The packaged weights' tokens over their 4 runs: 1600 + 977 + 2930 + 977 updates × 4096."""


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _one_line(err: pytest.ExceptionInfo, *said: str) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    for text in said:
        assert text in message, message
    return message


# --- the committed files are consistent: every output is what it was ---------------------------


@reads_once  # the store judged once for all of them, as a render's cache does
def _outputs() -> dict:
    """What the chapters print from the lineages (pretraining, fairseq, stand-in build)."""
    runs = pr.load_pretrain_runs()
    facts = pr.run_facts(runs)
    budget = pb.pretrain_budget()
    cand = pc.candidate_table(runs, facts=facts)
    records = pp.all_pretraining_runs()
    return {"facts": (facts["tokens_total"], facts["lineage"]), "budget": budget,
            "budget table": pb.budget_table(budget),
            "candidates": cand, "decomposition": decomposition_table(cand),
            "plateau": pp.plateau_table(records, facts["unigram_bits"]),
            "curves": pcu.curves(runs), "long runs": pcu.long_run_table(runs),
            "lineage table": standin.lineage_table(), "cost": answers.standin_cost()}


def test_every_reader_prints_what_the_copies_said_on_the_committed_data():
    """The committed copies equal their checked forms (the test below), so every reader prints
    what it printed from the copies; here, the figures the chapters print from them."""
    after = _outputs()
    assert after["budget"].tokens_all_runs == after["facts"][0] == ALL_RUNS_TOKENS
    assert f"{ALL_RUNS_TOKENS:,} over the 4 runs" in " ".join(
        after["budget table"]["this project's stand-in"])
    packaged = after["candidates"].iloc[0]
    assert packaged["tokens (M, all runs)"] == ALL_RUNS_TOKENS / 1e6
    assert packaged["updates (all runs)"] == 1600 + 977 + 2930 + 977


def test_every_committed_copy_agrees_with_its_runs():
    """Each copy the cache and the package keep, checked: the figures are the copy's own."""
    package = checkpoints.package_manifest()
    assert pr.checked_lineage(package["lineage"], package) == package["lineage"]
    with one_reading():  # each experiment judged once, as the book's readers do
        copies = _check_copies()
    assert copies > 20


def _check_copies() -> int:
    copies = 0
    for manifest in sorted((PROJECT_ROOT / "data" / "runs").glob("*/*/manifest.json")):
        extra = _json(manifest).get("extra") or {}
        for key in ("continued_from", "checkpoint_source"):
            lineage = (extra.get(key) or {}).get("lineage")
            if lineage:
                assert pr.copied_lineage(lineage, manifest.parent) == lineage, manifest
                copies += 1
    return copies


def test_the_committed_unigram_entropy_and_corpus_counts_are_read_as_before(tmp_path,
                                                                             monkeypatch):
    counts = [int(line.rpartition(" ")[2])  # the reader as it was
              for line in (PACKAGED / "dict.txt").read_text(encoding="utf-8").splitlines()]
    total = sum(counts)
    assert pr.unigram_bits() == -sum(c / total * math.log2(c / total) for c in counts if c)
    monkeypatch.setattr(pb, "default_corpus", lambda: tmp_path / "not-prepared")
    assert pb._corpus_record() == _json(COMMITTED_SUMMARY)["pretrain"]
    assert pb.corpus_counts() == (54_368_313, 76_493_299)


# --- C2: the packaged checkpoint's copy, in the budget and the report --------------------------


def test_an_edited_package_copy_is_refused_by_the_budget_and_the_report(package):
    package()
    assert pb.pretrain_budget().tokens_all_runs == ALL_RUNS_TOKENS
    assert pr.run_facts(pr.load_pretrain_runs())["tokens_total"] == ALL_RUNS_TOKENS

    # C2 as the trial made it: lineage[0].tokens 6,553,600 → 65,536,000
    manifest = package(lambda d: d["lineage"][0].update(tokens=65_536_000))
    reads = (pb.pretrain_budget, lambda: pr.run_facts(pr.load_pretrain_runs()),
             lambda: pc.candidate_table(pr.load_pretrain_runs()))
    for read in reads:
        with pytest.raises(UserError) as err:
            read()
        _one_line(err, str(manifest), "lineage step data/runs/pretrain/cpu-seed1 records tokens "
                  "65536000 but the run's own manifest gives 6553600",
                  "package the checkpoint again")

    package(lambda d: d["lineage"][1].update(updates=1977))
    for read in reads[:2]:
        with pytest.raises(UserError, match="cpu-docbow1 records updates 1977 .* gives 977"):
            read()


def test_a_package_copy_without_figures_or_with_a_run_not_in_the_cache(package):
    # no figures in the copy: the runs' own records give them (the total was not shown before)
    package(lambda d: [s.update(tokens=None, updates=None) for s in d["lineage"]])
    assert pb.pretrain_budget().tokens_all_runs == ALL_RUNS_TOKENS
    assert pr.run_facts(pr.load_pretrain_runs())["tokens_total"] == ALL_RUNS_TOKENS
    # a step its run's own lineage does not name is no step of it (trial 29's R-15: it made
    # the total larger); the package is damaged, whatever the step's run
    package(lambda d: d["lineage"].insert(0, {"run": "data/runs/pretrain/no-such-run",
                                              "tokens": 999, "updates": 1}))
    for read in (pb.pretrain_budget, lambda: pr.run_facts(pr.load_pretrain_runs())):
        with pytest.raises(UserError, match=r"damaged \(its lineage names \['pretrain/no-such"):
            read()


# --- C2: the copies inside the runs' own manifests ---------------------------------------------


def _edit(manifest: Path, change) -> Path:
    data = _json(manifest)
    change(data)
    manifest.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return manifest


def test_an_edited_copy_in_a_continued_runs_manifest_is_refused(cache):
    manifest = _edit(cache / "pretrain" / "cpu-seed1-c2" / "manifest.json",
                     lambda d: d["extra"]["continued_from"]["lineage"][0].update(tokens=65_536_000))
    runs = pr.load_pretrain_runs()
    assert "cpu-seed1-c2" in {r.name for r in runs.used}  # the registry does not see it
    said = (str(manifest), "its lineage step data/runs/pretrain/cpu-seed1 records tokens 65536000 "
            "but the run's own manifest gives 6553600", "restore the run's folder")
    for read in (lambda: pp.token_curves(pp.all_pretraining_runs()), lambda: pcu.curves(runs),
                 lambda: pc.candidate_table(runs)):
        with pytest.raises(UserError) as err:
            read()
        assert "package the checkpoint" not in _one_line(err, *said)


def test_an_edited_copy_in_a_long_runs_manifest_is_refused(cache):
    manifest = _edit(cache / "pretrain" / "cpu-long2" / "manifest.json",
                     lambda d: d["extra"]["continued_from"]["lineage"][1].update(updates=4000))
    runs = pr.load_pretrain_runs()
    for read in (lambda: pcu.long_run_table(runs),
                 lambda: pp.plateau_table(pp.all_pretraining_runs(), 10.0)):
        with pytest.raises(UserError) as err:
            read()
        _one_line(err, str(manifest), "cpu-long records updates 4000 but the run's own manifest "
                  "gives 3418")


def test_an_edited_copy_in_a_fine_tuning_runs_checkpoint_source_is_refused(cache):
    for manifest in (cache / "fairseq-candidate-2").glob("*/manifest.json"):
        _edit(manifest, lambda d: d["extra"]["checkpoint_source"]["lineage"][1].update(
            tokens=9_416_705))
    with pytest.raises(UserError) as err:
        pc.candidate_table(pr.load_pretrain_runs())
    _one_line(err, str(cache / "fairseq-candidate-2"), "cpu-seed1-c1 records tokens 9416705 but "
              "the run's own manifest gives 9416704 (2299 updates × 4096 tokens_per_update)")


def test_a_runs_copy_may_end_with_weights_saved_on_the_way_and_names_git_for_the_cache():
    """The copy's last step is the weights the run started from, which may have been packaged
    before their run ended: fewer updates, and their tokens. The committed cache's manifest is
    restored with git."""
    folder = PROJECT_ROOT / "data" / "runs" / "pretrain" / "cpu-seed1-c2"
    lineage = _json(folder / "manifest.json")["extra"]["continued_from"]["lineage"]
    on_the_way = [lineage[0], {**lineage[1], "updates": 2000, "tokens": 2000 * 4096}]
    assert pr.copied_lineage(on_the_way, folder) == on_the_way
    for bad in ([lineage[0], {**lineage[1], "tokens": 2000 * 4096}],  # tokens of 2000 updates
                [lineage[0], {**lineage[1], "updates": 2400}],  # more than the run made
                [{**lineage[0], "updates": 1500, "tokens": 1500 * 4096}, lineage[1]]):
        with pytest.raises(UserError) as err:
            pr.copied_lineage(bad, folder)
        _one_line(err, str(folder / "manifest.json"),
                  "git checkout -- data/runs/pretrain/cpu-seed1-c2/manifest.json")


# --- D1/D2: the corpus record, through the summary's checked reader ---------------------------


def test_a_summary_whose_counts_contradict_is_refused_by_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(pb, "default_corpus", lambda: tmp_path / "not-prepared")
    edited = tmp_path / "data.json"
    for section, change in (
            ("pretrain", lambda d: d["pretrain"]["counts"]["train"].update(tokens=30_000_000)),
            ("cls", lambda d: d["cls"]["tokenization"]["valid"].update(unk=50_000))):
        data = _json(COMMITTED_SUMMARY)
        change(data)
        edited.write_text(json.dumps(data), encoding="utf-8")
        monkeypatch.setattr(pb, "summary_path", lambda: edited)
        for read in (pb.corpus_counts, pb.corpus_description, lambda: pb.budget_table(None)):
            with pytest.raises(UserError) as err:
                read()
            _one_line(err, str(edited), f"{section}.", "git checkout -- data/summaries/data.json")


# --- C1: the unigram entropy, through the checked dict.txt reader ------------------------------


def test_an_edited_packaged_dictionary_is_one_line_for_the_unigram_entropy(tmp_path, monkeypatch):
    folder = tmp_path / "roberta-small-fr"
    folder.mkdir()
    for name in ("dict.txt", "manifest.json"):
        shutil.copy2(PACKAGED / name, folder / name)
    assert pr.unigram_bits(folder / "dict.txt") == pr.unigram_bits()
    with (folder / "dict.txt").open("a", encoding="utf-8") as handle:
        handle.write("\u2581zzpiece 12 #fairseq:overwrite\n")  # C1 as the trial made it
    monkeypatch.setattr(pr, "packaged_dir", lambda: folder)
    for read in (lambda: pr.unigram_bits(folder / "dict.txt"), pr.unigram_bits):
        with pytest.raises(UserError) as err:
            read()
        _one_line(err, str(folder / "dict.txt"), "is not the file its manifest lists")


def test_a_dictionary_in_fairseqs_own_syntax_is_read_as_fairseq_reads_it(tmp_path):
    (tmp_path / "dict.txt").write_text("a 2\nb 1\na 1 #fairseq:overwrite\n", encoding="utf-8")
    assert pr.unigram_bits(tmp_path / "dict.txt") == 1.5  # three rows: 2, 1, 1
    (tmp_path / "dict.txt").write_text("a 2\nb one\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        pr.unigram_bits(tmp_path / "dict.txt")
    _one_line(err, f"{tmp_path / 'dict.txt'}: line 2 ")
