"""Whether the training file holds the test file's reviews, word for word or nearly: a check of
``prepare-cls`` (trials 14 to 19, D: the test reviews, copied with small changes, were trained
on)."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from finetune_lab.errors import UserError


class Text(Protocol):
    """A review, as far as comparing it goes."""
    text: str


MAX_SHARED = 0.1
"""The largest share of training reviews whose text may also be in the test file: Webis-CLS-10's
books share 48 of 2,000 (2.4 %); a training file made from the test file shares nearly all."""


UNSEEN = ("Cf", "Mn", "Me")
"""Characters that change no word as it reads: invisible ones (a soft hyphen, a zero-width
space or joiner) and accents apart from their letter (trial 19's D-x1: a soft hyphen inside every
word of the test file split each word in two, and the copy passed)."""
LOOKALIKE = str.maketrans(
    {**dict(zip("аеорсухіјѕԁԛԝһӏАВЕКМНОРСТХІЈЅУ", "aeopcyxijsdqwhlABEKMHOPCTXIJSY")),
     **dict(zip("αονρτικυεχΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "aovptikuexABEZHIKMNOPTYX")),
     # invisible "letters" and spaces other than the space: taken out, not word breaks
     **{c: None for c in "\u115f\u1160\u3164\uffa0\u2800\u00a0\u1680\u202f\u205f\u3000"},
     **{chr(c): None for c in range(0x2000, 0x200B)}})
"""Cyrillic and Greek letters that look Latin, as the Latin letter; fillers and other spaces
removed (19b's D2 to D4: the test file in look-alike letters, or with a narrow no-break space
or a Hangul filler inside each word, passed)."""


def comparable(text: str) -> str:
    """A review's words, lowercased, without punctuation or spacing, accents, invisible or
    look-alike characters: the same review with a character added or changed in case (trial
    15's D-n1: " ." after each test text), hidden inside its words or disguised compares
    equal."""
    text = unicodedata.normalize("NFKD", text.translate(LOOKALIKE))
    text = "".join(c for c in text if c.isascii() or unicodedata.category(c) not in UNSEEN)
    return " ".join(re.findall(r"\w+", text.casefold()))


SHINGLE = 4
"""A review is compared by its runs of :data:`SHINGLE` words (:func:`comparable`), so that words
added before or after a test review (trial 16's D-v), at both ends, or a few dropped inside it
(trial 17's D-v3, D-v4) leave it the test review."""
NEAR = 0.5
"""A training review holding this share of one test review's word runs (or that one holding as
much of the training review's) is that test review."""
COMMON = 50
"""A word run found in more test reviews than this says nothing of which one (boilerplate)."""


def shingles(words: list[str]) -> set[str]:
    """A review's runs of :data:`SHINGLE` words (of :func:`comparable`); a shorter review is its
    one run."""
    return {" ".join(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)} \
        or {" ".join(words)}


WORDS_NEAR = 0.7
"""A training review of :data:`MIN_WORDS` distinct words or more sharing this share of one test
review's distinct words (or that one as much of its) is that test review, in any order and with
words added or replaced (trial 18's D-w: a filler every third word, every fourth word replaced,
the words reversed)."""
MIN_WORDS = 8


def near_test_reviews(train: Sequence[Text], test: Sequence[Text]) -> int:
    """How many training reviews are a test review, word for word or nearly: :data:`NEAR` of
    the shorter one's runs of words in common, or :data:`WORDS_NEAR` of its distinct words
    (the real training file shares 48 of its 2,000 word for word, 75 nearly)."""
    test_words = [comparable(r.text).split() for r in test]
    runs = [shingles(w) for w in test_words]
    words = [set(w) for w in test_words]
    seen = Counter(w for held in words for w in held)
    by_run: dict[str, list[int]] = {}
    by_word: dict[str, list[int]] = {}
    for j, (held_runs, held_words) in enumerate(zip(runs, words)):
        for run in held_runs:
            by_run.setdefault(run, []).append(j)
        for word in held_words:
            if seen[word] <= COMMON:  # a rare word says which review it is from
                by_word.setdefault(word, []).append(j)
    near = 0
    for review in train:
        text = comparable(review.text).split()
        mine, hits = shingles(text), Counter()
        for run in mine:
            if len(found := by_run.get(run, ())) <= COMMON:
                hits.update(found)
        if any(n >= NEAR * min(len(mine), len(runs[j])) for j, n in hits.items()):
            near += 1
            continue
        bag = set(text)
        shared = Counter(j for word in bag for j in by_word.get(word, ()))
        near += len(bag) >= MIN_WORDS and any(
            len(bag & words[j]) >= WORDS_NEAR * min(len(bag), len(words[j]))
            for j, _ in shared.most_common(3))
    return near


def check_overlap(sources: Mapping[str, Path], train: Sequence[Text],
                  test: Sequence[Text]) -> None:
    """Refuse a training file that is mostly the test file's reviews (trial 14's D1: the test
    file plus one byte passed the check that the two files differ)."""
    shared = near_test_reviews(train, test)
    if train and shared > MAX_SHARED * len(train):
        raise UserError(f"{sources['train']} shares {shared} of its {len(train)} reviews with "
                        f"{sources['test']}: the test reviews would be trained on; restore "
                        "Webis-CLS-10's training file")
