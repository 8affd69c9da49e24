"""What a chapter's output depends on: the data its front matter declares and the code it imports.

The data-aware freeze (:mod:`finetune_lab.book.freeze`) and the provenance footer
(:mod:`finetune_lab.book.provenance`) both need the same answer: a chapter's declared
``inputs:`` (paths or globs relative to the project root, for data) plus the package modules its
Python cells import, directly or through each other, hashed file by file. Light on purpose:
``finetune-lab check-freeze`` runs with PyYAML alone.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from pathlib import Path

from finetune_lab._files import sha256_file
from finetune_lab.book.qmd import code_cells, front_matter
from finetune_lab.errors import UserError

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


def chapter_inputs(project: Path, chapter: str) -> list[str] | None:
    """What a chapter's output depends on: its declared ``inputs:`` (data, as globs) and the
    import closure of its code. None when it has neither."""
    declared = declared_inputs(project / chapter) or []
    code = import_closure(project, chapter_imports(project / chapter))
    inputs = declared + [c for c in code if c not in declared]
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
    """Bytecode, and hidden files (a run's ``.lock`` while it is written, ``.superseded/``):
    none of them is committed, so a freeze that hashed them would be stale on a clean clone."""
    return ("__pycache__" in path.parts or path.suffix in {".pyc", ".pyo"}
            or any(part.startswith(".") for part in path.parts))


def hash_inputs(project: Path, patterns: Iterable[str]) -> dict[str, str]:
    """``{relative path: sha256}`` of every file the patterns name right now.

    A glob matches files (``**`` recurses); a plain path may be a file or a folder (all files
    below it). A plain path that does not exist is recorded as ``MISSING`` so that its later
    appearance counts as a change.
    """
    hashes: dict[str, str] = {}
    for pattern in patterns:
        if _GLOB_CHARS & set(pattern):
            matches = [p for p in project.glob(pattern) if p.is_file()]
            if pattern.endswith("**"):  # pathlib's "x/**" yields folders only before 3.13
                matches += [p for d in project.glob(pattern) if d.is_dir()
                            for p in d.rglob("*") if p.is_file()]
        else:
            target = project / pattern
            if target.is_dir():
                matches = [p for p in target.rglob("*") if p.is_file()]
            elif target.is_file():
                matches = [target]
            else:
                hashes[pattern] = MISSING
                continue
        for p in matches:
            if not _is_ignored(p.relative_to(project)):
                rel = p.relative_to(project).as_posix()
                if rel not in hashes:
                    hashes[rel] = sha256_file(p)
    return dict(sorted(hashes.items()))
