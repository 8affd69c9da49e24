"""Small display helpers shared by the chapters.

Tables are emitted as Markdown so that Quarto typesets them natively in both HTML and Typst/PDF
(a raw pandas HTML table would not reach the PDF), and so that ``tbl-cap`` cross-references work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd


def fmt_int(value: float | int) -> str:
    """Thousands separators, as the lab's writeups print parameter counts: 22,807,552."""
    return f"{int(value):,}"


def fmt_pct(value: float, digits: int = 1) -> str:
    return f"{100 * value:.{digits}f} %"


def markdown_table(
    df: pd.DataFrame,
    formatters: Mapping[str, Callable[[object], str]] | None = None,
    index: bool = False,
) -> str:
    """Render ``df`` as a GitHub-style Markdown table, formatting the named columns."""
    shown = df.copy()
    for column, fn in (formatters or {}).items():
        shown[column] = shown[column].map(fn)
    return shown.to_markdown(index=index, disable_numparse=True)


def show_table(
    df: pd.DataFrame,
    formatters: Mapping[str, Callable[[object], str]] | None = None,
    index: bool = False,
):
    """Display ``df`` as Markdown in a notebook cell (Quarto reads the ``text/markdown`` output)."""
    from IPython.display import Markdown

    return Markdown(markdown_table(df, formatters=formatters, index=index))
