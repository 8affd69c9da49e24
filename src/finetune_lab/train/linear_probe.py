"""What a checkpoint's frozen features already know of CLS-Books: a linear probe.

The lab's recipe (lr 1e-5, 5 epochs of batch 8) moves the encoder little: its training loss is
still far from zero when it stops. So fine-tuned accuracy is mostly what the weights bring before
fine-tuning. A logistic regression on frozen features measures that directly, in minutes instead
of the fine-tune's forty, with random initialisation as its baseline: the ``<s>`` vector the
classification head reads, and the mean over the review's tokens (which the head never sees).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from finetune_lab.argtypes import folder, record_name, seed_arg
from finetune_lab._files import sha256_file, utc_now, write_record
from finetune_lab.config import check_new_record, paths
from finetune_lab.data.cls_books import default_output as default_cls_dir
from finetune_lab.data.split_checks import read_checked_splits
from finetune_lab.models.checkpoints import load_hub_model, packaged_dir
from finetune_lab.runs.manifest import (
    device_info,
    environment_info,
    refuse_outside_project,
    weights_record,
)
from finetune_lab.runs.record_names import check_random_name, check_record_name

SPLIT_FILES = tuple(f"{split}.{kind}" for split in ("train", "valid", "test")
                    for kind in ("review", "label"))
"""The prepared split files a probe reads, recorded by sha256 as its ``inputs``."""
FEATURES = ("<s>", "mean")
"""``<s>``: the last layer's first position, what fairseq's classification head reads;
``mean``: the last layer averaged over the review's tokens."""

C_GRID = (0.01, 0.1, 1.0)
"""Inverse regularisation strengths tried; the validation split picks one per feature."""

MAX_TOKENS = 256
"""As fine-tuning: reviews are cut to the model's 256 positions (``<s>`` included)."""


def probe_dir() -> Path:
    """Where probe results are kept: one JSON per probed set of weights."""
    return paths().summaries / "probes"


def review_features(hub: Any, texts: list[str]) -> dict[str, np.ndarray]:
    """Frozen last-layer features of each review, one row per review, for each of FEATURES."""
    import torch

    rows: dict[str, list[np.ndarray]] = {name: [] for name in FEATURES}
    with torch.inference_mode():
        for text in texts:
            tokens = hub.encode(text)[:MAX_TOKENS]  # the start, as --shorten-method truncate
            last = hub.extract_features(tokens)[0].float()
            rows["<s>"].append(last[0].numpy())
            rows["mean"].append(last[1:].mean(0).numpy())
    return {name: np.stack(vectors) for name, vectors in rows.items()}


def probe_accuracy(features: dict[str, dict[str, np.ndarray]],
                   labels: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """Per feature: the C the validation split picks, and validation and test accuracy (%).

    ``features[split][name]`` are the rows of one split; the features are standardised on the
    training split (scikit-learn's pipeline), so C means the same for every checkpoint."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out = {}
    for name in FEATURES:
        best = None
        for c in C_GRID:
            model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))
            model.fit(features["train"][name], labels["train"])
            valid = 100 * model.score(features["valid"][name], labels["valid"])
            if best is None or valid > best[1]:
                best = (c, valid, model)
        c, valid, model = best
        out[name] = {"C": c, "valid_accuracy": round(valid, 2),
                     "test_accuracy": round(100 * model.score(features["test"][name],
                                                              labels["test"]), 2)}
    return out


def randomised(hub: Any, seed: int) -> Any:
    """The same architecture with fairseq's RoBERTa initialisation, as ``--init random`` starts."""
    import torch
    from fairseq.modules.transformer_sentence_encoder import init_bert_params

    torch.manual_seed(seed)
    hub.model.apply(init_bert_params)
    for module in hub.model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.reset_parameters()
    return hub


def run_probe(checkpoint: Path, *, name: str, random_init: bool = False, seed: int = 0,
              cls_dir: Path | None = None, out_dir: Path | None = None,
              force: bool = False) -> Path:
    """Probe the weights in ``checkpoint`` (or a random initialisation of their architecture)
    and write ``<out_dir>/<name>.json`` with what was probed, on what, and the accuracies. An
    existing record of that name (the book may cite it) is replaced only with ``force``."""
    record_name(name)
    checkpoint, cls_dir = Path(checkpoint), Path(cls_dir or default_cls_dir())
    out = Path(out_dir or probe_dir()) / f"{name}.json"
    check_new_record(out, f"the probe recorded as {name!r}", force=force)
    refuse_outside_project(checkpoint, out)
    if not random_init:
        check_record_name(name, checkpoint, out)
    else:
        check_random_name(name, out)
    splits = read_checked_splits(cls_dir)  # fitted on no test review
    start = time.monotonic()
    hub = load_hub_model(checkpoint)
    if random_init:
        hub = randomised(hub, seed)
    import torch

    features = {split: review_features(hub, texts) for split, (texts, _) in splits.items()}
    result = {
        "schema": 1,
        "name": name,
        "init": "random" if random_init else "pretrained",
        "seed": seed if random_init else None,
        "checkpoint": weights_record(checkpoint, out),
        "inputs": {name: sha256_file(cls_dir / name) for name in SPLIT_FILES},
        "sizes": {split: len(labels) for split, (_, labels) in splits.items()},
        "max_tokens": MAX_TOKENS,
        "C_grid": list(C_GRID),
        "probes": probe_accuracy(features, {s: labels for s, (_, labels) in splits.items()}),
        "time": utc_now(),
        "wall_time_s": round(time.monotonic() - start, 1),
        "threads": torch.get_num_threads(),
        "environment": environment_info(),
        "device": device_info(),
    }
    write_record(out, result)
    return out


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe", help="linear probe of a checkpoint's frozen features on CLS-Books",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=folder, default=None,
                   help="packaged checkpoint folder (default: data/checkpoints/roberta-small-fr)")
    p.add_argument("--name", required=True, help="result name (data/summaries/probes/NAME.json)")
    p.add_argument("--random", action="store_true",
                   help="probe a random initialisation of the checkpoint's architecture")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the random initialisation")
    p.add_argument("--cls-dir", type=folder, default=None, help="cls.books folder (default: work dir)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing record of NAME (kept beside it, as "
                        "NAME.json.replaced-<UTC time>)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    out = run_probe(args.checkpoint or packaged_dir(), name=args.name, random_init=args.random,
                    seed=args.seed, cls_dir=args.cls_dir, force=args.force)
    print(f"probe: {out}")
    return 0
