"""One call on a lent GPU machine: what travels there, what runs there, what comes back.

The device tool sends the working tree plus carried git-ignored folders (64 MiB in all) to a bare
machine that has torch, transformers and peft but no fairseq and no network, runs one command
of at most 10 minutes, and returns at most 8 files of 16 MiB each from ``$OUT``. Hence three
steps, each tested end to end on a CPU with a tiny budget (``tests/test_gpu_lab.py``):

* here, ``finetune-lab gpu-bundle`` fills ``.gpu/`` (:mod:`finetune_lab.runs.gpu_bundle`) with
  what the machine lacks and the plan (:mod:`finetune_lab.runs.gpu_plan`);
* there, ``bash scripts/gpu-lab.sh`` (``python -m finetune_lab.gpu_lab``,
  :mod:`finetune_lab.runs.gpu_remote`) installs it, runs the plan's jobs side by side and packs
  the new runs into pieces under 16 MiB (:mod:`finetune_lab.runs.gpu_archive`);
* here, ``finetune-lab gpu-unpack DIR`` checks and reassembles the pieces and moves each run into
  the run cache, where the registry checks it like any other run.

This module holds the commands of the three steps.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from finetune_lab._files import sha256_file
from finetune_lab.argtypes import (
    folder,
    non_negative_float,
    positive_float,
    positive_int,
    python_version,
    seed_arg,
)
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints
from finetune_lab.runs.gpu_archive import unpack
from finetune_lab.runs.gpu_bundle import GPU_PYTHON, TRANSFER_LIMIT, bundle
from finetune_lab.runs.gpu_plan import BUNDLE_DIR, LAB_PARTS, TINY_LORA_METHODS, Plan
from finetune_lab.runs.gpu_room import ROOM_DIR, put_back, set_aside
from finetune_lab.runs.gpu_remote import remote
from finetune_lab.runs.registry import validate_run
from finetune_lab.train.finetune_fairseq import next_candidate_experiment


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpu-bundle`` and ``gpu-unpack`` (the device side is :func:`main`)."""
    p = sub.add_parser("gpu-bundle", help="prepare .gpu/, what one GPU device call carries")
    p.add_argument("--steps", nargs="+", choices=("pretrain", "lab"), default=["lab"])
    p.add_argument("--tiny", action="store_true",
                   help="a smoke test: a few reviews, 1 epoch, 1 seed, 2 pretraining updates, "
                        "lora-qv and qlora-qv (experiments *-gpu-smoke)")
    p.add_argument("--pretrain-tokens", type=positive_int, default=70_000_000,
                   help="tokens of the pretraining corpus carried for --steps pretrain")
    p.add_argument("--pretrain-minutes", type=non_negative_float, default=0.0,
                   help="minutes of pretraining (default: what the call's deadline leaves)")
    p.add_argument("--pretrain-lr", type=positive_float, default=None)
    p.add_argument("--pretrain-batch-size", type=positive_int, default=None)
    p.add_argument("--pretrain-update-freq", type=positive_int, default=None)
    p.add_argument("--pretrain-run", default="gpu",
                   help="the pretraining run's name (pretrain-gpu/NAME, candidates/NAME)")
    p.add_argument("--tapt", action="store_true",
                   help="mix the CLS-Books training texts (prepare-pretrain --tapt) into the slice")
    p.add_argument("--then-finetune", action="store_true",
                   help="with --steps pretrain lab: fine-tune the new weights in the same call")
    p.add_argument("--lab-parts", nargs="+", choices=LAB_PARTS, default=list(LAB_PARTS))
    p.add_argument("--seeds", nargs="+", type=seed_arg, default=None)
    p.add_argument("--inits", nargs="+", choices=("pretrained", "random"), default=None,
                   help="the initialisations of the fairseq and Transformers runs (default both)")
    p.add_argument("--checkpoint", type=folder, default=None,
                   help="packaged weights under data/ (a candidate) for the fairseq pretrained "
                        "runs; they go to the next fairseq-candidate experiment")
    p.add_argument("--python", type=python_version, default=GPU_PYTHON,
                   help="the device's Python, for the wheels")
    p.add_argument("--from-environment", action="store_true",
                   help="a rehearsal where the call runs on a machine that has fairseq and the "
                        "wheels' packages (the tests): download nothing, carry no wheels")
    p.add_argument("--out", type=folder, default=None)
    p.add_argument("--force", action="store_true",
                   help="replace --out even if gpu-bundle did not make it")
    p.add_argument("--make-room", action="store_true",
                   help=f"set the run cache's logs and event files and the freeze aside in "
                        f"{ROOM_DIR}/ (the call reads neither) until gpu-unpack puts them back")
    p.set_defaults(func=_bundle)
    u = sub.add_parser("gpu-unpack", help="move a device call's runs into the run cache")
    u.add_argument("files", type=folder, nargs="?", default=None,
                   help="the folder the call's files came back in (none: only put back what "
                        "gpu-bundle --make-room set aside)")
    u.set_defaults(func=_unpack)


def _bundle(args: argparse.Namespace) -> int:
    plan = Plan(steps=list(args.steps), tiny=args.tiny,
                pretrain_minutes=args.pretrain_minutes,
                pretrain_tokens=args.pretrain_tokens if "pretrain" in args.steps else 0,
                pretrain_lr=args.pretrain_lr, pretrain_batch_size=args.pretrain_batch_size,
                pretrain_update_freq=args.pretrain_update_freq, tapt=args.tapt,
                pretrain_run=args.pretrain_run,
                lab_parts=list(args.lab_parts))
    if args.checkpoint is not None:
        ckpt = args.checkpoint.resolve()
        if not ckpt.is_relative_to(PROJECT_ROOT / "data"):
            raise UserError(f"--checkpoint {args.checkpoint}: pass a folder under "
                            f"{PROJECT_ROOT / 'data'} (e.g. data/work/candidates/NAME)")
        plan.checkpoint = ckpt.relative_to(PROJECT_ROOT).as_posix()
        plan.candidate_experiment = plan.candidate(next_candidate_experiment())
    if args.then_finetune:
        if set(args.steps) != {"pretrain", "lab"}:
            raise UserError("--then-finetune needs --steps pretrain lab")
        if args.checkpoint is not None:
            raise UserError("--then-finetune fine-tunes the call's own weights: drop --checkpoint")
        plan.then_finetune = True
        plan.candidate_experiment = plan.candidate(next_candidate_experiment())
    if args.seeds:
        plan.seeds = list(args.seeds)
    if args.inits:
        plan.fairseq_inits = plan.transformers_inits = list(args.inits)
    if args.tiny:
        plan.seeds, plan.epochs = plan.seeds[:1] if args.seeds else [0], 1
        plan.lora_methods = [m for m in plan.lora_methods if m in TINY_LORA_METHODS]
        plan.pretrain_tokens = min(plan.pretrain_tokens, 20_000) if plan.pretrain_tokens else 0
    if args.make_room:
        moved, size = set_aside()
        print(f"gpu-bundle: set aside {moved:,} files ({size / 2**20:.1f} MiB: the run cache's "
              f"logs and event files, the freeze) in {ROOM_DIR}/; the run cache and the book "
              "are incomplete here until `finetune-lab gpu-unpack` puts them back")
    try:
        info = bundle(args.out, plan=plan, python=args.python, force=args.force,
                      from_environment=args.from_environment)
    except BaseException:
        if args.make_room:  # no call will run: everything back at once
            put_back()
            print(f"gpu-bundle: what was set aside in {ROOM_DIR}/ is back", file=sys.stderr)
        raise
    made = Path(info["bundle"]).resolve()
    where = (made.relative_to(PROJECT_ROOT).as_posix() if made.is_relative_to(PROJECT_ROOT)
             else None)
    run = (f"run it with the device tool: command `bash scripts/gpu-lab.sh {where}`, carry "
           f"[\"{where}\"]" if where else
           f"the device tool carries folders of the checkout only: move it to "
           f"{PROJECT_ROOT / BUNDLE_DIR}, then run `bash scripts/gpu-lab.sh {BUNDLE_DIR}` there, "
           f"carrying [\"{BUNDLE_DIR}\"]")
    print(f"gpu-bundle: {info['bundle']} {info['carried_bytes'] / 2**20:.1f} MiB + working tree "
          f"{info['tree_bytes'] / 2**20:.1f} MiB of {TRANSFER_LIMIT / 2**20:.0f} MiB; {run}")
    return 0


def _unpack(args: argparse.Namespace) -> int:
    back, kept = put_back()  # first: the placed runs are checked against the committed ones
    if back:
        print(f"gpu-unpack: {back:,} files set aside by gpu-bundle --make-room are back")
    if kept:
        print(f"gpu-unpack: {len(kept):,} files set aside stay in {ROOM_DIR}/, as something "
              f"else lies at their place now (the first: {kept[0]}); compare and move them "
              "by hand, then run `finetune-lab gpu-unpack` again", file=sys.stderr)
    if args.files is None:
        if not back and not kept:
            raise UserError("nothing is set aside: pass the folder the call's files came back in")
        return 2 if kept else 0
    placed = unpack(args.files)
    if not placed:  # trial 24's G-i2: an unpack that placed nothing said nothing
        print("gpu-unpack: nothing new was placed in the project")
    bad = 0
    for dest in placed:
        rel = dest.relative_to(PROJECT_ROOT).as_posix()
        if rel.startswith("data/runs/") and dest.is_dir():
            rec = validate_run(dest)
            bad += not rec.valid
            print(f"gpu-unpack: {rel}: " + ("valid" if rec.valid else
                                            "INVALID: " + "; ".join(rec.problems))
                  + "".join(f" (warning: {w})" for w in rec.warnings))
        elif (dest / checkpoints.MANIFEST_FILE).is_file():  # packaged weights
            want = (checkpoints.package_manifest(dest) or {}).get("files", {})
            ok = checkpoints.MODEL_FILE in want and all(
                sha256_file(dest / name) == item["sha256"] for name, item in want.items())
            bad += not ok
            print(f"gpu-unpack: {rel}: {checkpoints.MODEL_FILE} "
                  + ("matches its manifest" if ok else "DOES NOT match its manifest"))
        else:
            print(f"gpu-unpack: {rel}")
    if bad:  # placed all the same (trial 29's L-21: exit 1, which no other fault gives)
        print(f"gpu-unpack: {bad} of the placed folders failed the checks above; the book "
              "leaves them out", file=sys.stderr)
    return 2 if bad or kept else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m finetune_lab.gpu_lab BUNDLE OUT``: the device side (see scripts/gpu-lab.sh)."""
    parser = argparse.ArgumentParser(prog="gpu-lab")
    parser.add_argument("bundle", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--parallel", type=positive_int, default=None)
    args = parser.parse_args(argv)
    try:
        result = remote(args.bundle, args.out, parallel=args.parallel)
    except UserError as exc:
        print(f"gpu-lab: error: {exc}", file=sys.stderr)
        return 2
    failed = [j["job"] for j in result["jobs"] if j["exit_code"] != 0]
    if failed:
        print(f"gpu-lab: failed: {', '.join(failed)} (their logs came back)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
