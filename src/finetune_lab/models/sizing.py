"""The analytic parameter count of RoBERTa-small-fr, tensor group by tensor group, without
pandas or torch: the book's Question 1 (:mod:`finetune_lab.models.params`, which asserts it equal
to the real models' ``numel()``) and the run registry's check of a Transformers run's total
(:mod:`finetune_lab.runs.derived_counts`) count with the same formulas."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RobertaSize:
    """The course model's hyperparameters (``roberta_small`` in the course's fairseq fork)."""

    vocab: int = 32_000
    dim: int = 512
    layers: int = 4
    ffn: int = 512
    heads: int = 8
    positions: int = 258  # 256 usable + padding_idx (1) + 1: fairseq's learned-position rows
    classes: int = 2

    @property
    def max_positions(self) -> int:
        """What ``--max-positions`` is set to: the learned rows less fairseq's pad offset."""
        return self.positions - 2


SMALL = RobertaSize()


@dataclass(frozen=True)
class Component:
    """One group of tensors, its formula, and its analytic size."""

    key: str
    name: str
    part: str  # embeddings | encoder layers | LM head | classification head
    kind: str  # weight | bias | layernorm | weight + bias
    formula: str  # LaTeX, in the symbols of RobertaSize
    count: int


def components(size: RobertaSize = SMALL) -> list[Component]:
    """Every parameter tensor group of fairseq's RoBERTa with a classification head."""
    V, d, L, f, P, C = size.vocab, size.dim, size.layers, size.ffn, size.positions, size.classes
    return [
        Component("tok_emb", "token embeddings", "embeddings", "weight", "V d", V * d),
        Component("pos_emb", "learned positions", "embeddings", "weight", "P d", P * d),
        Component("emb_ln", "embedding LayerNorm", "embeddings", "layernorm", "2d", 2 * d),
        Component("attn_w", "Q, K, V, output projections", "encoder layers", "weight",
                  "L \\cdot 4d^2", L * 4 * d * d),
        Component("attn_b", "Q, K, V, output biases", "encoder layers", "bias",
                  "L \\cdot 4d", L * 4 * d),
        Component("ffn_w", "feed-forward matrices", "encoder layers", "weight",
                  "L \\cdot 2 d f", L * 2 * d * f),
        Component("ffn_b", "feed-forward biases", "encoder layers", "bias",
                  "L (f + d)", L * (f + d)),
        Component("layer_ln", "layer LayerNorms (2 per layer)", "encoder layers", "layernorm",
                  "L \\cdot 2 \\cdot 2d", L * 4 * d),
        Component("lm_dense", "LM head dense (weight + bias)", "LM head", "weight + bias",
                  "d^2 + d", d * d + d),
        Component("lm_ln", "LM head LayerNorm", "LM head", "layernorm", "2d", 2 * d),
        Component("lm_bias", "LM head output bias (decoder tied to token embeddings)",
                  "LM head", "bias", "V", V),
        Component("cls_dense", "classification dense (weight + bias)", "classification head",
                  "weight + bias", "d^2 + d", d * d + d),
        Component("cls_out", "classification output (weight + bias)", "classification head",
                  "weight + bias", "d C + C", d * C + C),
    ]


ENCODER_WEIGHTS = ("tok_emb", "pos_emb", "attn_w", "ffn_w")
ENCODER_ALL = ENCODER_WEIGHTS + ("emb_ln", "attn_b", "ffn_b", "layer_ln")
LM_HEAD = ("lm_dense", "lm_ln", "lm_bias")
CLS_HEAD = ("cls_dense", "cls_out")


def hf_classifier_total(size: RobertaSize = SMALL) -> int:
    """Transformers' ``RobertaForSequenceClassification``: the whole encoder, its one
    token-type row, and the classification head (no LM head)."""
    counts = {c.key: c.count for c in components(size)}
    return sum(counts[k] for k in ENCODER_ALL + CLS_HEAD) + size.dim
