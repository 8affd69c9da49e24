"""Run manifests: what a run was, what it read, where and when it ran, and whether it finished.

A manifest is the one file that lets a reader trust (or reject) the TensorBoard events next to
it. It is always written atomically (temp file in the same folder, then :func:`os.replace`), so a
crash mid-write leaves the previous manifest, never half a JSON file.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from finetune_lab._files import (
    CONVERSION_RECORD, OUTPUT_MARKER,
    hidden,
    not_there,
    parse_json,
    regular_text,
    sha256_file,
    sha256_tree,
    write_json_atomic,
)
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.config import run_key as run_key  # (where runs import it from)
from finetune_lab.errors import UserError
from finetune_lab.runs.portable import TRACKED_PACKAGES as TRACKED_PACKAGES
from finetune_lab.runs.portable import cpu_model as cpu_model
from finetune_lab.runs.portable import device_info as device_info
from finetune_lab.runs.portable import environment_info as environment_info
from finetune_lab.runs.portable import git_commit as git_commit
from finetune_lab.runs.portable import package_versions as package_versions

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1

STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"
STATUS_FAILED = "failed"
STATUS_PAUSED = "paused"
"""A resumable run (long pretraining) that stopped at a segment's end, its budget not spent."""
STATUSES = (STATUS_RUNNING, STATUS_COMPLETE, STATUS_FAILED, STATUS_PAUSED)

FRAMEWORKS = ("fairseq", "transformers")

# The keys every manifest must carry, and their types: SCHEMA_FILE (manifest.schema.json).
# Keys that must be filled once a run says it is complete.
COMPLETE_KEYS = ("end_time", "wall_time_s", "exit_code", "outputs")

EVENT_FILE_MARKER = "events.out.tfevents"


class ManifestError(UserError):
    """A manifest is missing, unreadable or incomplete."""


def portable_path(path: Path | str) -> str:
    """A path as stored in manifests: relative to the project root when inside it.

    Relative paths keep manifests valid in another checkout of the repository.
    """
    resolved = Path(path).expanduser().resolve()
    try:
        return resolved.relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return str(resolved)


def outside_project(stored: str) -> bool:
    """Whether a path as a manifest or record stores it lies outside the project, where no
    freeze record can hold what it names."""
    return Path(stored).is_absolute() or posixpath.normpath(stored).split("/")[0] == ".."


def refuse_outside_project(folder: Path, record: Path) -> None:
    """A record the book reads (one inside the project) of weights outside it is refused before
    any work: the book reads a record's checkpoint folder, and what it reads must be something
    the freeze can name (trial 16's CF-v2: whether ``/tmp/...`` existed decided whether a
    damaged record was shown)."""
    if not outside_project(portable_path(record)) \
            and outside_project(portable_path(Path(folder) / "model.pt")):
        raise UserError(f"{folder} lies outside the project: the book keeps track only of "
                        "weights inside it; copy the packaged folder to "
                        "data/work/candidates/<name>/ and pass that as --checkpoint")


def weights_record(folder: Path, record: Path) -> dict[str, str]:
    """The ``checkpoint`` entry of ``record``, of packaged weights (a probe, fill-mask answers):
    path and sha256 of its ``model.pt`` (:func:`refuse_outside_project`)."""
    refuse_outside_project(folder, record)
    model = Path(folder) / "model.pt"
    return {"path": portable_path(model), "sha256": sha256_file(model)}


def resolve_stored_path(stored: str) -> Path:
    """Inverse of :func:`portable_path`."""
    p = Path(stored)
    return p if p.is_absolute() else PROJECT_ROOT / p


BUILD_RECORD = "manifest.json"
"""A data folder's own record of how it was built (commands, counts, timings): provenance, not
data. Run inputs leave it out, so rebuilding identical data does not invalidate the runs."""
BUILD_RECORDS = frozenset({BUILD_RECORD, CONVERSION_RECORD, OUTPUT_MARKER})
"""Every such record at the top of an input folder."""
BUILD_LOG = "preprocess.log"
"""``fairseq-preprocess``'s log, in every folder it writes: its options, the absolute path of
the dictionary among them, so it differs between two checkouts of identical data."""


def is_build_record(rel: str) -> bool:
    """Whether a file of an input folder (path relative to it) records how the data was built
    rather than holding data: left out of run inputs, so that identical data built again, or
    built in a checkout at another path, keeps the runs valid."""
    return rel in BUILD_RECORDS or rel.rsplit("/", 1)[-1] == BUILD_LOG


def input_record(path: Path | str) -> dict[str, Any]:
    """``{"path": ..., "sha256": {relpath: sha}}`` for a data folder/file or checkpoint (a
    folder's build records, :func:`is_build_record`, left out)."""
    hashes = sha256_tree(path)
    if Path(path).is_dir():
        hashes = {rel: sha for rel, sha in hashes.items() if not is_build_record(rel)}
    return {"path": portable_path(path), "sha256": hashes}


# --- reading and writing ---------------------------------------------------------------------


def write_manifest(run_dir: Path | str, manifest: Mapping[str, Any]) -> Path:
    """Atomically write ``run_dir/manifest.json``."""
    path = Path(run_dir) / MANIFEST_NAME
    try:
        write_json_atomic(path, dict(manifest))
    except OSError as exc:  # a full disk names no file: say which one could not be written
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return path


def read_manifest(run_dir: Path | str) -> dict[str, Any]:
    """Read ``run_dir/manifest.json``; raise :class:`ManifestError` naming the file if unusable."""
    path = Path(run_dir) / MANIFEST_NAME
    if not path.is_file():
        said = "is missing" if not os.path.lexists(path) else not_there(path)
        raise ManifestError(
            f"{path} {said}: this folder is not a recorded run. Re-run it with the "
            "`finetune-lab finetune ...` or `finetune-lab pretrain ...` command that makes it "
            "(README, 'Re-running the experiments'), or delete the folder."
        )
    try:
        data = loads_strict(regular_text(path))
    except (OSError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"{path} cannot be read ({exc}); re-run the run.") from exc
    except ValueError as exc:  # JSONDecodeError, or a number no computation can use
        raise ManifestError(f"{path} is not valid JSON ({exc}); re-run the run.") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path} does not hold a JSON object; re-run the run.")
    return data


INT_LIMIT = 2 ** 63
"""Integers a manifest may hold: what numpy and pandas compute with (int64)."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text} is out of range")
    return value


def _bounded(text: str) -> int:
    value = int(text)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError(f"the integer {text[:24]}{'...' if len(text) > 24 else ''} is out of "
                         "range")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses what Python's parser lets through but no table can use:
    ``NaN``/``Infinity``, a float that overflows (``1e400``), an integer beyond int64."""
    return parse_json(text, parse_float=_finite, parse_int=_bounded,
                      parse_constant=_no_constant)


def readable_manifests(folder: Path, pattern: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each manifest under ``folder`` matching ``pattern`` that reads as a JSON object, in path
    order, for a command's quick look before any work; a damaged one, or one that is no regular
    file, is skipped: the registry names it."""
    for manifest in sorted(folder.glob(pattern)):
        try:
            record = loads_strict(regular_text(manifest))
        except (OSError, UnicodeDecodeError, RecursionError, ValueError):
            continue
        if isinstance(record, dict):
            yield manifest, record


SCHEMA_FILE = Path(__file__).with_name("manifest.schema.json")
"""The shape of a manifest, as a JSON Schema (Draft 2020-12): types, required keys, records."""


@lru_cache(maxsize=1)
def _schema_validator():
    if "jsonschema" not in sys.modules:
        # jsonschema's format checkers import rfc3987_syntax when it is installed (jupyter brings
        # it), which compiles 39 lark grammars on import: over a second in every process that
        # reads a manifest (each chapter of a render), for an "iri" format this schema never
        # uses. A None entry makes that optional import fail, as jsonschema allows; it is
        # removed again, so a later import of rfc3987_syntax works as usual.
        blocked = "rfc3987_syntax" not in sys.modules
        if blocked:
            sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
        try:
            import jsonschema
        finally:
            if blocked:
                del sys.modules["rfc3987_syntax"]
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    formats = jsonschema.FormatChecker(formats=())
    formats.checks("date-time", raises=ValueError)(_is_time)
    return jsonschema.Draft202012Validator(schema, format_checker=formats)


def _is_time(value: object) -> bool:
    """A ``date-time`` as the recorder writes it (:func:`~finetune_lab._files.utc_now`): ISO
    8601 with a date, a time and a UTC offset, which pandas and string order both read."""
    if not isinstance(value, str):
        return True  # the type is the schema's business
    if not TIME_PATTERN.fullmatch(value):
        return False
    return datetime.fromisoformat(value.replace("Z", "+00:00")).tzinfo is not None


TIME_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def _where(path: Iterable[Any]) -> str:
    """``inputs.data[0]`` from jsonschema's path ``["inputs", "data", 0]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def schema_problems(manifest: Any) -> list[str]:
    """Where ``manifest`` breaks :data:`SCHEMA_FILE`, one sentence per place, using the
    schema's titles (``manifest 'outputs' is not a mapping of event file to sha256, ...``);
    judged once per content in a process (a store's copies, a render's chapters)."""
    try:
        text = json.dumps(manifest, sort_keys=True)
    except (TypeError, ValueError):
        return _schema_problems(manifest)
    return list(_problems_of(text, id(_schema_validator())))


@lru_cache(maxsize=4096)
def _problems_of(text: str, _validator: int) -> tuple[str, ...]:
    return tuple(_schema_problems(json.loads(text)))


def _schema_problems(manifest: Any) -> list[str]:
    problems: list[str] = []
    for err in sorted(_schema_validator().iter_errors(manifest),
                      key=lambda e: [str(p) for p in e.absolute_path]):
        where = _where(err.absolute_path)
        if err.validator == "required":
            prefix = f"{where}." if where else ""
            problems += [f"manifest lacks key '{prefix}{k}'" for k in err.validator_value
                         if isinstance(err.instance, dict) and k not in err.instance
                         and f"manifest lacks key '{prefix}{k}'" not in problems]
        else:
            title = err.schema.get("title") if isinstance(err.schema, dict) else None
            problems.append(f"manifest '{where}' is not {title}" if title
                            else f"manifest '{where}': {err.message}")
    return problems


def manifest_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Everything that makes ``manifest`` unusable, as readable sentences (empty if fine): its
    shape against the schema, then what its status says."""
    problems = schema_problems(manifest)
    if any(p.startswith("manifest lacks key") for p in problems):
        return problems
    if isinstance(manifest.get("seed"), float):  # JSON Schema counts 0.0 as an integer
        problems.append(f"seed {manifest['seed']!r} is not an integer")
    return problems + ([note] if (note := status_problem(manifest)) else [])


def status_problem(manifest: Mapping[str, Any]) -> str | None:
    """What the manifest's status says against using the run (None: complete with every key a
    complete run needs). A run whose only problem is this one did not finish: the book may
    show it as such (in progress, lost), never as a result."""
    status = manifest.get("status")
    problems: list[str] = []
    if status == STATUS_RUNNING:
        problems.append(
            "status is 'running': the run never finished (killed mid-way, or still in progress)"
        )
    elif status == STATUS_FAILED:
        code = manifest.get("exit_code")
        problems.append(
            f"status is 'failed': the training process exited with code {code}" if code is not None
            else "status is 'failed': the launch was interrupted before its training process "
                 f"ended ({manifest.get('error') or 'no exit code'})"
        )
    elif status == STATUS_PAUSED:
        problems.append(
            f"status is 'paused': a long run stopped at update {manifest.get('updates_done')} of "
            f"{(manifest.get('hyperparameters') or {}).get('max_update')}; the same "
            "`finetune-lab pretrain --tokens ...` command resumes it"
        )
    elif status == STATUS_COMPLETE:
        problems += [
            f"manifest says complete but lacks '{k}'"
            for k in COMPLETE_KEYS
            if manifest.get(k) is None
        ]
        if manifest.get("exit_code") not in (0, None):
            problems.append(f"manifest says complete but its training process exited with "
                            f"code {manifest.get('exit_code')}")
        wall = manifest.get("wall_time_s")
        if isinstance(wall, (int, float)) and not isinstance(wall, bool) and wall <= 0:
            problems.append(f"manifest says complete in {wall} s: no run takes no time")
    return "; ".join(problems) or None


def input_shape_problems(inputs: Any) -> list[str]:
    """The schema's complaints about a manifest's ``inputs`` alone (the registry hashes inputs
    only when their shape is right)."""
    return [p for p in schema_problems({"inputs": inputs})
            if p.startswith(("manifest 'inputs", "manifest lacks key 'inputs."))]


def event_files(run_dir: Path | str) -> list[Path]:
    """TensorBoard event files anywhere under ``run_dir`` (fairseq writes one folder per
    subset), none :func:`hidden`."""
    root = Path(run_dir)
    return sorted(p for p in root.rglob(f"{EVENT_FILE_MARKER}*")
                  if p.is_file() and not hidden(p.relative_to(root)))


def output_hashes(run_dir: Path | str) -> dict[str, str]:
    """sha256 of each event file, keyed by its path relative to the run folder."""
    root = Path(run_dir)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in event_files(root)}


LOG_FILES = ("train.log",)
"""Logs the chapters read facts from (a pretraining run's corpus blocks, passes, rates): hashed
when a run ends, like its event files, so an edited log is a rejected run, not a new number."""


def log_hashes(run_dir: Path | str) -> dict[str, str]:
    """sha256 of each of :data:`LOG_FILES` present in the run folder."""
    root = Path(run_dir)
    return {name: sha256_file(root / name) for name in LOG_FILES if (root / name).is_file()}


def checkpoint_hashes(run_dir: Path | str) -> dict[str, str]:
    """sha256 of each ``*.pt`` checkpoint a run saved under its folder (relative paths)."""
    root = Path(run_dir)
    return {p.relative_to(root).as_posix(): sha256_file(p)
            for p in sorted(root.rglob("*.pt")) if p.is_file()}
