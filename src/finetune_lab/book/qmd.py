"""Read and execute the book's ``.qmd`` chapters without Quarto.

Quarto is not installable everywhere the tests run (its PyPI package downloads a binary from
GitHub), so CI checks the chapters the way Quarto's Jupyter engine would run them: jupytext
reads the ``.qmd`` cells as R Markdown, inline ``{python}`` expressions become code cells where
they appear, and nbclient executes the notebook in the chapter's folder with the ``python3``
kernel. The structure checks (listed chapters exist, every cross-reference and citation
resolves) read ``_quarto.yml`` and the sources directly. :func:`front_matter` is the one reader
of a chapter's YAML front matter (the freeze takes a chapter's ``inputs:`` from it), so this
module imports only PyYAML at its top: the notebook libraries are loaded where they are used.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError

INLINE_RE = re.compile(r"`\{python\}\s+([^`]+)`")
LABEL_OPTION_RE = re.compile(r"^#\|\s*label:\s*(\S+)\s*$", re.M)
ANCHOR_RE = re.compile(r"\{#((?:fig|tbl|eq|sec|lst)-[\w-]+)[^}]*\}")
CROSSREF_RE = re.compile(r"(?<![\w@.])@((?:fig|tbl|eq|sec|lst)-[\w-]*\w)")
CITATION_RE = re.compile(r"\[[^\]]*?@([\w:.-]*\w)[^\]]*\]")
CODE_CELL_RE = re.compile(r"^```\{python[^}]*\}[ \t]*\n(.*?)^```", re.M | re.S)
FENCE_RE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE_RE = re.compile(r"`[^`\n]+`")


def load_quarto_config(root: Path = PROJECT_ROOT) -> dict:
    """Parse ``_quarto.yml``; a missing or malformed file is a :class:`UserError`."""
    path = root / "_quarto.yml"
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UserError(f"{path} is missing: this is not a finetune-lab checkout") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML ({yaml_problem(exc)})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte {exc.start}): restore it from git "
                        "(`git checkout -- _quarto.yml`)") from None


def yaml_problem(exc: yaml.YAMLError, first_line: int = 1) -> str:
    """PyYAML's message in one line: its problem and the file's line (its own is several
    lines); ``first_line``: the file's line the parsed text starts on."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{what}, line {mark.line + first_line}" if mark is not None else what


class FrontMatterError(UserError):
    """A chapter's YAML front matter is not valid YAML, not a mapping, or never closed."""


def front_matter(qmd: Path) -> dict[str, Any]:
    """The YAML front matter of a ``.qmd`` file (``{}`` when it has none)."""
    try:
        # an editor's "UTF-8 with BOM": Pandoc reads past it, and so must the declared inputs
        lines = qmd.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise FrontMatterError(f"{qmd} is not UTF-8 text (byte {exc.start}): restore it from git "
                               f"(`git checkout -- {qmd}`) or save it as UTF-8") from None
    if not lines or lines[0].strip() != "---":
        return {}
    for i, line in enumerate(lines[1:], start=1):
        if line.strip() in ("---", "..."):
            try:
                meta = yaml.safe_load("\n".join(lines[1:i])) or {}
            except yaml.YAMLError as exc:
                raise FrontMatterError(f"{qmd}: front matter is not valid YAML "
                                       f"({yaml_problem(exc, first_line=2)})") from None
            if not isinstance(meta, dict):
                raise FrontMatterError(f"{qmd}: front matter must be a YAML mapping")
            return meta
    raise FrontMatterError(
        f"{qmd}: front matter starts with '---' but never ends; add a closing '---'")


def _flatten_chapters(items: list) -> list[str]:
    out: list[str] = []
    for item in items or []:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            if isinstance(item.get("part"), str) and item["part"].endswith(".qmd"):
                out.append(item["part"])
            out.extend(_flatten_chapters(item.get("chapters", [])))
    return out


def book_chapters(root: Path = PROJECT_ROOT) -> list[Path]:
    """Every chapter and appendix listed in ``_quarto.yml``, in book order."""
    book = load_quarto_config(root).get("book", {})
    listed = _flatten_chapters(book.get("chapters", [])) + _flatten_chapters(
        book.get("appendices", [])
    )
    return [root / rel for rel in listed]


def code_cells(text: str) -> list[str]:
    """The source of each Python code cell of a chapter's text, in order (cell options kept)."""
    return CODE_CELL_RE.findall(text)


def prose(text: str) -> str:
    """The Markdown of a chapter without its fenced code blocks and inline code."""
    return INLINE_CODE_RE.sub("", FENCE_RE.sub("", text))


@dataclass(frozen=True)
class CrossRefs:
    """Labels a chapter defines and cross-references / citations it uses."""

    defined: set[str]
    used: set[str]
    citations: set[str]


def crossrefs(path: Path) -> CrossRefs:
    text = path.read_text(encoding="utf-8")
    defined = set(ANCHOR_RE.findall(text))
    for cell in code_cells(text):
        defined.update(LABEL_OPTION_RE.findall(cell))
    md = prose(text)
    used = set(CROSSREF_RE.findall(md))
    # Cell captions (tbl-cap / fig-cap) are prose too and may cross-reference.
    for cell in code_cells(text):
        for line in cell.splitlines():
            if re.match(r"#\|\s*(tbl|fig)-cap:", line):
                used.update(CROSSREF_RE.findall(line))
    citations = {c for c in CITATION_RE.findall(md) if not c.split("-")[0] in
                 ("fig", "tbl", "eq", "sec", "lst")}
    return CrossRefs(defined, used, citations)


def bib_keys(path: Path) -> set[str]:
    return set(re.findall(r"^@\w+\{([^,\s]+),", path.read_text(encoding="utf-8"), re.M))


def to_notebook(path: Path):
    """The chapter as an nbformat notebook, each inline expression turned into a code cell of
    its own (metadata ``inline``, ``expr``) after the paragraph holding it."""
    import jupytext
    import nbformat

    nb = jupytext.reads(path.read_text(encoding="utf-8"), fmt="Rmd")
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type == "markdown":  # one cell per expression, so that each value shows
            cells += [nbformat.v4.new_code_cell(f"str({e.strip()})",
                                                metadata={"inline": True, "expr": e.strip()})
                      for e in INLINE_RE.findall(cell.source)]
    nb.cells = cells
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
"""The backend of a Jupyter kernel, Quarto's included: figures are sent as images."""

FIGURE_LABEL_RE = re.compile(r"^#\|\s*label:\s*(fig-[\w-]+)", re.MULTILINE)


def figures_missing(nb) -> list[str]:
    """Labels of ``fig-`` cells that produced no image: such a cell renders as an empty figure."""
    missing = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        label = FIGURE_LABEL_RE.search(cell.source)
        if label is None:
            continue
        images = [o for o in cell.get("outputs", [])
                  if {"image/png", "image/svg+xml"} & set(o.get("data", {}))]
        if not images:
            missing.append(label.group(1))
    return missing


MARKDOWN_IN_INLINE_RE = re.compile(r"`|\*\*|\[[^\]]*\]\(")
"""Markdown that Quarto would print literally in an inline value: code, bold, a link."""


def inline_problems(nb) -> list[str]:
    """What is wrong with the inline values of an executed notebook (from :func:`to_notebook`):
    Quarto inserts an inline value as plain text, so a value that is empty, holds Markdown, or
    that the kernel never returned is named with its expression."""
    problems = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.metadata.get("inline"):
            continue
        expr = cell.metadata.get("expr", cell.source)
        shown = [o["data"]["text/plain"] for o in cell.get("outputs", [])
                 if o.get("output_type") == "execute_result" and "text/plain" in o.get("data", {})]
        if not shown:
            problems.append(f"`{expr}` returned no value")
            continue
        try:
            value = ast.literal_eval(shown[-1])
        except (ValueError, SyntaxError):
            value = shown[-1]
        if not str(value).strip():
            problems.append(f"`{expr}` is an empty string")
        elif MARKDOWN_IN_INLINE_RE.search(str(value)):
            problems.append(f"`{expr}` holds Markdown, shown literally: {value!r}")
    return problems


KERNEL_STARTS = 3
"""Kernels started for one chapter at most: jupyter_client picks a kernel's ports before the
kernel binds them, so two kernels started at once (the suite's workers) may be given the same
port, and one dies before it replies (jupyter_client issue 487; "Address already in use")."""


def execute_chapter(path: Path, timeout: int = 600):
    """Run every cell of ``path`` in its own folder, as Quarto does; raise on the first error,
    and if a ``fig-`` cell shows no image.

    The kernel gets Jupyter's inline matplotlib backend (whatever ``MPLBACKEND`` the caller has,
    e.g. Agg under pytest), as under Quarto, so that figures are checked the way they render.
    """
    from nbclient import NotebookClient

    for attempt in range(1, KERNEL_STARTS + 1):
        nb = to_notebook(path)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        try:  # the kernel's own environment: this process's MPLBACKEND is left as it is
            client.execute(env={**os.environ, "MPLBACKEND": INLINE_BACKEND})
            break
        except RuntimeError as exc:  # a kernel that died as it started, before any cell ran
            if attempt == KERNEL_STARTS or "Kernel died before replying" not in str(exc):
                raise
    missing = figures_missing(nb)
    if missing:
        raise UserError(f"{path}: figure cell(s) {', '.join(missing)} produced no image; a "
                        "plotting function must draw with pyplot (shown when the cell ends) or "
                        "the cell must end with the figure")
    return nb
