"""Which fairseq checkpoints may be unpickled, and fairseq's loader routed through that check.

torch >= 2.6 loads with ``weights_only=True``: only tensors and plain containers unpickle.
A fairseq 0.12 checkpoint also pickles one ``argparse.Namespace`` (its model configuration), so
it needs exactly one exception to the safe loader. This module grants that exception (and only
that one: nothing else is unpickled) to files whose sha256 is listed in a manifest the project
wrote, or that fairseq wrote into a folder the current run declared as its own save folder.
Everything else is refused with a message saying why and what to do. The ``--user-dir`` plugin
installs the check into fairseq; :mod:`checkpoints` packages checkpoints and loads them.
"""

from __future__ import annotations

import argparse
import errno
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune_lab._files import not_there, parse_json, sha256_file
from finetune_lab.config import PROJECT_ROOT, paths
from finetune_lab.errors import UserError

TRUSTED_DIRS_ENV = "FINETUNE_LAB_TRUSTED_DIRS"
"""``os.pathsep``-separated folders whose checkpoints fairseq wrote during this very run."""
TRUSTED_MANIFESTS_ENV = "FINETUNE_LAB_TRUSTED_MANIFESTS"
"""``os.pathsep``-separated extra manifests (a checkpoint packaged outside data/checkpoints)."""
MANIFEST_FILE = "manifest.json"
SAFE_EXTRA_GLOBALS = (argparse.Namespace,)


class UntrustedCheckpointError(UserError):
    """A checkpoint that is in no manifest: it is not unpickled."""



def manifest_hashes(manifest_paths: Iterable[Path]) -> set[str]:
    """Every sha256 listed under ``files`` (or a run manifest's ``outputs``) of the manifests."""
    hashes: set[str] = set()
    for path in manifest_paths:
        try:
            data = parse_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):  # a damaged manifest lists nothing; it never raises
            continue
        for key in ("files", "outputs", "checkpoints", "saved_checkpoints"):
            section = data.get(key)
            if not isinstance(section, dict):
                continue
            for value in section.values():
                sha = value.get("sha256") if isinstance(value, dict) else value
                if isinstance(sha, str):
                    hashes.add(sha)
    return hashes


RUN_CHECKPOINT_KEYS = ("checkpoints", "saved_checkpoints")
"""The sections of a run manifest that list checkpoints (its ``outputs`` are event files)."""

RunGate = Callable[[list[Path]], list[Path]]
_run_gate: RunGate | None = None


def gate_run_manifests(gate: RunGate | None) -> None:
    """Say which run manifests may vouch for a checkpoint (the gate keeps those of accepted runs
    from a list): the run stage installs its registry's verdict here (this module sits below it). Until one is installed, no run
    manifest does, so a process that never judged its runs trusts only packaged checkpoints,
    the environment's manifests and its own save folders."""
    global _run_gate
    _run_gate = gate


def _lists_checkpoints(manifest: Path) -> bool:
    data = _read_json(manifest) or {}
    return any(isinstance(data.get(key), dict) and data[key] for key in RUN_CHECKPOINT_KEYS)


def run_manifests() -> list[Path]:
    """Every run manifest that lists a checkpoint, accepted by the registry or not."""
    return [m for m in sorted(paths().runs.glob(f"*/*/{MANIFEST_FILE}")) if _lists_checkpoints(m)]


def package_manifests() -> list[Path]:
    """The committed checkpoint manifests and any named in the environment."""
    extra = [Path(m) for m in os.environ.get(TRUSTED_MANIFESTS_ENV, "").split(os.pathsep) if m]
    return sorted(paths().checkpoints.glob(f"*/{MANIFEST_FILE}")) + extra


def accepted_run_manifests() -> list[Path]:
    """The manifests of runs the registry accepts that list a checkpoint (only those: a
    rejected run's hashes vouch for nothing)."""
    return _run_gate(run_manifests()) if _run_gate is not None else []


def default_manifests() -> list[Path]:
    """:func:`package_manifests` and :func:`accepted_run_manifests`."""
    return package_manifests() + accepted_run_manifests()


def _rejected_listing(sha: str) -> Path | None:
    """A run manifest that lists ``sha`` although the registry rejects its run (for the
    refusal's message: the file is the project's, its run is not usable)."""
    return next((m for m in run_manifests() if sha in manifest_hashes([m])), None)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
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
        raise UserError(f"checkpoint {path} {not_there(path)}")
    sha = sha256_file(path)
    if _in_trusted_dir(path):
        return sha
    listed = manifest_hashes(package_manifests() if manifests is None else manifests)
    if manifests is None and sha not in listed:  # runs are judged only when they must vouch
        listed |= manifest_hashes(accepted_run_manifests())
    own = path.parent / MANIFEST_FILE
    own_data = _read_json(own)
    if sha not in listed and own.is_file() and own_data is None:
        raise UntrustedCheckpointError(
            f"refusing to load {path}: its own manifest {own} is damaged (not a JSON object), "
            "so nothing vouches for the file: restore the manifest (`git checkout -- "
            f"{own}` for the committed checkpoint), or package the checkpoint again.")
    files = (own_data or {}).get("files")
    entry = files.get(path.name) if isinstance(files, dict) else None
    recorded = entry.get("sha256") if isinstance(entry, dict) else None
    recorded = recorded if isinstance(recorded, str) else None
    if sha not in listed and recorded and recorded != sha:
        raise UntrustedCheckpointError(
            f"refusing to load {path}: it no longer matches its own manifest {own} (sha256 "
            f"{sha[:16]}... now, {recorded[:16]}... recorded): the file was changed or "
            "corrupted. Restore it (`git checkout -- " + str(path) + "` for the committed "
            "checkpoint), or package it again with the run that made it."
        )
    rejected = _rejected_listing(sha) if sha not in listed and manifests is None else None
    if rejected is not None:
        raise UntrustedCheckpointError(
            f"refusing to load {path}: the only manifest listing it is that of run "
            f"{rejected.parent.parent.name}/{rejected.parent.name}, "
            + ("which the registry rejects (`finetune-lab runs` says why): repair or re-run "
               "that run" if _run_gate is not None else "and no run was judged by the registry "
               "in this process: load it through a `finetune-lab` command")
            + ", or package the file "
            f"yourself if you trust it (`finetune-lab package-checkpoint {path} --trust "
            "--dest DIR`)."
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
def trusting(manifest: Path):
    """Also trust what ``manifest`` lists while loading in this process (a package folder's own
    manifest, as ``finetune fairseq --checkpoint DIR`` trusts it for its fairseq-train)."""
    before = os.environ.get(TRUSTED_MANIFESTS_ENV)
    os.environ[TRUSTED_MANIFESTS_ENV] = os.pathsep.join(filter(None, [str(manifest), before]))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUSTED_MANIFESTS_ENV, None)
        else:
            os.environ[TRUSTED_MANIFESTS_ENV] = before

@contextmanager
def fairseq_safe_globals(path: Path | str | None = None):
    """torch's safe loader, plus ``argparse.Namespace`` (fairseq's model configuration); what
    it refuses, or cannot read, of ``path`` becomes one sentence (:func:`unreadable`)."""
    import torch

    with torch.serialization.safe_globals(list(SAFE_EXTRA_GLOBALS)):
        try:
            yield
        except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile,
                KeyError, ValueError, IndexError) as exc:  # garbage fails in any of these ways
            raise unreadable(path, exc) from None
        except OSError as exc:  # a zip cut short can send torch's reader past its end (EINVAL)
            if exc.errno != errno.EINVAL:
                raise
            raise unreadable(path, exc) from None


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def unreadable(path: Path | str | None, exc: BaseException) -> UserError:
    """Why a checkpoint could not be loaded, without torch's advice: it suggests turning
    ``weights_only`` off, which would run whatever code a file holds."""
    what = f"checkpoint {path}" if path is not None else "a checkpoint"
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in text:
        found = _GLOBAL.search(text)
        held = f" (it names {found.group(1)})" if found else ""
        return UntrustedCheckpointError(
            f"refusing to load {what}: it is a file holding code{held}, which loading would "
            "run; this project loads tensors and fairseq's configuration only, never code. "
            "Delete the file, or restore the checkpoint from where it was made.")
    first = (text.strip().splitlines()[0] if text.strip() and not isinstance(exc, KeyError)
             else "not a file torch.save wrote")
    committed = path is not None and Path(path).resolve().is_relative_to(
        (PROJECT_ROOT / "data" / "checkpoints").resolve())
    fix = ("Restore it with `git checkout -- data/checkpoints/`" if committed
           else "Restore it from where it was made, or make it again")
    return UserError(f"{what} cannot be read: the file is damaged or cut short "
                     f"({first[:160]}). {fix}.")


def load_trusted(path: Path | str, manifests: Iterable[Path] | None = None, *,
                 trust: bool = False) -> dict[str, Any]:
    """``torch.load`` a listed fairseq checkpoint with ``weights_only=True``; ``trust``: the user
    vouches for an unlisted one (``package-checkpoint --trust``)."""
    import torch

    if not trust:
        check_trusted(path, manifests)
    elif not Path(path).is_file():
        raise UserError(f"checkpoint {path} {not_there(path)}")
    with fairseq_safe_globals(path):
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not (isinstance(state, dict) and isinstance(state.get("model"), dict)
            and all(isinstance(v, torch.Tensor) for v in state["model"].values())):
        raise UserError(f"{path} is not a fairseq checkpoint (it holds no 'model' mapping of "
                        "weights): give the model.pt or checkpoint_best.pt a run wrote")
    return state


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
        with fairseq_safe_globals(path):
            return original(path, arg_overrides, load_on_all_ranks)

    load_checkpoint_to_cpu._finetune_lab = True  # type: ignore[attr-defined]
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu

