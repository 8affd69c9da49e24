"""Shared test settings: never write into the repository's data/ from a test."""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import replace
from pathlib import Path

# The suite's processes (hundreds: fairseq runs, chapter kernels) cache what they compile, once,
# where an image sets PYTHONDONTWRITEBYTECODE (this machine's does): setup compiles only the
# project and fairseq, not the 17,000 files of site-packages, of which the tests import a fifth.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def _one_core_per_worker() -> None:
    """Pin each xdist worker (and every process it starts) to a core of its own when there are
    no more workers than cores: two workers whose torch, fairseq and kernels each spread over
    every core fight over them; pinned, each runs as if alone (issue 36)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if int(count) > 1 and int(count) <= len(cores):
        per = len(cores) // int(count)
        index = int(worker.removeprefix("gw"))
        os.sched_setaffinity(0, cores[index * per:(index + 1) * per])


_one_core_per_worker()

SLOWEST_FIRST = ("test_gpu_lab.py", "test_pretrain_long.py", "test_chapters.py",
                 "test_faults_registry.py", "test_fairseq_report.py", "test_pretrain_corpus.py",
                 "test_faults_trial24.py", "test_faults.py", "test_faults_trial8_lineage.py",
                 "test_jobs.py", "test_pretrain.py", "test_binarize.py", "test_freeze.py")
"""The files that took longest (``--durations``, issue 36), in that order. ``make test`` hands
the xdist workers one file at a time in collection order (``--no-loadscope-reorder``): the
longest first, so that the two workers end together instead of one finishing a long file alone
on its core, and each first builds a fixture of its own (the GPU rehearsal; the tiny pipeline)
instead of waiting for the other's."""


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: k for k, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole

import matplotlib  # noqa: E402

matplotlib.use("Agg")
os.environ.setdefault("MPLBACKEND", "Agg")
# a test that runs `freeze pre-render` starts no background worker unless it tests the worker
os.environ.setdefault("FINETUNE_LAB_PREWARM", "0")


# --- a tiny version of the whole pipeline, on real slices of the data root ------------------

import pytest  # noqa: E402

from finetune_lab.config import default_data_root  # noqa: E402
from finetune_lab.train.recipe import LAB_RECIPE  # noqa: E402

TINY_ARCH = {"encoder_layers": 1, "encoder_embed_dim": 32, "encoder_ffn_embed_dim": 32,
             "encoder_attention_heads": 2}
"""A roberta_small small enough to pretrain and fine-tune in seconds on a CPU."""

needs_data_root = pytest.mark.skipif(
    not (default_data_root() / "eltec-fra").is_dir()
    or not (default_data_root() / "webis-cls-10").is_dir(),
    reason="the data root (eltec-fra/, webis-cls-10/) is absent",
)


def built_once(tmp_path_factory, name: str, build):
    """``build(folder)``'s result, built once per test run and shared by the xdist workers.

    Session fixtures are per worker: with two workers, each built the tiny pipeline and grid
    (real fairseq runs, a minute each). The first worker to ask builds them under a lock in the
    run's shared temporary folder; the other waits and reads the pickled result. Tests copy what
    they damage (the fixtures' rule already), so one copy serves both."""
    import pickle
    import shutil

    from filelock import FileLock

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    done = shared.with_name(shared.name + ".pickle")
    with FileLock(str(shared) + ".lock"):
        if done.is_file():
            return pickle.loads(done.read_bytes())
        shutil.rmtree(shared, ignore_errors=True)  # a build that failed half-way
        shared.mkdir()
        result = build(shared)
        done.write_bytes(pickle.dumps(result))
        return result


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory):
    """Tokenizer (400 pieces, 3 novels), corpus, a 30-update pretraining run, packaged checkpoint,
    and CLS-Books sliced to 64/16/32 reviews and binarized: real files through the real code."""
    return built_once(tmp_path_factory, "pipeline", _build_pipeline)


TINY_VALID_TOKENS = 8192
"""Tokens a tiny corpus validates on: a held-out novel (55,000 tokens) took most of a tiny
pretraining run's time, one validation of it 5 to 20 s."""


def short_valid(bin_dir: Path, tokens: int = TINY_VALID_TOKENS) -> None:
    """Cut a binarized corpus's validation sets to their first ``tokens`` (as a tiny GPU call
    cuts its own, :func:`~finetune_lab.runs.gpu_bundle.corpus_slice`)."""
    import shutil

    from finetune_lab.runs.gpu_bundle import corpus_slice

    cut = bin_dir.with_name(bin_dir.name + ".short")
    corpus_slice(bin_dir, cut, tokens=None, valid_tokens=tokens)
    for made in cut.glob("valid*"):
        shutil.move(made, bin_dir / made.name)
    shutil.rmtree(cut)


def _build_pipeline(root):
    from finetune_lab.data import binarize, cls_books, pretrain_corpus, tokenizer
    from finetune_lab.train import pretrain
    from finetune_lab.train.pretrain_recipe import PretrainRecipe

    mp = pytest.MonkeyPatch()
    mp.setenv("FINETUNE_LAB_WORK_DIR", str(root / "work"))
    mp.setenv("FINETUNE_LAB_RUNS_DIR", str(root / "runs"))
    tok = tokenizer.train_tokenizer(out=root / "tok", vocab_size=400, max_novels=3,
                                    with_reviews=False)
    corpus, _ = pretrain_corpus.prepare_pretrain(tokenizer_dir=tok, out=root / "corpus",
                                                 with_reviews=False, max_novels=3, workers=1)
    short_valid(corpus / "bin")
    recipe = PretrainRecipe(tokens_per_sample=64, batch_size=8, max_update=30,
                            validate_every=15, log_interval=5, lr=1e-3, arch=TINY_ARCH)
    run_dir = pretrain.pretrain(max_update=30, run="tiny", data_dir=corpus, tokenizer_dir=tok,
                                recipe=recipe, package_to=root / "packaged", quiet=True,
                                precision="fp32")  # the continued run below tries bf16
    full = cls_books.prepare_cls(out=root / "cls.books")
    full = full[0] if isinstance(full, tuple) else full
    sliced = root / "cls.sliced"
    sliced.mkdir()
    for split, n in (("train", 64), ("valid", 16), ("test", 32)):
        for kind in ("review", "label"):
            lines = (full / f"{split}.{kind}").read_text(encoding="utf-8").splitlines(True)
            (sliced / f"{split}.{kind}").write_text("".join(lines[:n]), encoding="utf-8")
    cls_bin, _ = binarize.binarize_cls(cls_dir=sliced, tokenizer_dir=tok, out=root / "cls-bin",
                                       workers=1)
    mp.undo()  # later tests (and the chapters they execute) must see the real data/ again
    return {"root": root, "tok": tok, "corpus": corpus, "pretrain_run": run_dir,
            "packaged": root / "packaged", "cls": sliced, "cls_bin": cls_bin,
            "runs": root / "runs"}


@pytest.fixture(scope="session")
def tiny_tapt_corpus(tiny_pipeline, tmp_path_factory):
    """The tiny pipeline's task-adaptive corpus: reviews only (dvd/music, and the CLS-Books
    training texts twice), many of them longer than the tiny runs' 64-token samples."""
    from finetune_lab.data import pretrain_corpus

    def build(folder):
        made = pretrain_corpus.prepare_pretrain(
            tokenizer_dir=tiny_pipeline["tok"], out=folder / "bin", max_novels=3, workers=1,
            with_reviews=True, review_repeat=1, task_repeat=2, train_novels=False)[0]
        short_valid(made / "bin")
        return made
    return built_once(tmp_path_factory, "tapt", build)


CLS_GRID_SEEDS = (0, 1)
CLS_GRID_RECIPE = replace(LAB_RECIPE, epochs=3, lr=1e-3)


@pytest.fixture(scope="session")
def cls_grid(tiny_pipeline, tmp_path_factory):
    """The tiny CLS-Books grid through the lab's recipe (both inits, seeds 0 and 1; 64 training
    reviews, batch 8, 3 epochs: 24 updates, at a learning rate high enough that the seeds do not
    all end where they started), with a copy of the tiny pretraining run beside it: one runs
    root, shared by the fairseq tests. A test that changes a run copies it first."""
    import shutil

    from finetune_lab.train import finetune_fairseq as ff

    def build(root):
        ff.finetune_grid(("pretrained", "random"), CLS_GRID_SEEDS,
                         bin_dir=tiny_pipeline["cls_bin"], checkpoint_dir=tiny_pipeline["packaged"],
                         recipe=CLS_GRID_RECIPE, arch=TINY_ARCH, runs_root=root, log=False)
        pre = tiny_pipeline["pretrain_run"]
        shutil.copytree(pre, root / "pretrain" / pre.name)
        return root

    return built_once(tmp_path_factory, "cls-grid", build)


def use_tiny_work_dir(tiny_pipeline, tmp_path, monkeypatch) -> None:
    """Point the run cache and the work dir at ``tmp_path``, with the tiny pipeline's tokenizer
    as the work dir's own (what a long pretraining run packages its weights with)."""
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    (tmp_path / "work" / "tokenizer").mkdir(parents=True, exist_ok=True)
    for name in ("spm.model", "dict.txt"):
        target = tmp_path / "work" / "tokenizer" / name
        if not target.exists():
            target.write_bytes((tiny_pipeline["tok"] / name).read_bytes())


def make_tiny_cls(root, items, vocab_size: int):
    """A tiny sentencepiece + fairseq dict trained on ``items`` and a 32/8/8 ``cls.books`` split.

    ``items`` are 48 ``(text, label)`` pairs; returns ``(tokenizer_dir, cls_dir)``. Shared by the
    Transformers and LoRA tests, which need a real tokenizer and real split files, but tiny.
    """
    import sentencepiece as spm

    from finetune_lab.data import tokenizer as T
    from finetune_lab.data.cls_books import Review, write_split

    tok_dir = root / "tok"
    tok_dir.mkdir()
    T.train_spm([t for t, _ in items] * 3, tok_dir / "spm", vocab_size=vocab_size)
    T.write_fairseq_dict(spm.SentencePieceProcessor(model_file=str(tok_dir / "spm.model")),
                         tok_dir / "dict.txt")
    cls_dir = root / "cls.books"
    cls_dir.mkdir()
    reviews = [Review(text=t, label=y, rating=5.0 if y else 1.0, position=i)
               for i, (t, y) in enumerate(items)]
    write_split(cls_dir, "train", reviews[:32])
    write_split(cls_dir, "valid", reviews[32:40])
    write_split(cls_dir, "test", reviews[40:48])
    return tok_dir, cls_dir


def tiny_conversion(root, items) -> dict:
    """A real conversion of a tiny fairseq RoBERTa (as `convert-hf` makes it), from a packaged
    checkpoint of random weights, with a tiny CLS-Books split (:func:`make_tiny_cls` of
    ``items``): the conversion checks' tests damage copies of it."""
    import os
    import shutil

    import torch

    from finetune_lab.models import hf_convert, trust
    from finetune_lab.models.hf_tokenizer import FairseqIdTokenizer
    from finetune_lab.models.params import fairseq_model

    tok_dir, cls_dir = make_tiny_cls(root, items, vocab_size=200)
    size = hf_convert.tiny_size(FairseqIdTokenizer.from_dir(tok_dir).vocab_size)
    package = root / "package"
    package.mkdir()
    for name, src in (("sentencepiece.bpe.model", "spm.model"), ("dict.txt", "dict.txt")):
        shutil.copyfile(tok_dir / src, package / name)
    ckpt = package / "model.pt"
    torch.save({"model": fairseq_model(size, classification_head=False).state_dict(),
                "args": None, "cfg": {"model": {"encoder_attention_heads": size.heads}}}, ckpt)
    os.environ[trust.TRUSTED_DIRS_ENV] = str(package)
    try:
        model_dir = hf_convert.convert_checkpoint(ckpt, root / "hf", tok_dir)
    finally:
        del os.environ[trust.TRUSTED_DIRS_ENV]
    return {"root": root, "cls_dir": cls_dir, "model_dir": model_dir, "package": package}

# --- real tiny fairseq runs for the run-cache tests (registry, loaders, freeze, provenance) ---


@pytest.fixture(scope="session")
def tiny_grid(tmp_path_factory):
    """The grid of ``runfixtures.py`` (2 inits × 2 seeds, ~60 s), built once per test session and
    shared by every module that asks for it: copy a run (``runfixtures.copy_run``) to damage it."""
    from runfixtures import build_grid

    return built_once(tmp_path_factory, "tiny-grid", build_grid)


def write_package(root, modules: dict[str, str]):
    """A tiny ``src/finetune_lab`` package under ``root``: its ``__init__`` and ``modules``
    (file name to source), for the freeze tests' import closures; returns its folder."""
    pkg = root / "src" / "finetune_lab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, text in modules.items():
        (pkg / name).write_text(text)
    return pkg


def quarto_hash(chapter) -> str:
    """What Quarto's freeze records of a chapter's text: the md5 of its file."""
    return hashlib.md5(chapter.read_bytes()).hexdigest()


# --- a private copy of the committed run cache, for tests that damage it ----------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private copy of the committed run cache, which the book reads (the env variable)."""
    import shutil

    from finetune_lab.config import PROJECT_ROOT, RUNS_DIR_ENV

    root = tmp_path / "runs"
    shutil.copytree(PROJECT_ROOT / "data" / "runs", root, copy_function=link_events)
    monkeypatch.setenv(RUNS_DIR_ENV, str(root))
    return root


def link_events(src: str, dst: str) -> None:
    """Event files hard-linked (never written by these tests; the registry checks a file once
    per process), everything else copied."""
    import shutil
    from pathlib import Path

    if "tfevents" in Path(src).name:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def terminal_signals() -> None:
    """``preexec_fn`` of a command a test interrupts with Ctrl-C, a closed terminal or another
    stop signal: each handled as a terminal leaves it. A suite started in the background by a
    shell (``make test &``, ``nohup``) passes SIGINT, SIGQUIT and SIGHUP on ignored, and a
    command that ignores them cannot be asked what they do."""
    import signal

    from finetune_lab.errors import STOP_SIGNALS

    for sig in (signal.SIGINT, *STOP_SIGNALS):  # and the rest a test runner may pass on so
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, *STOP_SIGNALS))


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A private copy of the packaged checkpoint's manifest, read where the book reads the
    committed one; returns a writer of it (``change`` edits the data first) that gives its
    path."""
    import copy
    import json

    from finetune_lab.book import pretrain_budget
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.models import checkpoints

    folder = tmp_path / "roberta-small-fr"
    folder.mkdir()
    committed = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr" / "manifest.json"
    original = json.loads(committed.read_text(encoding="utf-8"))
    monkeypatch.setattr(checkpoints, "packaged_dir", lambda: folder)
    monkeypatch.setattr(pretrain_budget, "packaged_dir", lambda: folder)

    def write(change=None):
        data = copy.deepcopy(original)
        if change:
            change(data)
        (folder / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
        return folder / "manifest.json"
    return write
