"""The lab's <human>/<assistant> prompt format, with the EOS it lacked, on the real FAQ."""

from __future__ import annotations

import json

import pytest

from finetune_lab.data import qa_prompts as qp
from finetune_lab.errors import UserError


def test_format_example_is_the_labs_template_plus_eos():
    text = qp.format_example("How can I pay?", "By card.")
    assert text == "<human>: How can I pay?\n<assistant>: By card.</s>"
    assert qp.lab_format_example("How can I pay?", "By card.") + "</s>" == text
    assert text.startswith(qp.format_prompt("How can I pay?"))


def test_format_example_uses_the_given_eos_and_strips_whitespace():
    assert qp.format_example(" Q? ", " A. \n", eos_token="<|end|>") == \
        "<human>: Q?\n<assistant>: A.<|end|>"
    with pytest.raises(ValueError):
        qp.format_example("Q", "A", eos_token="")


def test_lab_template_has_no_eos():
    assert not qp.lab_format_example("Q", "A").endswith(qp.BLOOM_EOS)


def test_real_faq_loads():
    pairs = qp.load_faq()
    assert len(pairs) == 79
    assert pairs[0].question == "How can I create an account?"
    assert all(t.endswith("</s>") for t in qp.format_faq(pairs))


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    ('{"question": "q", "answer": "a"}', "no list of pairs"),
    ("[]", "no list of pairs"),
    ('[{"question": "q", "answer": "a"}, {"question": "q2"}]', "entry 1"),
    ('[{"question": "", "answer": "a"}]', "entry 0"),
])
def test_malformed_faq_is_a_user_error_naming_the_file(tmp_path, content, match):
    bad = tmp_path / "faq.json"
    bad.write_text(content)
    with pytest.raises(UserError, match=match) as info:
        qp.load_faq(bad)
    assert str(bad) in str(info.value)


def test_missing_faq_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        qp.load_faq(tmp_path / "nope.json")


def test_lengths(tmp_path):
    f = tmp_path / "faq.json"
    f.write_text(json.dumps([{"question": "Où ?", "answer": "Ici, là."}]))
    row = qp.length_table(qp.load_faq(f)).iloc[0]
    text = "<human>: Où ?\n<assistant>: Ici, là."
    assert row["chars"] == len(text)
    assert row["words"] == 6
    assert row["utf-8 bytes"] == len(text) + 2  # ù and à take two bytes each
    assert row["token upper bound"] == row["utf-8 bytes"] + 1


def test_length_summary_on_the_real_faq():
    summary = qp.length_summary(qp.load_faq()).set_index("measure")
    table = qp.length_table(qp.load_faq())
    assert summary.loc["chars", "max"] == table["chars"].max()
    assert summary.loc["question chars", "min"] <= summary.loc["question chars", "median"]
