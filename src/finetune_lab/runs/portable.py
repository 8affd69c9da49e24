"""What a manifest records of the machine and the command: never that machine's paths.

A manifest is committed and read in other checkouts, so what it records must not depend on
where the checkout that made it was: the interpreter is recorded as ``python`` (its version is
``environment.python``), a console script of the interpreter's environment by its name
(``finetune-lab``), and every path inside the checkout relative to its root
(``data/work/cls-books-bin``). The process is still launched with the real paths; only the
record is portable. :func:`migrate` rewrites manifests made before this rule
(``python -m finetune_lab.runs.portable``), without touching what the registry checks.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from finetune_lab._files import parse_json, write_json_atomic
from finetune_lab.config import PROJECT_ROOT

INTERPRETER = "python"
"""How a manifest names the Python interpreter that ran a command."""
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?(\.exe)?")
_CHECKOUT_MARKERS = ("data", "src", ".venv", "scripts", "tests", "_freeze")
"""Top-level folders of a checkout: an absolute path through one of them is inside a checkout
(perhaps another machine's), and the part from the marker on is its project-relative form."""


def _relative_to(path: PurePosixPath, root: PurePosixPath) -> str | None:
    try:
        return path.relative_to(root).as_posix() or "."
    except ValueError:
        return None


def portable_arg(arg: str, roots: Sequence[str | Path] = (), *,
                 bin_dirs: Sequence[str | Path] = ()) -> str:
    """One argument as a manifest stores it: an interpreter as ``python``, a console script of
    ``bin_dirs`` by its name, a path under one of ``roots`` (the project root first) relative
    to it; ``--flag=PATH`` has its value rewritten. Anything else is kept as it is."""
    flag, eq, value = arg.partition("=")
    if eq and flag.startswith("-"):
        return f"{flag}={portable_arg(value, roots, bin_dirs=bin_dirs)}"
    if not arg.startswith("/"):
        return arg
    path = PurePosixPath(arg)
    if _PYTHON.fullmatch(path.name):
        return INTERPRETER
    if any(str(path.parent) == str(PurePosixPath(d)) for d in bin_dirs):
        return path.name
    for root in (PROJECT_ROOT, *roots):
        rel = _relative_to(path, PurePosixPath(Path(root).as_posix()))
        if rel is not None:
            return rel
    return arg


def interpreter_bin_dirs() -> list[str]:
    """Folders whose programs are named alone in a command: this interpreter's."""
    return [str(Path(sys.executable).parent)]


def portable_command(command: Iterable[Any], roots: Sequence[str | Path] = ()) -> list[str]:
    """A command line as a manifest stores it (:func:`portable_arg` for each argument)."""
    bins = interpreter_bin_dirs()
    return [portable_arg(str(c), roots, bin_dirs=bins) for c in command]


# Packages whose versions decide what a run computes; recorded in every manifest.
TRACKED_PACKAGES = (
    "torch",
    "fairseq-fixed",
    "fairseq",
    "transformers",
    "peft",
    "numpy",
    "sentencepiece",
    "tensorboard",
    "finetune-lab",
)


# --- the machine, as a manifest records it -------------------------------------------------------------------


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (missing ones are left out, not guessed)."""
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def git_commit(repo: Path | str = PROJECT_ROOT) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}``; tolerant of no git and no commits."""

    def _git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(repo), *args],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo, else :func:`platform.processor`."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_info() -> dict[str, Any]:
    """The device a run used: GPU name and count when CUDA is visible, else the CPU model.

    ``threads`` is torch's intra-op thread count: on a shared CPU it says how many cores
    a run had (two one-thread runs side by side each report 1), so speeds compare fairly.
    """
    info: dict[str, Any] = {"cpu": cpu_model(), "cpu_count": os.cpu_count()}
    try:
        import torch

        info["threads"] = torch.get_num_threads()

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            info.update(
                type="cuda",
                name=torch.cuda.get_device_name(0),
                count=count,
                names=[torch.cuda.get_device_name(i) for i in range(count)],
            )
            return info
    except ImportError:
        pass
    info.update(type="cpu", name=info["cpu"], count=1)
    return info


def environment_info() -> dict[str, Any]:
    """Python, platform, package versions and git state of the code that launched a run. The
    interpreter is named ``python`` beside its version: its path is the machine's, not the
    run's (:mod:`~finetune_lab.runs.portable`)."""
    return {
        "python": platform.python_version(),
        "executable": INTERPRETER,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "packages": package_versions(),
        "git": git_commit(),
    }


# --- manifests made before the rule ----------------------------------------------------------


def checkout_roots(values: Iterable[Any]) -> list[str]:
    """The checkout roots absolute paths among ``values`` go through (``/x/y`` for
    ``/x/y/data/runs/...``): where another machine's checkout was."""
    roots: set[str] = set()
    for value in values:
        if not isinstance(value, str):
            continue
        value = value.partition("=")[2] if value.startswith("-") else value
        parts = PurePosixPath(value).parts if value.startswith("/") else ()
        for i, part in enumerate(parts[1:], start=1):
            if part in _CHECKOUT_MARKERS:
                roots.add(str(PurePosixPath(*parts[:i])))
                break
    return sorted(roots, key=len, reverse=True)


def portable_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with its command (and a launch's) and interpreter in portable form; its
    other fields, which the registry checks, unchanged."""
    out = dict(manifest)
    env = out.get("environment")
    values = [*(out.get("command") or []), *([env.get("executable")]
                                              if isinstance(env, dict) else [])]
    roots = checkout_roots(values)
    bins = [str(PurePosixPath(r) / ".venv" / "bin") for r in roots]
    if isinstance(out.get("command"), list):
        out["command"] = [portable_arg(str(c), roots, bin_dirs=bins) for c in out["command"]]
    if isinstance(env, dict) and isinstance(env.get("executable"), str):
        out["environment"] = {**env, "executable": portable_arg(env["executable"], roots,
                                                                bin_dirs=bins)}
    return out


def migrate(files: Iterable[Path]) -> list[Path]:
    """Rewrite each JSON file (run manifests, probe records) in portable form; returns those
    that changed. A file that does not parse is left for the registry to report."""
    changed = []
    for path in files:
        try:
            data = parse_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if isinstance(data, dict) and (new := portable_manifest(data)) != data:
            write_json_atomic(path, new)
            changed.append(path)
    return changed


def committed_records(project: Path = PROJECT_ROOT) -> list[Path]:
    """The committed JSON records that hold commands or an interpreter: run manifests and the
    probe and fill-mask summaries."""
    data = project / "data"
    return sorted([*data.glob("runs/*/*/manifest.json"), *data.glob("summaries/**/*.json")])


if __name__ == "__main__":  # pragma: no cover - the one-off migration of the run cache
    for changed in migrate(committed_records()):
        print(f"made portable: {changed.relative_to(PROJECT_ROOT)}")
