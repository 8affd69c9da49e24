"""Small display helpers shared by the chapters.

Tables are emitted as Markdown so that Quarto typesets them natively in both HTML and Typst/PDF
(a raw pandas HTML table would not reach the PDF), and so that ``tbl-cap`` cross-references work.
"""

from __future__ import annotations

import math

import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from finetune_lab.config import paths


def fmt_int(value: float | int) -> str:
    """Thousands separators, as the lab's writeups print parameter counts: 22,807,552."""
    return f"{int(value):,}"


def fmt_count(value: object) -> str:
    """A count in a table cell with thousands separators (1,125); any other value (a rate, a
    dash, a word) as it is, so that a column of settings can pass through it whole."""
    text = str(value)
    return f"{int(text):,}" if text.isdigit() else text


def fmt_lr(value: float) -> str:
    """A learning rate in one notation, the one the papers use: ``5e-4``, ``1e-5``, ``2.5e-4``
    (Python's ``:g`` gave ``0.0005`` beside ``1e-05``)."""
    mantissa, exponent = f"{float(value):e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def fmt_seeds(mean: float, std: float, n: int, digits: int = 1) -> str:
    """``81.2 ± 1.3 (n=3)``, and ``73.1 (n=1)`` for one seed, which has no spread to show (not
    ``73.1 ± – (n=1)``)."""
    if n == 1:
        return f"{mean:.{digits}f} (n=1)"
    return f"{mean:.{digits}f} ± {std:.{digits}f} (n={n})"


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
    header, and tabulate draws as many as the widest cell: one column of long help texts took
    nearly the whole PDF page, and identifiers that cannot wrap (``'FEATURE_EXTRACTION'``) ran
    into the next column. The dashes are :func:`column_weights` instead."""
    shown = df.copy()
    for column, fn in (formatters or {}).items():
        shown[column] = shown[column].map(fn)
    # a truth value reads as a word, not as Python's True (numpy's bool_ too)
    shown = shown.rename(columns=escape_tags).map(
        lambda v: escape_tags(v) if isinstance(v, str) else
        ("yes" if v else "no") if isinstance(v, (bool, np.bool_)) else v)
    text = shown.to_markdown(index=index, disable_numparse=True)
    lines = [line if i == 1 else minus_signs(line) for i, line in enumerate(text.split("\n"))]
    if len(lines) > 1:
        cells = [cell for cell in lines[1].strip("|").split("|")]
        table = shown.reset_index() if index else shown
        columns = [[str(name), *map(str, table[name])] for name in table.columns]
        lines[1] = "|" + "|".join(_dashes(cell, weight) for cell, weight
                                  in zip(cells, column_weights(columns))) + "|"
    return "\n".join(lines)


_CODE_SPAN = re.compile(r"(`[^`]*`)")
_TAG_START = re.compile(r"<(?=[A-Za-z/!])")
_HYPHEN_MINUS = re.compile(r"(?<![\w\-−.])-(?=\d)")


def minus_signs(text: str) -> str:
    """Each negative number's hyphen-minus as a minus sign (U+2212), outside code spans: a table
    of differences read "-1.5" beside "+1.5" and "− full", and a hyphen can break a line."""
    parts = _CODE_SPAN.split(text)
    return "".join(part if i % 2 else _HYPHEN_MINUS.sub("−", part)
                   for i, part in enumerate(parts))


def signed(value: float, digits: int = 1) -> str:
    """A difference with its sign, + or −: ``+1.5``, ``−0.4`` (``0.0`` when it rounds to 0)."""
    if round(value, digits) == 0:
        return f"{0:.{digits}f}"
    return minus_signs(f"{value:+.{digits}f}")


def escape_tags(text: object) -> object:
    """``text`` with every ``<`` that would open an HTML tag escaped, outside code spans.

    Pandoc reads a cell's ``<s>`` (RoBERTa's first token) as raw HTML: the page struck the rest
    of the cell through and the PDF dropped it. Code spans keep their text as it is."""
    if not isinstance(text, str):
        return text
    parts = _CODE_SPAN.split(text)
    return "".join(part if i % 2 else _TAG_START.sub(r"\\<", part)
                   for i, part in enumerate(parts))


MAX_COLUMN_WEIGHT = 40
"""The most width one column's unbreakable text can claim (see :func:`column_weights`)."""

LINE_CHARS = 105
"""About as many characters as a line of table text holds in the PDF (A4, text at 0.85em)."""


UPPER_WIDTH = 1.35
"""How many average characters an upper-case letter takes in the PDF's table font (A, M, W are
wide): ``'FEATURE_EXTRACTION'`` is wider than its 18 characters."""


def text_width(text: str) -> int:
    """``text``'s width in average characters (upper-case letters count :data:`UPPER_WIDTH`)."""
    return math.ceil(len(text) + (UPPER_WIDTH - 1) * sum(c.isupper() for c in text))


def column_weights(columns: list[list[str]]) -> list[int]:
    """Widths, in characters, for columns given as their header and cells.

    A table that fits a line keeps its natural widths. Otherwise each column first gets its longest word (text that cannot wrap: an identifier, a number,
    capped at :data:`MAX_COLUMN_WEIGHT`); what is left of a :data:`LINE_CHARS` line goes to the
    columns whose text is longer than that, in proportion to what they lack."""
    pad = 2
    need = [min(MAX_COLUMN_WEIGHT, max(text_width(word) for text in col
                                       for word in text.split() or [""])) + pad
            for col in columns]
    want = [max(text_width(text) for text in col) + pad for col in columns]
    if sum(want) <= LINE_CHARS:  # the table fits a line: as tabulate draws it
        return want
    spare = LINE_CHARS - sum(need)
    lack = [max(0, w - n) for w, n in zip(want, need)]
    if spare <= 0 or not sum(lack):
        return need
    return [n + round(spare * short / sum(lack)) for n, short in zip(need, lack)]


def _dashes(separator: str, weight: int) -> str:
    left, right = separator.strip().startswith(":"), separator.strip().endswith(":")
    return (":" if left else "") + "-" * max(3, weight) + (":" if right else "")


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
