"""Room for a GPU device call: files the call never reads, set aside here until it is unpacked.

A device call sends the working tree and the carried ``.gpu/`` (64 MiB in all, see
:mod:`gpu_bundle`). The tree alone grew past that: 45 MiB of it is the packaged checkpoint, which
the call fine-tunes, and 14 MiB the run cache, of which the call reads only the manifests (which
runs exist, and the lineage behind the checkpoint). ``gpu-bundle --make-room`` moves the run
cache's logs and event files, and the freeze, into the git-ignored ``.gpu-room/`` (same file
system: renames, nothing copied), with a list of what it moved written first; ``gpu-unpack``
puts them back before it places the call's runs, and ``gpu-unpack`` with no folder does only
that. Nothing is ever deleted but a set-aside file whose twin, byte for byte, is back in its
place (``git checkout`` restores them too).
"""

from __future__ import annotations

import filecmp
import os
import subprocess
from pathlib import Path

from finetune_lab._files import read_json, write_json_atomic
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import DamagedFileError, UserError, rename_noreplace

ROOM_DIR = ".gpu-room"
"""Where the files wait (git-ignored, so a call does not send them)."""
LIST_FILE = "moved.json"
KEPT = frozenset({"manifest.json", "experiment.json"})
"""What the call reads of the run cache."""


def sent_files(root: Path = PROJECT_ROOT, under: str = "") -> list[str]:
    """The files a device call sends (tracked, and untracked ones git does not ignore), under
    ``under`` only where one is given."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                           "--", under or "."], cwd=root, capture_output=True, check=True)
    return [p for p in proc.stdout.decode().split("\0") if p and (root / p).is_file()]


def movable(root: Path = PROJECT_ROOT) -> list[str]:
    """The files a call never reads: the freeze, and the run cache but for its manifests."""
    return [p for p in sent_files(root) if _movable_path(p)]


def _movable_path(rel: str) -> bool:
    parts = Path(rel).parts
    return not Path(rel).is_absolute() and ".." not in parts and Path(rel).name not in KEPT \
        and (parts[:1] == ("_freeze",) or parts[:2] == ("data", "runs")) and len(parts) > 1


def _room(root: Path) -> Path:
    """The room, refused where it is a link or no folder (check 30b's 30b-1: a link back into
    the project made every file its own "twin", deleted as put back)."""
    room = root / ROOM_DIR
    if room.is_symlink() or os.path.lexists(room) and not room.is_dir():
        raise UserError(f"{room} is a link or no folder: files are set aside only in a folder of "
                        "its own; move it away (nothing has been moved)")
    return room


def set_aside(root: Path = PROJECT_ROOT) -> tuple[int, int]:
    """Move :func:`movable` into ``.gpu-room/``; (files, bytes). The list is written first, so
    that :func:`put_back` finds every file, whatever stopped the moves."""
    room = _room(root)
    if (room / LIST_FILE).exists():
        raise UserError(f"{room / LIST_FILE} lists files set aside for an earlier call: put them "
                        "back first (`finetune-lab gpu-unpack`, with or without the call's folder)")
    files = movable(root)
    room.mkdir(exist_ok=True)
    write_json_atomic(room / LIST_FILE, files)
    size = 0
    for rel in files:
        (room / rel).parent.mkdir(parents=True, exist_ok=True)
        size += (root / rel).stat().st_size
        if not rename_noreplace(root / rel, room / rel):
            raise UserError(f"{room / rel} exists already: move it out of {room}, then "
                            "`finetune-lab gpu-unpack` puts back what was set aside")
    return len(files), size


def put_back(root: Path = PROJECT_ROOT) -> tuple[int, list[str]]:
    """Move what :func:`set_aside` moved back to its place; (files moved back, files kept in the
    room because something else now lies at their place). No list: (0, [])."""
    room = _room(root)
    try:
        files = read_json(room / LIST_FILE)
    except FileNotFoundError:
        return 0, []
    except (OSError, DamagedFileError) as exc:
        raise UserError(f"{room / LIST_FILE} cannot be read ({exc}): move the files under {room} "
                        "back to the same paths in the project by hand") from exc
    if not isinstance(files, list) or not all(isinstance(f, str) and _movable_path(f)
                                              for f in files):  # (check 30b's 30b-2)
        raise UserError(f"{room / LIST_FILE} is not a list of the paths --make-room moves: move "
                        f"the files under {room} back to the same paths in the project by hand")
    back, kept = 0, []
    for rel in files:
        src, dst = room / rel, root / rel
        if not src.is_file():
            continue  # never moved, or back already
        if os.path.lexists(dst):
            if dst.is_file() and not os.path.samefile(src, dst) \
                    and filecmp.cmp(src, dst, shallow=False):
                src.unlink()  # its twin is back (git checkout): nothing is lost
                back += 1
            else:
                kept.append(rel)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rename_noreplace(src, dst):
            back += 1
        else:
            kept.append(rel)
    if kept:
        write_json_atomic(room / LIST_FILE, kept)
        return back, kept
    (room / LIST_FILE).unlink()
    for folder, _dirs, _files in sorted(os.walk(room), key=lambda w: -len(w[0])):
        try:
            os.rmdir(folder)  # empty folders only: anything else put there stays
        except OSError:
            pass
    return back, kept


def room_note(root: Path = PROJECT_ROOT) -> str | None:
    """A line for commands that read the run cache while files are set aside, else None."""
    if not (root / ROOM_DIR / LIST_FILE).exists():
        return None
    return (f"the run cache's logs and the freeze are set aside in {root / ROOM_DIR} for a GPU "
            "call: `finetune-lab gpu-unpack` (with or without the call's folder) puts them back")
