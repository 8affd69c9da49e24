"""Small file helpers for the data-preparation commands: hashing, atomic folders, JSON.

Hashing and atomic JSON come from :mod:`finetune_lab.manifest` (one implementation for runs and
data steps); what is here is specific to the data steps: atomic output folders, the writability
check, hashing a folder with exclusions, and tool versions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune_lab.errors import UserError
from finetune_lab.manifest import _umask, sha256_file
from finetune_lab.manifest import sha256_tree as _sha256_tree
from finetune_lab.manifest import write_json_atomic as write_json

__all__ = ["sha256_file", "write_json"]  # re-exported: one implementation, in manifest.py


def sha256_tree(folder: Path, exclude: tuple[str, ...] = ("manifest.json",)) -> dict[str, str]:
    """``{relative path: sha256}`` for every file under ``folder``, its manifest left out."""
    return _sha256_tree(folder, exclude)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def check_writable(parent: Path) -> None:
    """Fail early, with the fix, when ``parent`` cannot receive the output folder."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot create the output folder {parent}: {exc.strerror}. "
            "Choose a writable location (--out) or fix its permissions."
        ) from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(
            f"the output folder {parent} is not writable. "
            "Choose a writable location (--out) or fix its permissions."
        )


@contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temp folder beside ``dest``; on success it replaces ``dest``, on failure it is removed.

    Readers therefore never see a half-written dataset, and a failed run leaves the previous
    complete output (or nothing) in place.
    """
    dest = Path(dest)
    check_writable(dest.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as exc:
        raise UserError(
            f"cannot write into {dest.parent}: {exc.strerror}. "
            "Choose a writable location (--out) or fix its permissions."
        ) from exc
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; give it normal permissions
        old = None
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def tool_versions() -> dict[str, str]:
    """Versions of the tools whose output the manifests describe (read from metadata, no import)."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for label, dist in (("sentencepiece", "sentencepiece"), ("fairseq", "fairseq-fixed"),
                        ("torch", "torch")):
        try:
            versions[label] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions
