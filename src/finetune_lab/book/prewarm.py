"""Compute a render's facts ahead of Quarto, on the core Quarto leaves idle.

Quarto executes the chapters one after another and, between two executions, runs pandoc and
Typst on one core. What costs a chapter's kernel time is what its ``@per_render`` functions
(:mod:`finetune_lab.render_cache`) compute: models built to be counted, a checkpoint converted
and compared, event files read and checked, and the imports of torch, fairseq, Transformers and
peft behind them. ``freeze pre-render`` therefore starts this worker for the chapters Quarto will
execute. It runs their code cells in one Python process, in book order, so that the render's
cache fills while Quarto is busy elsewhere and each heavy import is paid once.

The worker only ever fills the cache: its output is thrown away, and the kernels still run every
cell and produce what the book shows. A kernel that needs a fact the worker is computing waits
for it (the cache's per-key lock); one the worker has not reached yet, the kernel computes
itself. Either way the value comes from the same code and data, in the same render. A cell that
fails here ends the worker's pass over that chapter quietly: the kernel meets the same error and
reports it where it belongs. Set ``FINETUNE_LAB_PREWARM=0`` to render without the worker.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from finetune_lab import render_cache
from finetune_lab.book.qmd import book_chapters, code_cells
from finetune_lab.errors import UserError

PID_FILE = "prewarm.pid"
TOKEN_FILE = "render-id"
LOG_FILE = "prewarm.log"
MODULE = "finetune_lab.book.prewarm"
NOT_EVALUATED = re.compile(r"^#\|\s*eval:\s*false\s*$", re.MULTILINE)


def book_order(project: Path, chapters: list[str]) -> list[str]:
    """``chapters`` in the order Quarto renders them: the book's, then any others by name."""
    try:
        listed = [p.relative_to(project).as_posix() for p in book_chapters(project)]
    except (UserError, ValueError):
        listed = []
    return sorted(chapters, key=lambda c: (listed.index(c) if c in listed else len(listed), c))


def start(project: Path, chapters: list[str]) -> subprocess.Popen | None:
    """Start the worker for ``chapters`` (paths relative to ``project``), in the background.

    Call after :func:`render_cache.open_cache`. Nothing starts when there is nothing to execute,
    or when ``FINETUNE_LAB_PREWARM=0``.
    """
    folder = render_cache.cache_dir(project)
    if not chapters or not folder.is_dir() or os.environ.get("FINETUNE_LAB_PREWARM") == "0":
        return None
    token = uuid.uuid4().hex
    (folder / TOKEN_FILE).write_text(token, encoding="utf-8")
    with open(folder / LOG_FILE, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, "--project", str(project), "--token", token,
             *chapters],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, "MPLBACKEND": "Agg", render_cache.CACHE_ENV: str(folder)})
    (folder / PID_FILE).write_text(str(proc.pid), encoding="utf-8")
    return proc


def stop(project: Path) -> list[str]:
    """End a worker still running for this project's render (one a killed render left, too);
    returns the worker's report, a line per chapter it ran."""
    folder = render_cache.cache_dir(project)
    try:
        pid = int((folder / PID_FILE).read_text(encoding="utf-8"))
        # the pid file may be old: end the process only if it is this project's worker
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):  # none, gone, or no /proc (macOS): it stops at its next cell
        cmdline = []
    if MODULE.encode() in cmdline and str(project).encode() in cmdline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    try:
        log = (folder / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in log.splitlines() if line.startswith("prewarm: ")]


def _current(folder: Path, token: str) -> bool:
    """Whether the render that started this worker is still the one running."""
    try:
        return (folder / TOKEN_FILE).read_text(encoding="utf-8") == token
    except OSError:
        return False


def warm(project: Path, chapters: list[str], token: str) -> None:
    """Run each chapter's cells as its kernel will (in its folder, as a render's document)."""
    folder = render_cache.cache_dir(project)
    os.environ[render_cache.CACHE_ENV] = str(folder)
    for chapter in chapters:
        path = (project / chapter).resolve()
        os.chdir(path.parent)
        sys.path[0] = str(path.parent)
        os.environ["QUARTO_DOCUMENT_FILE"] = str(path)
        namespace: dict = {"__name__": "__main__"}
        start_time = time.monotonic()
        status = "done"
        for i, cell in enumerate(code_cells(path.read_text(encoding="utf-8"))):
            if NOT_EVALUATED.search(cell):
                continue
            if not _current(folder, token):
                print("prewarm: the render ended; stopping", flush=True)
                return
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(cell, f"{chapter} (cell {i + 1})", "exec"), namespace)
            except Exception as exc:  # noqa: BLE001 - the kernel meets it and reports it
                status = f"stopped at cell {i + 1} ({type(exc).__name__}: {exc})"
                break
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
        print(f"prewarm: {chapter}: {status}, {time.monotonic() - start_time:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--project", required=True)
    parser.add_argument("--token", required=True, help="the render-id of the render to serve")
    parser.add_argument("chapters", nargs="+")
    args = parser.parse_args(argv)
    warm(Path(args.project), args.chapters, args.token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
