"""Task 5: fine-tune with the Transformers ``Trainer`` under the fairseq runs' *effective* recipe.

run_glue.py with its defaults is not the fairseq recipe. Every place where they differ is named
by :func:`finetune_lab.train.hf_defaults.hf_vs_fairseq_defaults` (Trainer defaults read live from
``TrainingArguments``) and matched in :func:`training_arguments` / :class:`ParityTrainer`:

* Adam betas (0.9, 0.98) and eps 1e-8, weight decay 0.01 on **every** parameter: fairseq's
  ``--optimizer adam`` (``fairseq.optim.adam.Adam``) decays decoupled from the gradient, as
  AdamW does (``p -= lr * wd * p`` before the Adam step), and its parameter list has no
  exclusions; the Trainer by default exempts biases and LayerNorm weights, so
  :class:`ParityTrainer` decays all of them;
* no gradient clipping (fairseq ``--clip-norm 0``; Trainer default 1.0 -> ``max_grad_norm=0``);
* warm-up: the recipe's integer updates (``int(0.06 * total)``), not ``warmup_ratio`` (which
  the Trainer rounds *up*), then linear decay to 0 over the same total;
* dropout 0.1 / attention dropout 0.1 / classifier (pooler) dropout 0 as fairseq's RoBERTa;
* inputs: ``<s> pieces </s>`` truncated to the first 256 tokens (:mod:`finetune_lab.models.hf_tokenizer`).

Validation *and* test are evaluated after every epoch (fairseq ``--valid-subset valid,test``);
accuracy is logged in percent as fairseq logs it, so both frameworks' logs share units. Nothing
is checkpointed: the best epoch is chosen from the logs (:mod:`finetune_lab.runs.seedstats`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from finetune_lab._files import sha256_file
from finetune_lab.argtypes import experiment_name, folder, positive_int, seed_arg
from finetune_lab.data.split_checks import read_checked_splits
from finetune_lab.data.cls_books import default_output as default_cls
from finetune_lab.data.cls_books import read_split
from finetune_lab.data.tokenizer import default_output as default_tok
from finetune_lab.errors import UserError
from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
from finetune_lab.models.conversion_record import (CONVERTED_FROM, converted_from,
                                                  converted_from_record)
from finetune_lab.models.conversion_check import conversion_problem, require_conversion
from finetune_lab.models.hf_convert import convert_checkpoint, default_hf_dir, hf_model_config
from finetune_lab.models.hf_tokenizer import FairseqIdTokenizer, pad_batch
from finetune_lab.models.params import SMALL
from finetune_lab.runs.experiments import refuse_other_recipe
from finetune_lab.runs.recording import record_run, run_dir_for
from finetune_lab.runs.registry import validate_run
from finetune_lab.runs.runmeasure import measure_run
from finetune_lab.train.recipe import LAB_RECIPE, FinetuneRecipe

EXPERIMENT = "transformers"
FRAMEWORK = "transformers"
INITS = ("pretrained", "random")
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_LOGGING_STEPS = 25
EVAL_BATCH_SIZE = 32
OPTIM = "adamw_torch"


# --- data -----------------------------------------------------------------------------------


class ReviewDataset:
    """Token ids + label per review, encoded once (a plain list: the Trainer only indexes it)."""

    def __init__(self, ids: Sequence[Sequence[int]], labels: Sequence[int]):
        if len(ids) != len(labels):
            raise UserError(f"{len(ids)} reviews but {len(labels)} labels")
        self.items = [{"input_ids": list(i), "labels": int(y)} for i, y in zip(ids, labels)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


def collate(features: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Right-pad with ``<pad>`` (1) like fairseq; Transformers derives positions from it."""
    import torch

    batch = pad_batch([f["input_ids"] for f in features])
    batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)
    return batch


def load_splits(cls_dir: Path, tok) -> dict[str, ReviewDataset]:
    """The three CLS-Books splits, tokenized exactly as fairseq sees them; none trains on the
    test reviews (:func:`~finetune_lab.data.split_checks.read_checked_splits`)."""
    splits = read_checked_splits(Path(cls_dir))
    return {split: ReviewDataset(tok(reviews), labels)
            for split, (reviews, labels) in splits.items()}


def compute_metrics(eval_pred) -> dict[str, float]:
    """Accuracy in percent, as fairseq's sentence_prediction criterion logs it."""
    import numpy as np

    logits, labels = eval_pred.predictions, eval_pred.label_ids
    logits = logits[0] if isinstance(logits, tuple) else logits
    return {"accuracy": float(100.0 * (np.argmax(logits, axis=-1) == labels).mean())}


# --- the recipe -----------------------------------------------------------------------------


def hyperparameters(recipe: FinetuneRecipe, n_train: int, logging_steps: int,
                    size: dict | None = None) -> dict[str, Any]:
    """What the manifest records: the shared recipe, its schedule, and how the Trainer applies it."""
    hp = recipe.as_dict(n_train)
    hp.update(
        trainer_optim=OPTIM,
        trainer_lr_scheduler_type="linear",
        trainer_warmup_steps=recipe.warmup_updates(n_train),
        trainer_max_grad_norm=0.0,
        trainer_weight_decay_applies_to="all parameters (as fairseq)",
        trainer_classifier_dropout=0.0,
        trainer_logging_steps=logging_steps,
        trainer_eval_batch_size=EVAL_BATCH_SIZE,
        accuracy_unit="percent",
    )
    if size is not None:
        hp["model_size"] = size
    return hp


def training_arguments(recipe: FinetuneRecipe, n_train: int, seed: int, output_dir: Path,
                       logging_steps: int = DEFAULT_LOGGING_STEPS):
    """``TrainingArguments`` with every run_glue default that differs from fairseq overridden."""
    import torch
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=recipe.batch_size,
        per_device_eval_batch_size=EVAL_BATCH_SIZE,
        num_train_epochs=recipe.epochs,
        learning_rate=recipe.lr,
        lr_scheduler_type="linear",
        warmup_steps=recipe.warmup_updates(n_train),
        optim=OPTIM,
        adam_beta1=recipe.adam_betas[0],
        adam_beta2=recipe.adam_betas[1],
        adam_epsilon=recipe.adam_eps,
        weight_decay=recipe.weight_decay,
        max_grad_norm=recipe.clip_norm,  # 0: the Trainer skips clipping, as fairseq --clip-norm 0
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=logging_steps,
        report_to="none",  # our own TensorBoard writer points into the run folder
        seed=seed,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),  # pinned pages serve a GPU copy only
        remove_unused_columns=False,
        label_names=["labels"],
        disable_tqdm=True,
        log_level="warning",
    )


def _parity_trainer_class():
    from transformers import Trainer, TrainerCallback

    class ParityTrainer(Trainer):
        """Trainer with fairseq's weight-decay set and a per-epoch mean training loss."""

        def __init__(self, *args, test_dataset=None, **kwargs):
            super().__init__(*args, **kwargs)
            self._epoch_loss = None
            self._epoch_updates = 0
            self.add_callback(_EpochCallback(self, test_dataset))

        def get_decay_parameter_names(self, model) -> list[str]:
            """fairseq's Adam decays every parameter; the Trainer's default exempts some."""
            return [name for name, _ in model.named_parameters()]

        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            self._epoch_loss = loss if self._epoch_loss is None else self._epoch_loss + loss
            self._epoch_updates += 1
            return loss

    class _EpochCallback(TrainerCallback):
        """End of epoch: log the epoch's mean loss; after each validation, evaluate test."""

        def __init__(self, trainer, test_dataset):
            self.trainer, self.test_dataset, self._inside = trainer, test_dataset, False

        def on_epoch_end(self, args, state, control, **kwargs):
            t = self.trainer
            if t._epoch_updates:
                t.log({"epoch_loss": float(t._epoch_loss) / t._epoch_updates})
            t._epoch_loss, t._epoch_updates = None, 0

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if self._inside or self.test_dataset is None or "eval_accuracy" not in (metrics or {}):
                return
            self._inside = True
            try:
                self.trainer.evaluate(self.test_dataset, metric_key_prefix="test")
            finally:
                self._inside = False

    return ParityTrainer


def build_model(init: str, seed: int, recipe: FinetuneRecipe, *, model_dir: Path | None,
                size=None, vocab_size: int, model_kwargs: Mapping[str, Any] | None = None):
    """The classifier to fine-tune: converted pretrained weights, or a seeded random init.

    ``model_kwargs`` go to ``from_pretrained`` (e.g. a ``quantization_config``; pretrained only).
    """
    from transformers import RobertaForSequenceClassification, set_seed

    set_seed(seed)  # the classifier head (and a random init) draw from this
    if init == "pretrained":
        if model_dir is None:
            raise UserError("a pretrained init needs a converted model: pass --model-dir, or "
                            "let `finetune transformers` convert the packaged checkpoint")
        # (finetune_transformers, the one caller, held it to its conversion before any work)
        try:  # what the checks above cannot see is still one line (trial 27's E-m6)
            model = RobertaForSequenceClassification.from_pretrained(
                str(model_dir), num_labels=recipe.num_classes, classifier_dropout=0.0,
                hidden_dropout_prob=recipe.dropout,
                attention_probs_dropout_prob=recipe.attention_dropout, **dict(model_kwargs or {}))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise UserError(f"{model_dir} does not load as a converted model ({why}): convert "
                            f"it again (`finetune-lab convert-hf --out {model_dir} --force`)"
                            ) from None
    elif init == "random":
        if model_kwargs:
            raise UserError("model_kwargs (e.g. 4-bit loading) apply to pretrained weights only")
        size = size if size is not None else dataclasses.replace(SMALL, classes=recipe.num_classes)
        cfg = hf_model_config(size, recipe.dropout, recipe.attention_dropout)
        model = RobertaForSequenceClassification(cfg)
    else:
        raise UserError(f"--init must be one of {', '.join(INITS)}, not {init!r}")
    if model.config.vocab_size != vocab_size:
        raise UserError(f"the model has {model.config.vocab_size} embedding rows but the tokenizer "
                        f"gives {vocab_size} ids: use the tokenizer the model was trained with")
    return model


def ensure_converted() -> Path:
    """The default converted model, converting the packaged checkpoint on first use and again
    whenever the packaged checkpoint is replaced (a conversion of earlier weights would
    otherwise be fine-tuned under the new checkpoint's name), or the conversion is damaged (a
    file cut short or edited) or cannot be checked (made before ``conversion.json`` listed its
    files): it is scratch, so converted again, and what it held is kept beside it. The new
    conversion replaces the old one only once it is complete."""
    out = default_hf_dir()
    ckpt = packaged_dir() / MODEL_FILE
    damage = conversion_problem(out) if (out / "config.json").is_file() else None
    if not ckpt.is_file():  # nothing to convert (again) from
        if damage or not (out / "config.json").is_file():
            raise UserError(f"{damage or f'{out} holds no converted model'}; {ckpt}, which it is "
                            "converted from, is missing: restore it (`git checkout -- data/"
                            "checkpoints/roberta-small-fr`), or pass --model-dir")
        return out
    if (out / "config.json").is_file() and converted_from(out) == sha256_file(ckpt):
        if damage is None:
            return out
        print(f"{damage}: converting {out} again")
    elif out.exists():
        print(f"{out} was converted from other weights than {ckpt}: converting it again")
    # swapped in once complete; a damaged or unverified one (trial 28's E-m16) kept beside
    return convert_checkpoint(ckpt, out, ckpt.parent, force=bool(damage), keep_old=bool(damage))


def finetune_transformers(
    init: str,
    seed: int,
    *,
    cls_dir: Path | None = None,
    tokenizer_dir: Path | None = None,
    model_dir: Path | None = None,
    recipe: FinetuneRecipe = LAB_RECIPE,
    size=None,
    logging_steps: int = DEFAULT_LOGGING_STEPS,
    runs_root: Path | None = None,
    experiment: str = EXPERIMENT,
    run: str | None = None,
    overwrite: bool = False,
    model_kwargs: Mapping[str, Any] | None = None,
    adapt_model: Callable[[Any], Any] | None = None,
    extra_hyperparameters: Mapping[str, Any] | None = None,
    run_context: Callable[[Any], contextlib.AbstractContextManager] | None = None,
) -> Path:
    """One recorded run: ``<runs root>/<experiment>/<init>-seed<seed>/`` with TensorBoard events.

    ``tokenizer_dir`` defaults to the converted model's folder for ``pretrained`` (the tokenizer
    it was trained with) and to the work dir's ``tokenizer/`` for ``random``. ``size`` only
    matters for ``random`` (tests pass a tiny one).

    Hooks for variants of the recipe (the LoRA experiment, :mod:`finetune_lab.train.lora_cls`), all
    off by default: ``model_kwargs`` go to ``from_pretrained``; ``adapt_model(model)`` returns
    the model to train (e.g. peft-wrapped); ``extra_hyperparameters`` are recorded with the
    recipe's; ``run_context(handle)`` is entered around building the Trainer and training, inside
    the recorded run (e.g. to measure peak memory into ``handle.manifest``).
    """
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    cls_dir = Path(cls_dir) if cls_dir is not None else default_cls()
    read_split(cls_dir, "train")  # missing: said before a conversion of 40 s (trial 26's E-m10)
    if init == "pretrained":  # held to its conversion before any work (trial 27's E-m6)
        model_dir = require_conversion(Path(model_dir), tokenizer=tokenizer_dir is None) \
            if model_dir is not None else ensure_converted()
    if tokenizer_dir is None:
        tokenizer_dir = model_dir if init == "pretrained" else default_tok()
    tok = FairseqIdTokenizer.from_dir(tokenizer_dir, max_positions=recipe.max_positions)
    data = load_splits(cls_dir, tok)
    n_train = len(data["train"])
    model = build_model(init, seed, recipe, model_dir=model_dir, size=size,
                        vocab_size=tok.vocab_size, model_kwargs=model_kwargs)
    c = model.config  # recorded for both inits, so the registry can compare the runs
    hp = hyperparameters(recipe, n_train, logging_steps, size={
        "vocab": c.vocab_size, "dim": c.hidden_size, "layers": c.num_hidden_layers,
        "ffn": c.intermediate_size, "heads": c.num_attention_heads,
        "positions": c.max_position_embeddings, "classes": c.num_labels})
    if extra_hyperparameters:
        hp.update(extra_hyperparameters)
    refuse_other_recipe(run_dir_for(experiment, run or f"{init}-seed{seed}", runs_root).parent,
                        hp)  # an experiment.json that would reject the run: before training
    if adapt_model is not None:
        model = adapt_model(model)
    inputs = [cls_dir, tokenizer_dir]
    # the converted folder lives in the git-ignored work dir: the fairseq checkpoint it was
    # converted from is what says, on any machine, whether the run used the current one
    source = converted_from_record(model_dir) if init == "pretrained" else None
    with record_run(experiment, run or f"{init}-seed{seed}", framework=FRAMEWORK, init=init,
                    seed=seed, hyperparameters=hp, data=inputs,
                    checkpoint=model_dir if init == "pretrained" else None,
                    runs_root=runs_root, overwrite=overwrite,
                    extra={CONVERTED_FROM: source} if source else None) as handle:
        writer = SummaryWriter(log_dir=str(handle.run_dir))
        context = run_context(handle) if run_context is not None else contextlib.nullcontext()
        try:
            with measure_run(handle, model), context, tempfile.TemporaryDirectory(prefix="hf-trainer-") as scratch:
                trainer = _parity_trainer_class()(
                    model=model,
                    args=training_arguments(recipe, n_train, seed, Path(scratch), logging_steps),
                    train_dataset=data["train"], eval_dataset=data["valid"],
                    test_dataset=data["test"], data_collator=collate,
                    compute_metrics=compute_metrics,
                    callbacks=[TensorBoardCallback(tb_writer=writer)],
                )
                trainer.train()
        finally:
            writer.close()
    return handle.run_dir


# --- CLI ------------------------------------------------------------------------------------


def add_finetune_parser(finetune_subparsers: argparse._SubParsersAction) -> None:
    """Register ``finetune transformers`` under the lead's ``finetune`` group."""
    p = finetune_subparsers.add_parser(
        "transformers", help="Task 5: fine-tune with the Transformers Trainer (fairseq's recipe)",
        description=finetune_transformers.__doc__)
    p.add_argument("--init", choices=INITS, nargs="+", default=["pretrained"],
                   help="pretrained (converted checkpoint) and/or random")
    p.add_argument("--seeds", type=seed_arg, nargs="+", default=list(DEFAULT_SEEDS))
    p.add_argument("--cls-dir", type=folder, default=None, help="cls.books folder (default: work dir)")
    p.add_argument("--model-dir", type=folder, default=None,
                   help="converted model (default: <work dir>/hf/roberta-small-fr)")
    p.add_argument("--tokenizer-dir", type=folder, default=None)
    p.add_argument("--logging-steps", type=positive_int, default=DEFAULT_LOGGING_STEPS)
    p.add_argument("--runs-root", type=folder, default=None)
    p.add_argument("--epochs", type=positive_int, default=LAB_RECIPE.epochs,
                   help="shorter runs for a smoke test, recorded as transformers-<N>ep (the lab: 5)")
    p.add_argument("--experiment", type=experiment_name, help=f"run-cache folder (default: {EXPERIMENT}, or "
                   f"{EXPERIMENT}-<N>ep for shorter runs)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    recipe = dataclasses.replace(LAB_RECIPE, epochs=args.epochs)
    experiment = args.experiment or (
        EXPERIMENT if args.epochs == LAB_RECIPE.epochs else f"{EXPERIMENT}-{args.epochs}ep")
    for init in args.init:
        for seed in args.seeds:
            target = run_dir_for(experiment, f"{init}-seed{seed}", args.runs_root)
            if (target / "manifest.json").is_file() and validate_run(target).valid:
                print(f"finetune transformers: {experiment}/{target.name} is complete; skipped")
                continue
            out = finetune_transformers(
                init, seed, cls_dir=args.cls_dir, tokenizer_dir=args.tokenizer_dir,
                model_dir=args.model_dir, recipe=recipe, logging_steps=args.logging_steps,
                runs_root=args.runs_root, experiment=experiment, overwrite=True)
            print(f"finetune transformers: wrote {out}")
    return 0
