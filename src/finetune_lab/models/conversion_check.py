"""A converted Transformers folder held to what its conversion recorded, before any work.

Fault trial 27's E-m6, E-m12: a ``model.safetensors`` cut short ended in a ``SafetensorError``
traceback, and a ``config.json`` edited to 3 layers trained a model that was not the
conversion, because only ``config.json`` and the source's sha256 were looked at. Now
``conversion.json`` lists each file's size and sha256 (sizes compared first, hashes only when
they agree), its ``size`` is held against ``config.json``, and every folder (a user's own
``save_pretrained`` too) is held to its ``model.safetensors`` header: the bytes it announces,
and the layers and embedding rows its tensors have. A conversion made before the list (trial
28's E-m16: sizes alone let an edited byte train) cannot be checked, so it is not trusted.
Light (no torch): the registry and the CLI can ask it.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from finetune_lab._files import (CONVERSION_RECORD, OUTPUT_MARKER, parse_json, read_json,
                                 sha256_file, tree_entries, unchanged)
from finetune_lab.errors import UserError
from finetune_lab.models.hf_tokenizer import CONFIG_FILE, DICT_FILE, SPM_FILE

FILES_KEY = "files"
"""The key, in ``conversion.json``, of ``{name: {"bytes", "sha256"}}`` for every file written."""
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER_FILES = ("spm.model", "dict.txt")
_SIZE_FIELDS = {"vocab": "vocab_size", "dim": "hidden_size", "layers": "num_hidden_layers",
                "ffn": "intermediate_size", "heads": "num_attention_heads",
                "positions": "max_position_embeddings"}


def file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file a conversion wrote into ``folder`` (its record and marker
    aside: the record cannot list itself), as ``conversion.json`` keeps them."""
    return {f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
            for f in sorted(Path(folder).iterdir())
            if f.is_file() and f.name not in (CONVERSION_RECORD, OUTPUT_MARKER)}


def _record(folder: Path) -> dict[str, Any] | None:
    path = folder / CONVERSION_RECORD
    if not path.exists():
        return None
    try:
        record = read_json(path)
    except (OSError, ValueError) as exc:
        raise _Damage(f"{path} is damaged ({getattr(exc, 'why', None) or exc})") from None
    if not isinstance(record, dict):
        raise _Damage(f"{path} is damaged (not a JSON object)")
    return record


class _Damage(Exception):
    """What is wrong, naming the file; said by :func:`conversion_problem`."""


class _Unverified(_Damage):
    """A conversion whose record holds no sha256 for a file the model loads: nothing says those
    bytes are the ones converted (trial 28's E-m16: one bit of ``model.safetensors`` flipped in
    a conversion made before the list, its size kept, trained)."""


def _listed_files(folder: Path, record: dict[str, Any], needed: tuple[str, ...]) -> str | None:
    """Each file the conversion listed: there, of its size, then of its sha256. Returns why
    the conversion is unverified (no list, or one without a file of ``needed``), for the
    caller to say once the weights' header has had its say (a file cut short is named so)."""
    listed = record.get(FILES_KEY)
    rec = folder / CONVERSION_RECORD
    if listed is None:  # sizes alone (the marker's) cannot tell an edited byte
        return (f"{rec} lists no files (a conversion made before it did), so nothing holds "
                f"{folder / WEIGHTS} to what was converted")
    if not isinstance(listed, dict) or not all(isinstance(v, dict) for v in listed.values()):
        raise _Damage(f"{rec} is damaged (its {FILES_KEY} is not a mapping of files)")
    for name, want in listed.items():
        path = folder / name
        if not path.is_file():
            raise _Damage(f"{path} is missing")
        if path.stat().st_size != want.get("bytes"):
            raise _Damage(f"{path} is {path.stat().st_size:,} bytes, but its conversion wrote "
                          f"{want.get('bytes'):,}")
    for name, want in listed.items():  # hashes only once every size agrees
        if sha256_file(folder / name) != want.get("sha256"):
            raise _Damage(f"{folder / name} is not the file its conversion wrote (sha256 "
                          f"{str(want.get('sha256'))[:12]}…)")
    unlisted = [n for n in needed if n not in listed]
    return (f"{rec} lists no sha256 for {', '.join(unlisted)}, so nothing holds "
            f"{folder / unlisted[0]} to what was converted") if unlisted else None


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a safetensors file, held to the file's length: a file cut short (or
    grown) is said here, not in a ``SafetensorError`` traceback."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        text = handle.read(n) if 0 <= n <= size - 8 else b""
    try:
        header = parse_json(text.decode("utf-8")) if text else None
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError):
        header, ends = None, []
    if header is None or 8 + n + max(ends, default=0) != size:
        said = (f"announces {8 + n + max(ends, default=0):,} bytes" if header is not None
                else "does not read")
        raise _Damage(f"{path} is cut short or damaged ({size:,} bytes; its header {said})")
    return header


def _config(folder: Path) -> dict[str, Any]:
    try:
        config = parse_json((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise _Damage(f"{folder / CONFIG} is damaged ({exc})") from None
    if not isinstance(config, dict):
        raise _Damage(f"{folder / CONFIG} is damaged (not a JSON object)")
    return config


def _shape_against_config(folder: Path, config: dict[str, Any], header: dict[str, Any],
                          size: Any) -> None:
    """``config.json`` against the size the conversion recorded, and against the tensors the
    weights hold (layers, embedding rows and width): the model built is the one converted."""
    if isinstance(size, dict):
        for key, field in _SIZE_FIELDS.items():
            if key in size and config.get(field) != size[key]:
                raise _Damage(f"{folder / CONFIG} says {field} {config.get(field)}, but its "
                              f"conversion ({CONVERSION_RECORD}) made {size[key]}")
    layers = {int(k.split(".")[3]) for k in header
              if k.startswith("roberta.encoder.layer.") and k.split(".")[3].isdigit()}
    if layers and config.get("num_hidden_layers") != max(layers) + 1:
        raise _Damage(f"{folder / CONFIG} says num_hidden_layers "
                      f"{config.get('num_hidden_layers')}, but {WEIGHTS} holds {max(layers) + 1}")
    emb = (header.get("roberta.embeddings.word_embeddings.weight") or {}).get("shape")
    if isinstance(emb, list) and len(emb) == 2 and \
            [config.get("vocab_size"), config.get("hidden_size")] != emb:
        raise _Damage(f"{folder / CONFIG} says vocab_size {config.get('vocab_size')} and "
                      f"hidden_size {config.get('hidden_size')}, but {WEIGHTS}'s embeddings are "
                      f"{emb[0]} × {emb[1]}")


def _problem(folder: Path, tokenizer: bool) -> _Damage | None:
    """:func:`conversion_problem`, as the exception that says it (None: nothing)."""
    needed = (CONFIG, WEIGHTS, *(TOKENIZER_FILES if tokenizer else ()))
    try:
        for name in needed:
            if not (folder / name).is_file():
                raise _Damage(f"{folder / name} is missing")
        record = _record(folder)
        unverified = _listed_files(folder, record, needed) if record is not None else None
        header = _safetensors_header(folder / WEIGHTS)
        _shape_against_config(folder, _config(folder), header,
                              (record or {}).get("size"))
        if unverified:
            raise _Unverified(unverified)
    except _Damage as exc:
        return exc
    except OSError as exc:
        return _Damage(f"{exc.filename or folder} cannot be read ({exc.strerror})")
    return None


def conversion_problem(folder: Path, *, tokenizer: bool = True) -> str | None:
    """What is wrong with the converted model in ``folder``, naming the file (None: nothing).

    ``tokenizer``: its ``spm.model`` and ``dict.txt`` are read too (the folder is also the
    tokenizer). A conversion whose ``conversion.json`` lists no sha256 for a file the model
    loads is a problem too: it cannot be checked. A folder without ``conversion.json`` (a
    user's ``save_pretrained``, which claims no source) is held to what its own files say."""
    problem = _problem(Path(folder), tokenizer)
    return None if problem is None else str(problem)


def require_conversion(folder: Path, *, tokenizer: bool = True) -> Path:
    """``folder`` as ``--model-dir``: refused in one line when it is not whole, or cannot be
    checked, with how to make a conversion there (``convert-hf`` writes the work dir's unless
    given ``--out``)."""
    folder = Path(folder)
    problem = _problem(folder, tokenizer)
    if problem is None:
        return folder
    made = (folder / CONVERSION_RECORD).is_file()
    full = folder.is_dir() and any(folder.iterdir())  # --force keeps what it held beside it
    what = ("a conversion that can be checked" if isinstance(problem, _Unverified) else
            "the conversion it was" if made else "a whole converted model")
    raise UserError(f"{problem}: {folder} is not {what}; convert into it (`finetune-lab "
                    f"convert-hf --out {folder}{' --force' if full else ''}`), or drop "
                    "--model-dir (the work dir's conversion is then used, made on first use)")


CONVERTED_FILES = frozenset({"config.json", "model.safetensors", "generation_config.json",
                             SPM_FILE, DICT_FILE, CONFIG_FILE, CONVERSION_RECORD})


def converted_output(folder: Path) -> bool:
    """A conversion written before output markers: its record, nothing a conversion does not
    write (so a user's folder once converted into is never replaced), and each file of the
    sha256 its record lists (trial 30's L-2: an edited ``config.json`` was replaced)."""
    if not (folder / CONVERSION_RECORD).is_file() or not tree_entries(folder) <= CONVERTED_FILES:
        return False
    try:
        listed = read_json(folder / CONVERSION_RECORD).get("files")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(listed, dict) and set(listed) == tree_entries(folder) - {
        CONVERSION_RECORD} and unchanged(folder, listed)
