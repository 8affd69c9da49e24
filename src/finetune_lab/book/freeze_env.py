"""The environment as a freeze input: the locked versions of the packages a chapter runs.

A chapter's output depends on pandas, Transformers or fairseq as much as on its own code: a new
pandas can change a table. The versions are pinned in the lock files (``requirements/lock.txt``,
``requirements/fairseq.txt``; torch in ``pyproject.toml``, see ``scripts/lock.sh``), so each
chapter's freeze record also holds ``{"package NAME": VERSION}`` for every distribution its code
imports (its cells and the package modules of its import closure, imports inside functions
included) and every distribution those require, as the lock's ``# via`` annotations tell.
Changing a locked version then makes ``finetune-lab check-freeze`` name the package for the
chapters that use it, and only those. Read from the files alone: no package is imported, so the
check still runs with PyYAML only.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from finetune_lab._files import sha256_file
from finetune_lab.book.chapter_inputs import hash_inputs
from finetune_lab.book.qmd import code_cells

LOCK_FILES = ("requirements/lock.txt", "requirements/fairseq.txt")
KEY = "package "
"""Prefix of an environment entry in a freeze record (``package pandas``): no file has it."""
IMPORT_NAMES = {"sklearn": "scikit-learn", "yaml": "pyyaml", "IPython": "ipython",
                "PIL": "pillow", "fairseq": "fairseq-fixed", "fairseq_cli": "fairseq-fixed",
                "google": "protobuf", "dateutil": "python-dateutil", "mpl_toolkits": "matplotlib",
                "Cython": "cython", "pkg_resources": "setuptools"}
"""Import names whose distribution is named otherwise (the rest: lower case, ``_`` → ``-``)."""
LOADED_ON_DEMAND = {"pandas": ("tabulate",)}
"""Optional dependencies a distribution imports only when called (``DataFrame.to_markdown``
draws every table of the book with tabulate): no requirement and no import names them."""
_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(project: Path) -> tuple[dict[str, str], dict[str, set[str]]]:
    """``({distribution: version}, {distribution: distributions it requires})`` from the lock
    files and ``pyproject.toml``'s torch pin; empty where the project has no lock."""
    versions: dict[str, str] = {}
    requires: dict[str, set[str]] = {}
    for rel in LOCK_FILES:
        path = project / rel
        if not path.is_file():
            continue
        current, in_via = None, False
        for line in path.read_text(encoding="utf-8").splitlines():
            if m := _ENTRY.match(line):
                current, in_via = normalize(m.group(1)), False
                versions[current] = m.group(2)
                continue
            text = line.strip().lstrip("#").strip()
            if current is None or not line.lstrip().startswith("#"):
                continue
            if text.startswith("via"):
                in_via, text = True, text[3:].strip()
            if in_via and text:
                # `-r requirements/fairseq-deps.txt` is fairseq-fixed's own list
                parent = "fairseq-fixed" if "fairseq-deps" in text else normalize(text.split()[0])
                if not text.startswith(("-r", "-c")) or parent == "fairseq-fixed":
                    requires.setdefault(parent, set()).add(current)
    pyproject = project / "pyproject.toml"
    if versions and pyproject.is_file() and (
            m := re.search(r'"torch==([^"]+)"', pyproject.read_text(encoding="utf-8"))):
        versions["torch"] = m.group(1)
    return versions, requires


def _imported_roots(source: str) -> set[str]:
    """Top-level names of the absolute imports in ``source``, at any depth."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython syntax in a cell: its import lines alone
        tree = ast.parse("\n".join(ln.strip() for ln in source.splitlines()
                                   if ln.strip().startswith(("import ", "from "))) or "pass")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def chapter_packages(project: Path, chapter: str, patterns: Iterable[str]) -> dict[str, str]:
    """``{"package NAME": locked version}`` for what ``chapter`` runs: the distributions its
    cells and the package's Python files among ``patterns`` import, and what they require."""
    versions, requires = locked(project)
    if not versions:
        return {}
    sources = code_cells((project / chapter).read_text(encoding="utf-8"))
    sources += [(project / p).read_text(encoding="utf-8") for p in patterns
                if p.startswith("src/") and p.endswith(".py") and (project / p).is_file()]
    roots = set().union(*map(_imported_roots, sources)) - set(sys.stdlib_module_names)
    todo = [d for r in roots if (d := IMPORT_NAMES.get(r, normalize(r))) in versions]
    seen: set[str] = set()
    while todo:
        dist = todo.pop()
        if dist not in seen:
            seen.add(dist)
            todo += [d for d in (*requires.get(dist, ()), *LOADED_ON_DEMAND.get(dist, ()))
                     if d in versions]
    return {f"{KEY}{d}": versions[d] for d in sorted(seen)}


OPTION = "option "
"""The record's key for one of Quarto's execution options (``option _quarto.yml: NAME``)."""
EXECUTION_KEYS = frozenset({"echo", "eval", "error", "warning", "output", "include", "execute",
                            "jupyter", "engine", "keep-ipynb", "df-print"})
"""Options that change what a chapter's execution yields, besides every ``fig-`` option."""


def _yaml(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def option_files(project: Path, chapter: str) -> list[Path]:
    """Where Quarto takes a chapter's options from: ``_quarto.yml``, its profiles
    (``_quarto-NAME.yml``), the files its ``metadata-files`` names, and each ``_metadata.yml``
    from the project's folder down to the chapter's."""
    files = [project / "_quarto.yml", *sorted(project.glob("_quarto-*.yml"))]
    for config in list(files):
        named = _yaml(config).get("metadata-files")
        files += [project / str(n) for n in (named if isinstance(named, list) else [])]
    folder, parts = project, Path(chapter).parent.parts
    for part in ("", *parts):
        folder = folder / part if part else folder
        files.append(folder / "_metadata.yml")
    return [f for f in dict.fromkeys(files) if f.is_file()]


def execution_options(project: Path, chapter: str) -> dict[str, str]:
    """``{"option FILE: NAME": value}`` for the options in :func:`option_files` that change what
    a chapter executes to (``execute``, ``jupyter``, ``fig-*``, ``echo``..., at the top or under
    a format): Quarto's own freeze executes nothing again for them (trial 24's F-i2: the HTML
    figures' ``fig-format`` changed from svg to png, and the book kept its SVG figures; 24b's
    F-j: the same option in ``_metadata.yml``, at the top, in a profile or a metadata file)."""
    found: dict[str, object] = {}
    for path in option_files(project, chapter):
        config, rel = _yaml(path), path.relative_to(project).as_posix()
        formats = config.get("format") if isinstance(config.get("format"), dict) else {}
        scopes = [("", config), *((f"format.{f}.", o) for f, o in formats.items())]
        for prefix, options in scopes:
            for name, value in (options.items() if isinstance(options, dict) else ()):
                if isinstance(name, str) and (name.startswith("fig-") or name in EXECUTION_KEYS):
                    found[f"{rel}: {prefix}{name}"] = value
        where = config.get("project") if isinstance(config.get("project"), dict) else {}
        if where.get("execute-dir") is not None:  # the folder it runs in (trial 29's R-10)
            found[f"{rel}: project.execute-dir"] = where["execute-dir"]
    return {f"{OPTION}{name}": json.dumps(value, sort_keys=True, default=str)
            for name, value in sorted(found.items()) if value is not None}


MATPLOTLIBRC = "matplotlibrc "
"""The record's key for the matplotlibrc a chapter's figures are drawn with."""


def matplotlibrc(project: Path, chapter: str) -> dict[str, str]:
    """``{"matplotlibrc WHERE": sha256}`` of the file matplotlib reads its settings from when a
    chapter executes in its folder, as ``matplotlib.matplotlib_fname`` finds it: ``matplotlibrc``
    in that folder, ``$MATPLOTLIBRC`` (a file, or a folder holding one), then the user's
    configuration folder; its own default is the locked matplotlib's (trial 25's F-k: red axes
    and 30-point text set in ``chapters/matplotlibrc`` left the freeze up to date). A chapter
    runs in the project's folder instead where ``_quarto.yml`` sets ``execute-dir: project``
    (trial 29's R-10)."""
    home = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "matplotlib")
    given = os.environ.get("MATPLOTLIBRC")
    book = _yaml(project / "_quarto.yml").get("project")
    runs_in = project if isinstance(book, dict) and book.get("execute-dir") == "project" \
        else (project / chapter).parent
    candidates = [runs_in / "matplotlibrc",
                  *([Path(given), Path(given) / "matplotlibrc"] if given else []),
                  Path(home) / "matplotlibrc"]
    for path in candidates:
        if path.is_file():
            where = path.relative_to(project).as_posix() if path.is_relative_to(project) \
                else "(outside the project)"
            return {f"{MATPLOTLIBRC}{where}": sha256_file(path)}
    return {}


KERNEL = "kernel "
"""The record's key for a file the chapters' Jupyter kernel runs or reads before a first cell."""
IPYTHON_CONFIGS = ("ipython_config.py", "ipython_config.json", "ipython_kernel_config.py",
                   "ipython_kernel_config.json")


def _jupyter_data_dirs() -> list[Path]:
    """Where Jupyter looks for a kernelspec, in its order (``jupyter_core``'s
    ``jupyter_path``): ``$JUPYTER_PATH``, the user's data folder, the environment's, the
    system's (the environment's before the user's with ``$JUPYTER_PREFER_ENV_PATH``)."""
    given = [Path(p) for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    user = [Path(os.environ.get("JUPYTER_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "jupyter"))]
    env = [Path(sys.prefix) / "share" / "jupyter"]
    system = [Path("/usr/local/share/jupyter"), Path("/usr/share/jupyter")]
    preferred = env + user if os.environ.get("JUPYTER_PREFER_ENV_PATH") else user + env
    return given + preferred + system


def kernel_startup(project: Path) -> dict[str, str]:
    """``{"kernel WHAT": sha256}`` of what the chapters' kernel runs before their first cell:
    the IPython profile's startup files and configuration (``$IPYTHONDIR`` or ``~/.ipython``),
    IPython's configuration in the environment and the system, and the kernelspec Jupyter
    starts the chapters' kernel from (check 25b's F-l1, F-l2: a startup file setting red axes,
    30-point text and one-decimal tables changed every chapter's output, and check-freeze said
    up to date; 26b's F-n3: the environment's kernelspec given a pandas option). On a machine
    set up as the README says, only the environment's kernelspec (ipykernel's, locked) is
    there. (What the environment itself runs, a ``.pth`` file or ``sitecustomize`` in its
    site-packages, is the locked packages' as installed, like their code.)"""
    ipython = Path(os.environ.get("IPYTHONDIR") or os.path.expanduser("~/.ipython"))
    profile = ipython / "profile_default"
    found = {f"IPython profile: {p.relative_to(profile).as_posix()}": p
             for p in [*(profile / n for n in IPYTHON_CONFIGS),
                       *sorted((profile / "startup").glob("*.py")),
                       *sorted((profile / "startup").glob("*.ipy"))]}
    for where, folder in (("environment", Path(sys.prefix) / "etc" / "ipython"),
                          ("system", Path("/usr/local/etc/ipython")),
                          ("system", Path("/etc/ipython"))):
        found.update({f"IPython {where}: {n}": folder / n for n in IPYTHON_CONFIGS})
    name = _yaml(project / "_quarto.yml").get("jupyter")
    name = name if isinstance(name, str) else "python3"
    spec = next((d / "kernels" / name / "kernel.json" for d in _jupyter_data_dirs()
                 if (d / "kernels" / name / "kernel.json").is_file()), None)
    if spec is not None:  # its argv and env run before the first cell too (check 26b's F-n3)
        found[f"kernelspec {name}"] = spec
    return {f"{KERNEL}{what}": sha256_file(path) for what, path in found.items()
            if path.is_file()}


def record_inputs(project: Path, chapter: str, patterns: list[str]) -> dict[str, str]:
    """What a chapter's freeze record holds: its input files' hashes, its packages' locked
    versions, the project's execution options, the matplotlibrc its figures read and what its
    kernel runs first."""
    return {**hash_inputs(project, patterns), **chapter_packages(project, chapter, patterns),
            **execution_options(project, chapter), **matplotlibrc(project, chapter),
            **kernel_startup(project)}
