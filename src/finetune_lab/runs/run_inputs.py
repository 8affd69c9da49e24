"""Whether a run's inputs are still the ones it read: its data and checkpoint against the
sha256 its manifest recorded, and, for a run from a converted Transformers model, the fairseq
checkpoint behind that model. What differs becomes a problem of the run (or, for the corpus of a
pretraining run, a warning), with what to do about it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path
from typing import Any, Protocol

from finetune_lab._files import OUTPUT_MARKER, parse_json, read_json, regular_text, sha256_file
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.models.checkpoints import package_manifest
from finetune_lab.models.conversion_record import CONVERTED_FROM
from finetune_lab.runs import manifest as mf


class Findings(Protocol):
    """What these checks read and fill in: the registry's ``RunRecord``."""

    experiment: str
    manifest: dict[str, Any] | None
    problems: list[str]
    warnings: list[str]
    stale_checkpoint: str | None


_HASH_CACHE: dict[tuple[int, int, int, int], str] = {}


def cached_sha256(path: Path) -> str:
    """A file's sha256, computed once per process for a given file (its inode: a hard link,
    as a copied run store's event files are, is the same file), size and modification time."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASH_CACHE:
        _HASH_CACHE[key] = sha256_file(path)
    return _HASH_CACHE[key]


def recorded_checkpoint_sha(manifest: dict[str, Any] | None) -> str | None:
    """The sha256 of the checkpoint file a run started from, as its manifest records it."""
    digest = (((manifest or {}).get("inputs") or {}).get("checkpoint") or {}).get("sha256")
    return digest.get(".") if isinstance(digest, dict) else digest


CORPUS_EXPERIMENTS = frozenset({"pretrain"})
"""Experiments whose product is weights, not a result compared with other runs: a corpus prepared
again after such a run is a warning (the run, its curves and its checkpoint stand for the corpus
it read), not a reason to exclude it."""


def recorded_files(record: dict[str, Any]) -> frozenset[Path]:
    """The files an input record lists (by their sha256), as paths on this machine."""
    stored, recorded = record.get("path"), record.get("sha256") or {}
    if not stored or not isinstance(recorded, dict):
        return frozenset({mf.resolve_stored_path(stored)}) if stored else frozenset()
    root = mf.resolve_stored_path(stored)
    return frozenset(root if rel == "." else root / rel for rel in recorded)


def check_input(label: str, record: dict[str, Any], rec: Findings,
                skip: frozenset[Path] = frozenset()) -> None:
    """Compare an input with what the run recorded; the differences are problems, except for
    the corpus of a run whose product is weights (:data:`CORPUS_EXPERIMENTS`): warnings.
    ``skip``: files another input checks (a converted model is both a run's data and its
    checkpoint), so that one change is reported once."""
    found = input_differences(label, record, rec, skip)
    if label == "data" and rec.experiment in CORPUS_EXPERIMENTS:
        rec.warnings += [f"the corpus was prepared again after the run, so this run stands for "
                         f"the corpus it read, not the current one: {p.split('; ')[0]}"
                         for p in found]
    else:
        rec.problems += found


def _in_project_store(rec: Findings) -> bool:
    """Whether the run lies in the project's own run store, which the book reads and its freeze
    records: its inputs must be checked only where the freeze can hash them too."""
    where = getattr(rec, "path", None)
    return where is not None and Path(where).resolve().is_relative_to(
        (PROJECT_ROOT / "data" / "runs").resolve())


def input_differences(label: str, record: dict[str, Any], rec: Findings,
                      skip: frozenset[Path] = frozenset()) -> list[str]:
    """Every way the input differs from the run's record (missing, changed, new files), files
    named as the manifest stores them (relative to the project when inside it)."""
    found: list[str] = []
    stored = record.get("path")
    recorded = record.get("sha256") or {}
    if not stored or not recorded:
        return [f"manifest {label} entry lacks a path or its sha256"]
    root = mf.resolve_stored_path(stored)
    if root.is_dir() and (root.resolve() == Path(root.anchor)
                          or PROJECT_ROOT.resolve().is_relative_to(root.resolve())):
        return [f"manifest {label} path {stored} is no data folder (it holds the project, or is "
                "the file system's root): the manifest is damaged"]
    if not root.exists():
        rec.warnings.append(f"{label} {stored} is not on this machine; its sha256 is unverified")
        return found
    inside = root.resolve().is_relative_to(PROJECT_ROOT.resolve())
    if _in_project_store(rec) and not inside:
        rec.warnings.append(f"{label} {stored} lies outside the project, where the book's freeze "
                            "cannot follow it; its sha256 is unverified")  # trial 15's CF-n3
        return found
    if _in_project_store(rec) and mf.hidden(root.resolve().relative_to(PROJECT_ROOT.resolve())):
        rec.warnings.append(f"{label} {stored} lies in a hidden folder, which the book's freeze "
                            "does not follow; its sha256 is unverified")  # trial 17's CF-v3
        return found
    if root.is_dir():  # manifests written before inputs left the build records out
        recorded = {k: v for k, v in recorded.items() if not mf.is_build_record(k)}
    for rel, want in sorted(recorded.items()):
        f = root if rel == "." else root / rel
        if f in skip:
            continue
        shown = stored if rel == "." else f"{str(stored).rstrip('/')}/{rel}"
        if not f.is_file():
            found.append(f"{label} file {shown} recorded by the manifest is missing")
            continue
        got = cached_sha256(f)
        if got != want and not same_but_version_stamp(f, want, rec.manifest):
            why = ("the checkpoint was replaced after the run (a new pretraining), so re-run it "
                   "from the new one" if label == "checkpoint" else
                   "the data changed after the run, so re-run it")
            if label == "checkpoint":
                rec.stale_checkpoint = want
            found.append(
                f"hash mismatch: {label} file {shown} has sha256 {got[:12]}… but the run used "
                f"{want[:12]}…; {why}"
            )
    if root.is_dir():
        now = {rel for f in root.rglob("*") if f.is_file()
               if not mf.is_build_record(rel := f.relative_to(root).as_posix())
               and not mf.hidden(rel)}
        for extra in sorted(now - set(recorded)):
            found.append(f"{label} folder {stored} has a new file {extra} the run never saw")
    return found


VERSION_STAMP = "transformers_version"
"""The key ``save_pretrained`` writes into a model's ``config.json``: the Transformers version
that wrote it, not a property of the model."""


def same_but_version_stamp(f: Path, want: str, manifest: dict[str, Any] | None) -> bool:
    """Whether ``f``, a ``config.json`` written by ``save_pretrained``, differs from the file a
    run read only by its :data:`VERSION_STAMP`: restamped with the Transformers version the run
    recorded and serialised as Transformers does (sorted keys, indent 2), it has the sha256 the
    run used. So a model converted again from the same checkpoint by a newer Transformers keeps
    the runs made from the old conversion valid, while any other change still fails."""
    version = (((manifest or {}).get("environment") or {}).get("packages") or {}).get("transformers")
    if f.name != "config.json" or not version:
        return False
    try:
        config = parse_json(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(config, dict) or VERSION_STAMP not in config:
        return False
    config[VERSION_STAMP] = version
    restamped = json.dumps(config, indent=2, sort_keys=True) + "\n"
    return hashlib.sha256(restamped.encode("utf-8")).hexdigest() == want


def check_conversion_source(rec: Findings) -> None:
    """A run from a converted Transformers model (in the git-ignored work dir, so often not on
    this machine) against the fairseq checkpoint it was converted from: the one its manifest
    names (``extra.converted_from``), or, for runs made before that was recorded, the packaged
    checkpoint if it was created after the run started (so the run's model cannot be it)."""
    man = rec.manifest or {}
    if man.get("framework") == "fairseq" or rec.stale_checkpoint:
        return
    source = (man.get("extra") or {}).get(CONVERTED_FROM)
    if source:
        current = mf.resolve_stored_path(source["path"])
        if current.is_file() and (got := cached_sha256(current)) != source["sha256"]:
            rec.stale_checkpoint = source["sha256"]
            rec.problems.append(
                f"the model was converted from {source['path']} with sha256 "
                f"{source['sha256'][:12]}…, which is now {got[:12]}…: the checkpoint was "
                "replaced after the run (a new pretraining), so re-run it from the new one")
        return
    package = package_manifest()
    created, started = (package or {}).get("created"), man.get("start_time")
    if created and started and str(created) > str(started):
        rec.stale_checkpoint = "unrecorded"
        rec.problems.append(
            f"the run started ({started}) before the packaged checkpoint was created "
            f"({created}), so its converted model came from an earlier checkpoint: the "
            "checkpoint was replaced after the run (a new pretraining), so re-run it from the "
            "new one")


def refuse_inside_output(folder: Path, what: str) -> None:
    """``folder`` (a runs root, say) must not lie in a folder another command made and replaces
    whole (trial 8's W5: runs recorded inside the prepared CLS-Books folder made every run that
    read it see a new file)."""
    for parent in (folder, *folder.parents):
        if (parent / OUTPUT_MARKER).is_file():
            try:
                made_by = f"`finetune-lab {read_json(parent / OUTPUT_MARKER)['command']}`"
            except (OSError, ValueError, TypeError, KeyError):
                made_by = "a finetune-lab command"
            raise UserError(f"{what} {folder} is inside {parent}, which {made_by} made (its "
                            f"{OUTPUT_MARKER} says so): choose a folder outside it")


def refuse_inside_runs(root: Path) -> None:
    """A runs root that is, or lies in, an experiment or a run folder (trial 29's L-14:
    ``FINETUNE_LAB_RUNS_DIR=data/runs/fairseq/random-seed0`` put a new run inside a committed
    one), refused as ``finetune-lab runs`` refuses it."""
    for parent in (root, *root.parents):
        if _run_manifest(parent / mf.MANIFEST_NAME) or (parent / "experiment.json").is_file():
            raise UserError(f"runs root {root} is inside the run or experiment folder {parent}: "
                            "name the folder that holds <experiment>/<run>/ (default: data/runs)")
    if root.is_dir() and any(_run_manifest(p / mf.MANIFEST_NAME) for p in root.iterdir()):
        raise UserError(f"runs root {root} is an experiment folder (its folders hold runs): "
                        f"name {root.parent}, which holds it")


def _run_manifest(path: Path) -> bool:
    """Whether ``path`` is a run's manifest (its experiment and run named in it), not another
    program's ``manifest.json`` above the project (check 29b's F2)."""
    try:
        data = parse_json(regular_text(path))
    except (OSError, ValueError, UserError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "experiment" in data and "run" in data


def work_inputs(project: Path) -> list[str]:
    """What the runs in ``project``'s ``data/runs`` name as inputs inside the project (a folder
    as ``folder/**``), sorted: the registry checks each of them where it is, so each is
    an input of every chapter that judges runs (trial 14's CF2: ``pretrain-bin/bin``, the
    ablations' and GPU runs' corpora and the candidates' weights were declared by none)."""
    found: set[str] = set()
    for man in sorted((project / "data" / "runs").glob("*/*/manifest.json")):
        if mf.hidden(man.relative_to(project)):
            continue
        try:
            inputs = parse_json(regular_text(man)).get("inputs")
        except (OSError, UserError, ValueError, AttributeError):
            continue  # a damaged manifest: the registry lists its run as bad, reading no input
        records = [*(inputs.get("data") or []), inputs.get("checkpoint")] \
            if isinstance(inputs, dict) and isinstance(inputs.get("data") or [], list) else []
        for record in records:
            stored = record.get("path") if isinstance(record, dict) else None
            path = posixpath.normpath(stored) if isinstance(stored, str) else ""
            # every input inside the project, where the registry checks it (trial 16's CF-v:
            # data/pp/bin, outside data/work, was checked and recorded by no chapter)
            if path and not posixpath.isabs(path) and not path.startswith("..") \
                    and not mf.hidden(Path(path)):  # the registry does not check those either
                single = list(record.get("sha256") or {}) == ["."]
                found.add(path if single else f"{path}/**")
    return sorted(found)


def record_folders(project: Path) -> list[str]:
    """The manifest and dictionary of every packaged folder that a fill-mask record in
    ``project`` names inside it: the book reads them to check the record's answers
    (``fill_mask.checkpoint_folder``), so each is an input of the chapters that show records
    (trial 16's CF-v2)."""
    found: set[str] = set()
    for rec in sorted((project / "data" / "summaries" / "fill-mask").glob("*.json")):
        try:
            stored = parse_json(regular_text(rec))["checkpoint"]["path"]
        except (OSError, UserError, ValueError, KeyError, TypeError):
            continue  # a damaged record: the book sets it aside, reading no folder
        if isinstance(stored, str) and not mf.hidden(rec.relative_to(project)) \
                and not mf.outside_project(stored):
            folder = posixpath.dirname(posixpath.normpath(stored))
            found.update({f"{folder}/manifest.json", f"{folder}/dict.txt"})
    return sorted(found)
