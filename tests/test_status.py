"""The book's first-page status table reflects the run cache, not a hand-written claim."""

from __future__ import annotations

import json

from finetune_lab.book.report import signed
from finetune_lab.book.status import lab_status


def test_empty_cache_says_not_run(tmp_path):
    df = lab_status(runs_root=tmp_path / "runs").set_index("lab part")
    assert df.loc["Tasks 3-4", "runs"] == "not run yet"
    assert df.loc["Question 1 / Task 1", "runs"] == "no training run needed"
    assert df.loc["Question 1 / Task 1", "chapter"] == "@sec-architecture"


def test_a_run_that_does_not_count_is_named_by_what_it_is(tmp_path):
    run = tmp_path / "runs" / "fairseq" / "random-seed0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"status": "running"}))
    df = lab_status(runs_root=tmp_path / "runs").set_index("lab part")
    assert df.loc["Tasks 3-4", "runs"] == "0 valid runs; 1 rejected"


def test_the_stand_in_row_names_its_unfinished_runs_by_status():
    """The committed cache holds paused and failed pretraining runs: they are said to be
    paused and failed, not "excluded", and every recorded run is counted once."""
    import re

    from finetune_lab.config import paths
    from finetune_lab.runs.registry import discover_runs

    mine = [r for r in discover_runs(paths().runs)
            if r.experiment in ("pretrain", "pretrain-gpu")]
    row = lab_status().set_index("lab part").loc["(stand-in)", "runs"]
    valid, rest = re.fullmatch(r"(\d+) valid runs: .*?(?:; (.*))?", row).groups()
    said = {s: int(n) for n, s in (part.split(" ", 1) for part in (rest or "").split(", ") if part)}
    assert int(valid) == sum(r.valid for r in mine) and "excluded" not in row
    assert said == {s: sum(r.status == s for r in mine if not r.valid)
                    for s in {r.status for r in mine if not r.valid}}


def test_unwritten_chapter_is_said(tmp_path):
    df = lab_status(root=tmp_path, runs_root=tmp_path / "runs")
    assert set(df["chapter"]) == {"not written yet"}


def test_results_at_a_glance_without_runs_say_so(tmp_path, monkeypatch):
    """On an empty run cache the front page still renders: Q1's counts (computed, not run) and
    "not run yet" for every fine-tuning result."""
    from finetune_lab.models import params
    from finetune_lab.book.glance import COURSE, PROJECT, glance_table

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path))
    table = glance_table()
    q1 = table[table["result"].str.startswith("Q1")]
    assert set(q1[PROJECT]) == {f"{n:,}" for n in params.WRITEUP_ANSWERS}
    assert q1["result"].iloc[0].startswith("Q1: parameters, the lab's convention")
    rest = table[~table["result"].str.startswith("Q1")]
    assert list(rest[PROJECT]) == ["not run yet"] * 3
    assert set(rest[COURSE]) == {""}
    assert rest["evidence"].str.contains(r"\(chapters/\w+\.qmd").all()


def test_results_at_a_glance_give_accuracies_and_signed_named_gaps():
    """The committed run cache's rows: the accuracies themselves beside the course's figures,
    and each difference signed, named by its direction, with one decimal like its interval."""
    import re

    from finetune_lab.book import hf_compare
    from finetune_lab.book.course_reference import COURSE_TEST_ACCURACY
    from finetune_lab.book.glance import COURSE, PROJECT, glance_table

    rows = glance_table().set_index("result")
    gap = hf_compare.framework_gaps(hf_compare.load_comparison()).set_index("init")
    g = gap.loc["pretrained"]
    assert rows.loc["Transformers − fairseq (pretrained, same recipe)", PROJECT] == (
        f"{signed(g['difference'])}\u00a0points (95\u00a0% CI {signed(g['ci_low'])} to "
        f"{signed(g['ci_high'])})")
    pre = rows.loc["fairseq, pretrained stand-in: test accuracy"]
    assert re.fullmatch(r"\d+\.\d\s±\s\d+\.\d\s%\s\(n\s=\s\d+\)", pre[PROJECT])
    assert pre[COURSE] == COURSE_TEST_ACCURACY["pretrained"].text()
    assert re.search(r"^[+−]?\d+\.\d\spoints \(95\s% CI [+−]?\d+\.\d to [+−]?\d+\.\d\)$",
                     rows.loc["fairseq: pretrained − random", PROJECT])
    lora = [r for r in rows.index if "− full fine-tuning" in r]
    assert lora and all(re.fullmatch(r"[+−]?\d+\.\d\spoints \(95\s% CI [+−]?\d+\.\d to "
                                     r"[+−]?\d+\.\d\)", rows.loc[r, PROJECT]) for r in lora)


def test_results_at_a_glance_name_runs_left_behind_by_a_new_checkpoint(tmp_path, monkeypatch):
    """LoRA runs made from an earlier checkpoint are not "not run yet": they wait for a re-run
    (and, all excluded, they leave the LoRA-against-full gaps empty instead of failing)."""
    from pathlib import Path

    import pandas as pd

    from finetune_lab.book import glance
    from finetune_lab.runs.registry import RunRecord
    from finetune_lab.runs.tblogs import LoadedRuns

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path))
    stale = RunRecord(path=Path("lora-qv-seed0"), experiment="lora", name="lora-qv-seed0",
                      problems=["the checkpoint was replaced"], stale_checkpoint="0" * 64)
    monkeypatch.setattr(glance, "lora_cached_runs",
                        lambda: LoadedRuns(scalars=pd.DataFrame(), runs=[stale]))
    row = glance.glance_table().set_index("result").loc[
        "LoRA − full fine-tuning (RoBERTa-small-fr)"]
    assert row[glance.PROJECT].startswith("to be re-run")


def test_task_7_is_said_not_run_with_its_reason(tmp_path):
    """Task 7 (the BLOOM-560m QLoRA) has a row of its own that says why it has no run, apart
    from the RoBERTa LoRA runs that stand beside it."""
    df = lab_status(runs_root=tmp_path / "runs").set_index("lab part")
    assert df.loc["Task 7", "runs"].startswith("not run: BLOOM-560m's weights")
    assert df.loc["(beside Task 7)", "runs"] == "not run yet"
