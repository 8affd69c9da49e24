"""File helpers every stage shares: hashing, atomic files and folders, JSON, timestamps.

One implementation of each, at the bottom of the package, so that data steps, checkpoints and run
manifests hash and write files the same way without importing each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from importlib import metadata
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune_lab.errors import UserError

CONVERSION_RECORD = "conversion.json"
"""A converted Transformers model's record: its source's sha256 and the numerical check, with
its time (written by :mod:`finetune_lab.models.hf_convert`)."""


def utc_now() -> str:
    """ISO-8601 UTC timestamp with seconds; one format everywhere so times compare as strings."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks so checkpoints do not fill memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(path: Path | str, exclude: Iterable[str] = ()) -> dict[str, str]:
    """sha256 of every file under ``path`` (or of ``path`` itself if it is a file), leaving out
    files named in ``exclude`` (a data step's own manifest and logs).

    Keys are POSIX paths relative to ``path`` (``"."`` for a single file), sorted, so two trees
    compare equal exactly when they hold the same files with the same bytes.
    """
    skip = set(exclude)
    root = Path(path)
    if root.is_file():
        return {".": sha256_file(root)}
    if not root.is_dir():
        raise UserError(f"cannot hash {root}: no such file or directory")
    return {
        f.relative_to(root).as_posix(): sha256_file(f)
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.name not in skip
    }


def digest_of(hashes: Mapping[str, str]) -> str:
    """One sha256 summarising a ``{path: sha256}`` map (order-independent), for short display."""
    text = "\n".join(f"{k}\t{v}" for k, v in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path | str, data: Any) -> None:
    """Write JSON so that readers see either the old file or the new one, never a partial one."""
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    """Write ``data`` so that readers see either the old file or the new one, never a partial one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; use normal permissions
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    versions = {"python": platform.python_version()}
    for label, dist in (("sentencepiece", "sentencepiece"), ("fairseq", "fairseq-fixed"),
                        ("torch", "torch")):
        try:
            versions[label] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions
