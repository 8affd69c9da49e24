"""BLOOM-560m without its weights: the published configuration, its shape, and tiny stand-ins.

BLOOM-560m's weights cannot be downloaded where this book is built, and counting its parameters
does not need them: the model is built from its published ``config.json`` on PyTorch's ``meta``
device (shapes, no storage). :class:`BloomShape` holds the numbers the chapter's formulas use;
:func:`tiny_bloom_config` and :func:`make_tiny_bloom` give a same-architecture model small
enough for CPU checks and for the CI run of ``finetune-lab lora-qa``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_lab.data.qa_prompts import QAPair, lab_format_example, load_faq
from finetune_lab.render_cache import per_render

BLOOM_560M: dict[str, Any] = {
    "vocab_size": 250_880,
    "hidden_size": 1024,
    "n_layer": 24,
    "n_head": 16,
    "layer_norm_epsilon": 1e-5,
    "initializer_range": 0.02,
    "apply_residual_connection_post_layernorm": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "pretraining_tp": 1,
    "slow_but_exact": False,
    "use_cache": True,
    "tie_word_embeddings": True,
    "unk_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
}
"""The published configuration of ``bigscience/bloom-560m`` (its ``config.json``)."""

BLOOM_LINEARS: dict[str, tuple[int, int]] = {
    "query_key_value": (1, 3),
    "dense": (1, 1),
    "dense_h_to_4h": (1, 4),
    "dense_4h_to_h": (4, 1),
}
"""The ``nn.Linear`` layers of one BLOOM block: (in, out) features in multiples of the width."""

RANDOM_INIT_FLAG = "finetune_lab_random_init"
"""Set in the ``config.json`` of a model written by :func:`make_tiny_bloom` (weights random)."""


def bloom_config(**overrides: Any):
    """``BloomConfig`` of BLOOM-560m, any value overridden (e.g. a tiny one for tests)."""
    from transformers import BloomConfig

    return BloomConfig(**{**BLOOM_560M, **overrides})


def meta_bloom(config=None):
    """``BloomForCausalLM`` on the meta device: every tensor has its shape and no storage."""
    import torch
    from transformers import BloomForCausalLM

    with torch.device("meta"):
        return BloomForCausalLM(config if config is not None else bloom_config())


def tiny_bloom_config(vocab_size: int = 256, **overrides: Any):
    """A 2-block, width-64 BLOOM configuration (same architecture, tiny): for CPU checks."""
    return bloom_config(vocab_size=vocab_size, hidden_size=64, n_layer=2, n_head=4, **overrides)


@dataclass(frozen=True)
class BloomShape:
    """The numbers of a BLOOM configuration that the formulas use."""

    vocab: int
    d: int
    layers: int

    @classmethod
    @per_render
    def of(cls, config=None) -> "BloomShape":
        cfg = config if config is not None else bloom_config()
        return cls(vocab=cfg.vocab_size, d=cfg.hidden_size, layers=cfg.n_layer)

    @property
    def total(self) -> int:
        """``V d + 4d + L (12 d^2 + 13 d)``: embeddings (tied with the LM head), the embedding
        and final LayerNorms, and per block four Linear layers with biases and two LayerNorms."""
        d = self.d
        return self.vocab * d + 4 * d + self.layers * (12 * d * d + 13 * d)

    @property
    def linear_weights(self) -> int:
        """``L \\cdot 12 d^2``: what 4-bit loading quantises (every block Linear's weight)."""
        return self.layers * 12 * self.d * self.d

    @property
    def biases(self) -> int:
        """Every tensor named ``bias``: Linear biases ``9d`` and two LayerNorms ``2d`` per block,
        plus the embedding and final LayerNorms."""
        return self.layers * (9 * self.d + 2 * self.d) + 2 * self.d

    @property
    def embedding_share(self) -> float:
        """The tied token embedding's share of all parameters (``V d / total``)."""
        return self.vocab * self.d / self.total

    def lora(self, r: int, targets: Iterable[str]) -> int:
        """``L \\sum r (d_in + d_out)``: A is r x d_in, B is d_out x r, per adapted Linear."""
        total = 0
        for name in targets:
            i, o = BLOOM_LINEARS[name]
            total += r * (i + o) * self.d
        return self.layers * total

    def lora_only_biases(self, targets: Iterable[str]) -> int:
        """``bias="lora_only"``: the biases of the adapted Linear layers only."""
        return self.layers * sum(BLOOM_LINEARS[t][1] * self.d for t in targets)


def make_tiny_bloom(out_dir: Path | str, pairs: Sequence[QAPair] | None = None,
                    vocab_size: int = 400, seed: int = 0) -> Path:
    """Write a tiny random-weight BLOOM and a byte-level BPE tokenizer to ``out_dir``.

    The tokenizer is trained on the FAQ itself with BLOOM's special tokens at BLOOM's ids
    (``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, ``<pad>`` 3), since BLOOM's cannot be downloaded. The
    config carries ``finetune_lab_random_init: true`` so that runs record ``init="random"``.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import BloomForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pairs = list(pairs) if pairs is not None else load_faq()
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([lab_format_example(p.question, p.answer) for p in pairs],
                            trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    cfg = tiny_bloom_config(vocab_size=len(fast))
    setattr(cfg, RANDOM_INIT_FLAG, True)
    BloomForCausalLM(cfg).save_pretrained(out)
    return out
