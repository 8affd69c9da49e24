"""The fairseq chapter's command lines and schedule, built by the code that runs the grid.

The chapter shows the exact ``fairseq-train`` line one run of the grid executes, so it is built
with :func:`finetune_lab.train.finetune_fairseq.fairseq_args` for the runs' own size, recipe and
architecture (:func:`plan`), never typed in; the schedule table derives the updates and warm-up
from the training-set size as the recipe does.
"""

from __future__ import annotations

import inspect
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import pandas as pd

from finetune_lab.data.cls_splits import summary_path, train_size
from finetune_lab.book.report import project_path
from finetune_lab.data.binarize import default_output as default_bin
from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
from finetune_lab.runs.recording import run_dir_for
from finetune_lab.runs.registry import RunRecord
from finetune_lab.train import finetune_fairseq as ff
from finetune_lab.train.recipe import LAB_RECIPE, FinetuneRecipe

EXPERIMENT = ff.EXPERIMENT
INITS = ff.INITS
SEEDS: tuple[int, ...] = tuple(inspect.signature(ff.finetune_grid).parameters["seeds"].default)
FINETUNE_COMMAND = (f"finetune-lab finetune fairseq --init {' '.join(INITS)} "
                    f"--seeds {' '.join(map(str, SEEDS))}")
"""The command that makes the chapter's runs (the grid's defaults, spelled out)."""


@dataclass(frozen=True)
class Plan:
    """What one run of the grid executes: training-set size, recipe and architecture overrides."""

    n_train: int
    source: Path | None
    """The file ``n_train`` was read from; None when read from the runs' manifests."""
    recipe: FinetuneRecipe = LAB_RECIPE
    arch: dict[str, int] = field(default_factory=dict)


def plan(used: Sequence[RunRecord] = ()) -> Plan:
    """The runs' own size, recipe and architecture when the valid runs ``used`` agree on them;
    else the lab's.

    Without runs, ``n_train`` is read from the committed data summary
    (``data/summaries/data.json``, written by the data pipeline) and the recipe is
    :data:`recipe.LAB_RECIPE`, so that the command can be shown without the prepared data.
    """
    hps = {json.dumps(r.manifest["hyperparameters"], sort_keys=True) for r in used}
    if len(hps) == 1:
        hp = json.loads(hps.pop())
        names = {f.name for f in fields(FinetuneRecipe)}
        kw = {k: v for k, v in hp.items() if k in names}
        if "adam_betas" in kw:
            kw["adam_betas"] = tuple(kw["adam_betas"])
        return Plan(int(hp["n_train"]), None, FinetuneRecipe(**kw),
                    dict(hp.get("arch_overrides") or {}))
    summary = summary_path()
    if summary.is_file():
        return Plan(train_size(summary), summary)
    bin_dir = ff.require_cls_bin(default_bin())
    return Plan(ff.train_size(bin_dir), bin_dir)


def recipe_differences(p: Plan) -> list[str]:
    """The settings in which the runs differ from the lab's recipe (none for the lab's data)."""
    ours, lab = p.recipe.as_dict(), LAB_RECIPE.as_dict()
    diff = [f"{k} = {ours[k]} (the lab: {lab[k]})" for k in ours if ours[k] != lab[k]]
    return diff + [f"{k} = {v}" for k, v in sorted(p.arch.items())]


def default_checkpoint() -> Path:
    """The packaged stand-in checkpoint the pretrained runs start from."""
    return packaged_dir() / MODEL_FILE


def train_command(p: Plan, init: str = "pretrained", seed: int = SEEDS[0], *,
                  bin_dir: Path | None = None, cpu: bool = False,
                  runs_root: Path | None = None) -> list[str]:
    """The ``fairseq-train`` argument list one run of the grid executes.

    Built with :func:`finetune_fairseq.fairseq_args` for the default data and checkpoint paths;
    neither needs to exist. ``--tensorboard-logdir`` is the run's folder in the run cache.
    """
    ckpt = default_checkpoint() if init == "pretrained" else None
    args = ff.fairseq_args(bin_dir or default_bin(), p.recipe, p.n_train, seed=seed,
                           checkpoint=ckpt, cpu=cpu, arch=p.arch or None)
    logdir = run_dir_for(EXPERIMENT, ff.run_name(init, seed), runs_root)
    return ["fairseq-train", *args, "--tensorboard-logdir", str(logdir)]


def render_command(argv: list[str], width: int = 76) -> str:
    """Shell text, options (with their values) joined up to ``width`` characters a line, project
    paths made relative: a line, its indent and its `` \\`` fit the PDF's code width, so none
    wraps between a flag and its value."""
    shown = [project_path(a) if a.startswith("/") else a for a in argv]
    groups: list[list[str]] = []
    for tok in shown:
        if tok.startswith("--") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    lines: list[str] = []
    for g in groups:
        text = shlex.join(g)
        if lines and len(lines[-1]) + 1 + len(text) <= width:
            lines[-1] += " " + text
        else:
            lines.append(text)
    return " \\\n    ".join(lines)


def init_flags(p: Plan) -> list[str]:
    """The options the pretrained runs add to the random ones (computed from both lines)."""
    pre = train_command(p, "pretrained", 0)
    rnd = set(train_command(p, "random", 0))
    return [a for a in pre if a.startswith("--") and a not in rnd]


def schedule_table(p: Plan) -> pd.DataFrame:
    """The recipe's schedule derived from ``n_train``: updates, warm-up, peak learning rate."""
    n_train, recipe = p.n_train, p.recipe
    source = "the runs' manifests" if p.source is None else f"`{project_path(p.source)}`"
    rows = [
        ("training reviews", f"{n_train:,}", f"binarized training set, read from {source}"),
        ("batch size", f"{recipe.batch_size}", "recipe"),
        ("updates per epoch", f"{recipe.updates_per_epoch(n_train):,}",
         f"⌈{n_train:,} / {recipe.batch_size}⌉ (the last, smaller batch is kept)"),
        ("epochs", f"{recipe.epochs}", "recipe"),
        ("total updates", f"{recipe.total_updates(n_train):,}",
         f"{recipe.updates_per_epoch(n_train):,} × {recipe.epochs}"),
        ("warm-up updates", f"{recipe.warmup_updates(n_train)}",
         f"⌊{recipe.warmup_ratio:g} × {recipe.total_updates(n_train):,}⌋"),
        ("peak learning rate", f"{recipe.lr:g}",
         "reached at the end of warm-up, then linear decay to 0 at the last update"),
    ]
    return pd.DataFrame(rows, columns=["quantity", "value", "how"])
