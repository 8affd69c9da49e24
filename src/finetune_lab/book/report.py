"""Small display helpers shared by the chapters.

Tables are emitted as Markdown so that Quarto typesets them natively in both HTML and Typst/PDF
(a raw pandas HTML table would not reach the PDF), and so that ``tbl-cap`` cross-references work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pandas as pd

from finetune_lab.config import paths


def fmt_int(value: float | int) -> str:
    """Thousands separators, as the lab's writeups print parameter counts: 22,807,552."""
    return f"{int(value):,}"


def fmt_pct(value: float, digits: int = 1) -> str:
    return f"{100 * value:.{digits}f} %"


def project_path(path: Path | str) -> str:
    """A path as the reader should type it: relative to the project root when inside it."""
    p = Path(path)
    try:
        return p.resolve().relative_to(paths().project.resolve()).as_posix()
    except ValueError:
        return str(p)


def code_list(items: Iterable[str]) -> str:
    """``a``, ``b`` and ``c`` as inline code, for a sentence printed as Markdown."""
    codes = [f"`{i}`" for i in items]
    return codes[0] if len(codes) == 1 else ", ".join(codes[:-1]) + " and " + codes[-1]


def markdown_table(
    df: pd.DataFrame,
    formatters: Mapping[str, Callable[[object], str]] | None = None,
    index: bool = False,
) -> str:
    """Render ``df`` as a GitHub-style Markdown table, formatting the named columns.

    Pandoc sizes the columns of a pipe table that does not fit a line from the dashes under its
    header; tabulate draws as many as the widest cell, so one column of long help texts took
    nearly the whole PDF page and printed the others on top of each other. The dashes are
    capped at :data:`MAX_COLUMN_WEIGHT`, which bounds how much wider one column gets than
    another."""
    shown = df.copy()
    for column, fn in (formatters or {}).items():
        shown[column] = shown[column].map(fn)
    text = shown.to_markdown(index=index, disable_numparse=True)
    lines = text.split("\n")
    if len(lines) > 1:
        lines[1] = "|" + "|".join(_capped(cell) for cell in lines[1].strip("|").split("|")) + "|"
    return "\n".join(lines)


MAX_COLUMN_WEIGHT = 40
"""Dashes at most under one column header (see :func:`markdown_table`)."""


def _capped(separator: str) -> str:
    left, right = separator.startswith(":"), separator.endswith(":")
    dashes = min(MAX_COLUMN_WEIGHT, max(3, len(separator) - left - right))
    return (":" if left else "") + "-" * dashes + (":" if right else "")


def show_table(
    df: pd.DataFrame,
    formatters: Mapping[str, Callable[[object], str]] | None = None,
    index: bool = False,
):
    """Display ``df`` as Markdown in a notebook cell (Quarto reads the ``text/markdown`` output)."""
    from IPython.display import Markdown

    return Markdown(markdown_table(df, formatters=formatters, index=index))


def show_shell(text: str):
    """Display ``text`` as a fenced ``bash`` block (Quarto reads the ``text/markdown`` output)."""
    from IPython.display import Markdown

    return Markdown(f"```bash\n{text}\n```")
