"""The stand-in chapter's facts and the appendix's decomposition, on the committed run cache."""

from __future__ import annotations

import pandas as pd

from finetune_lab.book import decomposition as dc
from finetune_lab.book import standin


def test_the_lineage_table_says_which_runs_read_the_task_texts():
    table = standin.lineage_table().set_index("run")
    assert list(table.index) == ["`cpu-seed1`", "`cpu-docbow1`", "`cpu-sinpos1`",
                                 "`cpu-sinpos1-bow`"]
    assert table.loc["`cpu-seed1`", "starts from"] == "random weights"
    assert "sinusoids" in table.loc["`cpu-sinpos1`", "starts from"]
    assert standin.task_adaptive_steps() == ["cpu-docbow1", "cpu-sinpos1-bow"]
    assert table.loc["`cpu-sinpos1`", "texts"] == "novels + dvd/music reviews"
    # the tokens add up to what the package's lineage records (26.6 M)
    assert round(sum(float(t) for t in table["tokens (M)"]), 1) == 26.6


def _cand(rows):
    base = {"weights": "candidate (not packaged)", "task-adaptive": "no", "bag weight": 0.0,
            "fine-tuned on": "CPU", "acc mean": 70.0, "acc std": 1.0, "minus random (points)": 1.0, "ci_low": -1.0,
            "ci_high": 3.0}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_a_step_takes_the_weights_with_most_seeds_within_the_packaged_budget():
    cand = _cand([
        {"weights": "packaged checkpoint", "run": "`pretrain/p`", "tokens (M, all runs)": 20.0,
         "n fine-tuned": 3, "task-adaptive": "yes: saw them", "bag weight": 8.0},
        {"run": "`pretrain/a`", "tokens (M, all runs)": 10.0, "n fine-tuned": 2},
        {"run": "`pretrain/b`", "tokens (M, all runs)": 12.0, "n fine-tuned": 3},
        {"run": "`pretrain/c`", "tokens (M, all runs)": 50.0, "n fine-tuned": 4},  # over budget
    ])
    table = dc.decomposition_table(cand)
    assert list(table["weights"]) == ["`b`", "not run", "`p`"]
    assert table["− random (points, CI)"].iloc[0] == "+1.0 (−1.0 to +3.0)"  # signed, as elsewhere
    assert table["n"].tolist() == [3, 0, 3]


def test_the_committed_cache_answers_every_step_and_says_where_each_was_fine_tuned():
    from finetune_lab.book import pretrain_candidates as pc
    from finetune_lab.book import pretrain_report as pr

    runs = pr.load_pretrain_runs()
    table = dc.decomposition_table(pc.candidate_table(runs)).set_index("pretraining")
    general, packaged = table.iloc[0], table.iloc[-1]
    assert general["weights"] == "`cpu-seed1-c1`" and general["n"] == 3
    assert packaged["weights"] == "`cpu-sinpos1-bow`" and packaged["n"] == 3
    assert packaged["− random (points, CI)"].startswith("+9.1")
    # the clean lineage's `<s>` step: weights that never read a CLS-Books text, tuned on a GPU
    dapt = table.iloc[1]
    assert dapt["weights"] == "`cpu-clean-bow1`" and dapt["n"] == 3
    assert dapt["fine-tuned on"] == "GPU" and packaged["fine-tuned on"] == "CPU"


def test_weights_pretrained_in_a_gpu_call_and_fine_tuned_there_are_candidates():
    """pretrain-gpu/gpu4 and its five fine-tunings (fairseq-candidate-12) were in no table: the
    candidate table read the CPU experiment's pretraining runs only."""
    from finetune_lab.book import pretrain_candidates as pc
    from finetune_lab.book import pretrain_report as pr

    cand = pc.candidate_table(pr.load_pretrain_runs()).set_index("run")
    gpu = cand.loc["`pretrain-gpu/gpu4`"]
    assert gpu["n fine-tuned"] == 5 and gpu["fine-tuned on"] == "GPU"
    assert round(gpu["tokens (M, all runs)"], 1) == 105.1  # 1,604 updates of 65,536 tokens
    assert round(gpu["acc mean"], 1) == 73.6 and gpu["ci_low"] > 0  # beats random
    assert gpu["task-adaptive"] == "no" and gpu["valid loss, novels (bits)"] > 8  # on the plateau
    # never fine-tuned: the plateau table lists it, the candidate table does not
    assert "`pretrain-gpu/gpu`" not in cand.index
