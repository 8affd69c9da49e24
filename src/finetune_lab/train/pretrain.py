"""Pretrain the stand-in RoBERTa-small-fr with fairseq's ``masked_lm`` task.

The course's checkpoint is not public, so "pretrained vs random" needs a pretrained model of the
project's own. The recipe is RoBERTa's [Liu et al. 2019] scaled to the small model: 15 % masking
(80 % ``<mask>``, 10 % random, 10 % unchanged), Adam (0.9, 0.98) with eps 1e-6 and weight decay
0.01, linear warm-up then linear decay, dropout 0.1, 256-token samples. The same code runs on a
GPU (bf16, large batches) and on a CPU (smaller budget); the run lands in the run cache under
``data/runs/pretrain/<run>/`` and its best checkpoint is packaged under
``data/checkpoints/roberta-small-fr/``. This module holds one run on a budget in minutes or
updates; ``pretrain_long`` one schedule over a budget in tokens, in resumable segments.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from finetune_lab._files import sha256_file
from finetune_lab.config import paths
from finetune_lab.data import pretrain_corpus, tokenizer
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints, trust
from finetune_lab.runs.experiments import pin_config
from finetune_lab.runs.fairseq_logs import last_update
from finetune_lab.runs.manifest import device_info, portable_path
from finetune_lab.runs.recording import (
    record_run,
    refuse_existing_run,
    run_dir_for,
    run_fairseq_train,
)
from finetune_lab.train.pretrain_fairseq import (
    calibrate,
    corpus_entry,
    echoing,
    fairseq_args,
    fairseq_progress,
    require_corpus,
)
from finetune_lab.train.pretrain_lineage import (
    checkpoint_metadata,
    continuation_source,
    continued_run_name,
    runs_built_on,
)
from finetune_lab.runs.runlock import run_lock
from finetune_lab.train.pretrain_recipe import (
    EXPERIMENT,
    Launch,
    PretrainRecipe,
    cpu_has_bf16,
    default_recipe,
    device_defaults,
    experiment_config,
    fresh_state_dir,
    refuse_start_in_state,
    spread,
    state_dir,
)
from finetune_lab.train.pretrain_throughput import throughput_record


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
    root = Path(runs_root) if runs_root is not None else paths().runs
    # refused before any work: the run, the experiment's recipe, where the weights would go
    refuse_existing_run(experiment, run, root, overwrite=overwrite)
    refuse_built_on(run_dir_for(experiment, run, root), root)
    state_name = run if experiment == EXPERIMENT else f"{experiment}-{run}"
    refuse_start_in_state(state_name, parent["path"] if parent is not None else None)
    if package:  # before pin_config, which may write experiment.json (trial 7's P6)
        checkpoints.check_package_dest(package_to)
    pin_config(root / experiment, experiment_config(recipe), recipe.hyperparameters())
    with run_lock(state_dir(state_name)):  # one launch per save folder (24b's W-j1)
        save_dir = fresh_state_dir(state_name)

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
        env = {trust.TRUSTED_DIRS_ENV: str(save_dir)}
        extra: dict[str, Any] = {"calibration": calibration, "corpora": [corpus_entry(bin_dir)]}
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
            checkpoints.package_checkpoint(best, spm_model, spm_dict, package_to,
                                           manifests=manifests, metadata=metadata,
                                           flag="--package-to")
        return run_dir


def refuse_built_on(run_dir: Path, runs_root: Path) -> None:
    """``--overwrite`` of a run that the packaged checkpoint or other runs are built on is
    refused: they would cite another run under its name (trial 16's O-1)."""
    built = runs_built_on(run_dir, runs_root) if run_dir.is_dir() else []
    if built:
        more = f" and {len(built) - 1} more" if len(built) > 1 else ""
        raise UserError(f"{run_dir}: {built[0]}{more} {'is' if len(built) == 1 else 'are'} "
                        "built on this run, and would cite another run under its name; "
                        "choose another --run")
