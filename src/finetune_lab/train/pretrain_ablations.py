"""Short pretraining ablations: which recipe lowers the held-out loss fastest on this machine.

Each ablation is one config (as in peft's ``method_comparison``), run as a short continued
pretraining from the packaged checkpoint, with its own warm-up and decay inside the same wall
time, the same seed (so the same samples) and the same threads. What they measure is held-out
masked-LM loss (novels and reviews) at equal wall time: the question a CPU budget asks.
They land in ``data/runs/pretrain-ablation/<name>/`` and are never packaged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from finetune_lab.argtypes import folder, positive_float, positive_int
from finetune_lab.config import paths
from finetune_lab.models.checkpoints import packaged_dir
from finetune_lab.runs import jobs as parallel

EXPERIMENT = "pretrain-ablation"

ABLATIONS: dict[str, dict[str, str]] = {
    "fp32-dropout": {"precision": "fp32", "dropout": "0.1", "lr": "5e-4"},
    "bf16-dropout": {"precision": "bf16", "dropout": "0.1", "lr": "5e-4"},
    "bf16": {"precision": "bf16", "dropout": "0", "lr": "5e-4"},
    "bf16-lr1e-3": {"precision": "bf16", "dropout": "0", "lr": "1e-3"},
}
"""Name -> the ``pretrain`` flags it sets. ``fp32-dropout`` is the recipe of the runs so far."""

SEED = 2
"""One seed for all: the packaged weights' own run used seed 1, so these samples are new to them."""


def command(name: str, minutes: float, checkpoint: Path) -> list[str]:
    """The ``finetune-lab pretrain`` command line of one ablation."""
    flags = ABLATIONS[name]
    return [sys.executable, "-m", "finetune_lab.cli", "pretrain", "--experiment", EXPERIMENT,
            "--run", name, "--continue-from", str(checkpoint), "--minutes", str(minutes),
            "--seed", str(SEED), "--no-package", "--precision", flags["precision"],
            "--dropout", flags["dropout"], "--lr", flags["lr"]]


def run_ablations(names: list[str], minutes: float, jobs: int, checkpoint: Path) -> int:
    """Run the ablations ``jobs`` at a time, the CPU's threads split evenly between them.

    A run already in the run cache is skipped; a failed one is reported and the others go on.
    """
    unknown = sorted(set(names) - set(ABLATIONS))
    if unknown:
        raise SystemExit(f"unknown ablation(s) {', '.join(unknown)}: choose from "
                         f"{', '.join(ABLATIONS)}")
    todo = [n for n in names if not (paths().runs / EXPERIMENT / n / "manifest.json").is_file()]
    grid = [parallel.Job(name, command(name, minutes, checkpoint),
                         paths().work / f"{EXPERIMENT}-{name}.out") for name in todo]
    results = parallel.run_parallel(grid, jobs, label="pretrain-ablations")
    return parallel.report(results, "pretrain-ablations")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain-ablations",
                       help="short pretraining ablations at equal wall time (recipe choices)")
    p.add_argument("--names", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    p.add_argument("--minutes", type=positive_float, default=8.0, help="wall time of each ablation")
    p.add_argument("--jobs", type=positive_int, default=2, help="ablations side by side")
    p.add_argument("--checkpoint", type=folder, default=None,
                   help="packaged weights to start from (default: the committed checkpoint)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_ablations(args.names, args.minutes, args.jobs, args.checkpoint or packaged_dir())
