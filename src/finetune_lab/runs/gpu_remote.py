"""There, on the GPU machine: install what the bundle carries, run the plan's jobs, pack the runs.

``bash scripts/gpu-lab.sh`` starts :func:`remote` (through ``python -m finetune_lab.gpu_lab``):
it installs the carried wheels, compiles fairseq's two Cython modules in place, binarizes
CLS-Books with the same tokenizer (so the data hashes match the ones here), runs the plan's jobs
side by side (one process per run, CPU threads split between them, all on the one GPU), and
packs the new run folders and weights (:mod:`finetune_lab.runs.gpu_archive`). The machine has
torch, transformers and peft but no fairseq: this module imports none of them at its top.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from finetune_lab._files import parse_json
from finetune_lab.config import DATA_ROOT_ENV, PROJECT_ROOT, paths
from finetune_lab.errors import UserError
from finetune_lab.runs import jobs
from finetune_lab.runs.gpu_archive import pack
from finetune_lab.runs.gpu_plan import (
    PLAN_FILE,
    TEST_FILE_ROOT,
    Plan,
    lab_jobs,
    pretrain_budget,
    pretrain_deadline,
    pretrain_jobs,
)

CYTHON_MODULES = ("data_utils_fast", "token_block_utils_fast")
"""fairseq's compiled modules that the lab needs; its C++ ones (BLEU, NAT, BASE layers) it
does not."""


DEFERRED_IMPORTS = {
    "fairseq/criterions/sentence_prediction.py": {
        b"from sklearn.metrics import f1_score": b"    f1 = f1_score(",
        b"from sklearn.metrics import matthews_corrcoef as _matthews_corrcoef":
            b"    mcc = _matthews_corrcoef(",
        b"from scipy.stats import pearsonr, spearmanr": b"    pearson_corr = pearsonr("},
    "fairseq/tasks/audio_classification.py": {
        b"from sklearn import metrics as sklearn_metrics":
            b"            fpr, tpr, thresholds = sklearn_metrics.roc_curve("},
}
"""Imports at the top of two fairseq modules that every fairseq process loads (its registries
import every criterion and task), each moved to just before the one line that uses it: the
GLUE metrics and an audio task, never used here, that cost each process 1.2 s of its 4 s start
(scikit-learn and SciPy)."""


def defer_unused_imports(src: Path) -> list[str]:
    """Move :data:`DEFERRED_IMPORTS` in the fairseq source tree ``src`` (its line endings kept);
    the modules it changed. A module whose lines are not as listed (another fairseq) is left as
    it is: it then starts as slowly as fairseq does, and works the same."""
    changed = []
    for rel, moves in DEFERRED_IMPORTS.items():
        path = src / rel
        text = path.read_bytes() if path.is_file() else b""
        eol = b"\r\n" if b"\r\n" in text else b"\n"
        lines = text.split(eol)
        def where(start: bytes) -> list[int]:
            return [i for i, line in enumerate(lines) if line.startswith(start)]

        if not all(len(where(imp)) == len(where(use)) == 1 for imp, use in moves.items()):
            continue
        for imp, use in moves.items():
            lines.remove(imp)
            at = where(use)[0]
            lines[at:at] = [use[:len(use) - len(use.lstrip())] + imp]
        path.write_bytes(eol.join(lines))
        changed.append(rel)
    return changed


def build_fairseq(src: Path) -> None:
    """Compile fairseq's Cython modules in place (seconds; its C++ extensions are not needed),
    with its unused imports deferred (:func:`defer_unused_imports`)."""
    defer_unused_imports(src)
    code = (
        "import numpy\n"
        "from setuptools import Extension, setup\n"
        "from Cython.Build import cythonize\n"
        f"names = {list(CYTHON_MODULES)!r}\n"
        "exts = [Extension('fairseq.data.' + n, ['fairseq/data/' + n + '.pyx'],\n"
        "        include_dirs=[numpy.get_include()], language='c++',\n"
        "        extra_compile_args=['-std=c++11', '-O2']) for n in names]\n"
        "setup(name='fairseq-src', ext_modules=cythonize(exts, quiet=True),\n"
        "      script_args=['build_ext', '--inplace', '-q', '-j', '2'])\n"  # both at once
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise UserError(f"compiling fairseq's Cython modules failed:\n{proc.stderr[-3000:]}")


def run_jobs(todo: Sequence[jobs.Job], *, env: dict[str, str], parallel: int | None = None,
             deadline: float | None = None,
             on_done: Callable[[list[dict[str, Any]]], None] | None = None,
             ) -> list[dict[str, Any]]:
    """Run the jobs side by side (:func:`finetune_lab.runs.jobs.run_parallel`); each one's exit
    code, time and log (relative to the logs' parent folder), for ``gpu-lab.json``. ``on_done``
    gets the results so far each time a job ends."""
    so_far: list[dict[str, Any]] = []

    def entry(r: jobs.JobResult) -> dict[str, Any]:
        return {"job": r.name, "exit_code": r.exit_code, "seconds": r.seconds,
                "log": f"{r.log.parent.name}/{r.log.name}"}

    def ended(r: jobs.JobResult) -> None:
        so_far.append(entry(r))
        if on_done is not None:
            on_done(list(so_far))

    results = jobs.run_parallel(todo, parallel or len(todo), env=env, label="gpu-lab",
                                deadline=deadline, on_done=ended)
    return [entry(r) for r in results]


def finished_runs(experiment: Path) -> list[Path]:
    """The run folders of an experiment whose manifest says complete: what a snapshot carries
    (a run still going, stopped or failed stays behind; its log comes back with the logs)."""
    done = []
    for run in sorted(p for p in experiment.iterdir() if p.is_dir()):
        try:
            man = parse_json((run / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(man, dict) and man.get("status") == "complete":
            done.append(run)
    return done


def gpu_monitor(log: Path) -> subprocess.Popen | None:
    """``nvidia-smi`` sampling the GPU's use and memory every second into ``log`` (the call's
    own record of how busy the device was); None where there is no ``nvidia-smi``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        query = "--query-gpu=timestamp,utilization.gpu,memory.used,power.draw"
        return subprocess.Popen([exe, query, "--format=csv", "-l", "1"],
                                stdout=fh, stderr=subprocess.DEVNULL)


@functools.cache
def device_info() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        return {"type": "cuda", "name": torch.cuda.get_device_name(0),
                "count": torch.cuda.device_count(), "torch": torch.__version__}
    return {"type": "cpu", "name": "cpu", "count": os.cpu_count(), "torch": torch.__version__}


def remote(bundle_dir: Path, out: Path, *, parallel: int | None = None) -> dict[str, Any]:
    """Everything the device call does after ``scripts/gpu-lab.sh`` starts it."""
    started = time.monotonic()  # durations and deadlines; the log folder's name is a date
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    bundle_dir = Path(bundle_dir).resolve()
    plan = Plan(**parse_json((bundle_dir / PLAN_FILE).read_text(encoding="utf-8")))
    timings: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="gpu-lab-"))
    site, src = work / "site", work / "fairseq-src"

    def step(name: str, t0: float) -> None:
        timings[name] = round(time.monotonic() - t0, 1)
        print(f"gpu-lab: {name} done in {timings[name]:.0f} s", flush=True)

    t0 = time.monotonic()
    wheels = sorted(str(w) for w in (bundle_dir / "wheels").glob("*.whl"))
    if wheels:  # a rehearsal bundle (gpu-bundle --from-environment) carries none
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--disable-pip-version-check", "--target", str(site),
                        *wheels], check=True)
    if (bundle_dir / "fairseq-src.tar.xz").is_file():
        with tarfile.open(bundle_dir / "fairseq-src.tar.xz") as tar:
            tar.extractall(work, filter="data")
        build_fairseq(src)
    step("install", t0)
    t0 = time.monotonic()
    with tarfile.open(bundle_dir / "data.tar.xz") as tar:
        tar.extractall(PROJECT_ROOT, filter="data")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(src), str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        DATA_ROOT_ENV: str(PROJECT_ROOT / TEST_FILE_ROOT)}  # what the split checks read
    logs = work / "logs"
    monitor = gpu_monitor(logs / "nvidia-smi.csv")
    cli = [sys.executable, "-m", "finetune_lab.cli"]
    prep = []
    if "lab" in plan.steps:
        prep.append(jobs.Job("binarize-cls", [*cli, "binarize-cls"], logs / "binarize-cls.log"))
    if "lab" in plan.steps and {"transformers", "lora"} & set(plan.lab_parts):
        # once, before the runs that read the conversion start side by side
        prep.append(jobs.Job("convert-hf", [*cli, "convert-hf"], logs / "convert-hf.log"))
    results = []
    for job in prep:  # the runs share these, so they come first, one at a time
        results += run_jobs([job], env=env, parallel=1)
    step("data", t0)
    runs = paths().runs
    # The committed runs travel with the tree: a snapshot carries only the runs this call made.
    present = {p for p in runs.glob("*/*") if p.is_dir()}
    kept = paths().work / "gpu-lab-logs" / stamp
    generation = 0

    def snapshot(results_now: list[dict[str, Any]]) -> dict[str, Any]:
        """Everything finished so far, to ``out`` at once (replacing the last snapshot whole),
        so that a deadline, a crash or a kill of the call keeps every finished run."""
        nonlocal generation
        generation += 1
        t = time.monotonic()
        members: list[Path] = []
        products: list[Path] = []
        experiments = [plan.experiment(base) for base in ("fairseq", "transformers", "lora",
                                                          "pretrain")]
        if plan.checkpoint:
            experiments.append(plan.candidate_experiment or plan.experiment("fairseq-candidate"))
        for name in experiments:
            runs_done = [r for r in (finished_runs(runs / name) if (runs / name).is_dir()
                                     else []) if r not in present]
            if runs_done:
                products.append(runs / name)
                members += [p for p in [runs / name / "experiment.json"] if p.is_file()]
                members += runs_done
        if "pretrain" in plan.steps:  # never a carried --checkpoint back
            fresh = paths().work / "candidates" / plan.pretrain_name
            if (fresh / "manifest.json").is_file():
                products.append(fresh)
                members.append(fresh)
        shutil.copytree(logs, kept, dirs_exist_ok=True)
        products.append(kept)
        members.append(kept)
        made = pack(members, out, generation=generation, extra={
            "plan": asdict(plan), "device": device_info(), "jobs": results + results_now,
            "timings_s": timings, "wall_s": round(time.monotonic() - started, 1),
            "snapshot": generation,
            "products": [p.relative_to(PROJECT_ROOT).as_posix() for p in products]})
        print(f"gpu-lab: snapshot {generation} ({len(members)} items) in "
              f"{time.monotonic() - t:.1f} s at {time.monotonic() - started:.0f} s", flush=True)
        return made

    todo: list[jobs.Job] = []
    if "pretrain" in plan.steps:
        todo += pretrain_jobs(plan, logs, minutes=pretrain_budget(plan, started))
    t0 = time.monotonic()
    if plan.then_finetune and "lab" in plan.steps:  # pretraining first, then its weights
        results += run_jobs(todo, env=env, parallel=1, deadline=pretrain_deadline(plan, started))
        step("pretraining", t0)
        fresh = paths().work / "candidates" / plan.pretrain_name
        if (fresh / "model.pt").is_file():
            plan = replace(plan, checkpoint=fresh.relative_to(PROJECT_ROOT).as_posix())
        else:
            print("gpu-lab: the pretraining packaged no weights: the lab's pretrained runs use "
                  "the committed checkpoint", flush=True)
        todo = []
        snapshot([])
    if "lab" in plan.steps:
        todo += lab_jobs(plan, logs)
    # The call is killed at 10 minutes with nothing sent back: stop the runs in time, and save
    # each finished run at once.
    results += run_jobs(todo, env=env, parallel=parallel, deadline=started + plan.runs_until_s,
                        on_done=snapshot)
    step("runs", t0)
    if monitor is not None:
        monitor.terminate()
    result = snapshot([])
    print(f"gpu-lab: whole call {time.monotonic() - started:.0f} s", flush=True)
    return result
