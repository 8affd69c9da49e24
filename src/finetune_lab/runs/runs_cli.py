"""``finetune-lab runs``: every recorded run, whether the registry accepts it, and why not."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from finetune_lab.config import RUNS_DIR_ENV, paths
from finetune_lab.errors import UserError
from finetune_lab.runs.registry import discover_runs, excluded_runs


def shown(line: str) -> str:
    """One line as the terminal should show it: a folder's name may hold a newline or an
    escape sequence, which would print a line of its own ("ok  fairseq/...") or colour."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in line)


def check_runs_root(root: Path) -> None:
    """A runs root named on the command line must be a folder: a typo must not read as "no
    runs" and exit 0."""
    if root.is_dir():
        return
    what = "is a file, not a folder" if root.exists() else "does not exist"
    raise UserError(f"runs root {root} {what}; name the folder that holds "
                    "<experiment>/<run>/manifest.json (default: data/runs)")


def check_not_an_experiment(root: Path) -> None:
    """A runs root that is itself an experiment (its folders hold manifests, or it has an
    experiment.json) would list every subset folder as a broken run, with advice to delete
    folders of valid runs (trial 8's R1); one that is a run would say "no runs"."""
    if (root / "manifest.json").is_file():  # trial 9's R1: "no runs", over a valid run
        raise UserError(f"{root} is a run folder, not the runs root: give --root "
                        f"{root.parent.parent} --experiment {root.parent.name}")
    run = next((p for p in sorted(root.iterdir()) if (p / "manifest.json").is_file()), None) \
        if root.is_dir() else None
    if run is not None or (root / "experiment.json").is_file():
        shown_run = f" ({run.name}/manifest.json)" if run is not None else ""
        raise UserError(f"{root} is an experiment folder{shown_run}, not the runs root: give "
                        f"--root {root.parent} --experiment {root.name}")


def _cmd_runs(args: argparse.Namespace) -> int:
    if args.root is not None and not str(args.root).strip():
        raise UserError("--root is empty: name the folder that holds "
                        "<experiment>/<run>/manifest.json (default: data/runs)")
    root = Path(args.root) if args.root is not None else paths().runs
    # The default root may not exist yet (a fresh clone); one named on the command line or in
    # FINETUNE_LAB_RUNS_DIR must.
    if args.root is not None or root.exists() or os.environ.get(RUNS_DIR_ENV, "").strip():
        check_runs_root(root)
    if root.is_dir():
        check_not_an_experiment(root)
    records = discover_runs(root, args.experiment or None, check_inputs=not args.no_inputs)
    if not records:
        print(f"no runs under {root}")
        return 1 if args.strict else 0
    for r in records:
        mark = "ok " if r.valid else "BAD"
        print(shown(f"{mark} {r.experiment}/{r.name} [{r.described('framework')} "
                    f"init={r.described('init')} seed={r.described('seed')} "
                    f"status={r.described('status')}]"))
        for p in r.problems:
            print(shown(f"      problem: {p}"))
        for w in r.warnings:
            print(shown(f"      warning: {w}"))
    n_bad = len(excluded_runs(records))
    print(f"{len(records) - n_bad} valid, {n_bad} excluded")
    return 1 if (args.strict and n_bad) else 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("runs", help="list recorded runs, whether each is valid, and why not")
    p.add_argument("--root", default=None, help="runs root (default: data/runs)")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument("--no-inputs", action="store_true", help="do not re-hash data and checkpoints")
    p.add_argument("--strict", action="store_true", help="exit 1 if any run is excluded")
    p.set_defaults(func=_cmd_runs)
