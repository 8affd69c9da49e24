"""LoRA against full fine-tuning of RoBERTa-small-fr on CLS-Books (``finetune-lab finetune lora``).

One experiment, ``data/runs/lora/<method>-seed<seed>/``, whose runs differ by *method* only
(:data:`METHODS`): LoRA on the query and value projections (``lora-qv``) or on every attention
projection (``lora-attn``), full fine-tuning (``full``), and ``lora-qv`` on a 4-bit NF4 base
(``qlora-qv``: on the GPU, or through bitsandbytes' CPU kernels). A ``full`` run is exactly a
Transformers run from the pretrained checkpoint, so by default the chapter takes that row from
the Transformers experiment (:data:`FULL_BASELINE`) instead of making the same runs twice.

The recipe is the Transformers runs', reused rather than copied
(:func:`finetune_lab.train.hf_finetune.finetune_transformers`); the one value that differs is the
LoRA methods' peak learning rate, :data:`LORA_LR`. Under LoRA the new classification head is
trained in full (``modules_to_save=["classifier"]``). The experiment pins an ``experiment.json``
from its first run (shared hyperparameters, and :data:`VARYING`, what the methods vary on
purpose). Reading the runs back and the chapter's tables are :mod:`finetune_lab.book.lora_cls_runs`
and :mod:`finetune_lab.book.lora_cls_report`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_lab.argtypes import (experiment_name, folder, positive_float, positive_int,
                                   seed_arg)
from finetune_lab.errors import UserError
from finetune_lab.models.four_bit import bitsandbytes_available, keep_cpu_4bit_trainable
from finetune_lab.models.lora_configs import LAB_BNB, LAB_LORA, bnb_config, lora_config
from finetune_lab.models.params import SMALL, RobertaSize
from finetune_lab.runs.experiments import write_new_config
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.runs.recording import run_dir_for
from finetune_lab.runs.registry import (
    EXPERIMENT_CONFIG,
    VARYING_KEYS,
    differing_hyperparameters,
    read_experiment_config,
    validate_run,
)
from finetune_lab.train import hf_finetune
from finetune_lab.train.recipe import LAB_RECIPE, FinetuneRecipe

EXPERIMENT = "lora"
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_METHODS = ("lora-qv", "lora-attn", "qlora-qv")
"""What ``finetune lora`` makes by default; the ``full`` row comes from :data:`FULL_BASELINE`."""
FULL_BASELINE = "transformers"
"""The experiment whose ``pretrained`` runs are the full fine-tuning row when this experiment
has no ``full`` runs of its own (:func:`finetune_lab.book.lora_cls_runs.baseline_full_runs`)."""

LORA_R = 16
LORA_ALPHA = 32
LORA_DROPOUT = LAB_LORA["lora_dropout"]
LORA_LR = 5e-4
"""Peak learning rate of the LoRA methods. Full fine-tuning keeps the lab's 1e-5; a low-rank
update starting from B = 0 moves far more slowly at that rate, and the LoRA paper fine-tuned
RoBERTa-base with LoRA at 5e-4 (its Table 9, SST-2 and most GLUE tasks). The schedule (warm-up,
decay, epochs, batch) is the lab's; only its peak differs, and it is recorded as ``lr``."""

BNB_SKIP = ["classifier"]
"""Kept in full precision under 4-bit loading: the new head is trained in full."""

VARYING = ("method", "lr", "lora", "quantization")
"""The hyperparameters that differ between methods by design (seed and init aside)."""


@dataclass(frozen=True)
class Method:
    """One way of fine-tuning: which linear layers get adapters (``None``: all weights train)."""

    name: str
    label: str
    targets: tuple[str, ...] | None
    quantized: bool = False

    @property
    def is_lora(self) -> bool:
        return self.targets is not None

    def lr(self, recipe: FinetuneRecipe = LAB_RECIPE, lora_lr: float = LORA_LR) -> float:
        return lora_lr if self.is_lora else recipe.lr

    def lora_settings(self) -> dict[str, Any] | None:
        """The ``LoraConfig`` arguments (the lab's, with this method's targets and the head)."""
        if not self.is_lora:
            return None
        return {"r": LORA_R, "lora_alpha": LORA_ALPHA, "lora_dropout": LORA_DROPOUT,
                "bias": LAB_LORA["bias"], "target_modules": list(self.targets or ()),
                "modules_to_save": ["classifier"], "task_type": "SEQ_CLS"}

    def quantization(self) -> dict[str, Any] | None:
        return {**LAB_BNB, "llm_int8_skip_modules": list(BNB_SKIP)} if self.quantized else None


QV = ("query", "value")
ATTN = ("query", "key", "value", "attention.output.dense")
METHODS: dict[str, Method] = {
    "lora-qv": Method("lora-qv", "LoRA, query + value", QV),
    "lora-attn": Method("lora-attn", "LoRA, all attention projections", ATTN),
    "full": Method("full", "full fine-tuning", None),
    "qlora-qv": Method("qlora-qv", "QLoRA (4-bit NF4 base), query + value", QV, quantized=True),
}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"method {name!r} is not one of {', '.join(METHODS)}") from None


def run_name(method: str, seed: int) -> str:
    return f"{method}-seed{seed}"


def run_command(methods: Sequence[str] = DEFAULT_METHODS, seeds: Sequence[int] = DEFAULT_SEEDS
                ) -> str:
    """The command line that makes the runs this chapter reads."""
    return ("finetune-lab finetune lora --methods " + " ".join(methods)
            + " --seeds " + " ".join(str(s) for s in seeds))


RUN_COMMAND = run_command()
FULL_COMMAND = "finetune-lab finetune transformers --init pretrained --seeds " + " ".join(
    str(s) for s in DEFAULT_SEEDS)
"""Makes the full fine-tuning row (the Transformers chapter's pretrained runs)."""


# --- parameter counts ----------------------------------------------------------------------


def head_parameters(size: RobertaSize | None = None) -> int:
    """The classification head: ``dense`` d x d + d and ``out_proj`` d x C + C."""
    size = size if size is not None else SMALL
    return size.dim * size.dim + size.dim + size.dim * size.classes + size.classes


def analytic_counts(method: Method, dim: int, layers: int, classes: int, total: int
                    ) -> tuple[int, int]:
    """``(trainable, all)`` as peft counts them, from the formula.

    Every adapted RoBERTa projection maps ``d -> d``, so each adds ``r (d + d)``; the head
    (``dense`` d x d + d, ``out_proj`` d x C + C) is trained as a copy that peft counts in both
    numbers. ``total`` is the plain classifier's parameter count.
    """
    if not method.is_lora:
        return total, total
    lora = layers * len(method.targets or ()) * LORA_R * (dim + dim)
    head = dim * dim + dim + dim * classes + classes  # = head_parameters()
    return lora + head, total + lora + head


def wrap(model, method: Method):
    """peft-wrap ``model`` for ``method`` (the model itself for full fine-tuning)."""
    if not method.is_lora:
        return model
    from peft import get_peft_model

    return get_peft_model(model, lora_config(**method.lora_settings()))


# --- one run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _record_method(handle, method: Method):
    """Name the method in the manifest's ``extra`` (counts, memory and time are recorded for
    every Transformers run by :func:`finetune_lab.runs.runmeasure.measure_run`)."""
    handle.manifest.setdefault("extra", {})["method"] = method.name
    yield


def _four_bit_kwargs(method: Method) -> dict[str, Any] | None:
    """Loading arguments of a quantised method: the lab's NF4 config, on the GPU when there is
    one, else on the CPU (bitsandbytes' CPU kernels; the bf16 compute uses AMX where the CPU
    has it)."""
    if not method.quantized:
        return None
    import torch

    if not bitsandbytes_available():
        raise UserError(f"{method.name} needs bitsandbytes, which does not import here; "
                        "install it (pip install bitsandbytes) or leave qlora-qv out of --methods")
    return {"quantization_config": bnb_config(llm_int8_skip_modules=list(BNB_SKIP)),
            "device_map": {"": 0} if torch.cuda.is_available() else "cpu"}


def finetune_lora(
    method: str,
    seed: int,
    *,
    cls_dir: Path | None = None,
    tokenizer_dir: Path | None = None,
    model_dir: Path | None = None,
    recipe: FinetuneRecipe = LAB_RECIPE,
    lora_lr: float = LORA_LR,
    logging_steps: int | None = None,
    runs_root: Path | None = None,
    experiment: str = EXPERIMENT,
    overwrite: bool = False,
) -> Path:
    """One recorded run ``<runs root>/<experiment>/<method>-seed<seed>/`` from the converted
    pretrained RoBERTa-small-fr (``model_dir``, default: converted from the packaged checkpoint).

    The Trainer recipe is :func:`finetune_lab.train.hf_finetune.finetune_transformers`'s, with the
    method's peak learning rate; the model is peft-wrapped for the LoRA methods.
    """
    m = get_method(method)
    run_recipe = dataclasses.replace(recipe, lr=m.lr(recipe, lora_lr))
    def adapt(model):
        if m.quantized:
            from peft import prepare_model_for_kbit_training

            keep_cpu_4bit_trainable(model)  # else the first evaluation breaks training on CPU
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        return wrap(model, m)

    run_dir = hf_finetune.finetune_transformers(
        "pretrained", seed, cls_dir=cls_dir, tokenizer_dir=tokenizer_dir, model_dir=model_dir,
        recipe=run_recipe,
        logging_steps=logging_steps if logging_steps is not None else hf_finetune.DEFAULT_LOGGING_STEPS,
        runs_root=runs_root, experiment=experiment, run=run_name(m.name, seed),
        overwrite=overwrite, model_kwargs=_four_bit_kwargs(m), adapt_model=adapt,
        extra_hyperparameters={"method": m.name, "lora": m.lora_settings(),
                               "quantization": m.quantization()},
        run_context=lambda handle: _record_method(handle, m))
    pin_experiment(run_dir)
    return run_dir


def pin_experiment(run_dir: Path) -> Path:
    """Write ``experiment.json`` from the first run (shared hyperparameters + what varies);
    later runs must agree with it, or the registry flags them (refused here, loudly)."""
    hp = read_manifest(run_dir)["hyperparameters"]
    varying = sorted(VARYING)
    shared = {k: v for k, v in hp.items() if k not in set(varying) | VARYING_KEYS}
    exp_dir = Path(run_dir).parent
    config = read_experiment_config(exp_dir)
    if config is None:
        write_new_config(exp_dir, {
            "hyperparameters": shared, "varying": varying,
            "note": "pinned from the first run; the methods differ in 'varying' by design"},
            skip=Path(run_dir).name)
    else:
        differ = differing_hyperparameters(config, shared)
        if differ:
            raise UserError(f"{run_dir} was trained with hyperparameters {differ} unlike the "
                            f"other runs ({exp_dir / EXPERIMENT_CONFIG}); the registry will "
                            "exclude it. Use another --runs-root or experiment to change them.")
    return exp_dir / EXPERIMENT_CONFIG


# --- CLI ------------------------------------------------------------------------------------


def add_finetune_parser(finetune_subparsers: argparse._SubParsersAction) -> None:
    """Register ``finetune lora`` under the lead's ``finetune`` group."""
    p = finetune_subparsers.add_parser(
        "lora", help="LoRA vs full fine-tuning of RoBERTa-small-fr on CLS-Books (same recipe)",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(DEFAULT_METHODS),
                   help="qlora-qv needs bitsandbytes (a GPU, or its 4-bit CPU kernels)")
    p.add_argument("--seeds", type=seed_arg, nargs="+", default=list(DEFAULT_SEEDS))
    p.add_argument("--lora-lr", type=positive_float, default=LORA_LR,
                   help=f"peak learning rate of the LoRA methods (default {LORA_LR:g}; "
                        f"full fine-tuning keeps the lab's {LAB_RECIPE.lr:g})")
    p.add_argument("--cls-dir", type=folder, default=None, help="cls.books folder (default: work dir)")
    p.add_argument("--model-dir", type=folder, default=None,
                   help="converted model (default: <work dir>/hf/roberta-small-fr)")
    p.add_argument("--tokenizer-dir", type=folder, default=None)
    p.add_argument("--logging-steps", type=positive_int, default=None)
    p.add_argument("--runs-root", type=folder, default=None)
    p.add_argument("--epochs", type=positive_int, default=LAB_RECIPE.epochs,
                   help="shorter runs for a smoke test, recorded as lora-<N>ep (the lab: 5)")
    p.add_argument("--experiment", type=experiment_name, help=f"run-cache folder (default: {EXPERIMENT}, with "
                   "-<N>ep and -lr<LR> for other epochs and LoRA learning rates)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    recipe = dataclasses.replace(LAB_RECIPE, epochs=args.epochs)
    experiment = EXPERIMENT
    if args.epochs != LAB_RECIPE.epochs:
        experiment += f"-{args.epochs}ep"
    if args.lora_lr != LORA_LR:  # another LoRA learning rate is another experiment
        experiment += f"-lr{args.lora_lr:g}"
    experiment = args.experiment or experiment
    for method in args.methods:
        for seed in args.seeds:
            target = run_dir_for(experiment, run_name(method, seed), args.runs_root)
            if (target / "manifest.json").is_file() and validate_run(target).valid:
                print(f"finetune lora: {experiment}/{target.name} is complete; skipped")
                continue
            out = finetune_lora(
                method, seed, cls_dir=args.cls_dir, tokenizer_dir=args.tokenizer_dir,
                model_dir=args.model_dir, recipe=recipe, lora_lr=args.lora_lr,
                logging_steps=args.logging_steps, runs_root=args.runs_root,
                experiment=experiment, overwrite=True)
            print(f"finetune lora: wrote {out}")
    return 0
