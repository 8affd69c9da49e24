"""The ``pretrain`` and ``package-checkpoint`` commands.

``pretrain`` runs on a budget in minutes or updates (:mod:`~finetune_lab.train.pretrain`), or,
with ``--tokens``, one long resumable run (:mod:`~finetune_lab.train.pretrain_long`); both are
behind the one command so that their options stay one set.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from finetune_lab.argtypes import (
    port,
    experiment_name,
    folder,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
    resolved_folder,
    run_name,
    seed_arg,
    segment_minutes,
)
from finetune_lab.config import paths
from finetune_lab.data import tokenizer
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints, position_init, trust
from finetune_lab.runs.manifest import MANIFEST_NAME, portable_path, readable_manifests
from finetune_lab.train.pretrain import pretrain
from finetune_lab.train.pretrain_lineage import checkpoint_metadata
from finetune_lab.train.pretrain_long import pretrain_long
from finetune_lab.train.pretrain_recipe import (
    EXPERIMENT,
    PRECISIONS,
    Launch,
    PretrainRecipe,
    default_recipe,
    device_defaults,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``pretrain`` and ``package-checkpoint``."""
    p = sub.add_parser("pretrain", help="pretrain the stand-in RoBERTa-small-fr (masked LM)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--max-update", type=positive_int, help="budget in updates")
    budget.add_argument("--minutes", type=positive_float,
                        help="budget in minutes (default: 8 on a GPU, 120 on a CPU); "
                             "turned into updates by a short calibration run")
    budget.add_argument("--tokens", type=positive_float, metavar="N",
                        help="a long, resumable run: the budget in tokens (e.g. 150e6), with "
                             "one schedule over all of it; run the same command again to resume "
                             "it (see --segment-minutes, --tapt-fraction)")
    p.add_argument("--segment-minutes", type=segment_minutes,
                   help="with --tokens: stop this launch (saving, resumable) after this long")
    p.add_argument("--tapt-fraction", type=fraction, default=0.0,
                   help="with --tokens: the last fraction of the budget (1: all of it) is "
                        "task-adaptive, on `prepare-pretrain --tapt`'s corpus (the CLS-Books "
                        "training texts)")
    p.add_argument("--dropout", type=probability,
                   help="dropout and attention dropout (default: 0 on a CPU, where the model "
                        "underfits, as the ablations measured; 0.1 on a GPU, RoBERTa's)")
    p.add_argument("--sample-break-mode", choices=("none", "eos"),
                   help="none (default): 256-token stretches of running text; eos: one line (a "
                        "review, a paragraph) per sample, starting with <s> like a fine-tuning input")
    p.add_argument("--bow-weight", type=non_negative_float,
                   help="also train <s> to predict its sample's bag of words, with this weight "
                        "per sample against one masked token (default 0: masked LM alone); "
                        "needs --sample-break-mode eos")
    p.add_argument("--position-init", choices=position_init.CHOICES, default="keep",
                   help="with --tokens: keep the starting weights' position table (default), "
                        "or write sinusoids into it before the first update, scaled to the word "
                        "embeddings (the table stays learned; see the pretraining chapter's "
                        "Positions section); without --continue-from, into the random "
                        "initialisation, drawn to a file first")
    p.add_argument("--stop-minutes", type=positive_float,
                   help="with --max-update: also stop (and save) when this much time has passed")
    p.add_argument("--seed", type=seed_arg,
                   help="fixes initialisation and sample order (default 1; with --continue-from, "
                        "1 + the runs behind the weights, so that no run replays its parent's "
                        "samples)")
    p.add_argument("--run", type=run_name,
                   help="run name (default: <device>-seed<seed>; with --tokens, <device>-long)")
    p.add_argument("--batch-size", type=positive_int, help="sequences per step (default by device)")
    p.add_argument("--update-freq", type=positive_int, help="steps per update (default by device)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"peak learning rate (default: {PretrainRecipe.lr:g}; 7e-4 on a GPU)")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="default: bf16 on a GPU that has it (else fp16), and on a CPU with AMX "
                        "or AVX512-BF16; fp32 on other CPUs")
    p.add_argument("--data", type=resolved_folder, help="binarized corpus (default: prepare-pretrain's)")
    p.add_argument("--no-package", action="store_true",
                   help="do not replace data/checkpoints/roberta-small-fr")
    p.add_argument("--package-to", type=folder, metavar="DIR",
                   help="package the result here instead of data/checkpoints/roberta-small-fr: "
                        "a candidate to fine-tune (`finetune fairseq --init pretrained "
                        "--checkpoint DIR --experiment fairseq-candidate`) before it replaces "
                        "the committed one")
    p.add_argument("--overwrite", action="store_true", help="redo an existing run")
    p.add_argument("--experiment", default=EXPERIMENT, type=experiment_name,
                   help="run-cache folder (default: pretrain; the ablations use "
                        "pretrain-ablation)")
    dist = p.add_argument_group(
        "data-parallel training (fairseq's own, through torchrun; see the README's Scaling out)")
    dist.add_argument("--nproc-per-node", type=positive_int, default=1,
                      help="processes on this machine (one per GPU; gloo on CPUs)")
    dist.add_argument("--nnodes", type=positive_int, default=1, help="machines")
    dist.add_argument("--node-rank", type=non_negative_int, default=0, help="this machine's rank")
    dist.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address")
    dist.add_argument("--master-port", type=port, default=29500)
    p.add_argument("--continue-from", type=folder, metavar="CHECKPOINT_DIR",
                   help="continue pretraining from a packaged checkpoint folder (e.g. "
                        "data/checkpoints/roberta-small-fr) with a fresh warm-up and decay, so "
                        "CPU sessions add up; the new package records the lineage")
    p.set_defaults(func=_run, before_work=refuse_before_work)

    pk = sub.add_parser("package-checkpoint",
                        help="package a trusted fairseq checkpoint as model.pt + dict + spm")
    pk.add_argument("source", type=Path)
    pk.add_argument("--dest", type=folder)
    pk.add_argument("--force", action="store_true",
                    help="replace --dest even if it is not a packaged checkpoint")
    pk.add_argument("--trust", action="store_true",
                    help="package a SOURCE that no manifest of this project lists (one you made "
                         "or trust); the package's manifest says so")
    pk.set_defaults(func=_run_package)


PACKAGE_FIX = ("pass --package-to another folder (`package-checkpoint --force` can replace it "
               "later), or --no-package")


def refuse_before_work(args: argparse.Namespace, cited_fix: str = PACKAGE_FIX) -> None:
    """Everything ``pretrain`` refuses before its first update, in one line; ``reproduce`` asks
    it before its first step (trial 27's P-m4), with advice of its own (``cited_fix``)."""
    if args.bow_weight and args.sample_break_mode != "eos":
        raise UserError("--bow-weight needs --sample-break-mode eos: <s> summarises one review "
                        "or paragraph, not a stretch that starts mid-sentence")
    for flag, given in (("--position-init", args.position_init != "keep"),
                        ("--tapt-fraction", args.tapt_fraction > 0)):
        if given and args.tokens is None:  # a short run would train without it, silently
            raise UserError(f"{flag} needs a long run (--tokens N)")
    if args.tokens is not None and args.experiment != EXPERIMENT:  # trial 7's P5: ignored
        raise UserError(f"--experiment {args.experiment}: a long run (--tokens N) always goes "
                        f"to {EXPERIMENT}/, whose other runs it continues; drop --experiment")
    if args.continue_from is not None and not Path(args.continue_from).is_dir():  # 25's E-k14
        raise UserError(f"--continue-from {args.continue_from} does not exist: give a folder "
                        "of packaged weights (package-checkpoint makes one)")
    if not args.node_rank < args.nnodes:  # trial 30's E-19: accepted, then it hung
        raise UserError(f"--node-rank {args.node_rank} is not below --nnodes {args.nnodes}: "
                        "the machines are ranked 0 to --nnodes - 1")
    if not args.master_addr.strip():
        raise UserError(f"--master-addr {args.master_addr!r} is empty: give rank 0's host name "
                        "or IP address")
    if not args.no_package:  # before any work, as package-checkpoint refuses without --force
        refuse_cited_dest(args.package_to or checkpoints.packaged_dir(), cited_fix)


def _run(args: argparse.Namespace) -> int:
    d = device_defaults()
    refuse_before_work(args)
    recipe = default_recipe(batch_size=args.batch_size, update_freq=args.update_freq,
                            lr=args.lr, dropout=args.dropout, attention_dropout=args.dropout,
                            sample_break_mode=args.sample_break_mode, bow_weight=args.bow_weight)
    launch = Launch(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                    node_rank=args.node_rank, master_addr=args.master_addr,
                    master_port=args.master_port)
    if args.tokens is not None:
        run_dir = pretrain_long(run=args.run or f"{d['device']}-long", tokens=int(args.tokens),
                                continue_from=args.continue_from, seed=args.seed,
                                data_dir=args.data, tapt_fraction=args.tapt_fraction,
                                recipe=replace(recipe, validate_every=250),
                                precision=args.precision, segment_minutes=args.segment_minutes,
                                package=not args.no_package, package_to=args.package_to,
                                launch=launch, position_init=args.position_init)
        print(f"pretrain: run recorded in {run_dir}")
        return 0
    run_dir = pretrain(max_update=args.max_update, minutes=args.minutes or args.stop_minutes,
                       seed=args.seed,
                       run=args.run, data_dir=args.data, recipe=recipe,
                       package=not args.no_package, package_to=args.package_to,
                       overwrite=args.overwrite,
                       continue_from=args.continue_from, precision=args.precision,
                       experiment=args.experiment, launch=launch)
    print(f"pretrain: run recorded in {run_dir}")
    return 0


def runs_citing(weights: Path) -> list[str]:
    """The recorded runs (``experiment/run``) whose manifest names ``weights`` as the checkpoint
    they started from: in the run store, and in the project's own, which the book reads wherever
    ``FINETUNE_LAB_RUNS_DIR`` points (trial 21's A-c5: weights committed runs fine-tuned were
    replaced by a pretraining whose runs went elsewhere)."""
    stored = portable_path(weights)
    found = []
    own = paths().project / "data" / "runs"
    stores = dict.fromkeys(p.resolve() for p in (paths().runs, own))
    for store in stores:
        for manifest, record in readable_manifests(store, f"*/*/{MANIFEST_NAME}"):
            ckpt = record.get("inputs").get("checkpoint") \
                if isinstance(record.get("inputs"), dict) else None
            if isinstance(ckpt, dict) and ckpt.get("path") == stored:
                found.append(f"{manifest.parent.parent.name}/{manifest.parent.name}")
    return list(dict.fromkeys(found))  # a run store that is a copy of the project's


def refuse_cited_dest(dest: Path, fix: str) -> None:
    """Weights packaged into ``dest`` would replace ones the book or recorded runs cite: the
    packaged checkpoint the book reads, or weights runs fine-tuned (trial 8's K1: the folder was
    absent, and its runs turned BAD, told to re-run; trial 9's W1: `pretrain` packaged onto the
    book's checkpoint without asking)."""
    if dest.resolve() == checkpoints.packaged_dir().resolve() \
            and checkpoints.require_whole_package(dest) is not None:  # weights gone: say so
        raise UserError(f"{dest} holds the packaged checkpoint the book reads: replacing it sets "
                        f"aside every run built on it; {fix}")
    citing = runs_citing(dest / checkpoints.MODEL_FILE)
    if citing:
        more = f" and {len(citing) - 1} more" if len(citing) > 1 else ""
        raise UserError(f"{dest} is where run {citing[0]}{more} found the weights it fine-tuned: "
                        f"other weights there would reject it; {fix}")


def _run_package(args: argparse.Namespace) -> int:
    checkpoints.check_package_source(args.source, args.dest)
    dest = Path(args.dest) if args.dest is not None else checkpoints.packaged_dir()
    if not args.force:
        refuse_cited_dest(dest, "choose another --dest, or pass --force (which keeps the old "
                                "weights beside it)")
    spm_model, spm_dict = tokenizer.require_tokenizer(tokenizer.default_output())
    manifests = trust.default_manifests()
    dest = checkpoints.package_checkpoint(args.source, spm_model, spm_dict, args.dest,
                                          manifests=manifests, trust=args.trust,
                                          force=args.force,
                                          metadata=checkpoint_metadata(args.source, manifests,
                                                                       trust=args.trust))
    print(f"package-checkpoint: wrote {dest}")
    return 0
