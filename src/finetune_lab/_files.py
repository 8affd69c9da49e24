"""File helpers every stage shares: hashing, atomic files and folders, JSON, timestamps: one
implementation of each, at the bottom of the package, used by every stage alike."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from finetune_lab.config import (check_protected_file, hidden, protected,  # noqa: F401
                                 replaces_weights)
from finetune_lab.errors import DamagedFileError, UserError
from finetune_lab.errors import check_writable as check_writable
from finetune_lab.errors import clear_stale_temps, short_name
from finetune_lab.errors import regular_only as _regular
from finetune_lab.errors import sha256_file as sha256_file
from finetune_lab.errors import move_aside as move_aside
from finetune_lab.errors import rename_noreplace as rename_noreplace
from finetune_lab.errors import swap_paths as _swap
from finetune_lab.errors import not_there as not_there

CONVERSION_RECORD = "conversion.json"
"""A converted model's record: its source's sha256 and check (:mod:`~.models.hf_convert`)."""
OUTPUT_MARKER = ".finetune-lab-output"
"""Written by :func:`atomic_dir` into each folder it makes (its command, every path it wrote):
the command replaces that folder and nothing else. Hashes and run inputs leave it out."""


def utc_now() -> str:
    """ISO-8601 UTC timestamp with seconds; one format everywhere so times compare as strings."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def sha256_tree(path: Path | str, exclude: Iterable[str] = ()) -> dict[str, str]:
    """sha256 of every file under ``path`` (of ``path`` itself if a file), but files named in
    ``exclude`` (a data step's manifest, logs) and :func:`hidden` ones (:data:`OUTPUT_MARKER`).
    Keys: POSIX paths relative to ``path`` (``"."`` for a file), sorted, so equal trees are."""
    root, skip = Path(path), frozenset(exclude)
    if root.is_file():
        return {".": sha256_file(root)}
    if not root.is_dir():
        raise UserError(f"cannot hash {root}: no such file or directory")
    return {rel.as_posix(): sha256_file(f) for f in sorted(root.rglob("*"))
            if f.is_file() and f.name not in skip and not hidden(rel := f.relative_to(root))}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: Path | str, data: Any) -> None:
    """Write JSON so that readers see either the old file or the new one, never a partial one."""
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))


def write_record(path: Path, data: Any) -> None:
    """Write a named record (``fill-mask``, ``probe``) that ``--force`` lets replace another:
    the one it replaces is kept beside it (:func:`keep_beside`), as ``data-summary`` keeps its
    own (trial 27's L-m6: a user's notes in a record were lost)."""
    if path.is_file() and not path.is_symlink():
        keep_beside(path)
    write_json_atomic(path, data)


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    """Write ``data`` so that readers see either the old file or the new one, never a partial one."""
    target = Path(path)
    if target.is_symlink():  # a link the user made (one file shared by two folders) stays,
        check_protected_file(target)  # but no run's or checkpoint's file is written through it
        target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; use normal permissions
        try:
            os.replace(tmp, target)
        except OSError as exc:  # the file that cannot be replaced, not the scratch file
            raise OSError(exc.errno, exc.strerror, str(target)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_json(text: str, **options: Any) -> Any:
    """``json.loads``, with a structure nested too deep for Python's parser (a RecursionError,
    which no file the project writes has) raised as the JSONDecodeError any other damage is."""
    try:
        return json.loads(text, **options)
    except RecursionError:  # a JSONDecodeError, which every caller of json.loads handles
        raise json.JSONDecodeError("nested too deeply to be a record (a damaged file)",
                                   text, 0) from None


def regular_text(path: Path | str) -> str:
    """A file's UTF-8 text if it is a regular file (a named pipe blocked its readers for ever),
    else the OSError an unreadable file raises, which every reader of records handles."""
    _regular(path)
    return Path(path).read_text(encoding="utf-8")


def regular_bytes(path: Path | str) -> bytes:
    """A regular file's bytes (:func:`regular_text`'s rule), for a reader that decodes them."""
    _regular(path)
    return Path(path).read_bytes()


def read_utf8(path: Path, fix: str) -> str:
    """A text file the project reads, as UTF-8; one that is not is one line naming it, the
    byte where it stops being text, and ``fix`` (what to do), not a UnicodeDecodeError."""
    try:
        return regular_text(path)
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte {exc.start}): {fix}") from None


def read_json(path: Path) -> Any:
    """A JSON file the project wrote, strictly (no NaN or Infinity, which no writer here
    means); a damaged one is one line naming it, not a traceback that does not."""
    try:
        return parse_json(regular_text(path), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DamagedFileError(path, str(exc).splitlines()[0]) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"it holds {name}")


Recognizer = Callable[[Path], bool]
"""Whether an unmarked folder is one a command wrote before markers existed: it looks for the
command's own record first, so that a large foreign folder is not walked."""


def tree_entries(folder: Path) -> set[str]:
    """Every path under ``folder``, relative POSIX, folders ending in ``/``; links are listed,
    never followed; the marker is left out."""
    found: set[str] = set()
    for top, dirs, files in os.walk(folder):
        rel = Path(top).relative_to(folder)
        for name in dirs:
            link = os.path.islink(os.path.join(top, name))
            found.add((rel / name).as_posix() + ("" if link else "/"))
        found.update((rel / name).as_posix() for name in files)
    found.discard(OUTPUT_MARKER)
    return found


def _within(entries: set[str], allowed: set[str]) -> list[str]:
    """Entries neither in ``allowed`` nor a folder holding an allowed file."""
    folders = {f"{parent.as_posix()}/" for a in allowed for parent in Path(a).parents
               if parent != Path(".")}
    return sorted(e for e in entries if e not in allowed and e not in folders)


def _stamps(folder: Path) -> dict[str, list[int]]:
    """Each file's size and modification time, as the command wrote them."""
    return {e: _stamps_of(folder / e) for e in sorted(tree_entries(folder))
            if (folder / e).is_file() and not (folder / e).is_symlink()}


def _changed(folder: Path, stamps: Any) -> list[str]:
    """The files the command wrote that were edited since (trial 25's L-k3: one was replaced
    without a copy); a marker without stamps (older) names none."""
    return sorted(e for e, was in (stamps.items() if isinstance(stamps, dict) else ())
                  if (folder / e).is_file() and _stamps_of(folder / e) != was)


def _stamps_of(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def data_step_output(*steps: str) -> Recognizer:
    """A folder a data step wrote before markers: its ``manifest.json`` names one of ``steps``
    (any step when none is given), every file is one its ``outputs`` list, of the sha256 listed
    (or the manifest, or a ``preprocess.log`` beside an output: trial 30's L-1, L-3, a file
    edited or a user's folder holding such a log was replaced without --force)."""
    def recognize(folder: Path) -> bool:
        try:
            manifest = read_json(folder / "manifest.json")
        except (OSError, ValueError):
            return False
        if not isinstance(manifest, dict) or not isinstance(manifest.get("outputs"), dict):
            return False
        step = manifest.get("step")
        if not isinstance(step, str) or (steps and step not in steps):
            return False
        outputs, entries = manifest["outputs"], tree_entries(folder)
        logs = {f"{Path(o).parent.as_posix()}/preprocess.log".lstrip("./") for o in outputs}
        return not _within(entries, {*outputs, "manifest.json", *(logs & entries)}) \
            and unchanged(folder, outputs)
    return recognize


def unchanged(folder: Path, listed: dict[str, Any]) -> bool:
    """Whether each file ``listed`` (path: sha256, or a dict holding one) is so in ``folder``."""
    wants = {rel: w.get("sha256") if isinstance(w, dict) else w for rel, w in listed.items()}
    return all(isinstance(w, str) and not (folder / rel).is_symlink() and (folder / rel).is_file()
               and sha256_file(folder / rel) == w for rel, w in wants.items())


def _refusal(dest: Path, problem: str, force_hint: bool) -> UserError:
    fix = ("pass --force to replace it (what it holds is then kept beside it)" if force_hint else
           "choose another output folder, or move it away first")
    return UserError(f"{dest} {problem}: it was left as it is; {fix}")


def check_replaceable(dest: Path, owner: str | None, *, force: bool = False,
                      earlier: Recognizer | None = None, can_force: bool = True) -> None:
    """Refuse (a one-line :class:`UserError` naming ``dest``) to replace anything the command
    ``owner`` did not make itself, unless ``force``.

    Replaceable: nothing there; an empty folder; a folder whose marker names ``owner`` and which
    holds only paths the command wrote (a file dropped in later is the user's, and refuses the
    whole); a folder without a marker that ``earlier`` recognizes (outputs written before markers
    existed: by default a data step's manifest naming ``owner``). ``owner`` None (a caller that
    has not named its command): a folder made by any command of this project. ``can_force``
    False: the calling command has no ``--force``, so the refusal does not advise one.
    """
    guard = protected(dest, owner=owner)  # a new folder too (trial 12's A43, A45)
    if guard and guard[1]:
        raise UserError(f"{dest} {guard[0]}: no command writes there, --force included; pass "
                        "another folder")
    if not os.path.lexists(dest):
        return
    if guard:  # --force replaces there only what the command made
        force, can_force = False, False
    if force:
        return
    who = f"`finetune-lab {owner}`" if owner else "finetune-lab"
    if os.path.islink(dest) or not dest.is_dir():
        kind = "is a link" if os.path.islink(dest) else "is a file"
        raise _refusal(dest, f"{kind}, not a folder {who} made", owner is not None and can_force)
    marker = dest / OUTPUT_MARKER
    if marker.is_file():
        try:
            record = read_json(marker)
            made_by, wrote = str(record["command"]), set(record["entries"])
        except (OSError, ValueError, TypeError, KeyError):
            raise _refusal(dest, f"has a damaged {OUTPUT_MARKER}, so who made it is not known",
                           owner is not None and can_force) from None
        if owner is not None and made_by != owner:
            raise _refusal(dest, f"was made by `finetune-lab {made_by}` (its {OUTPUT_MARKER} "
                           f"says so), not by {who}", can_force)
        extra = _within(tree_entries(dest), wrote) + _changed(dest, record.get("stamps"))
    elif _empty(dest):  # nothing to lose
        return
    elif (earlier or data_step_output(*([owner] if owner else [])))(dest):
        return
    else:
        raise _refusal(dest, f"exists and was not made by {who} (it has no "
                       f"{OUTPUT_MARKER})", owner is not None and can_force)
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise _refusal(dest, f"holds {extra[0]}{more}, which {who} did not write (or changed "
                       "since it wrote it)", owner is not None and can_force)


def replaceable(dest: Path, owner: str | None, earlier: Recognizer | None = None) -> bool:
    """Whether ``dest`` is nothing, or only what ``owner`` made: all a command ever deletes."""
    try:
        return check_replaceable(dest, owner, earlier=earlier) is None
    except UserError:
        return False


def _drop_old(old: Path, dest: Path, keep: bool) -> None:
    """Remove the folder ``dest`` held (``old``), or with ``keep`` (what ``--force`` replaced,
    weights) keep it beside ``dest`` (:func:`keep_beside`): what a command did not make is never
    deleted, whatever it holds (trials 10 to 19: a run, weights or state that no check
    recognised, its manifest cut or gone, was wiped)."""
    if not keep:
        return _remove(old)
    keep_beside(old, dest)


def keep_beside(old: Path, dest: Path | None = None) -> Path:
    """Keep what ``dest`` held (``old``; ``dest`` itself by default), a file or a folder, beside
    it as ``NAME.replaced-<UTC second>`` (:func:`move_aside`: ``-2``, ... when taken), and say
    where: the one way every command keeps what it replaces."""
    dest = Path(dest if dest is not None else old)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    kept = move_aside(Path(old), dest.parent / f"{dest.name}.replaced-{stamp}")
    print(f"{dest} was replaced; what it held is kept in {kept}", file=sys.stderr)
    return kept


def _empty(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return next(entries, None) is None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(dest: Path, owner: str | None = None, *, force: bool = False, earlier:
               Recognizer | None = None, marker: bool = True, keep_old: bool = False,
               flag: str = "--out") -> Iterator[Path]:
    """Yield a temp folder beside ``dest``; on success it replaces ``dest``, on failure it is
    removed: readers never see a half-written dataset, and a failed run leaves the previous
    output (or nothing) in place. ``dest`` is replaced only if ``owner`` made it
    (:func:`check_replaceable`, before the work and again before the swap); ``force`` replaces
    anything, and keeps what it replaced beside it unless ``owner`` made it (:func:`_drop_old`).
    ``marker``: write :data:`OUTPUT_MARKER` (off for a folder whose exact files identify it, the
    packaged checkpoint). ``keep_old``: keep it, whoever made it. ``flag``: the caller's option
    that names ``dest``, for the advice on an unwritable one."""
    dest = Path(os.path.abspath(dest))  # trial 28's L-m2: `.` has no name to rename it by
    check_replaceable(dest, owner, force=force, earlier=earlier)
    check_writable(dest.parent, flag)
    try:
        prefix = f".{short_name(dest.name)}.tmp-"  # (a name that fits)
        clear_stale_temps(dest.parent, prefix)
        tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dest.parent))
    except OSError as exc:
        raise UserError(f"cannot write into {dest.parent}: {exc.strerror}. Choose a writable "
                        f"location ({flag}) or fix its permissions.") from exc
    swapped, old_id = False, None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; give it normal permissions
        if marker:
            write_json_atomic(tmp / OUTPUT_MARKER, {
                "command": owner or _step_of(tmp) or "finetune-lab",
                "entries": sorted(tree_entries(tmp)), "stamps": _stamps(tmp)})
        check_replaceable(dest, owner, force=force, earlier=earlier)  # changed meanwhile?
        # --force keeps what it replaces, as it is now (19b's F8: a file added meanwhile), and
        # other weights are never deleted, whoever made them (trial 20's A-z1: candidates)
        keep = keep_old or force and not replaceable(dest, owner, earlier) or replaces_weights(dest, tmp)
        if not os.path.lexists(dest):
            os.replace(tmp, dest)
            return
        new = dest.parent / f".{short_name(dest.name)}.new-{os.getpid()}"  # not a half-written
        tmp = new if rename_noreplace(tmp, new) else tmp  # name, which the old gets (30's L-5)
        old_id = _identity(dest)  # what the old one is, whenever an interrupt comes (30's L-4)
        swapped = _swap(tmp, dest)  # ``dest`` is the old or the new, always
        if swapped:  # ``tmp`` is the old one: never removed below (trial 29's L-30)
            _drop_old(tmp, dest, keep)
        else:  # no exchange here: two renames, and the old put back if the second fails
            old = dest.parent / f".{short_name(dest.name)}.old-{os.getpid()}"
            os.replace(dest, old)
            try:
                os.replace(tmp, dest)
            except BaseException:
                os.replace(old, dest)
                raise
            _drop_old(old, dest, keep)
    except BaseException as exc:
        swapped = swapped or old_id is not None and _identity(tmp) == old_id
        if swapped:  # the old folder, out of clear_stale_temps' reach, and said where
            held = dest.parent / f".{short_name(dest.name)}.old-{os.getpid()}"
            try:
                held = held if rename_noreplace(tmp, held) else tmp
            except OSError:
                held = tmp
            if not isinstance(exc, Exception):  # an interrupt: handled as one, said where
                print(f"{dest} was replaced; what it held is kept in {held}", file=sys.stderr)
                raise
            raise UserError(f"{dest} was replaced, but what it held could not be kept beside it "
                            f"({exc}); it is in {held}: move it where you want it") from exc
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno == errno.EBUSY:  # trial 13's A4
            raise UserError(f"{dest} is a mount point, which cannot be replaced: choose a "
                            "folder inside it as the output") from exc
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:
            exc.filename = str(dest)  # a full disk: name the output (not a DataRootError's)
        raise


def _identity(path: Path) -> tuple[int, int] | None:
    st = os.lstat(path) if os.path.lexists(path) else None
    return (st.st_dev, st.st_ino) if st else None


def _step_of(folder: Path) -> str | None:
    """The ``step`` a data step's manifest names (the command, for callers that gave none)."""
    try:
        step = read_json(folder / "manifest.json").get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, str) else None
