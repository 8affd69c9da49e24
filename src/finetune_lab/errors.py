"""Errors a user can fix. The CLI prints them as one clear line instead of a traceback; and the
renames that fail safely (an exchange, a rename that never replaces), which every writer shares."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import shutil
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class UserError(Exception):
    """Bad input or environment: the message names the file and the fix."""


class DamagedFileError(UserError, ValueError):
    """A file the project wrote that does not parse: a ValueError to code that expects one (a
    damaged marker or manifest read as "not ours"), one line naming the file to a user."""

    def __init__(self, path: object, why: str) -> None:
        super().__init__(f"{path} is damaged ({why}): restore it (`git checkout -- FILE` if it "
                         "is committed) or run the step that writes it again")
        self.why = why


class DataRootError(UserError, FileNotFoundError):
    """The raw-data root is missing or incomplete."""


class Interrupted(BaseException):
    """A signal (SIGTERM) asked the command to stop: raised, as Ctrl-C raises
    ``KeyboardInterrupt``, so that what is running is stopped and marked as such; the CLI then
    prints one line and exits 128 + the signal's number, as a shell reports a killed command."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted (signal {signum})")
        self.signum = signum


NOT_STOPS = frozenset(getattr(signal, name) for name in (
    "SIGINT", "SIGKILL", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGCHLD", "SIGCONT",
    "SIGWINCH", "SIGURG", "SIGPIPE", "SIGSEGV", "SIGFPE", "SIGBUS", "SIGILL") if hasattr(signal, name))
"""The signals that are no request to stop: Ctrl-C (``KeyboardInterrupt``, handled apart), the
two no process can catch, the terminal's stops and those ignored by default, SIGPIPE (Python's
own: a closed pipe is :class:`BrokenPipeError`), and a fault of the process itself."""
STOP_SIGNALS = tuple(sorted(set(signal.valid_signals()) - NOT_STOPS))
"""The signals that ask a command to stop besides Ctrl-C: every other one, whose default ends
the process without a word and leaves its scratch behind: a scheduler's or ``kill``'s, a closed
terminal's, Ctrl-\\, ``timeout -s``, a CPU limit, the real-time ones (trials 20 to 22, X: a
list of names always lacked the next one tried)."""


HELD: list[int] = []
"""The signals that asked the command to stop (trial 30's E-10, E-11): one that came while its
modules loaded waits here until they have, since an exception raised inside numpy's import left
it half-imported, and a "bad install" traceback, not the one line an interrupt gives."""


def hold(signum: int, _frame: object) -> None:
    """Keep a stop signal for later; a second one ends the process at once."""
    if HELD:
        os._exit(128 + signum)
    HELD.append(signum)


@contextmanager
def stop_signals_raise(handler: Callable[[int, object], None],
                       ctrl_c: Callable[[int, object], None] | None = None) -> Iterator[None]:
    """Within the block, :data:`STOP_SIGNALS` call ``handler`` (which raises), and Ctrl-C
    ``ctrl_c`` where one is given, in the main thread only (the only one that takes signals); a
    signal ignored (``nohup``) stays ignored."""
    wanted = {**dict.fromkeys(STOP_SIGNALS, handler), **({signal.SIGINT: ctrl_c} if ctrl_c else {})}
    previous = {sig: signal.signal(sig, wanted[sig]) for sig in wanted
                if threading.current_thread() is threading.main_thread()
                and signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, was in previous.items():
            signal.signal(sig, was)


@contextmanager
def library_write(dest: object) -> Iterator[None]:
    """A library's writer (``torch.save``, ``save_pretrained``) whose full disk is its own
    exception type (a RuntimeError, a SafetensorError), not an OSError: as one, named with
    ``dest``, which the CLI says in one line (trial 15's X-d3, X-d4)."""
    try:
        yield
    except OSError:
        raise
    except Exception as exc:
        text = str(exc)
        # torch's zip writer names no cause ("basic_ios::clear: iostream error", trial 16's
        # X-d4): a disk with less than a MiB left is the cause, whatever the text
        if "No space left" in text or "StorageFull" in text or "code: 28" in text \
                or _disk_full(dest):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dest)) from exc
        if (found := re.search(r"\(os error (\d+)\)", text)):  # Rust's I/O errors (safetensors):
            code = int(found[1])  # a file-size limit, trial 29's E-14
            raise OSError(code, os.strerror(code), str(dest)) from exc
        raise


def _disk_full(dest: object) -> bool:
    """Whether the disk that holds ``dest`` has less than a MiB left."""
    path = os.path.abspath(str(dest))
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free < 2**20


def not_there(path: Path | str, want: str = "file") -> str:
    """How ``path`` fails to be the ``want`` (``"file"`` or ``"folder"``) a command needs, for a
    one-line error: a folder given for a file was once reported as "does not exist"."""
    p = Path(path)
    try:
        os.stat(p)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # trial 29's E-17: said "does not exist"
            return "is reached through a loop of links"
    if os.path.islink(p) and not p.exists():
        return "is a link to nothing"
    if not p.exists():
        return "does not exist"
    if want == "folder":
        return "is a file, not a folder"
    return "is a folder, not a file" if p.is_dir() else "is not a regular file"


def check_writable(parent: Path, flag: str = "--out") -> None:
    """Fail early, with the fix, when ``parent`` cannot receive the output folder. ``flag``:
    the caller's own option for it (trial 28's E-m7: `package-checkpoint` has `--dest`, not
    the `--out` it was told to change)."""
    fix = f"Choose a writable location ({flag}) or fix its permissions."
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the output folder {parent}: {exc.strerror}. {fix}") \
            from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"the output folder {parent} is not writable. {fix}")


def _resolve_renameat2() -> Callable[..., int] | None:
    """Linux's ``renameat2``: it exchanges two paths in one step (``RENAME_EXCHANGE``), or
    renames only if nothing is at the new name (``RENAME_NOREPLACE``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


_RENAMEAT2 = _resolve_renameat2()
_AT_FDCWD, _RENAME_NOREPLACE, _RENAME_EXCHANGE = -100, 1, 2
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP)


def _renameat2(a: Path | str, b: Path | str, flag: int) -> int:
    """0, or the errno ``renameat2(a, b, flag)`` failed with (ENOSYS where there is none)."""
    if _RENAMEAT2 is None:
        return errno.ENOSYS
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flag) == 0:
        return 0
    return ctypes.get_errno()


def swap_paths(a: Path, b: Path) -> bool:
    """Exchange ``a`` and ``b`` atomically; False where the system or file system cannot (the
    caller then renames twice)."""
    err = _renameat2(a, b, _RENAME_EXCHANGE)
    if err and err not in _UNSUPPORTED:
        raise OSError(err, os.strerror(err), str(b))
    return not err


def rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename ``src`` (a file, folder or link) to ``dst`` unless something is there (False
    then): never replacing, which ``os.replace`` does to a file and ``os.rename`` to an empty
    folder. ``renameat2(RENAME_NOREPLACE)`` where there is one; elsewhere a file is hard-linked
    (which fails on a taken name) and then unlinked, a folder renamed after a look; to another
    disk, copied (``shutil.move``) after a look."""
    err = _renameat2(src, dst, _RENAME_NOREPLACE)
    if err in (0, errno.EEXIST):
        return not err
    if err not in (*_UNSUPPORTED, errno.EXDEV):
        raise OSError(err, os.strerror(err), str(src), None, str(dst))
    if os.path.lexists(dst):
        return False
    if err == errno.EXDEV or os.path.isdir(src) and not os.path.islink(src):
        shutil.move(os.fspath(src), os.fspath(dst))  # a rename on one disk
        return True
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError:  # no hard links on this file system: a rename after the look
        os.rename(src, dst)
        return True
    os.unlink(src)
    return True


def regular_only(path: Path | str) -> None:
    """An OSError for a path that is no regular file (a pipe, socket, device or folder)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError(errno.EINVAL, "not a regular file (a pipe, socket, device or folder)",
                      str(path))


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks so checkpoints do not fill memory; a pipe,
    socket or device is an OSError, never opened (a pipe blocked its reader for ever)."""
    regular_only(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


STAMP_LEN = 26
"""The end a kept copy's name must keep: ``.replaced-<UTC second>``, or a superseded run's
``-<time>``, which says what the copy is."""


def fitting_name(base: Path, reserve: int = 8) -> Path:
    """``base``, its name shortened (the end kept, a hash of the whole put before it) where it
    and ``reserve`` more bytes (a ``-N`` for a taken name) would be longer than a name may be
    here: trial 29's L-30, the copy of a 235-character folder did not fit, after the swap."""
    try:
        limit = os.pathconf(base.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    name = base.name
    if len(name.encode()) + reserve <= limit:
        return base
    tail, head = name[-STAMP_LEN:], name[:-STAMP_LEN]
    mark = "~" + hashlib.sha256(name.encode()).hexdigest()[:8]
    while head and len((head + mark + tail).encode()) + reserve > limit:
        head = head[:-1]
    return base.with_name(head + mark + tail)


def short_name(name: str, limit: int = 100) -> str:
    """The start of ``name`` in at most ``limit`` bytes, whole characters only: the stem of a
    command's temporary folder, which must fit beside ``name`` (check 29b's F13: 100
    characters of a multibyte name were 400 bytes)."""
    return name.encode()[:limit].decode(errors="ignore")


def move_aside(old: Path, base: Path) -> Path:
    """Move ``old`` to ``base``, or ``base-2``, ``base-3``, ...: the first name nothing holds
    (``lexists``: a link to nothing holds one too), taken without ever replacing
    (:func:`rename_noreplace`), so that keeping one thing never overwrites another (trial 27's
    L-m1: a backup of the same second, or a folder of that name, was in the way); a name too
    long for the file system is shortened first (:func:`fitting_name`)."""
    base = fitting_name(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10**6):
        kept = base.with_name(f"{base.name}-{n}") if n > 1 else base
        if not os.path.lexists(kept) and rename_noreplace(old, kept):
            return kept
    raise OSError(errno.EEXIST, "every name to keep it under is taken", str(base))


_MODES = {"w": os.O_WRONLY | os.O_CREAT, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND}


def open_in_place(path: Path, mode: str) -> IO[Any]:
    """``open(path, mode)`` for a file a command writes where it lies (a lock, a log), never
    through a link or into a pipe: trial 29's L-4 and L-22, a link planted at a run's lock or a
    job's log had the command overwrite the committed file it pointed to. ``mode``: ``w``,
    ``a`` or ``a+``, with ``b`` for bytes."""
    flags = _MODES[mode.replace("b", "")] | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(path):
            raise UserError(f"{path} is a link: a lock or log is never written through one "
                            "(what it points to would be overwritten); remove the link") from None
        if exc.errno == errno.ENXIO:  # a named pipe nothing reads
            raise UserError(f"{path} is not a regular file: remove it") from None
        raise
    held = os.fstat(fd)
    if not stat.S_ISREG(held.st_mode) or held.st_nlink > 1:  # a hard link (check 29b's F3)
        os.close(fd)
        raise UserError(f"{path} is not a regular file of its own"
                        + (f" (a hard link: {held.st_nlink} names)" if held.st_nlink > 1 else "")
                        + ": remove it (what else it is named stays as it is)")
    os.set_blocking(fd, True)
    if mode.startswith("w"):  # truncated only now that it is known to be this file alone
        os.ftruncate(fd, 0)
    return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")


def clear_stale_temps(parent: Path, prefix: str) -> None:
    """Remove the half-written folders ``PREFIX<pid>-*`` that a command killed outright
    (SIGKILL, a lost machine) left in ``parent``, its process gone (trial 29's L-1: 510 MB of a
    pretraining corpus stayed for good). Only a command's own temporary folders carry such a
    name; one whose process still runs, or whose name holds no process, is left alone."""
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith(prefix)]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(prefix):].partition("-")[0]
        if not pid.isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running (or another user's): not stale
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        print(f"removed {entry.path}, which an interrupted command left half-written",
              file=sys.stderr)
