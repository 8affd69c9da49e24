"""The lab's fine-tuning recipe, shared by the fairseq, Transformers and LoRA runs.

One definition, so that "the same hyperparameters" is true by construction. The schedule is
derived from the training-set size, never typed in: with the lab's 1800 training reviews,
batch 8 and 5 epochs give 1125 updates and 67 warm-up updates (6 %).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from finetune_lab.errors import UserError


@dataclass(frozen=True)
class FinetuneRecipe:
    """Task 3's hyperparameters (the course's fairseq command line)."""

    batch_size: int = 8
    epochs: int = 5
    lr: float = 1e-5
    warmup_ratio: float = 0.06
    lr_scheduler: str = "polynomial_decay"  # power 1: linear decay to 0
    optimizer: str = "adam"
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.01
    clip_norm: float = 0.0  # fairseq's default: no gradient clipping
    dropout: float = 0.1
    attention_dropout: float = 0.1
    max_positions: int = 256
    num_classes: int = 2
    best_checkpoint_metric: str = "accuracy"

    def updates_per_epoch(self, n_train: int) -> int:
        """fairseq and the Trainer both keep the last, smaller batch of an epoch."""
        if n_train <= 0:  # trial 26's E-m1: a ValueError's traceback
            raise UserError(f"the training split holds {n_train} reviews: prepare the split "
                            "again (`finetune-lab prepare-cls`, then `binarize-cls`)")
        return math.ceil(n_train / self.batch_size)

    def total_updates(self, n_train: int) -> int:
        return self.updates_per_epoch(n_train) * self.epochs

    def warmup_updates(self, n_train: int) -> int:
        """6 % of the total, rounded down as the lab did (1125 -> 67)."""
        return int(self.warmup_ratio * self.total_updates(n_train))

    def as_dict(self, n_train: int | None = None) -> dict:
        """All hyperparameters, plus the derived schedule when ``n_train`` is given."""
        out = asdict(self)
        out["adam_betas"] = list(self.adam_betas)
        if n_train is not None:
            out.update(n_train=n_train, total_updates=self.total_updates(n_train),
                       warmup_updates=self.warmup_updates(n_train))
        return out


LAB_RECIPE = FinetuneRecipe()
