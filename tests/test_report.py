"""Markdown tables as pandoc reads them."""

from __future__ import annotations

import math

import pandas as pd

from finetune_lab.book.report import (
    minus_signs,
    signed,
    LINE_CHARS,
    MAX_COLUMN_WEIGHT,
    column_weights,
    markdown_table,
)


def _dashes(markdown: str) -> list[int]:
    return [cell.strip(":").count("-") for cell in markdown.split("\n")[1].strip("|").split("|")]


def test_a_long_text_column_cannot_crush_the_others():
    """Pandoc sizes a wide pipe table's columns by the dashes under the header: tabulate's
    dashes as wide as a 600-character help text printed the LoRA chapter's first three columns on
    top of each other in the PDF (issue 15)."""
    help_text = "Lora attention dimension " * 24
    df = pd.DataFrame({"field": ["target_modules"], "lab": ["['query_key_value']"],
                       "help": [help_text]})
    text = markdown_table(df)
    # the identifiers get their whole length (+ 2), the help text the rest of the line
    field, lab = len("target_modules") + 2, len("['query_key_value']") + 2
    assert _dashes(text) == [field, lab, LINE_CHARS - field - lab]
    assert help_text.strip() in text.split("\n")[2]  # the cells themselves are untouched


def test_words_that_cannot_wrap_get_their_width():
    """A header that wraps must not take the width of an identifier that cannot: the LoRA
    chapter's ``'FEATURE_EXTRACTION'`` ran into the next column of its PDF table."""
    df = pd.DataFrame({"config": ["modules_to_save=['word_embeddings']"],
                       "block 0: rank and scaling of the adapter": ["16, 2"],
                       "help": ["a long sentence of help " * 10]})
    weights = column_weights([[str(c), *map(str, df[c])] for c in df.columns])
    assert weights[0] == len("modules_to_save=['word_embeddings']") + 2
    # the header wraps: its column gets its longest word and a share of the spare width
    assert len("scaling") + 2 < weights[1] < len(df.columns[1]) + 2 < weights[2]
    assert sum(weights) == LINE_CHARS
    # unbreakable runs are capped, so that none of them can take the whole line
    assert column_weights([[c * 600] for c in "xyz"]) == [MAX_COLUMN_WEIGHT + 2] * 3
    # a table that fits a line keeps tabulate's natural widths
    small = pd.DataFrame({"run": ["cpu-long3"], "status": ["paused"]})
    assert _dashes(markdown_table(small)) == [len("cpu-long3") + 2, len("status") + 2]


def test_a_token_that_looks_like_a_tag_is_escaped_outside_code():
    from finetune_lab.book.report import markdown_table

    table = markdown_table(pd.DataFrame({"probe on <s> (%)": ["`<s>` 75.7 <s>", 1.5]}))
    header, _, row, other = table.split("\n")
    assert "probe on \\<s> (%)" in header and "<s> (%)" not in header.replace("\\<s>", "")
    assert "`<s>` 75.7 \\<s>" in row  # the code span untouched, the bare token escaped
    assert "1.5" in other


def test_upper_case_identifiers_get_the_width_they_take():
    """``'FEATURE_EXTRACTION'`` is wider on the page than as many lower-case characters: its
    column gets more (LoRA chapter, PDF table of the TaskType values)."""
    from finetune_lab.book.report import UPPER_WIDTH, text_width

    help_text = ["a long sentence of help " * 10]
    upper = column_weights([["task"], ["'FEATURE_EXTRACTION'"], help_text])
    lower = column_weights([["task"], ["'feature_extraction'"], help_text])
    assert upper[1] > lower[1] == len("'feature_extraction'") + 2
    assert text_width("AB_c") == math.ceil(4 + 2 * (UPPER_WIDTH - 1)) > 4
    assert sum(upper) == sum(lower) == LINE_CHARS


def test_negative_numbers_get_a_minus_sign_but_code_and_dates_do_not():
    """Tables of differences printed "-1.5 (-3.4 to +0.4)" beside "− full"."""
    assert minus_signs("-1.5 (95 % CI -3.4 to +0.4)") == "\u22121.5 (95 % CI \u22123.4 to +0.4)"
    kept = "`--seed -1`, seed-1, 1e-5, 2026-11-26, pretrain-gpu"
    assert minus_signs(kept) == kept
    assert [signed(x) for x in (1.46, -0.44, -0.04, 0.0)] == ["+1.5", "\u22120.4", "0.0", "0.0"]
    table = markdown_table(pd.DataFrame({"gap": [-1.47], "code": ["`-1`"]}))
    assert "\u22121.47" in table and "`-1`" in table


def test_a_truth_value_reads_as_a_word():
    """Table 1.1's "equal" column printed Python's True; numpy's bools the same."""
    import numpy as np

    df = pd.DataFrame({"name": ["a", "b"], "equal": [True, False],
                       "all identical": np.array([False, True])})
    rows = [line.split("|")[2:4] for line in markdown_table(df).splitlines()[2:]]
    assert [[cell.strip() for cell in row] for row in rows] == [["yes", "no"], ["no", "yes"]]


def test_counts_learning_rates_and_one_seed_read_as_the_book_prints_them():
    from finetune_lab.book.report import fmt_count, fmt_lr, fmt_seeds

    assert [fmt_count(v) for v in (1125, "3418", 8, "1e-05", "–", "0.06")] == [
        "1,125", "3,418", "8", "1e-05", "–", "0.06"]
    assert [fmt_lr(v) for v in (5e-4, 1e-5, 2.5e-4)] == ["5e-4", "1e-5", "2.5e-4"]
    assert fmt_seeds(73.1, float("nan"), 1) == "73.1 (n=1)"
    assert fmt_seeds(78.06, 0.44, 3) == "78.1 ± 0.4 (n=3)"
