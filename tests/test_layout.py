"""The package's shape (issue 16): stages as subpackages, no import cycles, short modules.

The import graph is read from the source with ``ast`` (function-local imports included, since a
cycle hidden inside a function is still a cycle), so these checks need no heavy library.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT

PACKAGE_DIR = PROJECT_ROOT / "src" / "finetune_lab"
STAGES = ("data", "models", "runs", "train", "book")
"""Subpackages in import order: a module imports only from its own stage, earlier stages and the
top-level helpers (config, errors, argtypes, _files). ``runs`` (manifests, recording, the
registry) comes before ``train`` because training writes runs through it."""
ENTRY_POINTS = {"finetune_lab.cli", "finetune_lab.reproduce", "finetune_lab.gpu_lab"}
"""Top-level modules that drive every stage, and so may import any of them."""
HEAVY = {"torch", "fairseq", "fairseq_cli", "transformers", "peft", "bitsandbytes", "matplotlib",
         "seaborn", "pandas", "scipy", "numpy", "tbparse", "tensorboard", "sentencepiece",
         "nbclient", "nbformat", "jupytext", "IPython", "omegaconf", "tokenizers", "jsonschema",
         "datasets", "accelerate", "sklearn"}
"""Libraries slow enough to import that a module may import them inside the function that
needs them (so that ``finetune-lab --help`` or the freeze check does not pay for them)."""
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


@functools.cache
def _imports(name: str, path: Path) -> tuple[tuple[str, bool, ast.stmt, str], ...]:
    """``(imported module, at top level?, node, source line)`` for every import in a module."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    # top level: the module's statements, and those of a top-level ``try`` (an optional import)
    top = {id(node) for node in tree.body}
    top |= {id(sub) for node in tree.body if isinstance(node, ast.Try)
            for sub in node.body + [s for h in node.handlers for s in h.body]}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            found.append((target, id(node) in top, node, lines[node.lineno - 1]))
    return tuple(found)


def _graph() -> dict[str, set[str]]:
    return {name: {t for t, _, _, _ in _imports(name, path) if t in MODULES and t != name}
            for name, path in MODULES.items()}


def _stage(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else "top"


def test_stages_are_subpackages():
    for stage in STAGES:
        assert (PACKAGE_DIR / stage / "__init__.py").is_file(), stage
    loose = [n for n in MODULES if _stage(n) == "top" and n != "finetune_lab"]
    assert len(loose) <= 8, f"modules left at the top of the package: {loose}"


def test_no_import_cycles():
    graph = _graph()
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        order[node] = low[node] = len(order)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in graph:
        if name not in order:
            visit(name)
    assert not cycles, f"import cycles: {cycles}"


def test_stages_import_only_earlier_stages():
    rank = {"top": -1, **{s: i for i, s in enumerate(STAGES)}}
    wrong = []
    for name, targets in _graph().items():
        if name in ENTRY_POINTS:
            continue
        for target in targets:
            here, there = _stage(name), _stage(target)
            if rank[there] > rank[here] or (here == "top" and there != "top"):
                wrong.append(f"{name} -> {target}")
    assert not wrong, "imports against the stage order:\n" + "\n".join(sorted(wrong))


def _heavy_at_import(name: str, seen: set[str] | None = None) -> str | None:
    """The heavy library importing ``name`` pulls in at import time (through the package's
    top-level imports), or None."""
    seen = set() if seen is None else seen
    if name in seen or name not in MODULES:
        return None
    seen.add(name)
    for target, at_top, _, _ in _imports(name, MODULES[name]):
        if not at_top:
            continue
        if target.split(".")[0] in HEAVY:
            return target.split(".")[0]
        heavy = _heavy_at_import(target, seen)
        if heavy:
            return f"{heavy} (through {target})"
    return None


def test_function_local_imports_are_heavy_ones():
    """A function-local import is for a heavy library, or for a package module that imports one
    at its top; a local package import says which (``# heavy: ...``), or what it must follow
    (``# ordered: ...``: the console script's signal handlers, before the CLI loads)."""
    wrong = []
    for name, path in MODULES.items():
        for target, at_top, node, line in _imports(name, path):
            if at_top or target.split(".")[0] == "__future__":
                continue
            where = f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno}: {line.strip()}"
            if target.split(".")[0] in HEAVY:
                continue
            if target in MODULES or target.startswith("finetune_lab"):
                heavy = _heavy_at_import(target)
                if heavy is None and "# ordered:" in line:  # it must come after something
                    continue
                if heavy is None:
                    wrong.append(f"{where}  (light: import it at the top)")
                elif "# heavy" not in line:
                    wrong.append(f"{where}  (say why: '# heavy: {heavy}')")
            else:
                wrong.append(f"{where}  (standard or light library: import it at the top)")
    assert not wrong, f"{len(wrong)} function-local imports:\n" + "\n".join(wrong)


def test_modules_are_short():
    long = {str(p.relative_to(PACKAGE_DIR)): n for p in MODULES.values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_cli_starts_without_heavy_libraries():
    heavy = ["torch", "fairseq", "transformers", "matplotlib", "peft"]
    code = ("import sys; from finetune_lab import cli; cli.build_parser(); "
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [], f"`finetune-lab --help` imports {done.stdout.strip()}"


def test_the_checks_see_a_cycle(tmp_path, monkeypatch):
    """The cycle check is not vacuous: two modules importing each other inside functions."""
    pkg = tmp_path / "finetune_lab"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("")
    (pkg / "data" / "a.py").write_text("def f():\n    from finetune_lab.data import b\n")
    (pkg / "data" / "b.py").write_text("def g():\n    from finetune_lab.data import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIR", pkg)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", _modules())
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles()
    with pytest.raises(AssertionError, match="light: import it at the top"):
        test_function_local_imports_are_heavy_ones()


def _readme_modules() -> dict[str, set[str]]:
    """The README's table of the package, stage by stage: ``{stage: {module, ...}}``."""
    text = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### The package, stage by stage", 1)[1].split("\n## ", 1)[0]
    listed = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and cells[0].endswith("/`"):
            names = cells[1].split(", `fairseq_user_dir/`")[0]  # a folder of fairseq plug-ins
            listed[cells[0].strip("`/")] = {n.strip(" `") for n in names.split(",")}
    return listed


def test_the_readme_lists_every_module_of_each_stage():
    """An engineer finds a module by the README's table: it names each stage's modules, no
    more and no fewer (it had fallen behind by eleven)."""
    listed = _readme_modules()
    assert set(listed) == set(STAGES)
    for stage in STAGES:
        present = {p.stem for p in (PACKAGE_DIR / stage).glob("*.py") if p.stem != "__init__"}
        assert listed[stage] == present, (stage, sorted(present ^ listed[stage]))
