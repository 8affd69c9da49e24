"""The front page's headline table: the accuracies themselves, the course's figures beside them,
and every difference signed and named by its direction, computed live from the same functions
the chapters call, each row linking to the section that holds the evidence."""

from __future__ import annotations

import pandas as pd

from finetune_lab.book import answers
from finetune_lab.book.course_reference import COURSE_TEST_ACCURACY, course_gap_cell
from finetune_lab.book.lora_cls_report import trainable_share
from finetune_lab.book.lora_cls_runs import cached_runs as lora_cached_runs
from finetune_lab.book.report import fmt_int

PROJECT = "this project"
COURSE = "course writeups (external reference)"
NOT_RUN = "not run yet"
HEADLINE_METHODS = ("lora-qv", "qlora-qv")
"""The lab's LoRA and QLoRA settings on RoBERTa; the LoRA chapter has every method."""


def _link(text: str, target: str) -> str:
    return f"[{text}](chapters/{target})"


def _row(result: str, project: str, course: str, where: str) -> dict[str, str]:
    return {"result": result, PROJECT: project, COURSE: course, "evidence": where}


def glance_table() -> pd.DataFrame:
    """Q1's count (the lab's convention, then the two other totals labelled as what they are);
    test accuracy of fairseq pretrained and random and their difference; Transformers and
    Transformers − fairseq; LoRA's and QLoRA's accuracy, LoRA − full, and the trainable share. A result
    the run cache cannot give yet says so instead."""
    q1 = answers.q1_counts()
    arch = _link("Architecture", "architecture.qmd")
    rows = [
        _row("Q1: parameters, the lab's convention (weight matrices of embeddings, positions "
             "and layers)", fmt_int(q1["lab"]), "", arch),
        _row("Q1, another convention: the whole encoder, with biases and LayerNorms",
             fmt_int(q1["encoder"]), "", arch),
        _row("Q1, an error some writeups make: positions and feed-forward left out",
             fmt_int(q1["omission"]), "", arch),
    ]
    fs = answers.fairseq_accuracies()
    where = _link("fairseq", "fairseq.qmd")
    if fs is None:
        rows.append(_row("fairseq: pretrained − random initialisation", NOT_RUN, "", where))
    else:
        pre, rnd, gap = fs
        rows += [
            _row("fairseq, pretrained stand-in: test accuracy", pre.text(),
                 COURSE_TEST_ACCURACY["pretrained"].text(), where),
            _row("fairseq, random initialisation: test accuracy", rnd.text(),
                 COURSE_TEST_ACCURACY["random"].text(), where),
            _row("fairseq: pretrained − random", gap.text(), course_gap_cell(), where),
        ]
    hf = answers.transformers_result()
    where = _link("Transformers", "transformers.qmd")
    if hf is None:
        rows.append(_row("Transformers − fairseq (pretrained)", NOT_RUN, "", where))
    else:
        acc, gap = hf
        rows += [_row("Transformers, pretrained stand-in: test accuracy", acc.text(), "", where),
                 _row("Transformers − fairseq (pretrained, same recipe)", gap.text(), "", where)]
    where = _link("LoRA", "lora.qmd#sec-lora-cls")
    loaded = lora_cached_runs()
    gaps = answers.lora_results()
    if gaps.empty or loaded is None:
        stale = loaded is not None and any(r.stale_checkpoint for r in loaded.excluded)
        rows.append(_row("LoRA − full fine-tuning (RoBERTa-small-fr)",
                         "to be re-run: its runs were made from an earlier checkpoint"
                         if stale else NOT_RUN, "", where))
        return pd.DataFrame(rows)
    for _, g in gaps[gaps["method"].isin(HEADLINE_METHODS)].iterrows():
        m = g["method"]
        acc = answers.Accuracy(g["test mean"], g["test std"], int(g["n"]))
        gap = answers.Gap(g["test gap (points)"], g["ci_low"], g["ci_high"])
        rows += [_row(f"`{m}` on RoBERTa-small-fr: test accuracy", acc.text(), "", where),
                 _row(f"`{m}` − full fine-tuning (Task 5's Transformers runs; each at its "
                      f"own learning rate)", gap.text(), "", where)]
    rows.append(_row("LoRA (`lora-qv`): trainable share of all parameters, the new "
                     "classification head included",
                     f"{100 * trainable_share('lora-qv'):.2f} %", "", where))
    return pd.DataFrame(rows)
