"""``fairseq-train`` for masked-LM pretraining: its command line, the calibration run that turns
a time budget into updates, and the echo of its progress while it trains.

Shared by ``pretrain`` and ``pretrain_long``, which launch the same command differently (one
run on a budget, or one schedule in resumable segments).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from finetune_lab.config import paths
from finetune_lab.data import pretrain_corpus
from finetune_lab.data.child import PRE_EXEC
from finetune_lab.data.binarized import check_corpus
from finetune_lab.errors import UserError
from finetune_lab.runs.fairseq_logs import log_rates
from finetune_lab.runs.manifest import portable_path
from finetune_lab.train.pretrain_recipe import PretrainRecipe


def require_corpus(data_dir: Path) -> Path:
    """The binarized corpus folder (``bin/`` of ``prepare-pretrain``), checked: its files are
    there and hold no books test review (:func:`~finetune_lab.data.binarized.check_corpus`)."""
    bin_dir = data_dir / "bin" if (data_dir / "bin").is_dir() else data_dir
    needed = ["dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx"]
    missing = [n for n in needed if not (bin_dir / n).is_file()]
    if missing:
        raise UserError(
            f"{bin_dir} lacks {', '.join(missing)}: run `finetune-lab prepare-pretrain` first "
            "(it reads the tokenizer `adopt-tokenizer` gives), or pass --data"
        )
    check_corpus(bin_dir)
    return bin_dir


def corpus_entry(bin_dir: Path, phase: str | None = None) -> dict[str, Any]:
    """One corpus a run read, as its manifest's ``extra.corpora`` keeps it: path, kind and
    train-side sources (:func:`~finetune_lab.data.pretrain_corpus.corpus_record`; kind None
    for a folder ``prepare-pretrain`` did not write), so a lineage can be checked for the
    task's texts (:func:`~finetune_lab.train.pretrain_lineage.reads_task_texts`)."""
    record = pretrain_corpus.corpus_record(bin_dir) or {"kind": None}
    return {**({"phase": phase} if phase else {}), "path": portable_path(bin_dir), **record}


def valid_subsets(bin_dir: Path) -> list[str]:
    """``valid`` (held-out novels) and, when the corpus has them, ``valid1`` (held-out reviews)."""
    return ["valid"] + (["valid1"] if (Path(bin_dir) / "valid1.bin").is_file() else [])


def fairseq_args(bin_dir: Path, save_dir: Path, recipe: PretrainRecipe, *, seed: int,
                 device: str, precision: str, stop_minutes: float | None = None,
                 init_from: Path | None = None, stop_update: int | None = None) -> list[str]:
    """The ``fairseq-train`` command line (without ``--tensorboard-logdir``).

    ``stop_minutes`` makes fairseq itself stop (validating and saving a checkpoint, exit 0) when
    the time budget is spent, even if the machine turned out slower than calibrated.
    ``init_from`` (a ``model.pt``) starts from those weights with a fresh optimizer, schedule,
    data order and meters (fairseq's ``--finetune-from-model``): continued pretraining.
    ``stop_update`` ends this launch earlier than the schedule (``recipe.max_update``, over which
    warm-up and decay are laid): a phase of a long run.
    """
    whole_lines = recipe.sample_break_mode != "none"
    args = [
        str(bin_dir), "--user-dir", str(paths().user_dir),
        "--task", "masked_lm_docs" if whole_lines else "masked_lm",
        "--dataset-impl", "mmap",  # the binarized files, never a text file beside them (D-k1)
        "--criterion", "masked_lm_bow" if recipe.bow_weight > 0 else "masked_lm",
        "--arch", "roberta_small",
        "--sample-break-mode", recipe.sample_break_mode,
        "--tokens-per-sample", str(recipe.tokens_per_sample),
        "--mask-prob", str(recipe.mask_prob),
        "--leave-unmasked-prob", str(recipe.leave_unmasked_prob),
        "--random-token-prob", str(recipe.random_token_prob),
        "--optimizer", "adam", "--adam-betas", str(tuple(recipe.adam_betas)).replace(" ", ""),
        "--adam-eps", str(recipe.adam_eps), "--weight-decay", str(recipe.weight_decay),
        "--clip-norm", str(recipe.clip_norm),
        "--lr-scheduler", "polynomial_decay", "--lr", str(recipe.lr),
        "--warmup-updates", str(recipe.warmup_updates()),
        "--total-num-update", str(recipe.max_update),
        "--max-update", str(recipe.max_update if stop_update is None else stop_update),
        "--dropout", str(recipe.dropout), "--attention-dropout", str(recipe.attention_dropout),
        "--update-freq", str(recipe.update_freq),
        "--seed", str(seed), "--log-format", "simple", "--log-interval", str(recipe.log_interval),
        "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        "--validate-interval-updates", str(recipe.validate_every),
        "--save-interval-updates", str(recipe.validate_every), "--keep-interval-updates", "1",
        "--skip-invalid-size-inputs-valid-test", "--num-workers", str(recipe.num_workers),
    ]
    if whole_lines:  # lines differ in length: batches of as many tokens as a fixed batch holds
        args += ["--max-tokens", str(recipe.tokens_per_sample * recipe.batch_size),
                 "--batch-size", str(8 * recipe.batch_size)]
    else:
        args += ["--batch-size", str(recipe.batch_size)]
    if recipe.bow_weight > 0:
        args += ["--bow-weight", str(recipe.bow_weight)]
    for name, value in recipe.arch.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    subsets = valid_subsets(bin_dir)
    if subsets != ["valid"]:  # fairseq's default; the best checkpoint follows the first
        args += ["--valid-subset", ",".join(subsets)]
    if recipe.max_valid_steps is not None:
        args += ["--max-valid-steps", str(recipe.max_valid_steps)]
    if stop_minutes is not None:
        args += ["--stop-time-hours", f"{stop_minutes / 60:.4f}"]
    if init_from is not None:
        args += ["--finetune-from-model", str(init_from)]
    if device == "cpu":
        args.append("--cpu")
    if precision == "fp16" and device == "cpu":
        raise UserError("fp16 training needs a GPU; on a CPU use --precision bf16 or fp32")
    # fairseq 0.12 reads --bf16 as "TPU"; the project's --user-dir makes it bf16 on a GPU or a
    # CPU (fairseq_compat.install_bf16_without_tpu), with fp32 master weights
    if precision in ("bf16", "fp16"):
        args.append(f"--{precision}")
    return args


def calibrate(bin_dir: Path, recipe: PretrainRecipe, *, device: str, precision: str,
              scratch: Path, updates: int = 40) -> dict[str, float]:
    """Measure updates/s with a short throwaway run, to turn a minutes budget into updates."""
    probe = replace(recipe, max_update=updates, log_interval=max(1, updates // 4),
                    validate_every=10**9)
    args = fairseq_args(bin_dir, scratch, probe, seed=0, device=device, precision=precision)
    args += ["--no-save", "--disable-validation"]
    out = subprocess.run([sys.executable, "-m", "fairseq_cli.train", *args],
                         capture_output=True, text=True, preexec_fn=PRE_EXEC)
    if out.returncode != 0:
        raise UserError(f"the calibration run failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    rates = log_rates(out.stdout + out.stderr)
    if not rates:
        raise UserError("the calibration run logged no throughput; raise its number of updates")
    return rates



@contextmanager
def echoing(log: Path, show: Callable[[str], str | None] | None) -> Iterator[None]:
    """While the body runs (fairseq training), print ``show(line)`` for each new log line in a
    background thread (nothing when ``show`` is None: quiet)."""
    stop = threading.Event()
    watcher = None
    if show is not None:
        watcher = threading.Thread(target=echo_progress, args=(log, stop, show), daemon=True)
        watcher.start()
    try:
        yield
    finally:
        stop.set()
        if watcher:
            watcher.join()


def fairseq_progress(line: str) -> str | None:
    """fairseq's own progress lines (training, validation), without their logging prefix."""
    if any(f"| {kind} |" in line for kind in ("train_inner", "train", "valid", "valid1")):
        return line.split(" | INFO | ")[-1]
    return None


def echo_progress(log: Path, stop: threading.Event,
                  show: Callable[[str], str | None] = fairseq_progress) -> None:
    """Print ``show(line)`` for the lines fairseq adds to the run's log while it trains (not
    those of an earlier launch of a resumed run), each whole: a line still being written waits
    for its end, and the lines written as training ends are read too."""
    pos = log.stat().st_size if log.exists() else 0
    partial_line = ""
    while True:
        ending = stop.is_set()
        if log.exists():
            with open(log, encoding="utf-8", errors="replace") as fh:
                fh.seek(pos)
                chunk = partial_line + fh.read()
                pos = fh.tell()
            *lines, partial_line = chunk.split("\n")
            for line in lines:
                shown = show(line)
                if shown:
                    print(shown, flush=True)
        if ending:
            return
        stop.wait(1.0)

