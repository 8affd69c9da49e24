"""What a chapter's output depends on: the data its front matter declares and the code it imports.

The data-aware freeze (:mod:`finetune_lab.book.freeze`) and the provenance footer
(:mod:`finetune_lab.book.provenance`) both need the same answer: a chapter's declared
``inputs:`` (paths or globs relative to the project root, for data) plus the package modules its
Python cells import, directly or through each other, hashed file by file. Light on purpose:
``finetune-lab check-freeze`` runs with PyYAML alone.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from finetune_lab._files import sha256_file
from finetune_lab.book.qmd import code_cells, front_matter
from finetune_lab.config import RUNS_DIR_ENV, WORK_DIR_ENV
from finetune_lab.errors import UserError
from finetune_lab.runs.manifest import BUILD_LOG, hidden
from finetune_lab.runs.run_inputs import record_folders, work_inputs

MISSING = "MISSING"
"""The hash recorded for a declared path that does not exist (yet): its arrival is a change."""
_SKIP_DIRS = {"_freeze", "_site", ".quarto", ".venv", ".git", "node_modules", "build", "data"}
_GLOB_CHARS = set("*?[")


class FreezeError(UserError):
    """A chapter's ``inputs:`` front matter is malformed."""


def declared_inputs(qmd: Path) -> list[str] | None:
    """The chapter's ``inputs:`` list (``None`` when it declares none)."""
    inputs = front_matter(qmd).get("inputs")
    if inputs is None:
        return None
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs):
        raise FreezeError(
            f"{qmd}: 'inputs:' must be a list of paths or glob patterns relative to the project "
            "root, e.g. ['src/finetune_lab/models/params.py', 'data/runs/fairseq/**']"
        )
    for pattern in inputs:
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise FreezeError(f"{qmd}: input {pattern!r} must be relative to the project root")
    return inputs


PACKAGE = "finetune_lab"


def _package_imports(tree: ast.AST, module: str = "") -> set[str]:
    """Dotted names under :data:`PACKAGE` that ``tree`` imports, at any depth (the package
    imports lazily, inside functions). ``from finetune_lab import x`` yields ``finetune_lab.x``,
    which may be a module or a name; :func:`module_file` tells them apart."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == PACKAGE}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package
                parent = module.split(".")[:-node.level] if module else []
                base = ".".join([*parent, *([base] if base else [])])
            if base.split(".")[0] == PACKAGE:
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}
    return found


def module_file(project: Path, name: str) -> Path | None:
    """The source file of a dotted module name under ``src/`` (None: not a module there)."""
    base = project / "src" / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def chapter_imports(qmd: Path) -> set[str]:
    """The package names a chapter's Python cells import."""
    found: set[str] = set()
    for cell in code_cells(qmd.read_text(encoding="utf-8")):
        try:
            found |= _package_imports(ast.parse(cell))
        except SyntaxError:  # IPython syntax: read the import lines alone
            lines = [ln.strip() for ln in cell.splitlines()
                     if ln.strip().startswith(("import ", "from "))]
            for line in lines:
                try:
                    found |= _package_imports(ast.parse(line))
                except SyntaxError:
                    continue
    return found


def import_closure(project: Path, names: Iterable[str]) -> list[str]:
    """Source files (relative POSIX paths) of the package modules ``names`` import, directly or
    through each other, with the package's ``__init__``: the code a chapter's output depends
    on."""
    todo = [n for n in names if n.split(".")[0] == PACKAGE]
    if not todo:
        return []
    todo.append(PACKAGE)
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = module_file(project, name)
        if path is None:
            continue
        seen[name] = path
        parents = name.split(".")
        todo += [".".join(parents[:i]) for i in range(1, len(parents))]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo += sorted(_package_imports(tree, module=f"{package}.__init__"
                                        if path.name == "__init__.py" else name))
    return sorted({p.relative_to(project).as_posix() for p in seen.values()})


def package_data(project: Path) -> list[str]:
    """Every file of the package that is not Python source (relative POSIX paths): the files
    its modules read beside themselves (``runs/manifest.schema.json``, which decides which runs
    are valid). The import closure cannot see which module reads which, so a chapter that runs
    any of the package's code depends on all of them."""
    root = project / "src" / PACKAGE
    if not root.is_dir():
        return []
    return sorted(rel for p in root.rglob("*") if p.is_file() and p.suffix not in {".py", ".pyc"}
                  and p.name != "py.typed"  # a marker for type checkers, read by none
                  and not _is_ignored(Path(rel := p.relative_to(project).as_posix())))


REGISTRY = "src/finetune_lab/runs/registry.py"
"""Its reads also include what the runs name as inputs in ``data/work`` (:func:`work_inputs`)."""
FILL_MASK = "src/finetune_lab/book/fill_mask.py"
"""Its reads include the folders the fill-mask records name (:func:`record_folders`)."""
_PREPARED = ("data/work/cls.books/*", "data/work/tokenizer/*", "data/work/cls-books-bin/**")
MODULE_READS: dict[str, tuple[str, ...]] = {
    # a run's validity: the device calls' records (a GPU run names its call's GPU), the
    # packaged checkpoint, its weights hashed for every run that fine-tuned them (trial 13's
    # CF6), and the pretraining runs (no run names weights made after it started), the
    # prepared data its inputs are checked against
    REGISTRY: (
        "data/summaries/gpu-lab/*", "data/checkpoints/roberta-small-fr/*",
        "data/runs/pretrain/*/manifest.json", *_PREPARED, "data/work/hf/**"),
    # the data chapter's statistics, from the prepared data when it is there
    "src/finetune_lab/book/data_summary.py": (*_PREPARED, "data/work/pretrain-bin/manifest.json"),
    # the stand-in's corpus, from the prepared corpus's record when it is there (trial 30's R-15)
    "src/finetune_lab/book/pretrain_budget.py": ("data/work/pretrain-bin/manifest.json",),
    # the lab's own command and the two frameworks' inputs, from the prepared data
    **{f"src/finetune_lab/book/{m}.py": _PREPARED
       for m in ("fairseq_command", "hf_compare", "probe_report")},
    "src/finetune_lab/data/cls_splits.py": ("data/summaries/data.json",),
}
"""Data a module reads whatever the chapter asks of it: a chapter whose code imports the
module depends on it, declared or not."""


def chapter_inputs(project: Path, chapter: str) -> list[str] | None:
    """What a chapter's output depends on: its declared ``inputs:`` (data, as globs), the
    data its modules read (:data:`MODULE_READS`), the import closure of its code, and the
    package's data files when it runs any of that code. None when it has none of these."""
    declared = declared_inputs(project / chapter) or []
    code = import_closure(project, chapter_imports(project / chapter))
    implied = [p for module in code for p in MODULE_READS.get(module, ())]
    implied += work_inputs(project) if REGISTRY in code else []
    implied += record_folders(project) if FILL_MASK in code else []
    code += package_data(project) if code else []
    inputs = list(dict.fromkeys(declared + implied + code))
    return inputs or None


def chapters(project: Path) -> list[str]:
    """Every ``.qmd`` of the project (relative POSIX paths), skipping outputs and scratch."""
    found = []
    for dirpath, dirnames, filenames in os.walk(project):
        rel_dir = Path(dirpath).relative_to(project)
        dirnames[:] = sorted(
            d for d in dirnames
            if not (rel_dir == Path(".") and d in _SKIP_DIRS) and not d.startswith(".")
        )
        for name in sorted(filenames):
            if name.endswith(".qmd") and not name.startswith("_"):
                found.append((rel_dir / name).as_posix())
    return sorted(found)


def _is_ignored(path: Path) -> bool:
    """The package's bytecode, and hidden files (a run's ``.lock`` while it is written,
    ``.superseded/``): none of them is committed, so a freeze that hashed them would be stale on
    a clean clone. Under ``data/`` a file named like bytecode is data: a run may list it, and the
    registry reads it (trial 13's CF1)."""
    bytecode = "__pycache__" in path.parts or path.suffix in {".pyc", ".pyo"}
    return (bytecode and path.parts[:1] != ("data",)) or hidden(path)


EMPTY_FOLDER = "EMPTY FOLDER"
"""The hash recorded for a folder with no file below it: an empty run folder is listed by the
registry (as a run without a manifest), so its arrival or removal changes a chapter."""
RUNS_STORE = "data/runs/"
LINK = "LINK TO "
"""The hash recorded for a link to a folder under :data:`RUNS_STORE`, never entered: the
registry reads no run through a link (it lists it as bad), so a run folder replaced by a link
to an identical copy changes the book, and its record (trial 14's L3)."""
BROKEN_LINK = "BROKEN LINK"
"""The hash recorded for a symbolic link whose target is gone (or a link loop)."""
NOT_REGULAR = "not-a-regular-file:"
"""The prefix of the hash recorded for a path that is neither a regular file nor a folder
(``not-a-regular-file:fifo``): a named pipe, a socket or a device is never opened, since
reading one can block for ever (a pipe) or never end (``/dev/zero``); its arrival is a
change, named as any other."""
_KINDS = ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "char-device"),
          (stat.S_ISBLK, "block-device"), (stat.S_ISDIR, "folder"))


def _not_regular(mode: int) -> str:
    """The marker of a file of mode ``mode`` that is not a regular file."""
    return NOT_REGULAR + next((kind for test, kind in _KINDS if test(mode)), "other")


def file_hash(path: Path) -> str:
    """The sha256 of the regular file at ``path`` (a link to one: its target's), or the marker
    of anything else, which is never opened for reading: :data:`BROKEN_LINK` for a link to
    nothing (or a link loop), ``not-a-regular-file:<kind>`` for a pipe, a socket or a device,
    :data:`MISSING` for a path gone since it was listed."""
    try:
        st = os.stat(path)  # follows links, as the registry does
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise
        return BROKEN_LINK if os.path.islink(path) else MISSING
    if not stat.S_ISREG(st.st_mode):
        return _not_regular(st.st_mode)
    return sha256_file(path)


BUILD_RECORDS = ("manifest.json", "conversion.json")
BUILD_NOISE = frozenset({"created", "source"})
"""What the build records of ``data/work/`` say of where and when a folder was built that no
chapter reads (the moment of a conversion, the absolute path of what it was made from): data
rebuilt on another machine must not make the freeze stale for them. What the data chapter
prints (the commands, their workers, the timings) stays an input; fairseq-preprocess's log,
all paths and times, read by no chapter, is not an input at all."""


def work_file_hash(path: Path) -> str:
    """:func:`file_hash` of a file of ``data/work/``, a build record without its
    :data:`BUILD_NOISE` (hashed as canonical JSON, so its layout is no change either; a record
    that is not a JSON object is hashed whole, so its damage is a change)."""
    digest = file_hash(path)
    if path.name not in BUILD_RECORDS or digest in (MISSING, BROKEN_LINK) or \
            digest.startswith(NOT_REGULAR):
        return digest
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return digest
    if not isinstance(record, dict):
        return digest
    kept = json.dumps({k: v for k, v in record.items() if k not in BUILD_NOISE}, sort_keys=True)
    return "record:" + hashlib.sha256(kept.encode()).hexdigest()


def _walk(folder: Path, into_links: bool = True) -> Iterator[tuple[Path, bool]]:
    """``(path, is_empty_folder)`` for every file below ``folder`` and every folder with no file
    below it, following symbolic links (each real folder once: a link loop ends there); with
    ``into_links`` False, a link to a folder is yielded as a file, not entered."""
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        here = Path(dirpath)
        if not into_links:
            filenames += [d for d in dirnames if os.path.islink(here / d)]
            dirnames[:] = [d for d in dirnames if d not in filenames]
        for name in filenames:
            yield here / name, False
        if not filenames and not dirnames:
            yield here, True


def _glob_base(pattern: str) -> str:
    """The leading folders of a glob that hold no wildcard: where its matches can be."""
    parts = []
    for part in Path(pattern).parts:
        if _GLOB_CHARS & set(part):
            break
        parts.append(part)
    return "/".join(parts) or "."


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regex on relative POSIX paths: ``**`` any folders (none included), ``*``
    and ``?`` within a name, ``[...]`` a class; ``x/**`` everything below ``x``."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1:end]
            out, i = out + "[" + ("^" + body[1:] if body[:1] == "!" else body) + "]", end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _matches(project: Path, pattern: str) -> list[tuple[Path, bool]] | None:
    """Files (and empty folders) a pattern names; None for a plain path that does not exist.
    Under ``data/runs`` a link to a folder is a file, not entered (:data:`LINK`)."""
    runs = pattern.startswith(RUNS_STORE)
    if _GLOB_CHARS & set(pattern):
        base = project / _glob_base(pattern)
        if runs and base.is_symlink() and base != project / RUNS_STORE:  # a run or experiment
            return [(base, False)]
        regex = _glob_regex(pattern)
        # an empty folder or a folder link anywhere a glob looks is a change (a run folder
        # without a manifest, or one the registry will not read)
        return [(p, empty) for p, empty in (_walk(base, not runs) if base.is_dir() else ())
                if empty or os.path.islink(p) and os.path.isdir(p)
                or regex.fullmatch(p.relative_to(project).as_posix())]
    target = project / pattern
    if target.is_dir() and not (runs and target.is_symlink()):
        return list(_walk(target, not runs))
    if os.path.lexists(target):  # a file, a link (to nothing, too), a pipe, a device ...
        return [(target, False)]
    return None


def absent_inputs(project: Path, patterns: Iterable[str], under: Iterable[str]) -> list[str]:
    """The declared inputs below one of the folders ``under`` that name no file (machine-local
    data a fresh clone lacks until it is prepared)."""
    under = tuple(under)
    return [p for p in patterns if p.startswith(under)
            and not any(not empty for _, empty in (_matches(project, p) or ()))]


def check_book_stores(project: Path) -> None:
    """Refuse a render whose chapters would read another run store or work folder than the
    project's, which the freeze hashes (trial 13's X2: with ``FINETUNE_LAB_RUNS_DIR`` set, a
    render froze another store's numbers under the record of ``data/runs``)."""
    for var, own in ((RUNS_DIR_ENV, "data/runs"), (WORK_DIR_ENV, "data/work")):
        value = os.environ.get(var)
        # a relative path is read from each chapter's own folder (trial 14's X2): refused too
        if value and (not Path(value).expanduser().is_absolute()
                      or Path(value).expanduser().resolve() != (project / own).resolve()):
            raise UserError(f"{var} points at {value}, but the book is rendered from the "
                            f"project's {own}, which its freeze records; unset {var} to render")


def hash_inputs(project: Path, patterns: Iterable[str]) -> dict[str, str]:
    """``{relative path: sha256}`` of every file the patterns name right now.

    A glob matches files (``**`` recurses); a plain path may be a file or a folder (all files
    below it). Symbolic links are followed (a loop is read once), but for a link to a folder
    under ``data/runs`` (:data:`LINK`); a folder with no file below it is recorded as
    :data:`EMPTY_FOLDER` (``path/``), a link to nothing as
    :data:`BROKEN_LINK`, and a pipe, socket or device, never opened, as
    ``not-a-regular-file:<kind>`` (:func:`file_hash`). A plain path that does not exist is
    recorded as ``MISSING`` so that its later appearance counts as a change. In ``data/work/``,
    a build record is hashed without what says where and when it was built, and a build log
    not at all (:func:`work_file_hash`).
    """
    hashes: dict[str, str] = {}
    for pattern in patterns:
        matches = _matches(project, pattern)
        if matches is None:
            hashes[pattern] = MISSING
            continue
        for p, empty in matches:
            rel = p.relative_to(project).as_posix()
            if _is_ignored(Path(rel)) or rel in hashes or f"{rel}/" in hashes:
                continue
            work = rel.startswith("data/work/")
            if empty:
                hashes[f"{rel}/"] = EMPTY_FOLDER
            elif rel.startswith(RUNS_STORE) and os.path.islink(p) and os.path.isdir(p):
                hashes[rel] = LINK + os.readlink(p)
            elif not (work and p.name == BUILD_LOG):
                hashes[rel] = work_file_hash(p) if work else file_hash(p)
    return dict(sorted(hashes.items()))
