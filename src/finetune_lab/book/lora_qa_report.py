"""What the LoRA chapter shows of ``finetune-lab lora-qa``: the recipe, and the cached runs.

The training half is :mod:`finetune_lab.train.lora_qa`; this module only reads what it recorded
under ``data/runs/lora-qa/`` (manifests, TensorBoard scalars, ``generations.json``) and turns it
into tables, plus the one state-dependent paragraph (:func:`runs_markdown`): which runs exist
and how each differs from the lab's recipe.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd

from finetune_lab._files import parse_json
from finetune_lab.config import paths
from finetune_lab.errors import UserError
from finetune_lab.runs.listing import exclusions_markdown
from finetune_lab.runs.tblogs import LoadedRuns, load_experiments
from finetune_lab.train.hf_defaults import ratio_warmup_steps
from finetune_lab.train.lora_qa import EXPERIMENT, GENERATIONS_FILE, LAB_GENERATION, LAB_QA_ARGS


def cached_runs(root: Path | str | None = None) -> LoadedRuns | None:
    """Every recorded ``lora-qa`` run (valid or not) with the valid ones' scalars; ``None``
    when no run of this experiment was ever recorded under the runs root."""
    base = Path(root) if root is not None else paths().runs
    exp = base / EXPERIMENT
    if not exp.is_dir() or not any(p.is_dir() and p.name[0] not in "._" for p in exp.iterdir()):
        return None
    return load_experiments([EXPERIMENT], root=base)


def recipe_table() -> pd.DataFrame:
    """The lab's training and generation settings (what ``lora-qa`` uses by default).

    The lab's ``warmup_ratio`` is shown as transformers 5 takes it: a float ``warmup_steps`` in
    [0, 1), which the installed Trainer reads as a ratio and rounds up.
    """
    rows = []
    for k, v in asdict(LAB_QA_ARGS).items():
        if k == "warmup_ratio":
            steps = ratio_warmup_steps(v, LAB_QA_ARGS.max_steps)
            rows.append({"setting": "warmup_steps",
                         "value": f"{v} (a ratio: {steps} of the {LAB_QA_ARGS.max_steps} updates)"})
        else:
            rows.append({"setting": k, "value": str(v)})
    rows += [{"setting": f"generation: {k}", "value": str(v)}
             for k, v in asdict(LAB_GENERATION).items()]
    return pd.DataFrame(rows)


def runs_summary(loaded: LoadedRuns) -> pd.DataFrame:
    """One row per valid run: device, quantisation, optimizer, steps, first and last loss."""
    rows = []
    for rec in loaded.used:
        man = rec.manifest or {}
        hp = man.get("hyperparameters", {})
        s = loaded.scalars
        loss = s[(s["run"] == rec.name) & (s["subset"] == "train") & (s["tag"] == "loss")]
        loss = loss.sort_values("step")
        rows.append({
            "run": rec.name, "init": rec.init,
            "device": (man.get("device") or {}).get("name"),
            "4-bit": hp.get("quantization") is not None,
            "optimizer": hp.get("training", {}).get("optim"),
            "steps": int(loss["step"].max()) if len(loss) else 0,
            "first loss": float(loss["value"].iloc[0]) if len(loss) else float("nan"),
            "last loss": float(loss["value"].iloc[-1]) if len(loss) else float("nan"),
            "fallbacks": len((man.get("extra") or {}).get("fallbacks", [])),
        })
    return pd.DataFrame(rows)


def runs_markdown(loaded: LoadedRuns | None) -> str:
    """The chapter's paragraph on the cached runs: none, or each one with its fallbacks, then
    every excluded run with its reason."""
    if loaded is None or not loaded.used:
        text = ("**This run has not been made** (@nte-bloom): the run cache holds no valid "
                "`lora-qa` run, so this book shows no loss curve and no generations for the "
                "lab's fine-tune.")
    else:
        n = len(loaded.used)
        lines = [f"{n} valid run{'s' if n != 1 else ''} of `lora-qa` "
                 f"{'are' if n != 1 else 'is'} recorded. A run with fallbacks is not the lab's "
                 "recipe; each one says how it differs:", ""]
        for rec in loaded.used:
            fallbacks = ((rec.manifest or {}).get("extra") or {}).get("fallbacks") or []
            kind = "random-weight model" if rec.init == "random" else "pretrained weights"
            lines.append(f"- `{rec.name}` ({kind}): "
                         + ("; ".join(fallbacks) if fallbacks else "the lab's recipe, no fallback"))
        text = "\n".join(lines)
    if loaded is not None and loaded.excluded:
        text += "\n\n" + exclusions_markdown(loaded.runs)
    return text


def _printable(text: str) -> str:
    """One Markdown-table-safe line: control characters shown as U+FFFD, pipes escaped."""
    text = "".join(c if c.isprintable() else ("\ufffd" if c not in "\n\t" else " ") for c in text)
    return text.replace("|", "\\|")


def generations_table(record) -> pd.DataFrame:
    """Before/after answers of one run, from its ``generations.json``."""
    path = Path(record.path) / GENERATIONS_FILE
    if not path.is_file():
        raise UserError(f"{path} is missing: the run {record.name} saved no generations")
    data = parse_json(path.read_text(encoding="utf-8"))
    rows = []
    for before, after in zip(data["before"], data["after"]):
        rows.append({"question": before["question"],
                     "before": _printable(before["answer"]),
                     "after": _printable(after["answer"]),
                     "after stopped at EOS": after["stopped_at_eos"]})
    return pd.DataFrame(rows)
