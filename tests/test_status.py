"""The book's first-page status table reflects the run cache, not a hand-written claim."""

from __future__ import annotations

import json

from finetune_lab.book.status import lab_status


def test_empty_cache_says_not_run(tmp_path):
    df = lab_status(runs_root=tmp_path / "runs").set_index("lab part")
    assert df.loc["Tasks 3-4", "runs"] == "not run yet"
    assert df.loc["Question 1 / Task 1", "runs"] == "no training run needed"
    assert df.loc["Question 1 / Task 1", "chapter"] == "@sec-architecture"


def test_broken_run_is_counted_as_excluded(tmp_path):
    run = tmp_path / "runs" / "fairseq" / "random-seed0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"status": "running"}))
    df = lab_status(runs_root=tmp_path / "runs").set_index("lab part")
    assert df.loc["Tasks 3-4", "runs"] == "0 valid runs, 1 excluded"


def test_unwritten_chapter_is_said(tmp_path):
    df = lab_status(root=tmp_path, runs_root=tmp_path / "runs")
    assert set(df["chapter"]) == {"not written yet"}


def test_results_at_a_glance_without_runs_say_so(tmp_path, monkeypatch):
    """On an empty run cache the front page still renders: Q1's counts (computed, not run) and
    "not run yet" for every fine-tuning result."""
    from finetune_lab.models import params
    from finetune_lab.book.glance import glance_table

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path))
    table = glance_table()
    q1 = table[table["question"].str.startswith("Q1")]
    assert set(q1["result"]) == {f"{n:,}" for n in params.WRITEUP_ANSWERS}
    rest = table[~table["question"].str.startswith("Q1")]
    assert list(rest["result"]) == ["not run yet"] * 3
    assert rest["chapter"].str.contains(r"\(chapters/\w+\.qmd\)").all()


def test_results_at_a_glance_round_each_gap_alike():
    """The committed run cache's Transformers-vs-fairseq row gives the difference and its
    interval with one decimal each, as the fairseq row does (it once mixed 1 and 2)."""
    import re

    from finetune_lab.book import hf_compare
    from finetune_lab.book.glance import glance_table

    rows = glance_table().set_index("question")["result"]
    gap = hf_compare.framework_gaps(hf_compare.load_comparison()).set_index("init")
    g = gap.loc["pretrained"]
    assert rows["Transformers vs fairseq, same recipe (pretrained)"] == (
        f"{g['difference']:+.1f} points (95 % CI {g['ci_low']:+.1f} to {g['ci_high']:+.1f}), "
        + ("within" if g["within seed noise"] else "beyond") + " seed noise")
    fairseq = next(r for q, r in rows.items() if q.startswith("fairseq:"))
    assert re.search(r"points \(95 % CI [+-]\d+\.\d to [+-]\d+\.\d\)$", fairseq)


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
    row = glance.glance_table().set_index("question").loc["LoRA vs full fine-tuning"]
    assert row["result"].startswith("to be re-run")
