"""Every path the project reads or writes, from one place (cookiecutter-data-science style).

Raw inputs are read-only and live outside the repository (the *data root*); derived files that
are one-to-one copies of them go to the git-ignored *work dir*; what the project itself produces
and commits (run logs, manifests, metric tables, the pretrained checkpoint) lives under ``data/``.
"""

from __future__ import annotations

import filecmp
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from finetune_lab.errors import DataRootError, UserError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The repository root (``src/finetune_lab/config.py`` -> two levels up)."""

DATA_ROOT_ENV = "FINETUNE_LAB_DATA_ROOT"
WORK_DIR_ENV = "FINETUNE_LAB_WORK_DIR"
RUNS_DIR_ENV = "FINETUNE_LAB_RUNS_DIR"


@dataclass(frozen=True)
class Paths:
    """Resolved locations. Build it with :func:`paths` so environment overrides apply."""

    project: Path
    data_root: Path
    work: Path
    runs: Path
    checkpoints: Path
    summaries: Path

    @property
    def user_dir(self) -> Path:
        """The fairseq ``--user-dir`` plugin that registers ``roberta_small``."""
        return Path(__file__).resolve().parent / "models" / "fairseq_user_dir"


def default_data_root() -> Path:
    """``$FINETUNE_LAB_DATA_ROOT``, else ``../shared/data`` beside the checkout."""
    env = _env_path(DATA_ROOT_ENV)
    return env if env is not None else (PROJECT_ROOT.parent / "shared" / "data").resolve()


def _env_path(var: str) -> Path | None:
    """The folder a ``FINETUNE_LAB_*`` variable names, ``~`` expanded (None: unset); a
    ``~user`` of no user on this machine is one line (trial 15's X-e2: a traceback)."""
    value = os.environ.get(var)
    if not value:
        return None
    try:
        return Path(value).expanduser().resolve()
    except RuntimeError as exc:  # pathlib: a ~user of no user, or a loop of links
        why = ("is a link that leads back to itself" if str(exc).startswith("Symlink loop")
               else "has a ~ that names no home folder on this machine")
        raise UserError(f"{var}={value} {why}; give a folder's full path") from None


def paths() -> Paths:
    """The project's paths, honouring the ``FINETUNE_LAB_*`` environment variables."""
    data = PROJECT_ROOT / "data"
    work, runs = _env_path(WORK_DIR_ENV), _env_path(RUNS_DIR_ENV)
    for var, folder in ((WORK_DIR_ENV, work), (RUNS_DIR_ENV, runs)):
        if folder is not None and folder.exists() and not folder.is_dir():  # trial 21's X-c3
            raise UserError(f"{var}={os.environ[var]} is a file, not a folder: point it at a "
                            "folder (it is made where it does not exist)")
    return Paths(
        project=PROJECT_ROOT,
        data_root=default_data_root(),
        work=work if work is not None else data / "work",
        runs=runs if runs is not None else data / "runs",
        checkpoints=data / "checkpoints",
        summaries=data / "summaries",
    )


def require_data_root(*relative: str, root: Path | None = None) -> Path:
    """Return the data root after checking that each ``relative`` path exists under it.

    Raises :class:`DataRootError` naming the missing path and the two ways to fix it.
    """
    base = root if root is not None else default_data_root()
    if not base.is_dir():
        what = "is a file, not a folder" if base.exists() else "does not exist"
        raise DataRootError(
            f"data root {base} {what}. Set {DATA_ROOT_ENV}=/path/to/data "
            "(the folder holding webis-cls-10/, eltec-fra/ and qa/; see README, 'Data')."
        )
    for rel in relative:
        if not (base / rel).exists():
            raise DataRootError(
                f"{base / rel} is missing from the data root {base}. Point {DATA_ROOT_ENV} at a "
                "complete copy of the data (see README, 'Data')."
            )
    return base


def protected(dest: Path, *, file: bool = False,
              owner: str | None = None) -> tuple[str, bool] | None:
    """Which of the project's own stores ``dest`` is, holds or lies in, said for a refusal, and
    whether no ``--force`` passes it (True) or ``--force`` replaces there only what the command
    made itself (False). Trials 10 and 11: ``package-checkpoint --force --dest`` deleted every
    run (``data/runs``), the probe records, the packaged checkpoint's folder, ``src/``. A
    ``file`` (a record, a summary) may go into the records' folder or the project's work folder,
    and nowhere else in the project, the run store, the data root or the checkpoints' folder."""
    resolved = _protected_at(Path(dest).resolve(), file, Path.resolve)
    # and the path as given: a link where a store goes is that store (trial 13's A5: a link at
    # the packaged checkpoint's folder was replaced, its target lying outside every store)
    named = resolved or _protected_at(Path(os.path.abspath(dest)), file,
                                      lambda s: Path(os.path.abspath(s)))
    # packaged weights are replaced only by their packaging command (trial 18's A-p)
    held = None if named is not None else run_work_near(
        Path(dest), package_ok=owner == "package-checkpoint")
    if held is not None:  # runs of a store of any name (trials 15 to 18, A-n1, A-v, A-x, A-p)
        what = ("a run's training state" if STATE_FILE.fullmatch(held.name) else
                "packaged weights" if held.name == "model.pt" else "a run")
        return f"is, holds or lies in {what} ({held})", True
    return named


WALK_LIMIT = 200_000
"""Entries :func:`run_work_near` looks through below a folder before it refuses to say."""


def hidden(relative: Path | str) -> bool:
    """A path with a hidden part (a run's ``.lock``, ``.superseded/``, a ``.DS_Store``), which
    git leaves uncommitted, the freeze does not hash, and so no reader reads or records (trial
    11's CF11, CF14; trial 14's CF1: a ``.DS_Store`` in prepared data rejected its runs)."""
    return any(part.startswith(".") for part in Path(relative).parts)


def run_key(stored: str | Path) -> str:
    """``experiment/name`` of a run folder's path as a manifest stores it (project-relative or
    absolute), as :attr:`RunRecord.key <finetune_lab.runs.registry.RunRecord.key>` names runs:
    lineages and checkpoint sources are matched on it, whatever runs root or clone holds them.
    Here, below every stage, because packages (models) and runs both match on it."""
    p = Path(stored)
    return f"{p.parent.name}/{p.name}"


def is_run_manifest(manifest: Path) -> bool:
    """A run's ``manifest.json`` names its framework and experiment, which a data step's does
    not; read whole (trial 17's A-v7: a failed run's error text pushed both past the first
    4 KiB), and by its bytes, so that a damaged one is still a run."""
    try:
        with open(manifest, "rb") as handle:
            text = handle.read(64 << 20)
    except OSError:
        return False
    return b'"framework"' in text and b'"experiment"' in text


def run_work_near(dest: Path, *, package_ok: bool = False) -> Path | None:
    """A run's ``manifest.json`` at ``dest`` itself, in any folder above it, or anywhere below it
    (a run store, an experiment, a run, a file in one; trial 17's A-v8: five levels down), links
    not followed, or a run's event files, training state or packaged weights (``dest`` itself
    a package only where ``package_ok``: the packaging command's own output); None where there is
    none. A folder too large to look through is refused."""
    for place in (dest, *Path(os.path.abspath(dest)).parents):  # any depth (trial 19: A-x1r)
        if place.name == "manifest.json" and place.is_file() and is_run_manifest(place):
            return place
        if (place / "manifest.json").is_file() and is_run_manifest(place / "manifest.json"):
            return place / "manifest.json"
    if not dest.is_dir() or dest.is_symlink():
        return None
    seen = 0
    for top, dirs, files in os.walk(dest):
        seen += len(dirs) + len(files)
        if seen > WALK_LIMIT:
            raise UserError(f"{dest} holds more than {WALK_LIMIT:,} files and folders, too many "
                            "to make sure no run lies in it: pass a new or smaller folder")
        if "manifest.json" in files and is_run_manifest(Path(top) / "manifest.json"):
            return Path(top) / "manifest.json"
        # a run's training state, or packaged weights in a store below (trial 17's A-v9: the
        # work folder of an unset FINETUNE_LAB_WORK_DIR, a paused run's state in it)
        state = next((f for f in files if STATE_FILE.fullmatch(f)), None)
        if state is not None:
            return Path(top) / state
        if {"model.pt", "manifest.json"} <= set(files) and (Path(top) != dest or not package_ok):
            return Path(top) / "model.pt"
        # a run whose manifest is cut short or gone: its event files (trial 18's A-x)
        events = next((f for f in files if f.startswith("events.out.tfevents.")), None)
        if events is not None:
            return Path(top) / events
    return None


def replaces_weights(old: Path, new: Path) -> bool:
    """Whether putting ``new`` where ``old`` is would lose weights or training state: ``old``
    holds some (:func:`run_work_near`) that ``new`` does not hold byte for byte (trial 20's
    A-z1: candidates that runs fine-tuned, replaced by the command that made them)."""
    if not old.is_dir() or old.is_symlink() or run_work_near(old) is None:
        return False

    def weights(root: Path) -> dict[Path, Path]:
        return {f.relative_to(root): f for f in root.rglob("*.pt") if f.is_file()}
    was, now = weights(old), weights(new)
    return not was.keys() <= now.keys() or any(
        not filecmp.cmp(was[k], now[k], shallow=False) for k in was)


STATE_FILE = re.compile(r"checkpoint(_last|_best|\d+|_\d+_\d+)\.pt")
"""fairseq's saved training state (``--save-dir``): what a paused run resumes from."""


def _protected_at(d: Path, file: bool, norm: Callable[[Path], Path]) -> tuple[str, bool] | None:
    """:func:`protected` for ``d``, the stores' paths made comparable by ``norm``."""
    p = paths()
    for name, store in (("the run store", p.runs), ("the records' folder", p.summaries),
                        ("the checkpoints' folder", p.checkpoints), ("the work folder", p.work),
                        ("the data root", p.data_root), ("the project", p.project)):
        if norm(store).is_relative_to(d):
            return f"is or holds {name} {store}", True
    for name, store, hard in (("the run store", p.runs, True), ("the data root", p.data_root, True),
                              ("the records' folder", p.summaries, not file),
                              ("the checkpoints' folder", p.checkpoints, file)):
        if d.is_relative_to(norm(store)):
            return f"lies in {name} {store}", hard
    # the work folder is scratch but for what no command can make again: packaged candidate
    # weights that runs and records cite, and long runs' resumable state (trial 13's A1, A2)
    # (trial 14: the project's own as well as FINETUNE_LAB_WORK_DIR's, and the run cache of
    # `--runs-root data/work/lora-runs` that the README names)
    for work in dict.fromkeys((p.work, p.project / "data" / "work")):
        for name, store in (("the candidates' weights", work / "candidates"),
                            ("the long runs' resumable state", work / "pretrain-checkpoints"),
                            ("a run cache", work / "lora-runs")):
            if norm(store).is_relative_to(d):
                return f"is or holds {name} {store}", True
            if d.is_relative_to(norm(store)):
                return f"lies in {name} {store}", file
    # in the project only the project's own work folder is scratch: a FINETUNE_LAB_WORK_DIR
    # pointed at src/ or the root made them scratch too (trial 12's A29, A30)
    scratch = norm(p.project / "data" / "work")
    if d.is_relative_to(norm(p.project)) and not d.is_relative_to(scratch):
        return f"lies in the project {p.project}", file  # a file there is the project's
    return None


def check_protected_file(path: Path | str) -> None:
    """A file no command writes, through a link or not, ``--force`` included: one in the run
    store, the data root, the checkpoints' folder, or the project outside its work folder and
    records (:func:`protected`; trials 11 and 12: a record path linked to a run's manifest, and
    ``data-summary --out`` a source file, overwrote them)."""
    guard = protected(Path(path).resolve(), file=True)
    if guard and guard[1]:
        raise UserError(f"{path} {guard[0]}" + (f" (it links to {Path(path).resolve()})"
                                               if os.path.islink(path) else "")
                        + ": no command writes there, --force included; pass another path")


def check_new_record(path: Path, what: str, *, force: bool = False) -> None:
    """A named record of ``data/summaries/`` (the book may cite it) is replaced only with
    ``--force``: refused before any work, naming it."""
    check_protected_file(path)
    if os.path.islink(path):  # trial 12's L4, L5: through it, another record or a source file
        raise UserError(f"{path} is a link (to {Path(path).resolve()}): a record is a file of "
                        "its own; remove the link or choose another --name")
    folder = Path(os.path.abspath(path)).parent
    linked = next((p for p in (folder, *folder.parents) if p.is_relative_to(PROJECT_ROOT)
                   and p != PROJECT_ROOT and p.is_symlink()), None)
    if linked is not None:  # trial 30's L-9: the record went where the link pointed
        raise UserError(f"{linked} is a link (to {linked.resolve()}): a record is written only "
                        "into the project's own folders; put the folder back in place")
    if os.path.exists(path) and not os.path.isfile(path):  # trial 29's L-2: said after the work
        raise UserError(f"{path} is a folder or other non-file where the record goes: move it "
                        "away or choose another --name (--force replaces only a record)")
    if os.path.exists(path) and not force:
        raise UserError(f"{path} exists ({what}): it was left as it is; choose another --name, "
                        "or pass --force to replace it")

