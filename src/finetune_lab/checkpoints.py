"""Loading and packaging fairseq checkpoints under torch's safe loading.

torch >= 2.6 loads with ``weights_only=True``: only tensors and plain containers unpickle.
A fairseq 0.12 checkpoint also pickles one ``argparse.Namespace`` (its model configuration), so
it needs exactly one exception to the safe loader. This module grants that exception (and only
that one: nothing else is unpickled) to files whose sha256 is listed in a manifest the project
wrote, or that fairseq wrote into a folder the current run declared as its own save folder.
Everything else is refused with a message saying why and what to do.

The packaged checkpoint (``data/checkpoints/roberta-small-fr/``) is laid out as the course
shipped its model: ``model.pt`` (weights only, fp16, no optimizer state), ``dict.txt`` and
``sentencepiece.bpe.model``, plus a ``manifest.json`` listing every file's sha256.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune_lab.config import paths
from finetune_lab.errors import UserError
from finetune_lab.manifest import sha256_file, utc_now, write_json_atomic

TRUSTED_DIRS_ENV = "FINETUNE_LAB_TRUSTED_DIRS"
"""``os.pathsep``-separated folders whose checkpoints fairseq wrote during this very run."""
TRUSTED_MANIFESTS_ENV = "FINETUNE_LAB_TRUSTED_MANIFESTS"
"""``os.pathsep``-separated extra manifests (a checkpoint packaged outside data/checkpoints)."""

CHECKPOINT_NAME = "roberta-small-fr"
MODEL_FILE = "model.pt"
DICT_FILE = "dict.txt"
SPM_FILE = "sentencepiece.bpe.model"
MANIFEST_FILE = "manifest.json"
SAFE_EXTRA_GLOBALS = (argparse.Namespace,)


class UntrustedCheckpointError(UserError):
    """A checkpoint that is in no manifest: it is not unpickled."""


def packaged_dir() -> Path:
    return paths().checkpoints / CHECKPOINT_NAME


def package_manifest(folder: Path | None = None) -> dict[str, Any] | None:
    """The manifest of a packaged checkpoint folder (default: the committed one), or None."""
    manifest = Path(folder or packaged_dir()) / MANIFEST_FILE
    return json.loads(manifest.read_text(encoding="utf-8")) if manifest.is_file() else None


def manifest_hashes(manifest_paths: Iterable[Path]) -> set[str]:
    """Every sha256 listed under ``files`` (or a run manifest's ``outputs``) of the manifests."""
    hashes: set[str] = set()
    for path in manifest_paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in ("files", "outputs", "checkpoints", "saved_checkpoints"):
            section = data.get(key) or {}
            for value in section.values():
                sha = value.get("sha256") if isinstance(value, dict) else value
                if isinstance(sha, str):
                    hashes.add(sha)
    return hashes


def default_manifests() -> list[Path]:
    """The committed checkpoint manifests, every run manifest, and any named in the environment."""
    p = paths()
    extra = [Path(m) for m in os.environ.get(TRUSTED_MANIFESTS_ENV, "").split(os.pathsep) if m]
    return sorted(p.checkpoints.glob(f"*/{MANIFEST_FILE}")) + sorted(
        p.runs.glob(f"*/*/{MANIFEST_FILE}")
    ) + extra


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _in_trusted_dir(path: Path) -> bool:
    dirs = [Path(d).resolve() for d in os.environ.get(TRUSTED_DIRS_ENV, "").split(os.pathsep) if d]
    return any(path.resolve().is_relative_to(d) for d in dirs)


def check_trusted(path: Path | str, manifests: Iterable[Path] | None = None) -> str:
    """Return the file's sha256 if a manifest lists it (or it lies in a declared save folder)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    sha = sha256_file(path)
    if _in_trusted_dir(path):
        return sha
    listed = manifest_hashes(default_manifests() if manifests is None else manifests)
    own = path.parent / MANIFEST_FILE
    recorded = (((_read_json(own) or {}).get("files") or {}).get(path.name) or {}).get("sha256")
    if sha not in listed and recorded and recorded != sha:
        raise UntrustedCheckpointError(
            f"refusing to load {path}: it no longer matches its own manifest {own} (sha256 "
            f"{sha[:16]}... now, {recorded[:16]}... recorded): the file was changed or "
            "corrupted. Restore it (`git checkout -- " + str(path) + "` for the committed "
            "checkpoint), or package it again with the run that made it."
        )
    if sha not in listed:
        raise UntrustedCheckpointError(
            f"refusing to load {path}: its sha256 {sha[:16]}... is in no manifest of this project. "
            "A fairseq checkpoint needs an exception to torch's safe loading (it pickles an "
            "argparse.Namespace), which is granted only to files the project produced and "
            "listed. If you made this file or trust it, package it: `finetune-lab "
            f"package-checkpoint {path} --trust --dest DIR` (then `--checkpoint DIR`); or use "
            "the committed data/checkpoints/roberta-small-fr/model.pt."
        )
    return sha


@contextmanager
def fairseq_safe_globals():
    """torch's safe loader, plus ``argparse.Namespace`` (fairseq's model configuration)."""
    import torch

    with torch.serialization.safe_globals(list(SAFE_EXTRA_GLOBALS)):
        yield


def load_trusted(path: Path | str, manifests: Iterable[Path] | None = None, *,
                 trust: bool = False) -> dict[str, Any]:
    """``torch.load`` a listed fairseq checkpoint with ``weights_only=True``; ``trust``: the user
    vouches for an unlisted one (``package-checkpoint --trust``)."""
    import torch

    if not trust:
        check_trusted(path, manifests)
    elif not Path(path).is_file():
        raise UserError(f"checkpoint {path} does not exist")
    with fairseq_safe_globals():
        return torch.load(path, map_location="cpu", weights_only=True)


def install_fairseq_loader() -> None:
    """Route fairseq's own checkpoint loading through :func:`check_trusted` + safe loading.

    Called by the ``--user-dir`` plugin, so that ``fairseq-train --restore-file`` and
    ``RobertaModel.from_pretrained`` load the project's checkpoints without ever turning
    ``weights_only`` off.
    """
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_finetune_lab", False):
        return

    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        check_trusted(path)
        with fairseq_safe_globals():
            return original(path, arg_overrides, load_on_all_ranks)

    load_checkpoint_to_cpu._finetune_lab = True  # type: ignore[attr-defined]
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


TIED_WEIGHTS = ("encoder.lm_head.weight", "encoder.sentence_encoder.embed_tokens.weight")
"""RoBERTa's masked-LM head decodes with the token embedding (fairseq ties them)."""


def weights_only_state(state: dict[str, Any], dtype: str = "float16") -> dict[str, Any]:
    """A fairseq checkpoint reduced to what inference and fine-tuning need.

    Keeps the configuration and the model weights (floating tensors cast to ``dtype``); drops
    the optimizer state, criterion, task state and meters. The minimal ``optimizer_history`` and
    ``extra_state`` entries are what fairseq's loader expects to find.
    """
    import torch

    cast = getattr(torch, dtype)
    last = (state.get("optimizer_history") or [{}])[-1]
    # Tied tensors (the LM head's decoder is the token embedding) must stay one tensor after the
    # cast, or torch.save would store the 32000 x 512 matrix twice.
    cast_once: dict[tuple, Any] = {}
    model = {}
    for k, v in state["model"].items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.dtype)
        if key not in cast_once:
            cast_once[key] = v.to(cast) if v.is_floating_point() else v
        model[k] = cast_once[key]
    # A checkpoint saved from bf16 training stores the tied pair as two equal tensors; keep one.
    head, embed = TIED_WEIGHTS
    if head in model and embed in model and model[head] is not model[embed] \
            and torch.equal(model[head], model[embed]):
        model[head] = model[embed]
    return {
        "args": state.get("args"),
        "cfg": state.get("cfg"),
        "model": model,
        "optimizer_history": [{
            "criterion_name": last.get("criterion_name", "MaskedLmLoss"),
            "optimizer_name": last.get("optimizer_name", "FairseqAdam"),
            "lr_scheduler_state": {"best": None},
            "num_updates": int(last.get("num_updates", 0)),
        }],
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }


def package_checkpoint(
    source: Path,
    tokenizer_model: Path,
    dictionary: Path,
    dest: Path | None = None,
    *,
    metadata: dict[str, Any] | None = None,
    manifests: Iterable[Path] | None = None,
    trust: bool = False,
) -> Path:
    """Write ``dest/{model.pt,dict.txt,sentencepiece.bpe.model,manifest.json}`` atomically.
    ``trust``: the user vouches for a ``source`` that no manifest lists (recorded as such)."""
    import torch

    dest = Path(dest) if dest is not None else packaged_dir()
    for f in (tokenizer_model, dictionary):
        if not Path(f).is_file():
            raise UserError(f"{f} is missing: run `finetune-lab train-tokenizer` first")
    state = load_trusted(source, manifests, trust=trust)
    if trust:
        metadata = {**(metadata or {}), "trusted_by": "the user (package-checkpoint --trust)"}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes the folder private; this one is published
    try:
        torch.save(weights_only_state(state), tmp / MODEL_FILE)
        shutil.copyfile(dictionary, tmp / DICT_FILE)
        shutil.copyfile(tokenizer_model, tmp / SPM_FILE)
        files = {name: {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
                 for name in (MODEL_FILE, DICT_FILE, SPM_FILE)}
        write_json_atomic(tmp / MANIFEST_FILE, {
            "name": dest.name,
            "created": utc_now(),
            "source": {"path": str(source), "sha256": sha256_file(source)},
            "dtype": "float16",
            "num_updates": state["optimizer_history"][-1].get("num_updates"),
            "files": files,
            **(metadata or {}),
        })
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def load_hub_model(folder: Path | None = None):
    """The packaged model as a fairseq ``RobertaHubInterface`` (fill-mask, encode, ...), on CPU."""
    from finetune_lab.fairseq_compat import quiet_import

    folder = Path(folder) if folder is not None else packaged_dir()
    if not (folder / MODEL_FILE).is_file():
        raise UserError(
            f"{folder / MODEL_FILE} does not exist: run `finetune-lab pretrain` (see README)"
        )
    quiet_import()
    import finetune_lab.fairseq_user_dir  # noqa: F401  (registers roberta_small + the loader)
    from fairseq.models.roberta import RobertaModel

    from finetune_lab.fairseq_compat import preserved_root_logger

    with preserved_root_logger():
        hub = RobertaModel.from_pretrained(
            str(folder), checkpoint_file=MODEL_FILE, data_name_or_path=str(folder),
            bpe="sentencepiece", sentencepiece_model=str(folder / SPM_FILE),
        )
    hub.eval()
    return hub
