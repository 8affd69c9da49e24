"""One call on a lent GPU machine: what travels there, what runs there, what comes back.

The device tool sends the working tree plus carried git-ignored folders (64 MiB in all) to a bare
machine that has torch, transformers and peft but no fairseq and no network, runs one command
of at most 10 minutes, and returns at most 8 files of 16 MiB each from ``$OUT``. Hence three
steps, each tested end to end on a CPU with a tiny budget (``tests/test_gpu_lab.py``):

* here, ``finetune-lab gpu-bundle`` fills ``.gpu/`` (git-ignored, carried): fairseq-fixed's
  sdist without its examples and tests, wheels of what the machine lacks (bitsandbytes keeps only
  the CUDA build the machine's torch loads), the CLS-Books texts and the tokenizer (never
  committed: they travel as carried files), optionally a slice of the binarized pretraining
  corpus, and ``plan.json``, what to run;
* there, ``bash scripts/gpu-lab.sh`` (:func:`remote`) installs the wheels, compiles fairseq's two
  Cython modules in place, binarizes CLS-Books with the same tokenizer (so the data hashes match
  the ones here), runs the plan's jobs side by side (one process per run, CPU threads split
  between them, all on the one GPU), and packs the new run folders and weights into pieces under
  16 MiB with their sha256;
* here, ``finetune-lab gpu-unpack DIR`` checks and reassembles the pieces and moves each run into
  the run cache, under experiments of its own (``fairseq-gpu``, ...), where the registry checks it
  like any other run. Nothing already there is replaced.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from finetune_lab.argtypes import positive_int
from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.errors import UserError

BUNDLE_DIR = ".gpu"
"""Repo-relative folder the device call carries (``carry: [".gpu"]``); git-ignored."""
PLAN_FILE = "plan.json"
RESULT_FILE = "gpu-lab.json"
ARCHIVE = "gpu-lab.tar"
TRANSFER_LIMIT = 64 * 2**20
"""Working tree plus carried paths, per call."""
PIECE_BYTES = 15 * 2**20
"""Under the 16 MiB a file from ``$OUT`` may have."""
MAX_FILES_BACK = 8
GPU_PYTHON = "3.12"
"""The device machine's Python (KINDS.md)."""
CUDA_LIB = "libbitsandbytes_cuda130.so"
"""The bitsandbytes build that the machine's torch (cu130) loads; the others stay here."""
FAIRSEQ_SDIST = "fairseq-fixed==0.12.3.1"
WHEELS = ("hydra-core==1.3.2", "omegaconf==2.3.0", "bitarray", "bitsandbytes")
"""fairseq's needs that the machine's image lacks, and bitsandbytes for QLoRA."""
SDIST_WHEELS = ("antlr4-python3-runtime==4.9.3",)
"""Pure-Python needs published only as sdists: built into wheels here."""
DROP_FROM_SDIST = ("fairseq/examples", "examples", "tests", "docs")
"""17 of fairseq's 23 MB; nothing the lab imports lives there."""
CYTHON_MODULES = ("data_utils_fast", "token_block_utils_fast")
"""fairseq's compiled modules that the lab needs; its C++ ones (BLEU, NAT, BASE layers) it
does not."""
SUFFIX_TINY = "-smoke"
"""Experiments of a tiny-budget call are named apart, so they never mix with real runs."""
TINY_SIZES = {"train": 16, "valid": 8, "test": 8}
TINY_VALID_TOKENS = 4096
LAB_PARTS = ("fairseq", "transformers", "lora")
PRETRAIN_TAIL_S = 120.0
"""Seconds a pretraining job spends outside its time budget (which covers the calibration run):
fairseq's start, the last validation and saving, an exit that hangs (``recording.EXIT_GRACE_S``),
packaging the weights. 100 s, with the calibration outside the budget, lost a run."""
SLICE_CHUNK = 1000
"""Consecutive paragraphs kept or dropped together by :func:`corpus_slice`."""
GPU_CORPUS = "pretrain-gpu-bin"
"""The corpus slice a pretraining call carries (under the work dir, here and there)."""


@dataclass
class Plan:
    """What one call runs. ``lab``: the fairseq grid, the Transformers pretrained seeds and the
    LoRA methods, from the committed checkpoint; ``pretrain``: a stand-in pretrained for
    ``pretrain_minutes``, packaged as a candidate."""

    steps: list[str] = field(default_factory=lambda: ["lab"])
    tiny: bool = False
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    epochs: int = 5
    lora_methods: list[str] = field(default_factory=lambda: ["lora-qv", "qlora-qv"])
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
    finetune_reserve_s: float = 240.0
    runs_until_s: float = 530.0
    """Seconds after the call starts when unfinished runs are stopped (marked interrupted), so
    that packing ends inside the device's 10 minutes and what finished comes back."""

    def experiment(self, base: str) -> str:
        return f"{base}-gpu{SUFFIX_TINY if self.tiny else ''}"

    @property
    def pretrain_name(self) -> str:
        """The pretraining run's name there, and its candidate folder's."""
        return f"{self.pretrain_run}{SUFFIX_TINY}" if self.tiny else self.pretrain_run

    def candidate(self, name: str) -> str:
        """Where fine-tuning runs of other weights go: the next candidate experiment here (a
        tiny call's kept apart)."""
        return self.experiment(name) if self.tiny else name


@dataclass(frozen=True)
class Job:
    name: str
    argv: list[str]


# --------------------------------------------------------------------------------- here: bundle


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UserError(f"pip {' '.join(args[:3])} … failed (is PyPI reachable?):\n"
                        f"{proc.stderr.strip()[-2000:]}")


def _platform_args(python: str) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                "manylinux2014_x86_64"):
        args += ["--platform", tag]
    return args


def slim_sdist(sdist: Path, out: Path) -> Path:
    """fairseq's sdist less :data:`DROP_FROM_SDIST`, as ``fairseq-src.tar.xz`` (10.6 MB →
    about 0.5 MB)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        (top,) = Path(tmp).iterdir()
        for rel in DROP_FROM_SDIST:
            shutil.rmtree(top / rel, ignore_errors=True)
        target = out / "fairseq-src.tar.xz"
        with tarfile.open(target, "w:xz") as tar:
            tar.add(top, arcname="fairseq-src")
    return target


def slim_bitsandbytes(wheel: Path, keep: str = CUDA_LIB) -> Path:
    """Rewrite the bitsandbytes wheel with one CUDA library (and the CPU one): 43 MB → ~2 MB.
    Its RECORD loses the dropped files, so pip installs the rest as a whole wheel."""
    tmp = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        dropped = {n for n in src.namelist()
                   if Path(n).name.startswith("libbitsandbytes_")
                   and Path(n).name not in (keep, "libbitsandbytes_cpu.so")}
        if not any(Path(n).name == keep for n in src.namelist()):
            raise UserError(f"{wheel.name} has no {keep}: pin a bitsandbytes that ships it")
        for name in src.namelist():
            if name in dropped:
                continue
            data = src.read(name)
            if name.endswith(".dist-info/RECORD"):
                data = "".join(line + "\n" for line in data.decode().splitlines()
                               if line.split(",")[0] not in dropped).encode()
            dst.writestr(name, data)
    tmp.replace(wheel)
    return wheel


def _wheels(out: Path, python: str) -> list[Path]:
    wheel_dir = out / "wheels"
    wheel_dir.mkdir()
    _pip("download", "-q", "--no-deps", "-d", str(wheel_dir), *_platform_args(python), *WHEELS)
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp, *SDIST_WHEELS)
        _pip("wheel", "-q", "--no-deps", "-w", str(wheel_dir), *Path(tmp).iterdir())
    for w in wheel_dir.glob("bitsandbytes-*.whl"):
        slim_bitsandbytes(w)
    return sorted(wheel_dir.iterdir())


def tiny_cls(src: Path, dst: Path) -> None:
    """The first reviews of each split, both labels, for a tiny-budget call."""
    dst.mkdir(parents=True)
    for split, n in TINY_SIZES.items():
        reviews = (src / f"{split}.review").read_text(encoding="utf-8").splitlines()
        labels = (src / f"{split}.label").read_text(encoding="utf-8").splitlines()
        picked = [i for lab in ("0", "1") for i in [j for j, x in enumerate(labels) if x == lab][
            : n // 2]]
        picked.sort()
        (dst / f"{split}.review").write_text("".join(reviews[i] + "\n" for i in picked),
                                             encoding="utf-8")
        (dst / f"{split}.label").write_text("".join(labels[i] + "\n" for i in picked),
                                            encoding="utf-8")


def corpus_slice(bin_dir: Path, out: Path, tokens: int, valid_tokens: int | None = None,
                 *, also: Path | None = None, seed: int | None = None) -> int:
    """About ``tokens`` of the binarized pretraining corpus's training side, as fairseq's own
    indexed-dataset files with its dictionary: runs of :data:`SLICE_CHUNK` consecutive
    paragraphs drawn with a seeded coin, so that novels and reviews keep their shares (the corpus
    lists novels first) and a paragraph keeps its neighbours. The validation sets go whole (or up
    to ``valid_tokens``); without ``seed``, the first paragraphs; ``also`` (another corpus's ``bin/``, the task-adaptive one) is appended
    whole. Returns the training tokens kept."""
    out.mkdir(parents=True)
    shutil.copy2(bin_dir / "dict.txt", out / "dict.txt")
    for name in ("valid", "valid1"):
        if (bin_dir / f"{name}.idx").is_file():
            _slice(bin_dir / name, out / name, valid_tokens)
    extra = [also / "train"] if also is not None else []
    return _slice(bin_dir / "train", out / "train", tokens, seed=seed, extra=extra)


def _slice(src_prefix: Path, dst_prefix: Path, tokens: int | None, *, seed: int | None = None,
           extra: Sequence[Path] = ()) -> int:
    """``tokens`` of a dataset (None: all of it): its first items, or with ``seed`` chunks drawn
    at random; then every item of each ``extra`` dataset."""
    import random

    from fairseq.data import indexed_dataset

    if tokens is None and not extra:
        for ext in (".bin", ".idx"):
            shutil.copy2(src_prefix.with_suffix(ext), dst_prefix.with_suffix(ext))
        return 0
    src = indexed_dataset.MMapIndexedDataset(str(src_prefix))
    builder = indexed_dataset.MMapIndexedDatasetBuilder(str(dst_prefix.with_suffix(".bin")),
                                                        dtype=src._index.dtype)
    sizes = src.sizes
    total = int(sizes.sum())
    if tokens is None or tokens >= total:
        keep = range(len(src))
    elif seed is None:
        keep = range(int((sizes.cumsum() <= tokens).sum()) or 1)
    else:
        coin = random.Random(seed)
        share = tokens / total
        keep = [i for start in range(0, len(src), SLICE_CHUNK) if coin.random() < share
                for i in range(start, min(start + SLICE_CHUNK, len(src)))]
    kept = 0
    for i in keep:
        builder.add_item(src[i])
        kept += int(sizes[i])
    for prefix in extra:
        more = indexed_dataset.MMapIndexedDataset(str(prefix))
        for i in range(len(more)):
            builder.add_item(more[i])
            kept += int(more.sizes[i])
    builder.finalize(str(dst_prefix.with_suffix(".idx")))
    return kept


def tree_bytes(root: Path = PROJECT_ROOT) -> int:
    """What a device call sends besides carried paths: tracked files and untracked ones that git
    does not ignore."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          cwd=root, capture_output=True, check=True)
    return sum((root / p).stat().st_size for p in proc.stdout.decode().split("\0")
               if p and (root / p).is_file())


def bundle(out: Path | None = None, *, plan: Plan | None = None,
           python: str = GPU_PYTHON, corpus: Path | None = None) -> dict[str, Any]:
    """Fill ``out`` (default ``.gpu/``) with what one device call needs; refuse, naming the sizes,
    when it would not fit the call's 64 MiB with the working tree."""
    from finetune_lab import checkpoints, cls_books, tokenizer
    from finetune_lab._files import atomic_dir

    plan = plan or Plan()
    out = Path(out) if out else PROJECT_ROOT / BUNDLE_DIR
    cls_dir, tok_dir = cls_books.default_output(), tokenizer.default_output()
    for what, path, fix in (("CLS-Books texts", cls_dir, "finetune-lab prepare-cls"),
                            ("tokenizer", tok_dir, "finetune-lab train-tokenizer")):
        if not path.is_dir():
            raise UserError(f"{path} ({what}) does not exist: run `{fix}` first")
    tree = tree_bytes()  # before the bundle's half-made folder, which git does not ignore
    with atomic_dir(out) as tmp:
        with tempfile.TemporaryDirectory() as dl:
            _pip("download", "-q", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
                 "-d", dl, FAIRSEQ_SDIST)
            (sdist,) = Path(dl).glob("*.tar.gz")
            slim_sdist(sdist, tmp)
        _wheels(tmp, python)
        with tempfile.TemporaryDirectory() as stage:
            data = Path(stage) / "data" / "work"
            if plan.tiny:
                tiny_cls(cls_dir, data / cls_dir.name)
            else:
                shutil.copytree(cls_dir, data / cls_dir.name)
            shutil.copytree(tok_dir, data / tok_dir.name)
            if "pretrain" in plan.steps:
                # Kept here too, so that the pretraining run's data hashes check here later.
                src = Path(corpus) if corpus else _default_corpus()
                also = None
                if plan.tapt:
                    also = _tapt_corpus()
                    if not (also / "train.idx").is_file():
                        raise UserError(f"{also} has no train.idx: run `finetune-lab "
                                        "prepare-pretrain --tapt` first, or drop --tapt")
                with atomic_dir(paths().work / GPU_CORPUS) as sliced:
                    plan.pretrain_tokens = corpus_slice(
                        src, sliced / "bin", plan.pretrain_tokens or 10**12,
                        valid_tokens=TINY_VALID_TOKENS if plan.tiny else None, also=also,
                        seed=None if plan.tiny else 0)
            # what lies here already goes into the archive as it is, under its path there
            extra: list[tuple[Path, str]] = []
            if "pretrain" in plan.steps:
                extra.append((paths().work / GPU_CORPUS, f"data/work/{GPU_CORPUS}"))
            if plan.checkpoint:
                ckpt_dir = PROJECT_ROOT / plan.checkpoint
                if not (ckpt_dir / checkpoints.MODEL_FILE).is_file():
                    raise UserError(f"{ckpt_dir} holds no {checkpoints.MODEL_FILE}: pass a "
                                    "packaged checkpoint folder to --checkpoint")
                extra.append((ckpt_dir, plan.checkpoint))
            with tarfile.open(tmp / "data.tar.xz", "w:xz") as tar:
                tar.add(Path(stage) / "data", arcname="data")
                for path, arcname in extra:
                    tar.add(path, arcname=arcname)
        (tmp / PLAN_FILE).write_text(json.dumps(asdict(plan), indent=1) + "\n", encoding="utf-8")
        carried = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
        ckpt = checkpoints.packaged_dir() / checkpoints.MODEL_FILE
        held = f"{ckpt.stat().st_size / 2**20:.1f} MiB" if ckpt.is_file() else "not there"
        if tree + carried > TRANSFER_LIMIT:
            raise UserError(
                f"{out} ({carried / 2**20:.1f} MiB) and the working tree ({tree / 2**20:.1f} MiB, "
                f"of which {ckpt.name} {held}) exceed the device "
                f"call's {TRANSFER_LIMIT / 2**20:.0f} MiB: carry a smaller corpus slice "
                "(--pretrain-tokens), or move the checkpoint out of the tree for a pretraining call")
    return {"bundle": str(out), "carried_bytes": carried, "tree_bytes": tree, "plan": asdict(plan)}


def _default_corpus() -> Path:
    from finetune_lab import pretrain_corpus

    return pretrain_corpus.default_output() / "bin"


def _tapt_corpus() -> Path:
    from finetune_lab import pretrain_corpus

    return pretrain_corpus.tapt_output() / "bin"


# ------------------------------------------------------------------------------ there: remote


def build_fairseq(src: Path) -> None:
    """Compile fairseq's Cython modules in place (seconds; its C++ extensions are not needed)."""
    code = (
        "import numpy\n"
        "from setuptools import Extension, setup\n"
        "from Cython.Build import cythonize\n"
        f"names = {list(CYTHON_MODULES)!r}\n"
        "exts = [Extension('fairseq.data.' + n, ['fairseq/data/' + n + '.pyx'],\n"
        "        include_dirs=[numpy.get_include()], language='c++',\n"
        "        extra_compile_args=['-std=c++11', '-O2']) for n in names]\n"
        "setup(name='fairseq-src', ext_modules=cythonize(exts, quiet=True),\n"
        "      script_args=['build_ext', '--inplace', '-q'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise UserError(f"compiling fairseq's Cython modules failed:\n{proc.stderr[-3000:]}")


def lab_jobs(plan: Plan, python: str = sys.executable) -> list[Job]:
    """One process per run: the fairseq grid, the Transformers pretrained seeds, the LoRA
    methods (those of ``plan.lab_parts``)."""
    cli = [python, "-m", "finetune_lab.cli", "finetune"]
    seeds = [str(s) for s in plan.seeds]
    epochs = ["--epochs", str(plan.epochs)]
    jobs: list[Job] = []
    if "fairseq" in plan.lab_parts:
        for init in ("pretrained", "random"):
            where = ["--experiment", plan.experiment("fairseq")]
            if init == "pretrained" and plan.checkpoint:
                where = ["--checkpoint", plan.checkpoint, "--experiment",
                         plan.candidate_experiment or plan.experiment("fairseq-candidate")]
            jobs += [Job(f"fairseq-{init}-seed{s}",
                         [*cli, "fairseq", "--init", init, "--seeds", s, *epochs, *where])
                     for s in seeds]
    if "transformers" in plan.lab_parts:
        jobs += [Job(f"transformers-pretrained-seed{s}",
                     [*cli, "transformers", "--init", "pretrained", "--seeds", s, *epochs,
                      "--experiment", plan.experiment("transformers")]) for s in seeds]
    if "lora" in plan.lab_parts:
        jobs += [Job(f"lora-{m}-seed{s}",
                     [*cli, "lora", "--methods", m, "--seeds", s, *epochs,
                      "--experiment", plan.experiment("lora"),
                      *(["--force-4bit"] if m.startswith("qlora") and plan.tiny else [])])
                 for m in plan.lora_methods for s in seeds]
    return jobs


def pretrain_deadline(plan: Plan, started: float) -> float:
    """When the pretraining job must have ended: the call's run deadline, less the fine-tuning
    reserve when the same call fine-tunes its weights."""
    reserve = plan.finetune_reserve_s if plan.then_finetune and "lab" in plan.steps else 0.0
    return started + plan.runs_until_s - reserve


def pretrain_budget(plan: Plan, started: float, now: float | None = None) -> float:
    """Minutes of training for the pretraining job: the plan's, or (0) what is left before the
    call's deadline once :data:`PRETRAIN_TAIL_S` is set aside."""
    if plan.pretrain_minutes > 0:
        return plan.pretrain_minutes
    left = pretrain_deadline(plan, started) - (time.time() if now is None else now) \
        - PRETRAIN_TAIL_S
    if left < 60:
        raise UserError(f"only {left:.0f} s are left for pretraining before the call's deadline: "
                        "raise runs_until_s or carry less")
    return left / 60


def pretrain_jobs(plan: Plan, python: str = sys.executable,
                  minutes: float | None = None) -> list[Job]:
    budget = (["--max-update", "4"] if plan.tiny else
              ["--minutes", f"{minutes or plan.pretrain_minutes:.2f}"])
    if plan.pretrain_max_update and not plan.tiny:
        budget = ["--max-update", str(plan.pretrain_max_update),
                  "--stop-minutes", f"{minutes or plan.pretrain_minutes:.2f}"]
    for flag, value in (("--lr", plan.pretrain_lr), ("--batch-size", plan.pretrain_batch_size),
                        ("--update-freq", plan.pretrain_update_freq)):
        if value is not None:
            budget += [flag, f"{value:g}"]
    name = plan.pretrain_name
    return [Job("pretrain", [python, "-m", "finetune_lab.cli", "pretrain", *budget,
                             "--data", f"data/work/{GPU_CORPUS}/bin", "--run", name,
                             "--experiment", plan.experiment("pretrain"),
                             "--package-to", f"data/work/candidates/{name}"])]


def run_jobs(todo: Sequence[Job], logs: Path, *, env: dict[str, str],
             parallel: int | None = None, deadline: float | None = None) -> list[dict[str, Any]]:
    """Run the jobs side by side (:func:`finetune_lab.jobs.run_parallel`); each one's exit
    code, time and log, for ``gpu-lab.json``."""
    from finetune_lab import jobs as parallel_jobs

    results = parallel_jobs.run_parallel(
        [parallel_jobs.Job(j.name, j.argv, logs / f"{j.name}.log") for j in todo],
        parallel or len(todo), env=env, label="gpu-lab", deadline=deadline)
    return [{"job": r.name, "exit_code": r.exit_code, "seconds": r.seconds,
             "log": f"{logs.name}/{r.name}.log"} for r in results]


def device_info() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        return {"type": "cuda", "name": torch.cuda.get_device_name(0),
                "count": torch.cuda.device_count(), "torch": torch.__version__}
    return {"type": "cpu", "name": "cpu", "count": os.cpu_count(), "torch": torch.__version__}


def pack(paths_in: Sequence[Path], out: Path, *, root: Path = PROJECT_ROOT,
         piece_bytes: int = PIECE_BYTES, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Tar ``paths_in`` (relative to ``root``), split it into pieces of at most
    ``piece_bytes`` and write ``gpu-lab.json`` with each piece's and the whole's sha256."""
    out.mkdir(parents=True, exist_ok=True)
    whole = out / ARCHIVE
    with tarfile.open(whole, "w:xz", preset=1) as tar:  # weights hardly compress
        for p in paths_in:
            tar.add(p, arcname=Path(p).resolve().relative_to(root.resolve()).as_posix())
    digest, pieces = hashlib.sha256(), []
    with open(whole, "rb") as fh:
        while chunk := fh.read(piece_bytes):
            digest.update(chunk)
            name = f"{ARCHIVE}.{len(pieces):03d}"
            (out / name).write_bytes(chunk)
            pieces.append({"file": name, "bytes": len(chunk),
                           "sha256": hashlib.sha256(chunk).hexdigest()})
    whole.unlink()
    if len(pieces) + 1 > MAX_FILES_BACK:
        raise UserError(f"{len(pieces)} pieces of {piece_bytes / 2**20:.0f} MiB and "
                        f"{RESULT_FILE} exceed the {MAX_FILES_BACK} files a call returns")
    result = {**(extra or {}), "archive_sha256": digest.hexdigest(), "pieces": pieces}
    (out / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def remote(bundle_dir: Path, out: Path, *, parallel: int | None = None) -> dict[str, Any]:
    """Everything the device call does after ``scripts/gpu-lab.sh`` starts it."""
    started = time.time()
    bundle_dir = Path(bundle_dir).resolve()
    plan = Plan(**json.loads((bundle_dir / PLAN_FILE).read_text(encoding="utf-8")))
    timings: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="gpu-lab-"))
    site, src = work / "site", work / "fairseq-src"

    def step(name: str, t0: float) -> None:
        timings[name] = round(time.time() - t0, 1)
        print(f"gpu-lab: {name} done in {timings[name]:.0f} s", flush=True)

    t0 = time.time()
    wheels = sorted(str(w) for w in (bundle_dir / "wheels").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--disable-pip-version-check", "--target", str(site),
                    *wheels], check=True)
    with tarfile.open(bundle_dir / "fairseq-src.tar.xz") as tar:
        tar.extractall(work, filter="data")
    build_fairseq(src)
    step("install", t0)
    t0 = time.time()
    with tarfile.open(bundle_dir / "data.tar.xz") as tar:
        tar.extractall(PROJECT_ROOT, filter="data")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), str(src), str(PROJECT_ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    cli = [sys.executable, "-m", "finetune_lab.cli"]
    prep = []
    if "lab" in plan.steps:
        prep.append(Job("binarize-cls", [*cli, "binarize-cls"]))
    if "lab" in plan.steps and "transformers" in plan.lab_parts:
        prep.append(Job("convert-hf", [*cli, "convert-hf"]))
    results = []
    for job in prep:  # the runs share these, so they come first, one at a time
        results += run_jobs([job], work / "logs", env=env, parallel=1)
    step("data", t0)
    jobs: list[Job] = []
    if "pretrain" in plan.steps:
        jobs += pretrain_jobs(plan, minutes=pretrain_budget(plan, started))
    t0 = time.time()
    if plan.then_finetune and "lab" in plan.steps:  # pretraining first, then its weights
        results += run_jobs(jobs, work / "logs", env=env, parallel=1,
                            deadline=pretrain_deadline(plan, started))
        step("pretraining", t0)
        fresh = paths().work / "candidates" / plan.pretrain_name
        if (fresh / "model.pt").is_file():
            plan = replace(plan, checkpoint=fresh.relative_to(PROJECT_ROOT).as_posix())
        else:
            print("gpu-lab: the pretraining packaged no weights: the lab's pretrained runs use "
                  "the committed checkpoint", flush=True)
        jobs = []
    if "lab" in plan.steps:
        jobs += lab_jobs(plan)
    # The call is killed at 10 minutes with nothing sent back: stop the runs in time to pack.
    results += run_jobs(jobs, work / "logs", env=env, parallel=parallel,
                        deadline=started + plan.runs_until_s)
    step("runs", t0)
    runs = paths().runs
    experiments = [plan.experiment(base) for base in ("fairseq", "transformers", "lora",
                                                      "pretrain")]
    if plan.checkpoint:
        experiments.append(plan.candidate_experiment or plan.experiment("fairseq-candidate"))
    products = [runs / name for name in experiments if (runs / name).is_dir()]
    if "pretrain" in plan.steps:  # never a carried --checkpoint back
        products += [p for p in [paths().work / "candidates" / plan.pretrain_name] if p.is_dir()]
    logs = paths().work / "gpu-lab-logs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    shutil.copytree(work / "logs", logs, dirs_exist_ok=True)
    products.append(logs)
    t0 = time.time()
    result = pack(products, out, extra={
        "plan": asdict(plan), "device": device_info(), "jobs": results, "timings_s": timings,
        "wall_s": round(time.time() - started, 1),
        "products": [p.relative_to(PROJECT_ROOT).as_posix() for p in products]})
    print(f"gpu-lab: packed {len(result['pieces'])} pieces in {time.time() - t0:.0f} s; "
          f"whole call {time.time() - started:.0f} s", flush=True)
    return result


# -------------------------------------------------------------------------------- here: unpack


def unpack(src: Path, *, root: Path = PROJECT_ROOT) -> list[Path]:
    """Check each piece's sha256 and the whole's, then move every run folder and candidate it
    holds into place. A destination that already exists is left alone and reported."""
    src = Path(src)
    meta_path = src / RESULT_FILE
    if not meta_path.is_file():
        raise UserError(f"{meta_path} does not exist: pass the folder the device call's files "
                        "came back in")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    digest = hashlib.sha256()
    (root / "data").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root / "data") as tmp:  # same disk: moves are renames
        whole = Path(tmp) / ARCHIVE
        with open(whole, "wb") as fh:
            for piece in meta["pieces"]:
                if not (src / piece["file"]).is_file():
                    raise UserError(f"{src / piece['file']} is missing: every piece that "
                                    f"{meta_path.name} lists must come back with it")
                data = (src / piece["file"]).read_bytes()
                if hashlib.sha256(data).hexdigest() != piece["sha256"]:
                    raise UserError(f"{src / piece['file']} does not match its sha256 in "
                                    f"{meta_path}: fetch the call's files again")
                digest.update(data)
                fh.write(data)
        if digest.hexdigest() != meta["archive_sha256"]:
            raise UserError(f"the pieces listed in {meta_path} do not reassemble to the archive "
                            "it names: fetch the call's files again")
        stage = Path(tmp) / "stage"
        with tarfile.open(whole) as tar:
            tar.extractall(stage, filter="data")
        placed = []
        for product in meta["products"]:
            top = stage / product
            children = sorted(p for p in top.iterdir() if not p.name.startswith(".")) \
                if product.startswith("data/runs/") else [top]
            for item in children:
                dest = root / item.relative_to(stage)
                if dest.exists():
                    print(f"gpu-unpack: {dest.relative_to(root)} exists; left as it is")
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(item), dest)
                placed.append(dest)
    return placed


# -------------------------------------------------------------------------------------- CLI


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu-bundle", help="prepare .gpu/, what one GPU device call carries")
    p.add_argument("--steps", nargs="+", choices=("pretrain", "lab"), default=["lab"])
    p.add_argument("--tiny", action="store_true",
                   help="a smoke test: a few reviews, 1 epoch, 1 seed (experiments *-gpu-smoke)")
    p.add_argument("--pretrain-tokens", type=positive_int, default=70_000_000,
                   help="tokens of the pretraining corpus carried for --steps pretrain")
    p.add_argument("--pretrain-minutes", type=float, default=0.0,
                   help="minutes of pretraining (default: what the call's deadline leaves)")
    p.add_argument("--pretrain-lr", type=float, default=None)
    p.add_argument("--pretrain-batch-size", type=positive_int, default=None)
    p.add_argument("--pretrain-update-freq", type=positive_int, default=None)
    p.add_argument("--pretrain-run", default="gpu",
                   help="the pretraining run's name (pretrain-gpu/NAME, candidates/NAME)")
    p.add_argument("--tapt", action="store_true",
                   help="mix the CLS-Books training texts (prepare-pretrain --tapt) into the slice")
    p.add_argument("--then-finetune", action="store_true",
                   help="with --steps pretrain lab: fine-tune the new weights in the same call")
    p.add_argument("--lab-parts", nargs="+", choices=LAB_PARTS, default=list(LAB_PARTS))
    p.add_argument("--seeds", nargs="+", type=int, default=None)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="packaged weights under data/ (a candidate) for the fairseq pretrained "
                        "runs; they go to the next fairseq-candidate experiment")
    p.add_argument("--python", default=GPU_PYTHON, help="the device's Python, for the wheels")
    p.add_argument("--out", type=Path, default=None)
    p.set_defaults(func=_bundle)
    u = sub.add_parser("gpu-unpack", help="move a device call's runs into the run cache")
    u.add_argument("files", type=Path, help="the folder the call's files came back in")
    u.set_defaults(func=_unpack)


def _bundle(args: argparse.Namespace) -> int:
    from finetune_lab.finetune_fairseq import next_candidate_experiment

    plan = Plan(steps=list(args.steps), tiny=args.tiny,
                pretrain_minutes=args.pretrain_minutes,
                pretrain_tokens=args.pretrain_tokens if "pretrain" in args.steps else 0,
                pretrain_lr=args.pretrain_lr, pretrain_batch_size=args.pretrain_batch_size,
                pretrain_update_freq=args.pretrain_update_freq, tapt=args.tapt,
                pretrain_run=args.pretrain_run,
                lab_parts=list(args.lab_parts))
    if args.checkpoint is not None:
        ckpt = args.checkpoint.resolve()
        if not ckpt.is_relative_to(PROJECT_ROOT / "data"):
            raise UserError(f"--checkpoint {args.checkpoint}: pass a folder under "
                            f"{PROJECT_ROOT / 'data'} (e.g. data/work/candidates/NAME)")
        plan.checkpoint = ckpt.relative_to(PROJECT_ROOT).as_posix()
        plan.candidate_experiment = plan.candidate(next_candidate_experiment())
    if args.then_finetune:
        if set(args.steps) != {"pretrain", "lab"}:
            raise UserError("--then-finetune needs --steps pretrain lab")
        if args.checkpoint is not None:
            raise UserError("--then-finetune fine-tunes the call's own weights: drop --checkpoint")
        plan.then_finetune = True
        plan.candidate_experiment = plan.candidate(next_candidate_experiment())
    if args.seeds:
        plan.seeds = list(args.seeds)
    if args.tiny:
        plan.seeds, plan.epochs = plan.seeds[:1] if args.seeds else [0], 1
        plan.pretrain_tokens = min(plan.pretrain_tokens, 20_000) if plan.pretrain_tokens else 0
    info = bundle(args.out, plan=plan, python=args.python)
    print(f"gpu-bundle: {info['bundle']} {info['carried_bytes'] / 2**20:.1f} MiB + working tree "
          f"{info['tree_bytes'] / 2**20:.1f} MiB of {TRANSFER_LIMIT / 2**20:.0f} MiB; run it with "
          f"the device tool: command `bash scripts/gpu-lab.sh {BUNDLE_DIR}`, carry "
          f"[\"{BUNDLE_DIR}\"]")
    return 0


def _unpack(args: argparse.Namespace) -> int:
    from finetune_lab import checkpoints
    from finetune_lab.manifest import sha256_file
    from finetune_lab.registry import validate_run

    placed = unpack(args.files)
    bad = 0
    for dest in placed:
        rel = dest.relative_to(PROJECT_ROOT).as_posix()
        if rel.startswith("data/runs/") and dest.is_dir():
            rec = validate_run(dest)
            bad += not rec.valid
            print(f"gpu-unpack: {rel}: " + ("valid" if rec.valid else
                                            "INVALID: " + "; ".join(rec.problems))
                  + "".join(f" (warning: {w})" for w in rec.warnings))
        elif (dest / checkpoints.MANIFEST_FILE).is_file():  # packaged weights
            want = (checkpoints.package_manifest(dest) or {}).get("files", {})
            ok = checkpoints.MODEL_FILE in want and all(
                sha256_file(dest / name) == item["sha256"] for name, item in want.items())
            bad += not ok
            print(f"gpu-unpack: {rel}: {checkpoints.MODEL_FILE} "
                  + ("matches its manifest" if ok else "DOES NOT match its manifest"))
        else:
            print(f"gpu-unpack: {rel}")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m finetune_lab.gpu_lab BUNDLE OUT``: the device side (see scripts/gpu-lab.sh)."""
    parser = argparse.ArgumentParser(prog="gpu-lab")
    parser.add_argument("bundle", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--parallel", type=positive_int, default=None)
    args = parser.parse_args(argv)
    try:
        result = remote(args.bundle, args.out, parallel=args.parallel)
    except UserError as exc:
        print(f"gpu-lab: error: {exc}", file=sys.stderr)
        return 2
    failed = [j["job"] for j in result["jobs"] if j["exit_code"] != 0]
    if failed:
        print(f"gpu-lab: failed: {', '.join(failed)} (their logs came back)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
