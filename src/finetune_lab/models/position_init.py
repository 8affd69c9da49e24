"""Sinusoidal values for RoBERTa's *learned* position table, as a starting point for training.

On the masked-LM plateau the packaged weights' position rows are still noise (neighbouring rows
no more alike than distant ones), so attention cannot tell a token's neighbours from the rest of
the sample and the model predicts from a bag of words. Writing Vaswani et al.'s sinusoids into
the table gives every position a vector whose dot products with the others depend on the
distance alone; the architecture stays the course's (a learned table, trained like any weight).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from finetune_lab._files import sha256_file, write_bytes_atomic
from finetune_lab.errors import UserError
from finetune_lab.models.trust import fairseq_safe_globals

POSITIONS_KEY = "encoder.sentence_encoder.embed_positions.weight"
TOKENS_KEY = "encoder.sentence_encoder.embed_tokens.weight"
PADDING_IDX = 1
"""fairseq's learned positions number tokens from ``padding_idx + 1``: row 2 is position 0."""
CHOICES = ("keep", "sinusoidal")


def sinusoidal_table(n_positions: int, dim: int):
    """Vaswani et al.'s table: row p holds sin(p w_i) in even columns, cos(p w_i) in odd ones,
    with w_i = 10000^(-2i/dim); every row has norm sqrt(dim / 2)."""
    import torch

    if dim % 2:
        raise ValueError(f"a sinusoidal table needs an even width (got {dim})")
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)
    return table


def neighbour_similarity(table, lag: int = 1) -> float:
    """Mean cosine similarity of position rows ``lag`` apart (rows from position 0 on): near 0
    for an untrained table, near 1 for a smooth one."""
    import torch

    rows = torch.nn.functional.normalize(table[PADDING_IDX + 1:].double(), dim=1)
    return float((rows[lag:] * rows[:-lag]).sum(1).mean())


def write_sinusoidal_positions(checkpoint: Path) -> dict[str, Any]:
    """Overwrite the position rows of a fairseq checkpoint file with sinusoids, in place (atomic).

    The rows are scaled to the token embeddings' mean row norm, so that after the embedding
    LayerNorm a position weighs as much as a word. Returns what a manifest records: the scale,
    the neighbour similarity before and after, and the new file's sha256.
    """
    import torch

    with fairseq_safe_globals():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model = state.get("model", {})
    if POSITIONS_KEY not in model or TOKENS_KEY not in model:
        raise UserError(f"{checkpoint} is not a RoBERTa checkpoint with learned positions (no "
                        f"{POSITIONS_KEY}); --position-init sinusoidal needs one")
    old = model[POSITIONS_KEY]
    norm = float(model[TOKENS_KEY].double().norm(dim=1).mean())
    n_positions = old.shape[0] - (PADDING_IDX + 1)
    table = sinusoidal_table(n_positions, old.shape[1])
    table *= norm / math.sqrt(old.shape[1] / 2)
    new = old.clone()
    new[PADDING_IDX + 1:] = table.to(old.dtype)
    model[POSITIONS_KEY] = new
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_bytes_atomic(checkpoint, buffer.getvalue())
    return {"position_init": "sinusoidal", "row_norm": round(norm, 4),
            "neighbour_cosine_before": round(neighbour_similarity(old), 4),
            "neighbour_cosine_after": round(neighbour_similarity(new), 4),
            "sha256": sha256_file(checkpoint)}
