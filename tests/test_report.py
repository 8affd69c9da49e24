"""Markdown tables as pandoc reads them."""

from __future__ import annotations

import pandas as pd

from finetune_lab.book.report import MAX_COLUMN_WEIGHT, markdown_table


def test_a_long_text_column_cannot_crush_the_others():
    """Pandoc sizes a wide pipe table's columns by the dashes under the header: tabulate's
    dashes as wide as a 600-character help text printed the LoRA chapter's first three columns on
    top of each other in the PDF (issue 15)."""
    df = pd.DataFrame({"field": ["target_modules"], "lab": ["['query_key_value']"],
                       "help": ["x" * 600]})
    lines = markdown_table(df).split("\n")
    dashes = [cell.strip(":").count("-") for cell in lines[1].strip("|").split("|")]
    # tabulate pads each cell by one space
    assert dashes == [len("target_modules") + 1, len("['query_key_value']") + 1, MAX_COLUMN_WEIGHT]
    assert lines[2].count("x") == 600  # the cells themselves are untouched
