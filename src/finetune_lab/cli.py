"""The ``finetune-lab`` command: one subcommand per lab step.

Each subcommand lives in the module that does the work; that module exposes
``add_parser(subparsers)`` which registers the subcommand and sets ``func`` (a callable taking
the parsed namespace and returning an exit code). Add a module to ``COMMAND_MODULES`` to add a
subcommand.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from finetune_lab.config import paths
from finetune_lab.errors import HELD, Interrupted, UserError, hold, stop_signals_raise
from finetune_lab.runs.gpu_room import room_note

COMMAND_MODULES: list[str] = [
    "finetune_lab.models.params",
    "finetune_lab.train.pretrain_cli",
    "finetune_lab.train.pretrain_ablations",
    "finetune_lab.train.finetune",
    "finetune_lab.train.linear_probe",
    "finetune_lab.reproduce",
    "finetune_lab.data.cls_books",
    "finetune_lab.data.tokenizer",
    "finetune_lab.data.binarize",
    "finetune_lab.data.pretrain_corpus",
    "finetune_lab.book.data_summary",
    "finetune_lab.book.fill_mask",
    "finetune_lab.runs.runs_cli",
    "finetune_lab.book.freeze",
    "finetune_lab.train.lora_qa",
    "finetune_lab.models.hf_convert",
    "finetune_lab.gpu_lab",
]


LIGHT_COMMANDS = {"freeze": "finetune_lab.book.freeze", "check-freeze": "finetune_lab.book.freeze"}
"""Commands a publishing job runs with Quarto, Python and PyYAML alone (no torch, no pandas):
Quarto's pre- and post-render scripts over a committed freeze."""


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line (the flag and what is wrong), as every other error: the usage
    block is ``--help``'s. Subcommands' parsers are of this class too."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` says more)\n")


def build_parser(modules: Sequence[str] = tuple(COMMAND_MODULES)) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="finetune-lab",
        description="Re-run and report the NLP-frameworks lab (see README).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    user_dir = sub.add_parser("user-dir", help="print the fairseq --user-dir path of roberta_small")
    user_dir.set_defaults(func=_print_user_dir)
    for name in modules:
        importlib.import_module(name).add_parser(sub)
    return parser


def _print_user_dir(_args: argparse.Namespace) -> int:
    print(paths().user_dir)
    return 0


OS_FAULTS = {
    errno.ENOSPC: "the disk is full: free space there (data/work/pretrain-checkpoints/ holds the "
                  "largest files) or point FINETUNE_LAB_WORK_DIR / FINETUNE_LAB_RUNS_DIR at "
                  "another disk, then run the same command again",
    errno.EDQUOT: "the disk quota is used up: free space or point FINETUNE_LAB_WORK_DIR / "
                  "FINETUNE_LAB_RUNS_DIR elsewhere, then run the same command again",
    errno.EACCES: "you lack permission for it: fix its permissions or point "
                  "FINETUNE_LAB_WORK_DIR / FINETUNE_LAB_RUNS_DIR at a folder you can use",
    errno.EPERM: "you lack permission for it: fix its permissions or point "
                 "FINETUNE_LAB_WORK_DIR / FINETUNE_LAB_RUNS_DIR at a folder you can use",
    errno.EROFS: "it is on a read-only file system: point FINETUNE_LAB_WORK_DIR / "
                 "FINETUNE_LAB_RUNS_DIR at a writable one",
    errno.ENOTDIR: "a part of that path is a file, not a folder: give a path through folders",
    errno.EISDIR: "it is a folder where a file is wanted: give the file",
    errno.ENAMETOOLONG: "a name in that path is longer than the file system allows: give a "
                        "shorter path",
    errno.ELOOP: "a link in that path leads back to itself: give a path without the loop",
    errno.EFBIG: "the file is larger than this machine's file size limit (`ulimit -f`): raise "
                 "the limit or write elsewhere, then run the same command again",
}
"""Faults of the machine rather than of the project, told in one line with the path and the fix
(runs write atomically or are marked failed, so a fault leaves nothing half-written behind)."""

PATH_FAULTS = (errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EFBIG)
"""The faults of the path given, not of the folder it lies in."""

WRITE_FAULTS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
"""The faults that only a write meets; a refused permission may be a read's."""



LISTS = ("seeds", "init", "inits", "methods", "lab_parts", "steps", "names")
"""List options whose values name runs or parts of a grid: each once (trial 26's E-m3)."""


def _refuse_repeats(args: argparse.Namespace) -> None:
    for name in LISTS:
        values = getattr(args, name, None)
        if isinstance(values, list) and len(set(values)) < len(values):
            twice = next(v for v in values if values.count(v) > 1)
            raise UserError(f"--{name.replace('_', '-')} lists {twice} twice: give each once")


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # SIGTERM and SIGHUP (a closed terminal; trial 20's X-z6) as an exception, like Ctrl-C:
    # what a command was writing is removed or marked on the way out (a half-made output
    # folder is deleted), and the message is one line. While the commands' modules load (for
    # seconds) a signal waits (:func:`~finetune_lab.errors.hold`), handled as soon as they
    # have: raised inside numpy's import, it gave a "bad install" traceback (trial 30's E-10).
    # A SIGHUP ignored (`nohup`) stays ignored.
    stops = ExitStack()
    stops.enter_context(stop_signals_raise(hold, ctrl_c=hold))
    command = words[0] if words and not words[0].startswith("-") else "command"
    try:
        try:
            light = LIGHT_COMMANDS.get(words[0]) if words else None
            parser = build_parser([light] if light else COMMAND_MODULES)
            stops.close()
            stops.enter_context(stop_signals_raise(_terminated, ctrl_c=_ctrl_c))
            if HELD:
                raise Interrupted(HELD[0])
            args = parser.parse_args(argv)
            command = args.command
            _refuse_repeats(args)
            if command not in ("gpu-bundle", "gpu-unpack") and (note := room_note()):
                print(f"finetune-lab {command}: note: {note}", file=sys.stderr)
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # inside the try, so that a closed pipe is handled below
            if HELD:  # raised where it was lost (an import's callback): stopped all the same
                raise Interrupted(HELD[0])
            return code
        # What a stop signal left behind (numpy's "bad install" inside its import, a half-done
        # step's error) is the interrupt (trial 30's E-10).
        except Exception:
            if HELD:
                raise Interrupted(HELD[0]) from None
            raise
    except UserError as exc:
        print(f"finetune-lab {command}: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as exc:  # Ctrl-C, or SIGTERM during a run
        return _said_interrupted(command, exc)
    except RuntimeError as exc:  # pathlib's resolve() of a link loop (Python < 3.13)
        if not str(exc).startswith("Symlink loop from "):
            raise
        print(f"finetune-lab {command}: error: {str(exc)[len('Symlink loop from '):]} is a link "
              f"that leads back to itself: {OS_FAULTS[errno.ELOOP].split(': ', 1)[1]}",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # `finetune-lab runs | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if exc.errno is None and exc.filename is None:
            raise  # no fault of the machine's: a bug, shown whole
        # a copy that fails to write names its source first and its destination second
        # (shutil's sendfile path; trial 20's X-z3): the fault is the destination's
        where = exc.filename2 if exc.errno in WRITE_FAULTS and exc.filename2 else exc.filename
        name = os.fsdecode(where) if where is not None else None
        verb = "write" if exc.errno in WRITE_FAULTS else "read or write"
        advice = (fault_advice(exc.errno, name) if exc.errno in OS_FAULTS else
                  "fix that, then run the same command again")  # any other (trial 17's X-os)
        print(f"finetune-lab {command}: error: cannot {verb} {name or 'a file'}: "
              f"{exc.strerror or exc}; {advice}", file=sys.stderr)
        return 2
    finally:
        stops.close()
        HELD.clear()  # (a caller's next command starts with none)


def _terminated(signum: int, _frame: object) -> None:
    HELD.append(signum)  # also where what it raises turns into another error (a module's import)
    raise Interrupted(signum)


def _ctrl_c(signum: int, _frame: object) -> None:
    HELD.append(signum)
    raise KeyboardInterrupt


def _said_interrupted(command: str, exc: BaseException) -> int:
    print(f"finetune-lab {command}: {_interrupted(exc)}", file=sys.stderr)
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def fault_advice(code: int, filename: str | os.PathLike | None) -> str:
    """The fix for a machine fault at ``filename``: moving the work dir or the run cache helps
    only with a file inside them; a read-only checkout (Quarto's .quarto/ and _freeze/, say)
    needs a writable copy, whatever the environment says."""
    advice = OS_FAULTS[code]
    if filename is None or code in PATH_FAULTS:  # the path is the fault
        return advice
    where, p = Path(os.path.abspath(filename)), paths()
    movable = any(where.is_relative_to(os.path.abspath(d)) for d in (p.work, p.runs))
    if movable:
        return advice
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that disk, then run the same command again"
    if where.is_relative_to(p.project) or {".quarto", "_freeze"} & set(where.parts):
        return ("the checkout is not writable here (rendering writes .quarto/ and _freeze/, a "
                "data step data/summaries/): work in a writable copy (`git clone`), or fix the "
                "permissions")
    return "fix its permissions, or choose a location you can write"


def _interrupted(exc: BaseException) -> str:
    """One line for an interruption: the run that was being written says it was interrupted
    (:func:`~finetune_lab.runs.recording.record_run` marks it), so no traceback is needed."""
    marked = getattr(exc, "marked_run", None)
    return (f"interrupted; the run is marked interrupted ({marked})" if marked is not None
            else "interrupted")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
