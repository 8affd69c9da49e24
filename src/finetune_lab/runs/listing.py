"""The registry's verdicts as a table and as the Markdown list a chapter prints beside its
results: every excluded run named with its reasons."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.runs.registry import RunRecord, excluded_runs

if TYPE_CHECKING:
    import pandas as pd


def runs_table(records: Iterable[RunRecord]) -> pd.DataFrame:
    """One row per run: identity, status, validity and the reason it is excluded (if it is)."""
    import pandas as pd

    rows = [
        {
            "experiment": r.experiment,
            "run": r.name,
            "framework": r.described("framework"),
            "init": r.described("init"),
            "seed": r.described("seed"),
            "status": r.described("status"),
            "valid": r.valid,
            "reason": r.reason,
            "warnings": "; ".join(r.warnings),
        }
        for r in records
    ]
    columns = ["experiment", "run", "framework", "init", "seed", "status", "valid", "reason",
               "warnings"]
    return pd.DataFrame(rows, columns=columns)


def exclusions_markdown(records: Iterable[RunRecord]) -> str:
    """A Markdown list of excluded runs and why (empty string when every run is valid).

    Runs whose only problem is a replaced checkpoint are grouped in one item: they are not
    broken, they measure a model the book no longer uses.
    """
    bad = excluded_runs(records)
    stale = [r for r in bad if r.stale_checkpoint and len(r.problems) == 1]
    # a reason names files by their path on this machine: the book names them from the project
    # (trial 13's X1; issue 35, item 5: no machine path in the book)
    lines = [f"- `{r.experiment}/{r.name}` excluded: "
             + r.reason.replace(f"{PROJECT_ROOT}{os.sep}", "") for r in bad if r not in stale]
    if stale:
        names = ", ".join(f"`{r.experiment}/{r.name}`" for r in stale)
        lines.insert(0, f"- {names}: made from an earlier stand-in checkpoint, which a new "
                        "pretraining has replaced; excluded until re-run from the current one, "
                        "never mixed with its runs.")
    return "\n".join(lines)
