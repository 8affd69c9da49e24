"""One long pretraining run on a budget in tokens, in as many launches as it takes.

Short continued runs each pay a fresh warm-up and never reach the low learning rates at the end
of a decay. Here the schedule (warm-up, then linear decay to 0) is laid once over the whole
budget, and each launch (a *segment*: a session on a CPU, a call on a GPU) resumes from
fairseq's own ``checkpoint_last.pt`` (weights, optimizer, scheduler and data position), so a
run interrupted anywhere goes on as if it had not been. The budget may end with a
task-adaptive phase [Gururangan et al. 2020] on a second corpus (``prepare-pretrain --tapt``):
same schedule, same validation sets, only the training samples change. Each phase is named by
what its corpus's train side holds (:func:`~finetune_lab.data.pretrain_corpus.corpus_kind`), and
the manifest records every corpus read, so a lineage can be checked for the task's texts.
"""

from __future__ import annotations

import math
import secrets
import shutil
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from finetune_lab._files import sha256_file
from finetune_lab.config import paths
from finetune_lab.data import pretrain_corpus, tokenizer
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints, trust
from finetune_lab.models import position_init as position_inits
from finetune_lab.models.fairseq_compat import LAUNCH_ENV
from finetune_lab.runs.fairseq_logs import line_stat
from finetune_lab.runs.eventfiles import checked_events
from finetune_lab.runs.manifest import (device_info, event_files, portable_path, read_manifest,
                                        write_manifest)
from finetune_lab.runs.recording import record_run, run_fairseq_train, set_aside
from finetune_lab.runs.experiments import pin_config
from finetune_lab.train.pretrain_fairseq import (
    corpus_entry,
    echoing,
    fairseq_args,
    fairseq_progress,
    require_corpus,
)
from finetune_lab.train.pretrain_init import write_random_init
from finetune_lab.runs.runlock import run_lock
from finetune_lab.train.pretrain_resume import (LAST, check_own_state, keep_resume_state,  # noqa: F401
                                                note_save, resume_point)
from finetune_lab.train.pretrain_lineage import checkpoint_metadata, continuation_source
from finetune_lab.train.pretrain_recipe import (
    EXPERIMENT,
    Launch,
    PretrainRecipe,
    cpu_has_bf16,
    default_recipe,
    device_defaults,
    experiment_config,
    spread,
    state_dir,
)
from finetune_lab.train.pretrain_throughput import throughput_record



@dataclass(frozen=True)
class Phase:
    """A stretch of the schedule on one corpus: updates ``start`` (excluded) to ``until``."""

    name: str
    data: Path
    start: int
    until: int


def plan_phases(total_updates: int, general: Path, tapt: Path | None,
                tapt_fraction: float, general_kind: str = "general") -> list[Phase]:
    """The first phase, then (if any) the task-adaptive one over the last ``tapt_fraction``.

    A fraction of 1 is a run that is all task-adaptive: continued weights (``--continue-from``)
    adapted to the task's texts, as Gururangan et al. continue RoBERTa. ``general_kind`` names
    the first phase by what its corpus holds (``--data`` may be a dapt or tapt corpus).
    """
    if total_updates < 1:
        raise UserError("the token budget is less than one update: raise --tokens")
    if not 0 <= tapt_fraction <= 1:
        raise UserError(f"--tapt-fraction must be in [0, 1] (got {tapt_fraction})")
    if tapt is None or tapt_fraction == 0:
        return [Phase(general_kind, general, 0, total_updates)]
    if tapt_fraction == 1:
        return [Phase("tapt", tapt, 0, total_updates)]
    switch = max(1, round(total_updates * (1 - tapt_fraction)))
    return [Phase(general_kind, general, 0, switch), Phase("tapt", tapt, switch, total_updates)]


def phase_records(phases: list[Phase]) -> list[dict[str, Any]]:
    """The phases as the manifest keeps them (read back by ``pretrain_recipe.tapt_start``)."""
    return [{"name": p.name, "until_update": p.until} for p in phases]



def start_over_unsaved(run_dir: Path, save_dir: Path, save_every: int) -> None:
    """An unfinished run with no resumable state here: one that failed before its first save
    (Ctrl-C in its first minutes; trial 8's P9) starts over, its folder cleared as a re-run
    clears a failed run's; any other cannot resume here, and the message says what to do."""
    man = read_manifest(run_dir)
    last = max((checked_events(f)[0] for f in event_files(run_dir)), default=0)
    if man.get("status") == "failed" and last < save_every \
            and not any(save_dir.glob("checkpoint*.pt")):
        print(f"{run_dir} stopped at update {last}, before its first save (update "
              f"{save_every}): it starts over", flush=True)
        set_aside(run_dir)
        return
    if man.get("status") == "running":  # trial 21's W2-c2: a second launch beside a live one
        raise UserError(
            f"{run_dir} is running and has saved no state yet ({save_dir / LAST}): another "
            "launch may be writing it now (wait for it, or choose another --run); if none is, "
            "it was killed before its first save: move the run folder aside to start it over")
    raise UserError(
        f"{run_dir} is an unfinished run whose resumable state ({save_dir / LAST}) is not on "
        "this machine. It cannot resume; start a new run from the weights it last packaged "
        "(`--continue-from DIR --run NEW`), or move the run folder aside to start it over")


def progress_line(line: str, tokens_per_update: int, total_updates: int) -> str | None:
    """``tokens done / budget, tokens/s, ETA`` from one of fairseq's ``train_inner`` lines."""
    if "| train_inner |" not in line:
        return None
    updates, wps = line_stat(line, "num_updates"), line_stat(line, "wps")
    if updates is None or wps is None or wps <= 0:
        return None
    done = int(updates) * tokens_per_update
    total = total_updates * tokens_per_update
    eta_s = max(0, total - done) / wps
    return (f"pretrain: {done / 1e6:.2f} M of {total / 1e6:.2f} M tokens "
            f"({100 * done / total:.1f} %), {wps:,.0f} tokens/s, "
            f"{(total - done) / 1e6:.2f} M left, ETA {eta_s / 3600:.1f} h")


def pretrain_long(*, run: str, **launch: Any) -> Path:
    """One launch of the long run ``run`` (:func:`_launch`), holding the lock of its save folder
    in the work folder throughout (trial 24's W-i: two run stores sharing one work folder
    launched a run of the same name side by side, into one save folder, and each recorded the
    other's state as its own)."""
    with run_lock(state_dir(run)):
        return _launch(run=run, **launch)


def _launch(
    *,
    run: str,
    tokens: int,
    continue_from: Path | None = None,
    seed: int | None = None,
    data_dir: Path | None = None,
    tapt_dir: Path | None = None,
    tapt_fraction: float = 0.0,
    recipe: PretrainRecipe | None = None,
    precision: str | None = None,
    segment_minutes: float | None = None,
    segment_updates: int | None = None,
    runs_root: Path | None = None,
    package: bool = True,
    package_to: Path | None = None,
    quiet: bool = False,
    launch: Launch = Launch(),
    position_init: str = "keep",
) -> Path:
    """Run (or resume) the long run ``run`` until its budget is spent or this segment's time is.

    The first launch fixes the recipe; a later one with another recipe, seed or budget is
    refused (a different run needs another name). ``segment_minutes`` (or ``segment_updates``)
    ends this launch early, resumable. When the budget is spent, the final weights (the end of
    the decay) are packaged, to ``package_to`` or the committed checkpoint's folder.
    ``position_init="sinusoidal"`` writes sinusoids into the continued weights' position table
    before the first update (:mod:`~finetune_lab.models.position_init`).
    """
    defaults = device_defaults()
    recipe = recipe or default_recipe()
    device, precision = defaults["device"], precision or defaults["precision"]
    if device == "cpu" and precision == "bf16" and not cpu_has_bf16():
        print("pretrain: this CPU has no native bf16: it is emulated, slower than fp32")
    general = require_corpus(Path(data_dir) if data_dir else pretrain_corpus.default_output())
    tapt = None
    if tapt_fraction > 0:
        tapt = require_corpus(Path(tapt_dir) if tapt_dir else pretrain_corpus.tapt_output())
        if sha256_file(tapt / "dict.txt") != sha256_file(general / "dict.txt"):
            raise UserError(f"{tapt} and {general} have different dictionaries: build both with "
                            "the same tokenizer (`finetune-lab prepare-pretrain` and "
                            "`finetune-lab prepare-pretrain --tapt`)")
    spm_model, spm_dict = tokenizer.require_tokenizer(tokenizer.default_output())
    tokens_per_update = recipe.tokens_per_sample * recipe.batch_size * recipe.update_freq
    total = math.ceil(tokens / tokens_per_update)
    recipe = replace(recipe, max_update=total)
    first = pretrain_corpus.corpus_record(general)
    phases = plan_phases(total, general, tapt, tapt_fraction,
                         general_kind=first["kind"] if first else "general")
    parent = continuation_source(Path(continue_from), general) if continue_from else None
    if position_init not in position_inits.CHOICES:
        raise UserError(f"--position-init must be one of {', '.join(position_inits.CHOICES)} "
                        f"(got {position_init!r})")
    if seed is None:  # as `pretrain`: never replay the samples the weights were trained on
        seed = 1 + (len(parent["lineage"]) if parent is not None else 0)

    root = Path(runs_root) if runs_root is not None else paths().runs
    if package:  # refused before pin_config may write experiment.json
        checkpoints.check_package_dest(package_to)
    pin_config(root / EXPERIMENT, experiment_config(recipe),  # before any work, as the next
               recipe.hyperparameters())
    save_dir = state_dir(run)
    save_dir.mkdir(parents=True, exist_ok=True)
    point = resume_point(save_dir)
    per_process = spread(recipe, launch.world_size)
    hyper = {**recipe.hyperparameters(), "precision": precision, "budget_minutes": None,
             **launch.hyperparameters(per_process),
             "budget_tokens": int(tokens), "tapt_fraction": tapt_fraction,
             "phases": phase_records(phases)}
    if position_init != "keep":  # absent from the runs before the option, which kept them
        hyper["position_init"] = position_init
    run_manifest = root / EXPERIMENT / run / "manifest.json"
    if point is not None and not run_manifest.is_file():
        raise UserError(f"{save_dir} holds the state of a run that {run_manifest.parent} does "
                        "not record: a run of that name in another run store sharing this work "
                        "folder (resume it there), or a run folder that was lost (recover it); "
                        "or give this run another --run name")  # never "delete" (25's W-k2)
    if point is None and run_manifest.is_file():
        if read_manifest(run_manifest.parent).get("status") != "complete":
            start_over_unsaved(run_manifest.parent, save_dir, recipe.validate_every)
    if point is not None:
        check_own_state(run_manifest.parent, save_dir / LAST, point["updates"],
                        [p.data for p in phases], made=point)

    init_copy = save_dir / "init_model.pt"
    # from scratch with sinusoids: the random weights fairseq would draw, in a file to rewrite
    starts_from_file = parent is not None or position_init != "keep"
    extra: dict[str, Any] = {"calibration": None,
                             "corpora": [corpus_entry(p.data, p.name) for p in phases]}
    if starts_from_file and point is None:
        if parent is not None:
            shutil.copyfile(parent["path"], init_copy)
        else:
            extra["random_init"] = write_random_init(
                fairseq_args(phases[0].data, save_dir, per_process, seed=seed, device=device,
                             precision=precision), init_copy)
        if position_init == "sinusoidal":
            extra["position_init"] = position_inits.write_sinusoidal_positions(init_copy)
    if parent is not None:
        extra["continued_from"] = {k: parent[k] for k in ("sha256", "run", "lineage")}
    env = {trust.TRUSTED_DIRS_ENV: str(save_dir)}
    deadline = time.monotonic() + 60 * segment_minutes if segment_minutes else None
    with record_run(EXPERIMENT, run, framework="fairseq",
                    init="random" if parent is None else "continued", seed=seed,
                    hyperparameters=hyper, data=[p.data for p in phases], runs_root=runs_root,
                    extra=extra, resume=True) as handle:
        *earlier, segment = handle.manifest["segments"]
        segment["updates_from"] = first = point["updates"] if point else 0
        if earlier and earlier[-1].get("updates_to") is None:  # killed: it got as far as saved
            earlier[-1]["updates_to"] = first
        # a random id for this launch, on disk before fairseq starts: the plugin writes it into
        # every state it saves, and only a state with one of the run's ids is the run's own
        segment["launch"] = env[LAUNCH_ENV] = secrets.token_hex(8)
        write_manifest(handle.run_dir, handle.manifest)
        try:
            for phase in phases:
                point = resume_point(save_dir)
                done = point["updates"] if point else 0
                if done >= phase.until:
                    continue
                if done < phase.start:  # the previous phase stopped early (time): resume it first
                    break
                stop_minutes = None
                if deadline is not None:
                    left = (deadline - time.monotonic()) / 60
                    if left < 1:
                        break
                    stop_minutes = (point["training_time_s"] if point else 0) / 60 + left
                until = phase.until
                if segment_updates is not None:
                    if done >= first + segment_updates:
                        break
                    until = min(until, first + segment_updates)
                args = fairseq_args(phase.data, save_dir, per_process, seed=seed, device=device,
                                    precision=precision, stop_minutes=stop_minutes,
                                    init_from=init_copy if point is None and starts_from_file
                                    else None,
                                    stop_update=until) + launch.fairseq_flags(device)
                if point is not None and done == phase.start and phase.start > 0:
                    args.append("--reset-dataloader")  # the phase's corpus, from its start
                print(f"pretrain: {run}, phase {phase.name}: updates {done} to {until} of "
                      f"{total} ({tokens_per_update} tokens each)", flush=True)
                progress = partial(progress_line, tokens_per_update=tokens_per_update,
                                   total_updates=total)

                def watch(line: str) -> str | None:
                    note_save(line, handle.manifest, handle.run_dir, save_dir / LAST)
                    return None if quiet else progress(line) or fairseq_progress(line)
                with echoing(handle.run_dir / "train.log", watch):
                    run_fairseq_train(handle, args, env=env, launcher=launch.launcher())
        except BaseException:
            # stopped (SIGTERM, Ctrl-C, a failed launch): the state it leaves is the one the
            # next launch must find (trial 17's W2-v3: another run's state then passed)
            keep_resume_state(handle.manifest, save_dir / LAST)
            raise
        point = resume_point(save_dir)
        done = point["updates"] if point else 0
        segment["updates_to"] = done
        handle.manifest["updates_done"] = done
        handle.paused = done < total
        log = handle.run_dir / "train.log"  # none when the launch trained nothing
        log_text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        handle.manifest["throughput"] = throughput_record(log_text, recipe, device_info())
        final = save_dir / LAST
        if not handle.paused:
            handle.manifest.pop("resume_state", None)
            handle.manifest["saved_checkpoints"] = {
                LAST: {"path": portable_path(final), "sha256": sha256_file(final)}}
        else:  # what the next launch must find there (check_own_state)
            keep_resume_state(handle.manifest, final)
        run_dir = handle.run_dir
    if done < total:
        print(f"pretrain: {run} paused at update {done} of {total}; run the same command "
              "again to go on", flush=True)
        return run_dir
    if not package:
        return run_dir
    manifests = [run_dir / "manifest.json"]
    checkpoints.package_checkpoint(final, spm_model, spm_dict, package_to, manifests=manifests,
                                   metadata=checkpoint_metadata(final, manifests),
                                   flag="--package-to")
    return run_dir
