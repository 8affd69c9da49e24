"""run_glue's defaults against fairseq's and the lab's recipe, setting by setting.

The Transformers runs (:mod:`finetune_lab.train.hf_finetune`) match fairseq's *effective* recipe,
not run_glue's defaults. :func:`hf_vs_fairseq_defaults` reads the Trainer's defaults from the
installed ``TrainingArguments`` and fairseq's from its config classes, so the table the
Transformers chapter shows cannot drift from the libraries it describes.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab.data.cls_splits import train_size
from finetune_lab.models.fairseq_compat import quiet_import
from finetune_lab.render_cache import per_render
from finetune_lab.train.hf_finetune import OPTIM, training_arguments
from finetune_lab.train.recipe import LAB_RECIPE, FinetuneRecipe


def _trainer_defaults() -> dict[str, Any]:
    from transformers import TrainingArguments

    return {f.name: f.default for f in dataclasses.fields(TrainingArguments)}


def _fairseq_defaults() -> dict[str, Any]:
    """fairseq's own defaults, read from its config dataclasses and RoBERTa's base architecture."""
    quiet_import()
    from fairseq.dataclass.configs import OptimizationConfig
    from fairseq.models.roberta.model import base_architecture
    from fairseq.optim.adam import FairseqAdamConfig

    arch = argparse.Namespace()
    base_architecture(arch)
    opt = {f.name: f.default for f in dataclasses.fields(OptimizationConfig)}
    adam = {f.name: f.default for f in dataclasses.fields(FairseqAdamConfig)}
    return {"clip_norm": opt["clip_norm"], "adam_betas": adam["adam_betas"],
            "adam_eps": adam["adam_eps"], "weight_decay": adam["weight_decay"],
            "pooler_dropout": arch.pooler_dropout, "activation_dropout": arch.activation_dropout,
            "dropout": arch.dropout, "attention_dropout": arch.attention_dropout}


def ratio_warmup_steps(ratio: float, total: int) -> int:
    """The warm-up the installed Trainer gives a ratio: transformers 5 has no ``warmup_ratio``
    argument; a float ``warmup_steps`` in [0, 1) is the ratio, rounded up (``math.ceil``)."""
    from transformers import TrainingArguments

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, warmup_steps=ratio, report_to=[])
        return int(args.get_warmup_steps(total))


def _value(option: Any) -> str:
    """An enum option of ``TrainingArguments`` as the string a user types."""
    return str(getattr(option, "value", option))


@per_render
def hf_vs_fairseq_defaults(recipe: FinetuneRecipe = LAB_RECIPE, n_train: int | None = None) -> pd.DataFrame:
    """Each setting: Trainer/run_glue default (read live), fairseq default, lab recipe, our value.

    ``matched`` says whether the Transformers runs use the lab's effective value; ``n_train``
    defaults to the training reviews of the committed data summary.
    """
    from transformers import RobertaConfig

    if n_train is None:
        n_train = train_size()
    d = {k: _value(v) for k, v in _trainer_defaults().items()}
    fs = _fairseq_defaults()
    rc = RobertaConfig()
    total, warm = recipe.total_updates(n_train), recipe.warmup_updates(n_train)
    ours = training_arguments(recipe, n_train, 0, Path(tempfile.gettempdir()))
    betas = (ours.adam_beta1, ours.adam_beta2)
    hf_schedule_linear = _value(ours.lr_scheduler_type) == "linear"
    rows = [
        ("optimizer", f"{d['optim']} (AdamW)", "adam", recipe.optimizer, OPTIM,
         OPTIM.startswith("adamw"),
         "fairseq's Adam decays decoupled (p -= lr·wd·p before the step), as torch AdamW"),
        ("Adam betas", f"({d['adam_beta1']}, {d['adam_beta2']})", fs["adam_betas"],
         str(recipe.adam_betas), str(betas), betas == tuple(recipe.adam_betas), ""),
        ("Adam eps", d["adam_epsilon"], fs["adam_eps"], recipe.adam_eps, ours.adam_epsilon,
         ours.adam_epsilon == recipe.adam_eps,
         "same value; fairseq adds it to the bias-uncorrected √v (see text)"),
        ("weight decay", d["weight_decay"], fs["weight_decay"], recipe.weight_decay,
         ours.weight_decay, ours.weight_decay == recipe.weight_decay, ""),
        ("weight decay applies to", "all but biases and LayerNorm weights", "all parameters",
         "all parameters", "all parameters", True, "ParityTrainer.get_decay_parameter_names"),
        ("gradient clipping (max norm)", d["max_grad_norm"], fs["clip_norm"], recipe.clip_norm,
         ours.max_grad_norm, ours.max_grad_norm == recipe.clip_norm == 0,
         "0 disables clipping in both"),
        ("learning rate", d["learning_rate"], "(required)", recipe.lr, ours.learning_rate,
         ours.learning_rate == recipe.lr, ""),
        ("LR schedule", d["lr_scheduler_type"], "fixed", f"{recipe.lr_scheduler} (power 1)",
         "linear", hf_schedule_linear and recipe.lr_scheduler == "polynomial_decay",
         "linear warm-up from 0, linear decay to 0 (per-update values compared below)"),
        ("warm-up updates", d["warmup_steps"], 0, warm, ours.get_warmup_steps(total),
         ours.get_warmup_steps(total) == warm,
         f"int({recipe.warmup_ratio} × {total}); warmup_steps={recipe.warmup_ratio} (a ratio) "
         f"would give {ratio_warmup_steps(recipe.warmup_ratio, total)} (rounded up)"),
        ("total updates", "epochs × ⌈n / batch⌉", "(`--total-num-update`)", total,
         math.ceil(n_train / ours.per_device_train_batch_size) * int(ours.num_train_epochs),
         math.ceil(n_train / ours.per_device_train_batch_size) * int(ours.num_train_epochs) == total,
         f"n = {n_train} training reviews"),
        ("batch size", d["per_device_train_batch_size"], "(required)", recipe.batch_size,
         ours.per_device_train_batch_size, ours.per_device_train_batch_size == recipe.batch_size, ""),
        ("epochs", d["num_train_epochs"], "(`--max-epoch`)", recipe.epochs, ours.num_train_epochs,
         ours.num_train_epochs == recipe.epochs, ""),
        ("dropout", rc.hidden_dropout_prob, fs["dropout"], recipe.dropout, recipe.dropout, True, ""),
        ("attention dropout", rc.attention_probs_dropout_prob, fs["attention_dropout"],
         recipe.attention_dropout, recipe.attention_dropout, True, ""),
        ("classifier (pooler) dropout",
         f"{rc.classifier_dropout} (falls back to {rc.hidden_dropout_prob})",
         fs["pooler_dropout"], fs["pooler_dropout"], 0.0, fs["pooler_dropout"] == 0.0, ""),
        ("activation dropout", "(none)", fs["activation_dropout"], fs["activation_dropout"],
         "(none)", fs["activation_dropout"] == 0.0, "no dropout after the FFN activation in either"),
        ("max length (tokens)", "128 (run_glue.py `--max_seq_length`)", "(`--max-positions`)",
         recipe.max_positions, recipe.max_positions, True,
         "<s> pieces </s>, first 256 kept (fairseq `--shorten-method truncate`)"),
        ("evaluation", f"eval_strategy={d['eval_strategy']}", "every epoch (valid subsets)",
         "valid and test, every epoch", f"{_value(ours.eval_strategy)}: valid and test",
         _value(ours.eval_strategy) == "epoch", ""),
        ("checkpoint selection", f"save_strategy={d['save_strategy']}",
         "(`--best-checkpoint-metric`)", f"best valid {recipe.best_checkpoint_metric}",
         "no checkpoints; best valid epoch from the logs", True, ""),
    ]
    df = pd.DataFrame(rows, columns=["setting", "Trainer default", "fairseq default",
                                     "lab (fairseq run)", "Transformers run", "matched", "note"])
    for col in df.columns:
        if col != "matched":
            df[col] = df[col].astype(str)
    return df
