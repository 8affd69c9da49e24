"""Pretrain the stand-in RoBERTa-small-fr with fairseq's ``masked_lm`` task.

The course's checkpoint is not public, so "pretrained vs random" needs a pretrained model of the
project's own. The recipe is RoBERTa's [Liu et al. 2019] scaled to the small model: 15 % masking
(80 % ``<mask>``, 10 % random, 10 % unchanged), Adam (0.9, 0.98) with eps 1e-6 and weight decay
0.01, linear warm-up then linear decay, dropout 0.1, 256-token samples. The same code runs on a
GPU (bf16, large batches) and on a CPU (smaller budget); the run lands in the run cache under
``data/runs/pretrain/<run>/`` and its best checkpoint is packaged under
``data/checkpoints/roberta-small-fr/``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from finetune_lab.argtypes import non_negative_int, positive_float, positive_int, resolved_path
from finetune_lab.config import paths
from finetune_lab.errors import UserError
from finetune_lab.fairseq_logs import last_update, log_rates

EXPERIMENT = "pretrain"

# Dense bf16 tensor-core peaks (FLOP/s) used for model-FLOPs utilisation; matched by GPU name.
BF16_PEAK_FLOPS = {  # the first key found in the device name wins: variants before families
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM ("NVIDIA H100 80GB HBM3")
    "A100": 312e12,
    "A6000": 155e12,
    "L4": 121e12,
}


@dataclass(frozen=True)
class PretrainRecipe:
    """RoBERTa's masked-LM recipe for the small model; batch and budget depend on the device."""

    tokens_per_sample: int = 256
    mask_prob: float = 0.15
    leave_unmasked_prob: float = 0.1
    random_token_prob: float = 0.1
    lr: float = 5e-4
    warmup_ratio: float = 0.06
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-6
    weight_decay: float = 0.01
    clip_norm: float = 0.0
    dropout: float = 0.1
    attention_dropout: float = 0.1
    batch_size: int = 16
    update_freq: int = 1
    max_update: int = 1000
    validate_every: int = 250
    max_valid_steps: int | None = None  # a fixed prefix of the held-out batches (CPU budgets)
    log_interval: int = 10
    arch: dict[str, int] = field(default_factory=dict)  # overrides of roberta_small sizes
    num_workers: int = 1
    """Data-loading processes: masking runs there, and one cannot feed a GPU (the first H100 run,
    at 2 % of its peak, waited on it)."""

    def warmup_updates(self) -> int:
        return max(1, int(self.warmup_ratio * self.max_update))

    def hyperparameters(self) -> dict[str, Any]:
        out = asdict(self)
        out["adam_betas"] = list(self.adam_betas)
        out["warmup_updates"] = self.warmup_updates()
        out["tokens_per_update"] = self.tokens_per_sample * self.batch_size * self.update_freq
        return out


VARYING = ("num_workers", "batch_size", "update_freq", "tokens_per_update", "max_update", "warmup_updates",
           "validate_every", "max_valid_steps", "log_interval", "precision", "budget_minutes", "lr", "arch",
           "dropout", "attention_dropout", "budget_tokens", "tapt_fraction", "phases",
           "world_size")
"""Hyperparameters that legitimately differ between pretraining runs (device, budget, and what
the recipe ablations vary); the MLM recipe itself (masking, optimizer, sample length) must not."""


def experiment_config(recipe: PretrainRecipe) -> dict[str, Any]:
    """``data/runs/pretrain/experiment.json``: the fixed recipe, and what may vary per run."""
    fixed = {k: v for k, v in recipe.hyperparameters().items() if k not in VARYING}
    return {"hyperparameters": fixed, "varying": list(VARYING)}


PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Launch:
    """The processes of one pretraining run: one ``fairseq-train``, or ``world_size`` of them
    started by torchrun for fairseq's own data-parallel training (NCCL on GPUs, gloo on CPUs;
    fairseq's ``legacy_ddp`` on CPUs, where torch's DDP wants no device ids)."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def launcher(self) -> list[str] | None:
        """torchrun's command line (``python -m torch.distributed.run``), or None for one."""
        if self.world_size == 1:
            return None
        return [sys.executable, "-m", "torch.distributed.run",
                f"--nproc-per-node={self.nproc_per_node}", f"--nnodes={self.nnodes}",
                f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}",
                f"--master-port={self.master_port}"]

    def hyperparameters(self, per_process: PretrainRecipe) -> dict[str, Any]:
        """What a manifest records of the launch: with several processes, their number and
        each one's batch and update frequency (:func:`spread`); nothing for one."""
        if self.world_size == 1:
            return {}
        return {"world_size": self.world_size, "batch_size": per_process.batch_size,
                "update_freq": per_process.update_freq}

    def fairseq_flags(self, device: str) -> list[str]:
        if self.world_size == 1:
            return []
        return ["--distributed-world-size", str(self.world_size),
                "--distributed-backend", "gloo" if device == "cpu" else "nccl",
                "--ddp-backend", "legacy_ddp" if device == "cpu" else "pytorch_ddp"]


def spread(recipe: PretrainRecipe, world_size: int) -> PretrainRecipe:
    """The recipe for ``world_size`` processes with the same tokens per update: the update
    frequency is divided first, then the batch size; a recipe that divides by neither is
    refused (say which to change)."""
    if world_size == 1:
        return recipe
    if recipe.update_freq % world_size == 0:
        return replace(recipe, update_freq=recipe.update_freq // world_size)
    if recipe.batch_size % world_size == 0:
        return replace(recipe, batch_size=recipe.batch_size // world_size)
    raise UserError(
        f"{world_size} processes cannot share updates of {recipe.batch_size} sequences x "
        f"{recipe.update_freq} steps: choose --batch-size or --update-freq divisible by "
        f"{world_size}")


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes in bf16 natively (AMX or AVX512-BF16, from ``/proc/cpuinfo``):
    there ``--precision bf16`` makes matrix products several times faster than fp32 (on this
    project's CPU, a whole masked-LM update 1.3 times); elsewhere bf16 is emulated, and slower."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
    flags = set(cpuinfo.split())
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def device_defaults() -> dict[str, Any]:
    """Batch, precision and a default budget for the machine at hand."""
    import torch

    if torch.cuda.is_available():
        precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        # the H100 runs' recipe: 65,536 tokens per update in one step, lr 7e-4, ten loaders
        return {"device": "cuda", "precision": precision, "batch_size": 256, "update_freq": 1,
                "lr": 7e-4,
                "minutes": 8.0, "num_workers": max(1, min(10, (os.cpu_count() or 2) - 4)),
                "calibration_updates": 200}
    # bf16 where the CPU computes it natively, and no dropout: the recipe ablations
    # (`pretrain-ablations`, in the pretraining chapter) measured both as lowering the held-out
    # loss reached in a given time on this project's CPU
    return {"device": "cpu", "precision": "bf16" if cpu_has_bf16() else "fp32", "dropout": 0.0,
            "batch_size": 16, "update_freq": 1, "minutes": 120.0, "max_valid_steps": 40,
            "calibration_updates": 40}


def default_recipe(**overrides: Any) -> PretrainRecipe:
    """The recipe with this machine's batch, validation prefix and dropout (:func:`device_defaults`)."""
    d = device_defaults()
    base = {"batch_size": d["batch_size"], "update_freq": d["update_freq"],
            "max_valid_steps": d.get("max_valid_steps"), "num_workers": d.get("num_workers", 1),
            "lr": d.get("lr", PretrainRecipe.lr)}
    if "dropout" in d:
        base.update(dropout=d["dropout"], attention_dropout=d["dropout"])
    return PretrainRecipe(**{**base, **{k: v for k, v in overrides.items() if v is not None}})


def state_dir(run: str) -> Path:
    """Where a pretraining run's fairseq checkpoints (a long run's resumable state) live:
    git-ignored, on this machine only."""
    return paths().work / "pretrain-checkpoints" / run


def require_corpus(data_dir: Path) -> Path:
    """The binarized corpus folder (``bin/`` of ``prepare-pretrain``), checked."""
    bin_dir = data_dir / "bin" if (data_dir / "bin").is_dir() else data_dir
    needed = ["dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx"]
    missing = [n for n in needed if not (bin_dir / n).is_file()]
    if missing:
        raise UserError(
            f"{bin_dir} lacks {', '.join(missing)}: run `finetune-lab train-tokenizer` then "
            "`finetune-lab prepare-pretrain` first (or pass --data)"
        )
    return bin_dir


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
    args = [
        str(bin_dir), "--user-dir", str(paths().user_dir),
        "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta_small",
        "--sample-break-mode", "none", "--tokens-per-sample", str(recipe.tokens_per_sample),
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
        "--batch-size", str(recipe.batch_size), "--update-freq", str(recipe.update_freq),
        "--seed", str(seed), "--log-format", "simple", "--log-interval", str(recipe.log_interval),
        "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        "--validate-interval-updates", str(recipe.validate_every),
        "--save-interval-updates", str(recipe.validate_every), "--keep-interval-updates", "1",
        "--skip-invalid-size-inputs-valid-test", "--num-workers", str(recipe.num_workers),
    ]
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
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise UserError(f"the calibration run failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    rates = log_rates(out.stdout + out.stderr)
    if not rates:
        raise UserError("the calibration run logged no throughput; raise its number of updates")
    return rates


def model_flops_per_token(size: Any, context: int, mask_prob: float) -> float:
    """Training FLOPs per token of masked-LM pretraining: every matrix product, forward x 3.

    ``6 N`` (Kaplan et al. 2020) with N the weight matrices a token goes through: the encoder
    layers' (4 d² + 2 d ffn each) for every token, the LM head's dense layer and tied projection
    onto the vocabulary (d² + d V) only for the masked ``mask_prob`` of them (fairseq's
    ``RobertaLMHead`` projects only those), embedding lookups none; plus attention's scores and
    weighted sum, 12 L T d. Counting all 23 M parameters instead would overstate it 2.4 times.
    """
    d, layers = size.dim, size.layers
    encoder = layers * (4 * d * d + 2 * d * size.ffn)
    head = mask_prob * (d * d + d * size.vocab)
    return 6.0 * (encoder + head) + 12.0 * layers * context * d


def gpu_peak_flops(name: str | None) -> float | None:
    for key, peak in BF16_PEAK_FLOPS.items():
        if name and key in name:
            return peak
    return None


def throughput_record(log_text: str, recipe: PretrainRecipe, device: dict[str, Any]) -> dict:
    """Tokens/s and (on a known GPU) model-FLOPs utilisation against its dense bf16 peak."""
    from finetune_lab import params

    rates = log_rates(log_text)
    if not rates:
        return {}
    size = replace(params.SMALL, **{
        {"encoder_layers": "layers", "encoder_embed_dim": "dim", "encoder_ffn_embed_dim": "ffn",
         "encoder_attention_heads": "heads"}[k]: v for k, v in recipe.arch.items()
        if k in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
                 "encoder_attention_heads")
    })
    n = int(params.convention_table(size).iloc[3]["total"])  # encoder + LM head
    flops_token = model_flops_per_token(size, recipe.tokens_per_sample, recipe.mask_prob)
    out = {**rates, "model_flops_per_token": flops_token, "parameters": n,
           "achieved_flops": rates["tokens_per_s"] * flops_token}
    if device.get("type") == "cuda":
        peak = gpu_peak_flops(device.get("name"))
        if peak:
            out["peak_bf16_flops"] = peak
            out["mfu"] = out["achieved_flops"] / (peak * max(1, int(device.get("count") or 1)))
    return out


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
    those of an earlier launch of a resumed run)."""
    pos = log.stat().st_size if log.exists() else 0
    while not stop.is_set():
        if log.exists():
            with open(log, encoding="utf-8", errors="replace") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos = fh.tell()
            for line in chunk.splitlines():
                shown = show(line)
                if shown:
                    print(shown, flush=True)
        stop.wait(2.0)


def continuation_source(folder: Path, bin_dir: Path) -> dict[str, Any]:
    """The packaged checkpoint to continue pretraining from, checked, with its lineage.

    It must be trusted (its sha256 in its manifest) and share the corpus's dictionary, or the
    embedding rows would mean other pieces. The lineage lists every run the weights went through
    (updates and tokens each), so the tokens seen add up across continued runs.
    """
    import json

    from finetune_lab import checkpoints
    from finetune_lab.manifest import sha256_file

    folder = Path(folder)
    model, manifest = folder / checkpoints.MODEL_FILE, folder / checkpoints.MANIFEST_FILE
    for f in (model, manifest, folder / checkpoints.DICT_FILE):
        if not f.is_file():
            raise UserError(f"{f} is missing: --continue-from needs a packaged checkpoint folder "
                            "(model.pt, dict.txt, manifest.json), as `finetune-lab pretrain` "
                            "writes to data/checkpoints/roberta-small-fr")
    checkpoints.check_trusted(model, [manifest])
    if sha256_file(folder / checkpoints.DICT_FILE) != sha256_file(bin_dir / "dict.txt"):
        raise UserError(f"{bin_dir / 'dict.txt'} is not the dictionary of {folder}: binarize the "
                        "corpus with the checkpoint's tokenizer (`finetune-lab reproduce` adopts "
                        "it; or copy its dict.txt and sentencepiece model to data/work/tokenizer "
                        "and run `finetune-lab prepare-pretrain`)")
    man = checkpoints.package_manifest(folder)
    lineage = man.get("lineage")
    if lineage is None:  # packaged before lineages were kept: one run, read from its manifest
        tokens = None
        run_manifest = paths().project / str(man.get("run") or "") / "manifest.json"
        if man.get("run") and run_manifest.is_file():
            hp = json.loads(run_manifest.read_text(encoding="utf-8"))["hyperparameters"]
            tokens = int(hp["tokens_per_update"]) * int(man.get("num_updates") or 0)
        lineage = [{"run": man.get("run"), "updates": man.get("num_updates"), "tokens": tokens}]
    return {"path": str(model), "sha256": sha256_file(model), "run": man.get("run"),
            "lineage": lineage}


def pretrain(
    *,
    max_update: int | None = None,
    minutes: float | None = None,
    seed: int | None = None,
    run: str | None = None,
    data_dir: Path | None = None,
    tokenizer_dir: Path | None = None,
    recipe: PretrainRecipe | None = None,
    runs_root: Path | None = None,
    package_to: Path | None = None,
    package: bool = True,
    overwrite: bool = False,
    quiet: bool = False,
    continue_from: Path | None = None,
    precision: str | None = None,
    experiment: str = EXPERIMENT,
    launch: Launch = Launch(),
) -> Path:
    """Run one pretraining job into the run cache and (optionally) package its best checkpoint.

    ``launch`` spreads it over several processes (fairseq's data-parallel training), with the
    recipe's tokens per update kept (:func:`spread`); the manifest records the world size.

    ``continue_from`` (a packaged checkpoint folder) starts from its weights instead of a random
    initialisation, with a fresh warm-up and decay: on a CPU, sessions can add up this way. The
    packaged result then carries the lineage of every run behind it.
    """
    from finetune_lab import checkpoints, pretrain_corpus, tokenizer
    from finetune_lab.manifest import device_info, portable_path, sha256_file
    from finetune_lab.recording import record_run, run_fairseq_train

    defaults = device_defaults()
    recipe = recipe or default_recipe()
    bin_dir = require_corpus(Path(data_dir) if data_dir else pretrain_corpus.default_output())
    tok_dir = Path(tokenizer_dir) if tokenizer_dir else tokenizer.default_output()
    spm_model, spm_dict = tokenizer.require_tokenizer(tok_dir) if package else (None, None)
    device, precision = defaults["device"], precision or defaults["precision"]
    if device == "cpu" and precision == "bf16" and not cpu_has_bf16():
        print("pretrain: this CPU has no native bf16 (AMX, AVX512-BF16): bf16 is emulated and "
              "slower than fp32", file=sys.stderr)
    parent = continuation_source(Path(continue_from), bin_dir) if continue_from else None
    if seed is None:
        # the seed fixes the order of the samples: a continued run with its parent's seed would
        # replay the very samples the weights were trained on, in the same order
        seed = 1 + (len(parent["lineage"]) if parent is not None else 0)
    if parent is not None and run is None:
        run = continued_run_name(str(parent["run"] or device), len(parent["lineage"]))
    run = run or f"{device}-seed{seed}"
    save_dir = state_dir(run if experiment == EXPERIMENT else f"{experiment}-{run}")
    save_dir.mkdir(parents=True, exist_ok=True)

    calibration = None
    if minutes is None and max_update is None:
        minutes = defaults["minutes"]
    budget = minutes  # None: no time limit, only --max-update
    if max_update is None:
        # long enough on a GPU that start-up transients do not set the rate (40 updates there
        # measured 7.7 updates/s; the run then went at 10.2 and ended 30 % early)
        started = time.monotonic()
        calibration = calibrate(bin_dir, recipe, device=device, precision=precision,
                                scratch=save_dir / "calibration",
                                updates=defaults["calibration_updates"])
        # the budget covers the calibration too (a minute on the H100 with ten loaders)
        spent = (time.monotonic() - started) / 60
        budget = max(budget / 2, budget - spent)
        # 0.85: validations and saves every validate_every updates take their share (on the
        # H100, 20.5 updates/s calibrated, 16.8 over the run)
        max_update = max(10, int(0.85 * budget * 60 * calibration["updates_per_s"]))
        calibration.update(budget_minutes=budget, seconds=round(spent * 60, 1))
    recipe = replace(recipe, max_update=max_update,
                     validate_every=min(recipe.validate_every, max(1, max_update // 4)))

    # a copy in the run's scratch folder: the packaged file is replaced when this run ends
    init_copy = save_dir / "init_model.pt" if parent is not None else None
    if init_copy is not None:
        shutil.copyfile(parent["path"], init_copy)
    per_process = spread(recipe, launch.world_size)
    args = fairseq_args(bin_dir, save_dir, per_process, seed=seed, device=device,
                        precision=precision, stop_minutes=budget,
                        init_from=init_copy) + launch.fairseq_flags(device)
    hyper = {**recipe.hyperparameters(), "precision": precision, "budget_minutes": budget,
             **launch.hyperparameters(per_process)}
    env = {checkpoints.TRUSTED_DIRS_ENV: str(save_dir)}
    from finetune_lab.manifest import write_json_atomic
    from finetune_lab.registry import EXPERIMENT_CONFIG

    root = Path(runs_root) if runs_root is not None else paths().runs
    write_json_atomic(root / experiment / EXPERIMENT_CONFIG, experiment_config(recipe))
    extra: dict[str, Any] = {"calibration": calibration}
    if parent is not None:
        extra["continued_from"] = {k: parent[k] for k in ("sha256", "run", "lineage")}
    with record_run(experiment, run, framework="fairseq",
                    init="random" if parent is None else "continued", seed=seed,
                    hyperparameters=hyper, data=[bin_dir], runs_root=runs_root,
                    overwrite=overwrite, extra=extra) as handle:
        with echoing(handle.run_dir / "train.log", None if quiet else fairseq_progress):
            run_fairseq_train(handle, args, env=env, launcher=launch.launcher())
        best = save_dir / "checkpoint_best.pt"
        if not best.is_file():
            raise UserError(f"fairseq finished without writing {best}; see {handle.log_path}")
        # Checkpoints live outside the (committed) run folder; their hashes make them trusted.
        handle.manifest["saved_checkpoints"] = {
            "checkpoint_best.pt": {"path": portable_path(best), "sha256": sha256_file(best)}}
        log_text = (handle.run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
        handle.manifest["throughput"] = throughput_record(log_text, recipe, device_info())
        handle.manifest["updates_done"] = last_update(log_text)
        run_dir = handle.run_dir
    if package:
        manifests = [run_dir / "manifest.json"]
        metadata = checkpoint_metadata(best, manifests)
        checkpoints.package_checkpoint(best, spm_model, spm_dict, package_to, manifests=manifests,
                                       metadata=metadata)
    return run_dir


def continued_run_name(parent_run: str, runs_behind: int) -> str:
    """``cpu-seed1`` continued once is ``cpu-seed1-c1``, then ``cpu-seed1-c2`` (not ``-c1-c2``)."""
    first = re.sub(r"-c\d+$", "", Path(parent_run).name)
    return f"{first}-c{runs_behind}"


def lineage_of(manifest: dict[str, Any], run: str | None) -> list[dict[str, Any]]:
    """The runs behind a pretraining run's final weights, itself (``run``) last, each with its
    updates and tokens: what a package records, and what the report reads for a candidate."""
    hp = manifest["hyperparameters"]
    done = manifest.get("updates_done")
    earlier = ((manifest.get("extra") or {}).get("continued_from") or {}).get("lineage") or []
    return [*earlier, {"run": run, "updates": done,
                       "tokens": done * int(hp["tokens_per_update"]) if done is not None else None}]


def checkpoint_metadata(source: Path, manifests: list[Path], *,
                        trust: bool = False) -> dict[str, Any]:
    """What the packaged checkpoint's manifest says of its origin: run, the lineage of its
    weights (:func:`lineage_of`, whether packaged by ``pretrain`` or ``package-checkpoint``) and
    validation loss."""
    import json

    from finetune_lab import checkpoints
    from finetune_lab.manifest import portable_path, sha256_file

    sha = sha256_file(source)
    run, lineage = None, None
    for m in manifests:
        manifest = json.loads(Path(m).read_text(encoding="utf-8"))
        saved = manifest.get("saved_checkpoints") or {}
        if any(v.get("sha256") == sha for v in saved.values()):
            run = portable_path(Path(m).parent)
            lineage = lineage_of(manifest, run)
    state = checkpoints.load_trusted(source, manifests, trust=trust)
    loss = (state.get("extra_state") or {}).get("best")
    return {"run": run, "lineage": lineage, "valid_loss_bits": loss,
            "valid_perplexity": 2 ** loss if loss is not None else None}


def add_parser(sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain the stand-in RoBERTa-small-fr (masked LM)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--max-update", type=positive_int, help="budget in updates")
    budget.add_argument("--minutes", type=positive_float,
                        help="budget in minutes (default: 8 on a GPU, 120 on a CPU); "
                             "turned into updates by a short calibration run")
    budget.add_argument("--tokens", type=positive_float, metavar="N",
                        help="a long, resumable run: the budget in tokens (e.g. 150e6), with "
                             "one schedule over all of it; run the same command again to resume "
                             "it (see --segment-minutes, --tapt-fraction)")
    p.add_argument("--segment-minutes", type=positive_float,
                   help="with --tokens: stop this launch (saving, resumable) after this long")
    p.add_argument("--tapt-fraction", type=float, default=0.0,
                   help="with --tokens: the last fraction of the budget is task-adaptive, on "
                        "`prepare-pretrain --tapt`'s corpus (the CLS-Books training texts)")
    p.add_argument("--dropout", type=float,
                   help="dropout and attention dropout (default: 0 on a CPU, where the model "
                        "underfits, as the ablations measured; 0.1 on a GPU, RoBERTa's)")
    p.add_argument("--stop-minutes", type=float,
                   help="with --max-update: also stop (and save) when this much time has passed")
    p.add_argument("--seed", type=non_negative_int,
                   help="fixes initialisation and sample order (default 1; with --continue-from, "
                        "1 + the runs behind the weights, so that no run replays its parent's "
                        "samples)")
    p.add_argument("--run", help="run name (default: <device>-seed<seed>; with --tokens, "
                                  "<device>-long)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default by device)")
    p.add_argument("--update-freq", type=int, help="steps per update (default by device)")
    p.add_argument("--lr", type=float, default=None,
                   help=f"peak learning rate (default: {PretrainRecipe.lr:g}; 7e-4 on a GPU)")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="default: bf16 on a GPU that has it (else fp16), and on a CPU with AMX "
                        "or AVX512-BF16; fp32 on other CPUs")
    p.add_argument("--data", type=resolved_path, help="binarized corpus (default: prepare-pretrain's)")
    p.add_argument("--no-package", action="store_true",
                   help="do not replace data/checkpoints/roberta-small-fr")
    p.add_argument("--package-to", type=Path, metavar="DIR",
                   help="package the result here instead of data/checkpoints/roberta-small-fr: "
                        "a candidate to fine-tune (`finetune fairseq --checkpoint DIR "
                        "--experiment fairseq-candidate`) before it replaces the committed one")
    p.add_argument("--overwrite", action="store_true", help="redo an existing run")
    p.add_argument("--experiment", default=EXPERIMENT,
                   help="run-cache folder (default: pretrain; the ablations use "
                        "pretrain-ablation)")
    dist = p.add_argument_group(
        "data-parallel training (fairseq's own, through torchrun; see the README's Scaling out)")
    dist.add_argument("--nproc-per-node", type=positive_int, default=1,
                      help="processes on this machine (one per GPU; gloo on CPUs)")
    dist.add_argument("--nnodes", type=positive_int, default=1, help="machines")
    dist.add_argument("--node-rank", type=non_negative_int, default=0, help="this machine's rank")
    dist.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address")
    dist.add_argument("--master-port", type=positive_int, default=29500)
    p.add_argument("--continue-from", type=Path, metavar="CHECKPOINT_DIR",
                   help="continue pretraining from a packaged checkpoint folder (e.g. "
                        "data/checkpoints/roberta-small-fr) with a fresh warm-up and decay, so "
                        "CPU sessions add up; the new package records the lineage")
    p.set_defaults(func=_run)

    pk = sub.add_parser("package-checkpoint",
                        help="package a trusted fairseq checkpoint as model.pt + dict + spm")
    pk.add_argument("source", type=Path)
    pk.add_argument("--dest", type=Path)
    pk.add_argument("--trust", action="store_true",
                    help="package a SOURCE that no manifest of this project lists (one you made "
                         "or trust); the package's manifest says so")
    pk.set_defaults(func=_run_package)


def _run(args: argparse.Namespace) -> int:
    d = device_defaults()
    recipe = default_recipe(batch_size=args.batch_size, update_freq=args.update_freq,
                            lr=args.lr, dropout=args.dropout, attention_dropout=args.dropout)
    launch = Launch(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                    node_rank=args.node_rank, master_addr=args.master_addr,
                    master_port=args.master_port)
    if args.tokens is not None:
        from finetune_lab.pretrain_long import pretrain_long

        run_dir = pretrain_long(run=args.run or f"{d['device']}-long", tokens=int(args.tokens),
                                continue_from=args.continue_from, seed=args.seed,
                                data_dir=args.data, tapt_fraction=args.tapt_fraction,
                                recipe=replace(recipe, validate_every=250),
                                precision=args.precision, segment_minutes=args.segment_minutes,
                                package=not args.no_package, package_to=args.package_to,
                                launch=launch)
        print(f"pretrain: run recorded in {run_dir}")
        return 0
    run_dir = pretrain(max_update=args.max_update, minutes=args.minutes or args.stop_minutes,
                       seed=args.seed,
                       run=args.run, data_dir=args.data, recipe=recipe,
                       package=not args.no_package, package_to=args.package_to,
                       overwrite=args.overwrite,
                       continue_from=args.continue_from, precision=args.precision,
                       experiment=args.experiment, launch=launch)
    print(f"pretrain: run recorded in {run_dir}")
    return 0


def _run_package(args: argparse.Namespace) -> int:
    from finetune_lab import checkpoints, tokenizer

    spm_model, spm_dict = tokenizer.require_tokenizer(tokenizer.default_output())
    manifests = checkpoints.default_manifests()
    dest = checkpoints.package_checkpoint(args.source, spm_model, spm_dict, args.dest,
                                          manifests=manifests, trust=args.trust,
                                          metadata=checkpoint_metadata(args.source, manifests,
                                                                       trust=args.trust))
    print(f"package-checkpoint: wrote {dest}")
    return 0
