"""Real tiny fairseq runs for the run-cache tests (~60 s on 2 idle CPUs).

``conftest.py`` builds the grid once per test session (the ``tiny_grid`` fixture) and every test
module that asks for it shares it.

The grid: 2 inits × 2 seeds of a 1-layer, width-16 ``roberta_small`` fine-tuned for 3 epochs on
a synthetic two-class sentence_prediction task binarized with ``fairseq-preprocess``, validated
on ``valid`` and ``test`` every epoch. ``init="random"`` is fairseq's random init;
``init="pretrained"`` starts (``--restore-file``) from the best checkpoint of an earlier, recorded
tiny run on the same task (a real checkpoint made here, not a pretrained language model) —
enough to give the two inits different starting weights and to exercise checkpoint hashing.

Tests must copy runs before damaging them: the grid is shared (see :func:`copy_run`).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from finetune_lab.config import paths
from finetune_lab.models.trust import TRUSTED_MANIFESTS_ENV
from finetune_lab.runs.recording import TrainingFailedError, record_run, run_fairseq_train

EXPERIMENT = "tiny-grid"
SEEDS = (1, 2)
INITS = ("pretrained", "random")
EPOCHS = 3

# What the grid's manifests record as hyperparameters; TINY_ARGS turns them into flags.
HYPERPARAMETERS = {
    "arch": "roberta_small",
    "encoder_layers": 1,
    "encoder_embed_dim": 16,
    "encoder_ffn_embed_dim": 16,
    "encoder_attention_heads": 2,
    "max_positions": 32,
    "batch_size": 8,
    "max_epoch": EPOCHS,
    "optimizer": "adam",
    "lr": 1e-3,
    "lr_scheduler": "fixed",
    "dropout": 0.1,
}


def tiny_args(data_bin: Path, seed: int, hp: dict | None = None) -> list[str]:
    """fairseq-train flags for the tiny classifier (no --tensorboard-logdir: the helper adds it)."""
    hp = {**HYPERPARAMETERS, **(hp or {})}
    return [
        str(data_bin), "--user-dir", str(paths().user_dir), "--arch", hp["arch"],
        "--task", "sentence_prediction", "--criterion", "sentence_prediction",
        "--num-classes", "2", "--init-token", "0", "--separator-token", "2",
        "--encoder-layers", str(hp["encoder_layers"]),
        "--encoder-embed-dim", str(hp["encoder_embed_dim"]),
        "--encoder-ffn-embed-dim", str(hp["encoder_ffn_embed_dim"]),
        "--encoder-attention-heads", str(hp["encoder_attention_heads"]),
        "--max-positions", str(hp["max_positions"]), "--batch-size", str(hp["batch_size"]),
        "--max-epoch", str(hp["max_epoch"]), "--optimizer", hp["optimizer"],
        "--lr", str(hp["lr"]), "--lr-scheduler", hp["lr_scheduler"],
        "--dropout", str(hp["dropout"]), "--seed", str(seed), "--cpu", "--num-workers", "0",
        "--valid-subset", "valid,test", "--log-format", "simple", "--log-interval", "1",
        "--no-save",
    ]


def make_dataset(root: Path, n_train: int = 48, n_eval: int = 16) -> Path:
    """Synthetic sentences (class = which half of a 20-word vocabulary they use), binarized."""
    rng = random.Random(0)
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(20)]
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        with open(raw / f"{split}.input0", "w") as text, open(raw / f"{split}.label", "w") as lab:
            for _ in range(n):
                y = rng.randint(0, 1)
                pool = words[:10] if y else words[10:]
                # 1 word in 4 from the other class, so the task is learnable but not trivial
                toks = [rng.choice(words if rng.random() < 0.25 else pool)
                        for _ in range(rng.randint(3, 8))]
                text.write(" ".join(toks) + "\n")
                lab.write(f"{y}\n")
    data_bin = root / "data-bin"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source",
             "--trainpref", str(raw / f"train.{kind}"), "--validpref", str(raw / f"valid.{kind}"),
             "--testpref", str(raw / f"test.{kind}"), "--destdir", str(data_bin / kind),
             "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        for kind in ("input0", "label")
    ]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err.decode()[-2000:]
    # preprocess.log holds timestamps; the data is the .bin/.idx/dict files
    for log in data_bin.rglob("preprocess.log"):
        log.unlink()
    return data_bin


def make_pretrained_checkpoint(root: Path, data_bin: Path) -> Path:
    """Train the tiny model once, as a recorded run that saves its best checkpoint.

    The run's manifest lists the checkpoint's sha256 (``checkpoints``), which is what
    :mod:`finetune_lab.models.checkpoints` requires before fairseq may unpickle it under safe loading;
    fine-tuning runs therefore see this runs root through ``FINETUNE_LAB_RUNS_DIR``.
    """
    runs_root = root / "pretrain-runs"
    with record_run("tiny-pretrain", "seed100", framework="fairseq", init="random", seed=100,
                    hyperparameters={**HYPERPARAMETERS, "max_epoch": 2}, data=[data_bin],
                    runs_root=runs_root) as handle:
        args = [a for a in tiny_args(data_bin, seed=100, hp={"max_epoch": 2}) if a != "--no-save"]
        args += ["--save-dir", str(handle.run_dir / "checkpoints"), "--no-epoch-checkpoints",
                 "--no-last-checkpoints"]
        run_fairseq_train(handle, args)
    return handle.run_dir / "checkpoints" / "checkpoint_best.pt"


def _trust_env(checkpoint: Path | None) -> dict[str, str]:
    """Name the manifest of the run that saved ``checkpoint`` to fairseq's checkpoint loader,
    as ``finetune fairseq`` names a packaged checkpoint's: the trainer judges no runs itself."""
    if checkpoint is None:
        return {}
    return {TRUSTED_MANIFESTS_ENV: str(checkpoint.parents[1] / "manifest.json")}


def record_tiny_run(
    runs_root: Path, data_bin: Path, checkpoint: Path | None, *, init: str, seed: int,
    experiment: str = EXPERIMENT, run: str | None = None, hp: dict | None = None,
) -> Path:
    """One real recorded fairseq run; returns its folder."""
    hp_all = {**HYPERPARAMETERS, **(hp or {})}
    args = tiny_args(data_bin, seed, hp_all)
    if checkpoint is not None:
        args += ["--restore-file", str(checkpoint), "--reset-optimizer", "--reset-dataloader",
                 "--reset-meters", "--reset-lr-scheduler"]
    with record_run(experiment, run or f"{init}-seed{seed}", framework="fairseq", init=init,
                    seed=seed, hyperparameters=hp_all, data=[data_bin], checkpoint=checkpoint,
                    runs_root=runs_root) as handle:
        run_fairseq_train(handle, args, env=_trust_env(checkpoint))
    return handle.run_dir


@dataclass
class TinyGrid:
    root: Path          # scratch folder holding data-bin and the checkpoint
    runs_root: Path     # runs root holding EXPERIMENT/<init>-seed<seed>/
    data_bin: Path
    checkpoint: Path

    @property
    def experiment_dir(self) -> Path:
        return self.runs_root / EXPERIMENT


def build_grid(root: Path) -> TinyGrid:
    data_bin = make_dataset(root)
    checkpoint = make_pretrained_checkpoint(root, data_bin)
    runs_root = root / "runs"
    jobs = [(init, seed) for init in INITS for seed in SEEDS]
    errors: list[BaseException] = []

    def one(init: str, seed: int) -> None:
        record_tiny_run(runs_root, data_bin, checkpoint if init == "pretrained" else None,
                        init=init, seed=seed)

    def worker(batch):
        try:
            for init, seed in batch:
                try:
                    one(init, seed)
                except TrainingFailedError as exc:
                    # One CI run saw a tiny run exit 1 once (its log was lost with the machine).
                    # The grid is test input, not the test: retry once, in the open, with the
                    # failed log's tail as a warning; a second failure fails the tests.
                    warnings.warn(f"tiny run {init}-seed{seed} failed once, retried: {exc}")
                    shutil.rmtree(runs_root / EXPERIMENT / f"{init}-seed{seed}")
                    one(init, seed)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(jobs[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return TinyGrid(root=root, runs_root=runs_root, data_bin=data_bin, checkpoint=checkpoint)


def copy_run(grid: TinyGrid, run: str, runs_root: Path, experiment: str = EXPERIMENT) -> Path:
    """Copy one grid run into another runs root (so a test can damage it safely)."""
    dst = runs_root / experiment / run
    shutil.copytree(grid.experiment_dir / run, dst)
    return dst
