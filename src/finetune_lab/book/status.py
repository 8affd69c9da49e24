"""What the report covers and what has actually been run: the table on the book's first page."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.runs.gpu_plan import GPU_SUFFIX
from finetune_lab.runs.registry import RunRecord, discover_runs
from finetune_lab.runs.runspeed import device_name


@dataclass(frozen=True)
class LabTask:
    """One part of the lab, the chapter that answers it, and the run experiments it needs."""

    part: str
    question: str
    chapter: str
    section: str
    experiments: tuple[str, ...] = ()
    unrun: str = ""
    """Why the part has no run in this book, said when the run cache holds none."""


LAB_TASKS: tuple[LabTask, ...] = (
    LabTask("Question 1 / Task 1", "Count the parameters of RoBERTa-small-fr by hand and check",
            "chapters/architecture.qmd", "sec-architecture"),
    LabTask("Task 2", "Prepare CLS-Books: sentencepiece, fairseq-preprocess",
            "chapters/data.qmd", "sec-data"),
    LabTask("(stand-in)", "Pretrain the French RoBERTa-small the course does not publish",
            "chapters/pretraining.qmd", "sec-pretraining", ("pretrain",)),
    LabTask("Tasks 3-4", "Fine-tune with fairseq: 3 seeds, pretrained vs random",
            "chapters/fairseq.qmd", "sec-fairseq", ("fairseq",)),
    LabTask("Task 5", "Fine-tune with HuggingFace Transformers, same hyperparameters",
            "chapters/transformers.qmd", "sec-transformers", ("transformers",)),
    LabTask("Tasks 6 and 8, Question 2", "LoRA and 4-bit QLoRA of BLOOM-560m: configs, counts, memory",
            "chapters/lora.qmd", "sec-lora",
            unrun="computed from BLOOM-560m's configuration: no run needed"),
    LabTask("Task 7", "Fine-tune BLOOM-560m with QLoRA on the e-commerce FAQ",
            "chapters/lora.qmd", "sec-lora-qa", ("lora-qa",),
            unrun="not run: BLOOM-560m's weights were not available to this project (@nte-bloom)"),
    LabTask("(beside Task 7)", "LoRA and QLoRA against full fine-tuning of RoBERTa-small-fr on "
            "CLS-Books", "chapters/lora.qmd", "sec-lora-cls", ("lora",)),
)


def by_device(valid: list[RunRecord]) -> str:
    """``6 valid runs: 6 on the CPU, 6 on 1× NVIDIA H200``: which results were made where (a
    device call's runs sit in their own ``-gpu`` experiments, beside the CPU runs)."""
    n = len(valid)
    text = f"{n} valid run{'s' if n != 1 else ''}"
    counts: dict[str, int] = {}
    for r in valid:
        dev = (r.manifest or {}).get("device") or {}
        where = device_name(r.manifest or {}) if dev.get("type") == "cuda" else "the CPU"
        counts[where] = counts.get(where, 0) + 1
    if n and list(counts) != ["the CPU"]:  # only CPU runs: nothing to tell apart
        text += ": " + ", ".join(f"{c} on {where}" for where, c in sorted(
            counts.items(), key=lambda kv: kv[0] != "the CPU"))
    return text


def not_counted(runs: list[RunRecord]) -> str:
    """``; 2 paused, 2 failed``: the runs that do not count, by what they are (a run the
    registry rejects for a damaged file or a wrong value is ``rejected``); empty when all do."""
    counts = Counter(r.status for r in runs if not r.valid)
    return ("; " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
            if counts else "")


def lab_status(root: Path = PROJECT_ROOT, runs_root: Path | None = None) -> pd.DataFrame:
    """One row per lab part: its chapter (a cross-reference when written) and its runs.

    Runs are counted by the run registry: only complete runs that pass validation count; the
    others are named by their status (:func:`not_counted`). A device call's runs
    (``fairseq-gpu``, ...) count with their part, by device.
    """
    records = discover_runs(runs_root if runs_root is not None else paths().runs)
    rows = []
    for task in LAB_TASKS:
        written = (root / task.chapter).is_file()
        mine = [r for r in records if r.experiment.removesuffix(GPU_SUFFIX) in task.experiments]
        if not task.experiments:
            runs = task.unrun or "no training run needed"
        elif not mine:
            runs = task.unrun or "not run yet"
        else:
            runs = by_device([r for r in mine if r.valid]) + not_counted(mine)
        rows.append({
            "lab part": task.part,
            "asks": task.question,
            "chapter": f"@{task.section}" if written else "not written yet",
            "runs": runs,
        })
    return pd.DataFrame(rows)
