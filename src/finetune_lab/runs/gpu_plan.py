"""What one GPU device call runs: the plan that travels in ``.gpu/plan.json`` and its jobs.

A call to the lent GPU machine (:mod:`finetune_lab.gpu_lab`) runs one command of at most 10
minutes. The plan says which steps it takes (the lab's fine-tuning grid, a pretraining run, or
both, the pretraining's weights then fine-tuned in the same call) and, from it, this module
derives the command lines of the jobs and the time each may take.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from finetune_lab.errors import UserError
from finetune_lab.runs.jobs import Job

BUNDLE_DIR = ".gpu"
"""Repo-relative folder the device call carries (``carry: [".gpu"]``); git-ignored."""
PLAN_FILE = "plan.json"
GPU_SUFFIX = "-gpu"
"""A device call's experiments are the lab's with this suffix (``fairseq-gpu``, ...): its runs sit
beside the CPU runs of the same recipe, never among them."""
SUFFIX_TINY = "-smoke"
"""Experiments of a tiny-budget call are named apart, so they never mix with real runs."""
TINY_PRETRAIN_BATCH = 2
"""Sequences per update of a tiny call's pretraining (four updates of the lab's batch took 24 s
of a 2-core CPU's rehearsal)."""
TINY_PRETRAIN_UPDATES = 2
"""Updates of a tiny call's pretraining, whatever the clock says: each validates and saves, as
a real call's last one does (each took 6 s of the rehearsal, four of them half its pretraining)."""
TINY_LORA_METHODS = ("lora-qv", "qlora-qv")
"""The LoRA methods a tiny call rehearses: both code paths (bitsandbytes' or not); ``lora-attn``
differs from ``lora-qv`` only in the modules it adapts."""
LAB_PARTS = ("fairseq", "transformers", "lora")
PRETRAIN_TAIL_S = 120.0
"""Seconds a pretraining job spends outside its time budget (which covers the calibration run):
fairseq's start, the last validation and saving, an exit that hangs (``recording.EXIT_GRACE_S``),
packaging the weights. 100 s, with the calibration outside the budget, lost a run."""
TEST_FILE_ROOT = "data/work/books-test-file"
"""Where a call carries Webis-CLS-10's books test and training files, as a data root holding
those two: the device has no data root, and each run there compares its split or its corpus with
the test file (``split_checks.check_split``, ``binarized.check_corpus``) as it would here (trial
24's D-i2), the 51 reviews the training file shares with it allowed in a corpus."""
GPU_CORPUS = "pretrain-gpu-bin"
"""The corpus slice a pretraining call carries (under the work dir, here and there), followed
by the run's name (:attr:`Plan.corpus`): each run names its own slice, so the next call's slice
never replaces the data an earlier run's hashes check against (runs before that named this)."""


@dataclass
class Plan:
    """What one call runs. ``lab``: the fairseq grid, the Transformers pretrained seeds and the
    LoRA methods, from the committed checkpoint; ``pretrain``: a stand-in pretrained for
    ``pretrain_minutes``, packaged as a candidate."""

    steps: list[str] = field(default_factory=lambda: ["lab"])
    tiny: bool = False
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    epochs: int = 5
    fairseq_inits: list[str] = field(default_factory=lambda: ["pretrained", "random"])
    """The fairseq runs' initialisations (a candidate's call needs only its pretrained seeds)."""
    transformers_inits: list[str] = field(default_factory=lambda: ["pretrained", "random"])
    """The Transformers runs' initialisations: the lab's pretrained-vs-random pair, as fairseq's."""
    lora_methods: list[str] = field(default_factory=lambda: ["lora-qv", "lora-attn", "qlora-qv"])
    lab_parts: list[str] = field(default_factory=lambda: list(LAB_PARTS))
    checkpoint: str | None = None
    """Repo-relative folder of packaged weights (carried) that the fairseq pretrained runs start
    from instead of the committed checkpoint; their runs then go to ``candidate_experiment``."""
    candidate_experiment: str | None = None
    pretrain_minutes: float = 0.0
    """0: as long as the call's deadline leaves (see :func:`pretrain_budget`)."""
    pretrain_tokens: int = 0
    """Tokens of the corpus slice carried (0: none)."""
    pretrain_lr: float | None = None
    pretrain_batch_size: int | None = None
    pretrain_update_freq: int | None = None
    pretrain_max_update: int | None = None
    """Updates of the pretraining schedule, when a run on this machine measured the rate: no
    calibration run, and the time budget only as fairseq's stop."""
    pretrain_run: str = "gpu"
    """The pretraining run's name, and its candidate's folder under ``data/work/candidates``."""
    tapt: bool = False
    """Mix the CLS-Books training texts (``prepare-pretrain --tapt``) into the corpus slice."""
    then_finetune: bool = False
    """With both steps: fine-tune the weights the pretraining step packages, after it in the same
    call (its fairseq pretrained seeds go to ``candidate_experiment``); the pretraining leaves
    ``finetune_reserve_s`` of the call for that."""
    finetune_reserve_s: float = 150.0
    """Five fairseq fine-tunings of the lab's recipe side by side took 100 s on an H100, start and
    snapshots included (call 20261126T160047Z). 240 s left the pretraining 10 s after setup."""
    runs_until_s: float = 420.0
    """Seconds after the call starts when unfinished runs are stopped (marked interrupted): with
    up to 60 s for them to stop and a last small snapshot, the call ends within 8 minutes, setup
    included, which leaves the session's 15 minutes of device time room for the machine's start
    and a short rerun. Each finished run is already in ``$OUT`` by then (:mod:`gpu_remote`)."""

    def experiment(self, base: str) -> str:
        return f"{base}{GPU_SUFFIX}{SUFFIX_TINY if self.tiny else ''}"

    @property
    def pretrain_name(self) -> str:
        """The pretraining run's name there, and its candidate folder's."""
        return f"{self.pretrain_run}{SUFFIX_TINY}" if self.tiny else self.pretrain_run

    @property
    def corpus(self) -> str:
        """The folder under the work dir that holds this call's corpus slice."""
        return f"{GPU_CORPUS}-{self.pretrain_name}"

    def candidate(self, name: str) -> str:
        """Where fine-tuning runs of other weights go: the next candidate experiment here (a
        tiny call's kept apart)."""
        return self.experiment(name) if self.tiny else name


def _job(logs: Path, name: str, argv: list[str]) -> Job:
    return Job(name, argv, logs / f"{name}.log")


def lab_jobs(plan: Plan, logs: Path, python: str = sys.executable) -> list[Job]:
    """One process per run: the fairseq grid, the Transformers grid (pretrained and random
    seeds), the LoRA methods (those of ``plan.lab_parts``), each logging to
    ``logs/<name>.log``."""
    cli = [python, "-m", "finetune_lab.cli", "finetune"]
    seeds = [str(s) for s in plan.seeds]
    epochs = ["--epochs", str(plan.epochs)]
    jobs: list[Job] = []
    if "fairseq" in plan.lab_parts:
        for init in plan.fairseq_inits:
            where = ["--experiment", plan.experiment("fairseq")]
            if init == "pretrained" and plan.checkpoint:
                where = ["--checkpoint", plan.checkpoint, "--experiment",
                         plan.candidate_experiment or plan.experiment("fairseq-candidate")]
            jobs += [_job(logs, f"fairseq-{init}-seed{s}",
                          [*cli, "fairseq", "--init", init, "--seeds", s, *epochs, *where])
                     for s in seeds]
    if "transformers" in plan.lab_parts:
        jobs += [_job(logs, f"transformers-{init}-seed{s}",
                      [*cli, "transformers", "--init", init, "--seeds", s, *epochs,
                       "--experiment", plan.experiment("transformers")])
                 for init in plan.transformers_inits for s in seeds]
    if "lora" in plan.lab_parts:
        jobs += [_job(logs, f"lora-{m}-seed{s}",
                      [*cli, "lora", "--methods", m, "--seeds", s, *epochs,
                       "--experiment", plan.experiment("lora")])
                 for m in plan.lora_methods for s in seeds]
    return jobs


def pretrain_deadline(plan: Plan, started: float) -> float:
    """When the pretraining job must have ended: the call's run deadline, less the fine-tuning
    reserve when the same call fine-tunes its weights (``started`` and the result are
    ``time.monotonic()`` readings)."""
    reserve = plan.finetune_reserve_s if plan.then_finetune and "lab" in plan.steps else 0.0
    return started + plan.runs_until_s - reserve


def pretrain_budget(plan: Plan, started: float, now: float | None = None) -> float:
    """Minutes of training for the pretraining job: the plan's, or (0) what is left before the
    call's deadline once :data:`PRETRAIN_TAIL_S` is set aside."""
    if plan.pretrain_minutes > 0:
        return plan.pretrain_minutes
    if plan.tiny:  # a few updates (pretrain_jobs), not a time budget: a slow machine runs them
        return 1.0
    left = pretrain_deadline(plan, started) - (time.monotonic() if now is None else now) \
        - PRETRAIN_TAIL_S
    if left < 60:
        reserve = started + plan.runs_until_s - pretrain_deadline(plan, started)
        raise UserError(f"only {left:.0f} s are left for pretraining before the call's deadline "
                        f"({plan.runs_until_s:.0f} s, less {reserve:.0f} s kept for fine-tuning "
                        f"and {PRETRAIN_TAIL_S:.0f} s to save and package): pretrain alone "
                        "(gpu-bundle without --then-finetune) or carry less to set up")
    return left / 60


def pretrain_jobs(plan: Plan, logs: Path, python: str = sys.executable,
                  minutes: float | None = None) -> list[Job]:
    """The pretraining run: a time budget (or the plan's schedule, stopped by the time budget),
    the carried corpus slice, its weights packaged as a candidate."""
    budget = (["--max-update", str(TINY_PRETRAIN_UPDATES)] if plan.tiny else
              ["--minutes", f"{minutes or plan.pretrain_minutes:.2f}"])
    if plan.pretrain_max_update and not plan.tiny:
        budget = ["--max-update", str(plan.pretrain_max_update),
                  "--stop-minutes", f"{minutes or plan.pretrain_minutes:.2f}"]
    if plan.tiny and plan.pretrain_batch_size is None:  # the commands, not the model, rehearsed
        budget += ["--batch-size", str(TINY_PRETRAIN_BATCH)]
    for flag, value in (("--lr", plan.pretrain_lr), ("--batch-size", plan.pretrain_batch_size),
                        ("--update-freq", plan.pretrain_update_freq)):
        if value is not None:
            budget += [flag, f"{value:g}"]
    name = plan.pretrain_name
    return [_job(logs, "pretrain", [python, "-m", "finetune_lab.cli", "pretrain", *budget,
                                    "--data", f"data/work/{plan.corpus}/bin", "--run", name,
                                    "--experiment", plan.experiment("pretrain"),
                                    "--package-to", f"data/work/candidates/{name}"])]
