"""The record a Transformers conversion leaves beside the converted model, read back: which
fairseq checkpoint the folder came from. Light (no torch, no pandas), so that the run registry
can ask it.
"""

from __future__ import annotations

from pathlib import Path

from finetune_lab._files import CONVERSION_RECORD, parse_json
from finetune_lab.config import paths

CONVERTED_FROM = "converted_from"
"""The key, in a Transformers run's manifest ``extra``, of the fairseq checkpoint its converted
model came from (``{"path", "sha256"}``; the registry compares it with that file now)."""


def converted_from_record(out: Path) -> dict[str, str] | None:
    """The fairseq checkpoint that ``out`` was converted from, as its ``conversion.json``
    records it (the path relative to the project where it lies inside it), or None: no
    conversion there, or one without its record."""
    record = Path(out) / CONVERSION_RECORD
    if not record.is_file():
        return None
    try:
        source = parse_json(record.read_text(encoding="utf-8"))["source"]
        path, sha = Path(source["path"]), str(source["sha256"])
    except (ValueError, KeyError, TypeError):
        return None
    root = paths().project.resolve()
    inside = path.resolve().is_relative_to(root)
    return {"path": path.resolve().relative_to(root).as_posix() if inside else str(path),
            "sha256": sha}


def converted_from(out: Path) -> str | None:
    """The sha256 of the checkpoint that ``out`` was converted from (see
    :func:`converted_from_record`)."""
    record = converted_from_record(out)
    return record["sha256"] if record else None
