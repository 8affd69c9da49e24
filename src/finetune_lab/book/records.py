"""Small readers of the book's JSON records and of hash maps, shared by the freeze, the
provenance footers and the data summary."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from finetune_lab._files import read_json
from finetune_lab.errors import DamagedFileError


def digest_of(hashes: Mapping[str, str]) -> str:
    """One sha256 summarising a ``{path: sha256}`` map (order-independent), for short display."""
    text = "\n".join(f"{k}\t{v}" for k, v in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()



def read_record(path: Path, fields: Mapping[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """:func:`read_json` of a JSON object that must hold ``fields`` (name to type): one that
    parses but has another shape (``[]``, ``"counts": "many"``) is damaged too, named here, not
    a TypeError in the code that reads it."""
    record = read_json(path)
    if not isinstance(record, dict):
        raise DamagedFileError(path, f"it holds a {type(record).__name__}, not an object")
    for name, kind in fields.items():
        if not isinstance(record.get(name), kind):
            raise DamagedFileError(path, f"its {name!r} is {record.get(name)!r}")
    return record
