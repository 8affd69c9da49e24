"""Tasks 3-4: fine-tune RoBERTa-small-fr on CLS-Books with ``fairseq-train``, 3 seeds x 2 inits.

The command line is the lab's (``sentence_prediction``, 2 classes, init-token 0, separator-token
2, batch 8, 5 epochs, Adam (0.9, 0.98), lr 1e-5 with 6 % warm-up and linear decay), with the
schedule derived from the binarized training set's size (:mod:`finetune_lab.train.recipe`). Test
accuracy is logged every epoch (``--valid-subset valid,test``) so that the best-validation epoch
is picked from the logs afterwards; no checkpoint file is kept (``--no-save``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from finetune_lab._files import not_there, sha256_file
from finetune_lab.argtypes import (
    experiment_name,
    folder,
    positive_int,
    resolved_folder,
    seed_arg,
)
from finetune_lab.config import paths
from finetune_lab.data import binarize
from finetune_lab.data.binarized import check_binarized, mmap_header
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints, trust
from finetune_lab.models.checkpoints import package_manifest
from finetune_lab.runs import jobs
from finetune_lab.runs.fairseq_logs import log_rates
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.runs.experiments import refuse_other_recipe
from finetune_lab.runs.recording import record_run, run_dir_for, run_fairseq_train
from finetune_lab.runs.registry import validate_run
from finetune_lab.runs.run_inputs import cached_sha256
from finetune_lab.train.recipe import LAB_RECIPE, FinetuneRecipe

EXPERIMENT = "fairseq"
CANDIDATE_EXPERIMENT = "fairseq-candidate"
"""Fine-tuning runs from a candidate checkpoint (a pretraining not, or not yet, packaged): the lab's
recipe, kept apart from the grid so that trying a checkpoint never replaces the grid's runs."""
INITS = ("pretrained", "random")


def candidate_index(name: str) -> int | None:
    """1 for ``fairseq-candidate``, N for ``fairseq-candidate-N`` (one experiment per candidate
    tried), None for any other experiment."""
    if name == CANDIDATE_EXPERIMENT:
        return 1
    head, _, tail = name.rpartition("-")
    return int(tail) if head == CANDIDATE_EXPERIMENT and tail.isdigit() else None


def candidate_experiments(runs_root: Path | None = None) -> list[str]:
    """The candidate experiments of the run cache, in the order they were started."""
    root = Path(runs_root) if runs_root is not None else paths().runs
    names = [d.name for d in root.glob(f"{CANDIDATE_EXPERIMENT}*")
             if d.is_dir() and candidate_index(d.name) is not None]
    return sorted(names, key=candidate_index)


def next_candidate_experiment(runs_root: Path | None = None) -> str:
    """Where a newly tried checkpoint's runs go: never into an earlier candidate's experiment,
    whose complete runs were made from other weights (see :func:`same_checkpoint`)."""
    taken = [candidate_index(n) for n in candidate_experiments(runs_root)]
    return f"{CANDIDATE_EXPERIMENT}-{max(taken) + 1}" if taken else CANDIDATE_EXPERIMENT


def require_cls_bin(bin_dir: Path) -> Path:
    """The binarized CLS-Books folder (``input0/`` and ``label/``), checked."""
    needed = [f"{sub}/{split}.{ext}" for sub in ("input0", "label")
              for split in ("train", "valid", "test") for ext in ("bin", "idx")]
    needed += ["input0/dict.txt", "label/dict.txt"]
    missing = [n for n in needed if not (bin_dir / n).is_file()]
    if missing:
        raise UserError(
            f"{bin_dir} lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: run "
            "`finetune-lab prepare-cls`, `finetune-lab adopt-tokenizer` and "
            "`finetune-lab binarize-cls` first (or `finetune-lab reproduce`, which runs what is "
            "missing)"
        )
    return bin_dir


def train_size(bin_dir: Path) -> int:
    """Number of training reviews in the binarized data (what the schedule is derived from),
    read from the header of the labels' ``train.idx`` (magic, version 1, dtype code, count) as
    fairseq's ``MMapIndexedDataset.Index`` reads it: importing fairseq to read one number took
    five seconds of every fine-tuning launch (issue 36)."""
    index = bin_dir / "label" / "train.idx"
    try:
        with index.open("rb") as f:
            header = f.read(26)
    except OSError as exc:
        raise UserError(f"{index} cannot be read ({exc.strerror or exc}): run "
                        "`finetune-lab binarize-cls` again") from None
    return mmap_header(index, header, "run `finetune-lab binarize-cls` again")[1]


def check_same_dictionary(bin_dir: Path, checkpoint_dir: Path) -> None:
    """The data must be encoded with the checkpoint's own dictionary, or ids mean other pieces."""
    data_dict, ckpt_dict = bin_dir / "input0" / "dict.txt", checkpoint_dir / "dict.txt"
    if sha256_file(data_dict) != sha256_file(ckpt_dict):
        raise UserError(
            f"{data_dict} differs from the checkpoint's {ckpt_dict}: the binarized data was made "
            "with another tokenizer; re-run `finetune-lab binarize-cls` with the checkpoint's "
            "tokenizer"
        )


def fairseq_args(bin_dir: Path, recipe: FinetuneRecipe, n_train: int, *, seed: int,
                 checkpoint: Path | None, cpu: bool, arch: dict[str, int] | None = None,
                 log_interval: int = 10) -> list[str]:
    """The lab's ``fairseq-train`` command line (without ``--tensorboard-logdir``)."""
    args = [str(bin_dir), "--user-dir", str(paths().user_dir)]
    if checkpoint is not None:
        args += ["--restore-file", str(checkpoint), "--reset-optimizer", "--reset-dataloader",
                 "--reset-meters", "--reset-lr-scheduler"]
    args += [
        "--task", "sentence_prediction", "--num-classes", str(recipe.num_classes),
        # the binarized files only: left to infer it, fairseq reads a text file named `train`
        # beside train.bin instead (trial 25's D-k1: the test reviews so trained on)
        "--dataset-impl", "mmap",
        "--init-token", "0", "--separator-token", "2",
        "--max-positions", str(recipe.max_positions), "--shorten-method", "truncate",
        "--arch", "roberta_small", "--criterion", "sentence_prediction",
        "--batch-size", str(recipe.batch_size), "--required-batch-size-multiple", "1",
        "--max-epoch", str(recipe.epochs),
        "--optimizer", "adam", "--adam-betas", str(tuple(recipe.adam_betas)).replace(" ", ""),
        "--adam-eps", str(recipe.adam_eps), "--weight-decay", str(recipe.weight_decay),
        "--clip-norm", str(recipe.clip_norm),
        "--lr-scheduler", "polynomial_decay", "--lr", str(recipe.lr),
        "--total-num-update", str(recipe.total_updates(n_train)),
        "--warmup-updates", str(recipe.warmup_updates(n_train)),
        "--dropout", str(recipe.dropout), "--attention-dropout", str(recipe.attention_dropout),
        "--valid-subset", "valid,test",
        "--best-checkpoint-metric", recipe.best_checkpoint_metric,
        "--maximize-best-checkpoint-metric", "--no-save",
        "--seed", str(seed), "--log-format", "simple", "--log-interval", str(log_interval),
        "--num-workers", "0",
    ]
    for name, value in (arch or {}).items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    if cpu:
        args.append("--cpu")
    return args


def run_name(init: str, seed: int) -> str:
    return f"{init}-seed{seed}"


def checkpoint_source(ckpt_dir: Path) -> dict[str, Any]:
    """Where the packaged weights come from (its manifest's pretraining run, lineage and
    validation loss), so a fine-tuning run names the pretraining behind it."""
    man = package_manifest(ckpt_dir) or {}
    return {k: man.get(k) for k in ("run", "lineage", "valid_loss_bits")}


def same_checkpoint(run_dir: Path, model_pt: Path) -> bool:
    """Whether the run started from the file ``model_pt`` is now (by sha256, hashed once per
    process with the registry's checks)."""
    recorded = (read_manifest(run_dir).get("inputs") or {}).get("checkpoint") or {}
    return (recorded.get("sha256") or {}).get(".") == cached_sha256(model_pt)


def is_done(run_dir: Path) -> bool:
    """A run that the registry accepts as complete and valid is not redone."""
    if not (run_dir / "manifest.json").is_file():
        return False
    return validate_run(run_dir).valid


def finetune_grid(
    inits: tuple[str, ...] = INITS,
    seeds: tuple[int, ...] = (0, 1, 2),
    *,
    bin_dir: Path | None = None,
    checkpoint_dir: Path | None = None,
    recipe: FinetuneRecipe = LAB_RECIPE,
    arch: dict[str, int] | None = None,
    runs_root: Path | None = None,
    experiment: str = EXPERIMENT,
    log: bool = True,
) -> list[Path]:
    """Run every (init, seed) not yet complete; an incomplete or invalid run is redone."""
    import torch

    bin_dir = require_cls_bin(Path(bin_dir) if bin_dir else binarize.default_output())
    check_binarized(bin_dir)  # what fairseq trains on holds no test review
    n_train = train_size(bin_dir)
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else checkpoints.packaged_dir()
    model_pt = ckpt_dir / checkpoints.MODEL_FILE
    if "pretrained" in inits:
        if not model_pt.is_file():
            raise UserError(f"{model_pt} {not_there(model_pt)}: give the folder of a packaged "
                            "checkpoint, or run `finetune-lab pretrain` first")
        check_same_dictionary(bin_dir, ckpt_dir)
        trust.check_trusted(model_pt, [ckpt_dir / checkpoints.MANIFEST_FILE])
    source = checkpoint_source(ckpt_dir) if "pretrained" in inits else None
    cpu = not torch.cuda.is_available()
    hyper: dict[str, Any] = {**recipe.as_dict(n_train), "arch": "roberta_small",
                             "arch_overrides": dict(arch or {}), "precision": "fp32"}
    done: list[Path] = []
    if inits and seeds:  # an experiment.json that rejects these runs: refused before any work
        grid = run_dir_for(experiment, run_name(inits[0], seeds[0]), runs_root).parent
        refuse_other_recipe(grid, hyper)
        other = next((d for d in sorted(grid.glob("pretrained-seed*")) if "pretrained" in inits
                      and is_done(d) and not same_checkpoint(d, model_pt)), None)
        if other is not None:  # trial 26's R-m2: one experiment fine-tunes one checkpoint
            raise UserError(
                f"{other} holds a complete run from another checkpoint than {model_pt}: an "
                "experiment's pretrained runs fine-tune one checkpoint; pass another "
                f"--experiment (e.g. {next_candidate_experiment(runs_root)})")
    for init in inits:
        if init not in INITS:
            raise UserError(f"--init must be one of {', '.join(INITS)}, not {init!r}")
        for seed in seeds:
            name = run_name(init, seed)
            target = run_dir_for(experiment, name, runs_root)
            if is_done(target):
                if log:
                    print(f"finetune fairseq: {experiment}/{name} is complete; skipped")
                done.append(target)
                continue
            ckpt = model_pt if init == "pretrained" else None
            args = fairseq_args(bin_dir, recipe, n_train, seed=seed, checkpoint=ckpt, cpu=cpu,
                                arch=arch)
            if log:
                print(f"finetune fairseq: running {experiment}/{name} "
                      f"({recipe.total_updates(n_train)} updates, {'CPU' if cpu else 'GPU'})")
            with record_run(experiment, name, framework="fairseq", init=init, seed=seed,
                            hyperparameters=hyper, data=[bin_dir], checkpoint=ckpt,
                            runs_root=runs_root, overwrite=True,
                            extra={"checkpoint_source": source} if ckpt else None) as handle:
                # The subprocess trusts the checkpoint through its manifest, like this process.
                run_fairseq_train(handle, args, env={
                    trust.TRUSTED_MANIFESTS_ENV: str(ckpt_dir / checkpoints.MANIFEST_FILE)})
                text = (handle.run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
                handle.manifest["throughput"] = log_rates(text)
            done.append(target)
    return done


def add_finetune_parser(sub) -> None:
    """Register ``finetune fairseq`` under the ``finetune`` command group."""
    p = sub.add_parser("fairseq", help="Tasks 3-4: the lab's fairseq-train recipe, seeds x inits")
    p.add_argument("--init", nargs="+", choices=INITS, default=list(INITS))
    p.add_argument("--seeds", nargs="+", type=seed_arg, default=[0, 1, 2])
    p.add_argument("--data", type=resolved_folder, help="binarized CLS-Books (default: binarize-cls's)")
    p.add_argument("--checkpoint", type=folder,
                   help="packaged checkpoint folder (default: data/checkpoints/roberta-small-fr)")
    p.add_argument("--epochs", type=positive_int, default=LAB_RECIPE.epochs,
                   help="shorter runs for a smoke test (the lab: 5)")
    p.add_argument("--experiment", type=experiment_name,
                   help=f"run-cache folder (default: {EXPERIMENT}, or {EXPERIMENT}-<N>ep for "
                        f"shorter runs); e.g. {CANDIDATE_EXPERIMENT} to try a --checkpoint that "
                        "is not the packaged one without touching the grid")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="runs side by side, the CPU threads (or the GPUs) split between them; "
                        "each run's output goes to data/work/job-logs/<experiment>/<run>.log")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    recipe = replace(LAB_RECIPE, epochs=args.epochs)
    experiment = args.experiment or (
        EXPERIMENT if args.epochs == LAB_RECIPE.epochs else f"{EXPERIMENT}-{args.epochs}ep")
    if args.jobs > 1:
        return _run_jobs(args, experiment)
    finetune_grid(tuple(args.init), tuple(args.seeds), bin_dir=args.data,
                  checkpoint_dir=args.checkpoint, recipe=recipe, experiment=experiment)
    return 0


def _run_jobs(args: argparse.Namespace, experiment: str) -> int:
    """``--jobs N``: each (init, seed) is this same command for that one run, N at a time."""
    common = ["--epochs", str(args.epochs), "--experiment", experiment]
    if args.data:
        common += ["--data", str(args.data)]
    if args.checkpoint:
        common += ["--checkpoint", str(Path(args.checkpoint).resolve())]
    logs = paths().work / "job-logs" / experiment
    grid = [jobs.Job(run_name(init, seed),
                     jobs.cli("finetune", "fairseq", "--init", init, "--seeds", str(seed),
                              *common),
                     logs / f"{run_name(init, seed)}.log")
            for init in args.init for seed in args.seeds]
    label = f"finetune fairseq ({experiment})"
    try:
        results = jobs.run_parallel(grid, args.jobs, label=label)
    except KeyboardInterrupt:
        print(f"{label}: interrupted; the runs that were going are marked interrupted",
              file=sys.stderr)
        return 130
    return jobs.report(results, label)
