"""Loading real event files (fairseq per-subset folders, a real tiny Trainer run) into one frame."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from runfixtures import EPOCHS

from finetune_lab.runs.recording import record_run
from finetune_lab.runs.registry import discover_runs
from finetune_lab.runs.tblogs import COLUMNS, load_experiments, load_scalars

pytestmark = pytest.mark.slow

_VALID_LINE = re.compile(r"\| (valid|test) \| epoch (\d+) \| valid on '\w+' subset \|.*?"
                         r"\| accuracy ([\d.]+) \|.*?\| num_updates (\d+)")


def test_fairseq_subsets_stay_apart_and_match_the_log(tiny_grid) -> None:
    loaded = load_experiments(root=tiny_grid.runs_root)
    df = loaded.scalars
    assert list(df.columns) == COLUMNS
    assert len(loaded.used) == 4 and loaded.excluded == []
    assert set(df["subset"]) == {"train", "train_inner", "valid", "test"}
    run = df[df["run"] == "random-seed1"]
    # fairseq's own text log is an independent record of the same numbers
    log = (tiny_grid.experiment_dir / "random-seed1" / "train.log").read_text()
    logged = {(m[1], int(m[2])): (float(m[3]), int(m[4])) for m in _VALID_LINE.finditer(log)}
    assert len(logged) == 2 * EPOCHS
    for (subset, epoch), (acc, step) in logged.items():
        row = run[(run["subset"] == subset) & (run["tag"] == "accuracy") & (run["epoch"] == epoch)]
        assert len(row) == 1
        assert row["step"].item() == step
        assert row["value"].item() == pytest.approx(acc, abs=0.051)
    # train_inner: 48 sentences / batch 8 = 6 updates per epoch, each in its own epoch
    inner = run[(run["subset"] == "train_inner") & (run["tag"] == "loss")]
    assert list(inner["step"]) == list(range(1, 6 * EPOCHS + 1))
    assert list(inner["epoch"]) == [float(1 + (s - 1) // 6) for s in inner["step"]]
    assert (run["seed"] == 1).all() and (run["init"] == "random").all()


def test_transformers_trainer_logs(tmp_path: Path, monkeypatch) -> None:
    """A real (tiny, random-weight) RobertaForSequenceClassification trained by Trainer."""
    import torch
    from transformers import (
        RobertaConfig,
        RobertaForSequenceClassification,
        Trainer,
        TrainingArguments,
    )

    rng = np.random.default_rng(0)

    def dataset(n: int) -> list[dict]:
        rows = []
        for _ in range(n):
            y = int(rng.integers(2))
            ids = [0, *rng.integers(4 + 10 * y, 14 + 10 * y, size=6).tolist(), 2]
            rows.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(y),
                         "attention_mask": torch.ones(len(ids), dtype=torch.long)})
        return rows

    def accuracy(pred) -> dict:
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    hp = {"learning_rate": 1e-3, "num_train_epochs": 2, "per_device_train_batch_size": 8,
          "hidden_size": 16, "num_hidden_layers": 1}
    with record_run("hf-tiny", "random-seed1", framework="transformers", init="random", seed=1,
                    hyperparameters=hp, runs_root=tmp_path) as handle:
        monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(handle.run_dir))
        torch.manual_seed(1)
        model = RobertaForSequenceClassification(RobertaConfig(
            vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=16, max_position_embeddings=40, num_labels=2, pad_token_id=1))
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), report_to=["tensorboard"], eval_strategy="epoch",
            logging_strategy="steps", logging_steps=2, num_train_epochs=2,
            per_device_train_batch_size=8, use_cpu=True, save_strategy="no", seed=1,
            learning_rate=1e-3, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=dataset(32),
                          eval_dataset=dataset(16), compute_metrics=accuracy)
        trainer.train()
        test_metrics = trainer.evaluate(dataset(16), metric_key_prefix="test")
        history = trainer.state.log_history
    (rec,) = discover_runs(tmp_path)
    assert rec.valid, rec.reason
    df = load_scalars([rec])
    assert list(df.columns) == COLUMNS
    assert {"train", "eval", "test"} <= set(df["subset"])
    evals = df[(df["subset"] == "eval") & (df["tag"] == "accuracy")].sort_values("step")
    expected = [(h["step"], h["epoch"], h["eval_accuracy"]) for h in history
                if "eval_accuracy" in h]
    assert [(s, e) for s, e, _ in expected] == list(zip(evals["step"], evals["epoch"]))
    assert list(evals["epoch"]) == [1.0, 2.0]
    assert evals["value"].to_numpy() == pytest.approx([v for *_, v in expected], abs=1e-6)
    test = df[(df["subset"] == "test") & (df["tag"] == "accuracy")]
    assert test["value"].item() == pytest.approx(test_metrics["test_accuracy"], abs=1e-6)
    losses = df[(df["subset"] == "train") & (df["tag"] == "loss")]
    assert len(losses) == sum(1 for h in history if "loss" in h)



def test_tensorboards_reader_checks_each_record_with_the_same_crc_in_c() -> None:
    import random

    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow as stub

    from finetune_lab.runs import eventfiles, tblogs

    def tensorboards(data: bytes) -> int:  # its masked_crc32c, over its Python CRC
        x = stub.u32(stub.crc32c(data))
        return stub.u32(((x >> 15) | stub.u32(x << 17)) + 0xA282EAD8)

    rng = random.Random(0)
    samples = [b"", b"a", bytes(8)] + [rng.randbytes(rng.randrange(1, 300)) for _ in range(50)]
    tblogs.read_with_c_crc()
    assert stub.masked_crc32c is eventfiles.masked_crc32c
    assert eventfiles.google_crc32c.implementation == "c"  # the speed this is for
    assert [stub.masked_crc32c(s) for s in samples] == [tensorboards(s) for s in samples]
