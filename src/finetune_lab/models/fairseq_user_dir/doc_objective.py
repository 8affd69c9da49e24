"""Pretraining on whole documents, with ``<s>`` trained as their summary.

Why: fine-tuning (fairseq's ``sentence_prediction``) classifies a review from the last layer's
``<s>`` vector, but masked-LM pretraining never asks ``<s>`` to hold anything. The linear probes
of the pretraining chapter measured it: the best stand-in's frozen features held 74 % test
accuracy averaged over the tokens and 70 % at ``<s>``, no more than random weights. Two pieces
close that gap, both self-supervised (no label is read):

* ``masked_lm_docs``, a task: fairseq's ``masked_lm`` whose samples are whole lines (one review,
  one paragraph; ``--sample-break-mode eos``) cut to the model's positions, so that every sample
  starts with ``<s>`` as a fine-tuning input does (with ``none``, samples start mid-sentence);
* ``masked_lm_bow``, a criterion: the masked-LM loss plus, from the last layer's ``<s>``, the
  cross-entropy of the model's own masked-LM head against the sample's bag of words (its tokens,
  the ``bow_skip_top`` most frequent types of the dictionary left out), in the spirit of
  representative-word prediction (Ma et al. 2021, B-PROP) and of Condenser (Gao & Callan 2021),
  which train the ``[CLS]`` vector to stand for the text.

The logged ``loss`` stays the masked-LM loss alone (in bits per masked token), so that held-out
losses compare with runs without this objective; ``bow_loss`` is logged beside it.
"""

import math  # no `from __future__ import annotations`: fairseq reads the config's field types
from dataclasses import dataclass, field

import torch
from fairseq import modules
from fairseq.criterions import CRITERION_REGISTRY, FairseqCriterion, register_criterion
from fairseq.data import TruncateDataset
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics
from fairseq.tasks import TASK_REGISTRY, register_task
from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask
from omegaconf import II

TASK = "masked_lm_docs"
CRITERION = "masked_lm_bow"
BOW_SKIP_TOP = 100
"""The most frequent dictionary types left out of the bag (function words and frequent pieces,
which would otherwise be most of what ``<s>`` learns to predict)."""


class DocMaskedLMTask(MaskedLMTask):
    """``masked_lm`` with every sample cut to ``--tokens-per-sample`` tokens, ``<s>`` included.

    fairseq prepends ``<s>`` after its own shortening, so a line of ``tokens_per_sample`` tokens
    would become one token too long and be dropped from training without a word; cutting after
    the ``<s>`` keeps every review (the long ones lose their end, as in fine-tuning).
    """

    def _load_dataset_split(self, split, epoch, combine):
        dataset = super()._load_dataset_split(split, epoch, combine)
        return TruncateDataset(dataset, self.cfg.tokens_per_sample)


@dataclass
class MaskedLmBowConfig(FairseqDataclass):
    tpu: bool = II("common.tpu")
    bow_weight: float = field(default=8.0, metadata={
        "help": "weight of one sample's bag-of-words loss against one masked token's loss"})
    bow_skip_top: int = field(default=BOW_SKIP_TOP, metadata={
        "help": "leave the N most frequent types of the dictionary out of the bag"})


def bag_of_words(tokens: torch.Tensor, vocab: int, keep: torch.Tensor) -> torch.Tensor:
    """Each row's distribution over the vocabulary of its kept tokens (zeros for a row with none).

    ``keep`` is a boolean mask over the vocabulary (special and skipped types False).
    """
    counts = torch.zeros(tokens.size(0), vocab, dtype=torch.float32, device=tokens.device)
    counts.scatter_add_(1, tokens, keep[tokens].float())
    total = counts.sum(dim=1, keepdim=True)
    return counts / total.clamp(min=1.0)


class MaskedLmBowLoss(FairseqCriterion):
    """Masked-LM loss plus the ``<s>`` bag-of-words loss (module docstring)."""

    def __init__(self, cfg: MaskedLmBowConfig, task):
        super().__init__(task)
        self.bow_weight = cfg.bow_weight
        d = task.source_dictionary
        keep = torch.ones(len(d), dtype=torch.bool)
        keep[: d.nspecial] = False
        for idx in (d.bos(), d.eos(), d.pad(), d.unk(), getattr(task, "mask_idx", d.unk())):
            keep[idx] = False
        counts = torch.tensor(d.count, dtype=torch.float64)
        counts[~keep] = -1.0
        if cfg.bow_skip_top > 0:
            keep[torch.topk(counts, min(cfg.bow_skip_top, len(d))).indices] = False
        self.register_buffer("keep", keep, persistent=False)

    def forward(self, model, sample, reduce=True):
        src = sample["net_input"]["src_tokens"]
        target = sample["target"].clone()
        target[:, 0] = self.padding_idx  # <s> predicts the bag, not itself
        masked = target.ne(self.padding_idx)
        original = torch.where(masked, target, src)
        project = masked.clone()
        project[:, 0] = True
        logits = model(**sample["net_input"], masked_tokens=project)[0]
        is_first = torch.zeros_like(project)
        is_first[:, 0] = True
        first = is_first[project]  # which projected rows are <s>, in row-major order
        mlm_loss = modules.cross_entropy(logits[~first].float(), target[masked],
                                         reduction="sum", ignore_index=self.padding_idx)
        bag = bag_of_words(original, logits.size(-1), self.keep.to(src.device))
        bow_loss = -(bag * torch.log_softmax(logits[first].float(), dim=-1)).sum()
        bags = (bag.sum(dim=1) > 0).sum()
        sample_size = masked.int().sum()
        loss = mlm_loss + self.bow_weight * bow_loss
        logging_output = {
            "loss": mlm_loss.data, "bow_loss": bow_loss.data, "bags": bags.data,
            "ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
            "sample_size": sample_size,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        """The masked-LM loss as ``masked_lm`` logs it; the bag's loss in bits per sample."""
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        bow_sum = sum(log.get("bow_loss", 0) for log in logging_outputs)
        bags = sum(log.get("bags", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size,
                           round=3)
        metrics.log_scalar("bow_loss", bow_sum / max(bags, 1) / math.log(2), bags, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def register() -> None:
    """Register the task and the criterion once (the user dir may be imported twice)."""
    if TASK not in TASK_REGISTRY:
        register_task(TASK, dataclass=MaskedLMConfig)(DocMaskedLMTask)
    if CRITERION not in CRITERION_REGISTRY:
        register_criterion(CRITERION, dataclass=MaskedLmBowConfig)(MaskedLmBowLoss)
