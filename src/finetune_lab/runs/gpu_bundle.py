"""Here, before a GPU device call: fill ``.gpu/`` with what the bare machine lacks.

The device tool sends the working tree plus carried git-ignored folders (64 MiB in all) to a
machine that has torch, transformers and peft but no fairseq and no network. ``finetune-lab
gpu-bundle`` (:func:`bundle`) therefore carries fairseq-fixed's sdist without its examples and
tests, wheels of what the machine lacks (bitsandbytes keeps only the CUDA build the machine's
torch loads), the CLS-Books texts and the tokenizer (never committed: they travel as carried
files), optionally a slice of the binarized pretraining corpus, and the plan
(:mod:`finetune_lab.runs.gpu_plan`).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from finetune_lab._files import atomic_dir, check_replaceable, not_there, tree_entries
from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.data import cls_books, pretrain_corpus, tokenizer
from finetune_lab.data.split_checks import published_test_texts
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints
from finetune_lab.runs.gpu_plan import (BUNDLE_DIR, GPU_CORPUS, PLAN_FILE, TEST_FILE_ROOT, Plan,
                                        lab_jobs)
from finetune_lab.runs.gpu_room import movable, sent_files
from finetune_lab.runs.recording import run_dir_for

TRANSFER_LIMIT = 64 * 2**20
BLOCK = 4096  # the device tool counts whole blocks (see disk_bytes)
"""Working tree plus carried paths, per call."""
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
TINY_SIZES = {"train": 16, "valid": 8, "test": 8}
TINY_VALID_TOKENS = 1024
"""A tiny call's validation set: four validations of 4,096 tokens took half of its pretraining."""
SLICE_CHUNK = 1000
"""Consecutive paragraphs kept or dropped together by :func:`corpus_slice`."""
COMMAND = "gpu-bundle"


SLICE_ENTRIES = frozenset({"bin/", "bin/dict.txt"} | {
    f"bin/{split}.{ext}" for split in ("train", "valid", "valid1") for ext in ("bin", "idx")})
"""Everything :func:`corpus_slice` writes."""


def bundle_output(folder: Path) -> bool:
    """A bundle folder or corpus slice written before output markers, where :func:`bundle`
    writes them (``.gpu/``, the work dir's slice) and holding only what it writes: a user's
    folder given as ``--out`` is never taken for one, whatever it holds."""
    where = Path(os.path.abspath(folder))
    entries = tree_entries(folder)
    if where == Path(os.path.abspath(PROJECT_ROOT / BUNDLE_DIR)):
        return PLAN_FILE in entries and entries <= {
            PLAN_FILE, "data.tar.xz", "fairseq-src.tar.xz", "wheels/"} | {
            e for e in entries if e.startswith("wheels/") and e.endswith(".whl")}
    if where.parent == Path(os.path.abspath(paths().work)) and (
            where.name == GPU_CORPUS or where.name.startswith(f"{GPU_CORPUS}-")):
        return "bin/dict.txt" in entries and entries <= SLICE_ENTRIES
    return False


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        for code in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT):  # the machine's, not PyPI's
            if os.strerror(code) in proc.stderr:  # (trial 30's E-13: pip's traceback relayed)
                raise OSError(code, os.strerror(code), args[args.index("-d") + 1]
                              if "-d" in args else tempfile.gettempdir())
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


def needs_bitsandbytes(plan: Plan) -> bool:
    """Whether the call runs a 4-bit method: only then does it carry bitsandbytes (3.6 MiB of a
    call's 64, with the committed tree close to 59)."""
    return "lab" in plan.steps and "lora" in plan.lab_parts and any(
        m.startswith("qlora") for m in plan.lora_methods)


def _wheels(out: Path, python: str, *, bitsandbytes: bool = True) -> list[Path]:
    wheel_dir = out / "wheels"
    wheel_dir.mkdir()
    wanted = [w for w in WHEELS if bitsandbytes or not w.startswith("bitsandbytes")]
    _pip("download", "-q", "--no-deps", "-d", str(wheel_dir), *_platform_args(python), *wanted)
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


def disk_bytes(path: Path) -> int:
    """A file's size as the device tool counts it: whole 4 KiB blocks. By file sizes a tree and
    bundle of 63.4 MiB fitted, yet the tool refused them; in blocks they were 65.0 MiB."""
    return -(-path.stat().st_size // BLOCK) * BLOCK


def tree_bytes(root: Path = PROJECT_ROOT, under: str = "") -> int:
    """What a device call sends besides carried paths, in blocks; ``under``: only that
    folder's."""
    return sum(disk_bytes(root / p) for p in sent_files(root, under))


def taken_runs(plan: Plan) -> list[str]:
    """The plan's lab runs (``experiment/name``) that exist here already. The call would skip
    them, or redo a failed one that it then never sends back (a snapshot carries only the runs
    that were not there when it started): a call spent for nothing."""
    if "lab" not in plan.steps:
        return []
    runs = [f"{job.argv[job.argv.index('--experiment') + 1]}/{job.name.split('-', 1)[1]}"
            for job in lab_jobs(plan, Path("."))]
    return [r for r in runs if os.path.lexists(paths().runs / r)]


def free_seeds(plan: Plan) -> list[int]:
    """As many seeds as the plan has, the lowest for which none of its runs exists here."""
    free: list[int] = []
    seed = 0
    while len(free) < len(plan.seeds):
        if not taken_runs(replace(plan, seeds=[seed])):
            free.append(seed)
        seed += 1
    return free


def bundle(out: Path | None = None, *, plan: Plan | None = None,
           python: str = GPU_PYTHON, corpus: Path | None = None,
           force: bool = False, from_environment: bool = False) -> dict[str, Any]:
    """Fill ``out`` (default ``.gpu/``) with what one device call needs; refuse, naming the sizes,
    when it would not fit the call's 64 MiB with the working tree. ``out`` and the corpus slice
    replace only a bundle's own folders unless ``force``. ``from_environment``: a rehearsal on a
    machine that has fairseq and the wheels' packages already (the tests): nothing is downloaded,
    and the call there installs nothing."""
    plan = plan or Plan()
    out = Path(out) if out else PROJECT_ROOT / BUNDLE_DIR
    if taken := taken_runs(plan):
        raise UserError(f"{len(taken)} of the call's runs exist here already ({taken[0]}, ...): "
                        f"choose other seeds, e.g. --seeds {' '.join(map(str, free_seeds(plan)))}")
    cls_dir, tok_dir = cls_books.default_output(), tokenizer.default_output()
    for what, path, fix in (("CLS-Books texts", cls_dir, "finetune-lab prepare-cls"),
                            ("tokenizer", tok_dir, "finetune-lab adopt-tokenizer")):
        if not path.is_dir():
            raise UserError(f"{path} ({what}) {not_there(path, 'folder')}: run `{fix}` first")
    if "pretrain" in plan.steps:  # refused now, not after the downloads
        run_dir = run_dir_for(plan.experiment("pretrain"), plan.pretrain_name)  # a plain name
        taken = [p for p in (run_dir, paths().work / "candidates" / plan.pretrain_name)
                 if p.exists() or p.is_symlink()]
        if taken:  # the call's pretrain would refuse it there, after its setup
            raise UserError(f"{taken[0]} exists: choose another --pretrain-run")
        check_replaceable(paths().work / plan.corpus, COMMAND, force=force, earlier=bundle_output)
    slice_before = (paths().work / plan.corpus).exists()
    tree = tree_bytes()  # before the bundle's half-made folder, which git does not ignore
    with atomic_dir(out, COMMAND, force=force, earlier=bundle_output) as tmp:
        if not from_environment:
            with tempfile.TemporaryDirectory() as dl:
                _pip("download", "-q", "--no-deps", "--no-binary", ":all:",
                     "--no-build-isolation", "-d", dl, FAIRSEQ_SDIST)
                (sdist,) = Path(dl).glob("*.tar.gz")
                slim_sdist(sdist, tmp)
            _wheels(tmp, python, bitsandbytes=needs_bitsandbytes(plan))
        with tempfile.TemporaryDirectory() as stage:
            data = Path(stage) / "data" / "work"
            if plan.tiny:
                tiny_cls(cls_dir, data / cls_dir.name)
            else:
                shutil.copytree(cls_dir, data / cls_dir.name)
            shutil.copytree(tok_dir, data / tok_dir.name)
            published, _ = published_test_texts(cls_dir)  # Webis-CLS-10's, checked
            test_file = Path(stage) / TEST_FILE_ROOT / cls_books.BOOKS_DIR / published.name
            test_file.parent.mkdir(parents=True)
            for name in (published.name, "train.review"):  # the corpus check allows what
                if published.with_name(name).is_file():    # the two share
                    shutil.copyfile(published.with_name(name), test_file.with_name(name))
            if "pretrain" in plan.steps:
                # Kept here too, so that the pretraining run's data hashes check here later.
                src = Path(corpus) if corpus else _default_corpus()
                also = None
                if plan.tapt:
                    also = _tapt_corpus()
                    if not (also / "train.idx").is_file():
                        raise UserError(f"{also} has no train.idx: run `finetune-lab "
                                        "prepare-pretrain --tapt` first, or drop --tapt")
                with atomic_dir(paths().work / plan.corpus, COMMAND, force=force,
                                earlier=bundle_output) as sliced:
                    plan.pretrain_tokens = corpus_slice(
                        src, sliced / "bin", plan.pretrain_tokens or 10**12,
                        valid_tokens=TINY_VALID_TOKENS if plan.tiny else None, also=also,
                        seed=None if plan.tiny else 0)
            # what lies here already goes into the archive as it is, under its path there
            extra: list[tuple[Path, str]] = []
            if "pretrain" in plan.steps:
                extra.append((paths().work / plan.corpus, f"data/work/{plan.corpus}"))
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
        carried = sum(disk_bytes(f) for f in tmp.rglob("*") if f.is_file())
        ckpt = checkpoints.packaged_dir() / checkpoints.MODEL_FILE
        held = f"{ckpt.stat().st_size / 2**20:.1f} MiB" if ckpt.is_file() else "not there"
        if tree + carried > TRANSFER_LIMIT:
            if "pretrain" in plan.steps and not slice_before:  # this command's own, and useless
                shutil.rmtree(paths().work / plan.corpus, ignore_errors=True)
            raise UserError(
                f"{out} ({carried / 2**20:.1f} MiB) and the working tree ({tree / 2**20:.1f} MiB, "
                f"of which {ckpt.name} {held}) exceed the device "
                f"call's {TRANSFER_LIMIT / 2**20:.0f} MiB: carry a smaller corpus slice "
                "(--pretrain-tokens), leave out a part (--lab-parts; QLoRA carries bitsandbytes, "
                "3.6 MiB), set aside what the call does not read (--make-room: "
                f"{sum(disk_bytes(PROJECT_ROOT / p) for p in movable()) / 2**20:.1f} MiB), "
                "or move the checkpoint out for a pretraining call")
    return {"bundle": str(out), "carried_bytes": carried, "tree_bytes": tree, "plan": asdict(plan)}


def _default_corpus() -> Path:
    return pretrain_corpus.default_output() / "bin"


def _tapt_corpus() -> Path:
    return pretrain_corpus.tapt_output() / "bin"
