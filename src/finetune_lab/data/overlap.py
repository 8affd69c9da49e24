"""Whether the training file holds the test file's reviews, word for word or nearly: a check of
``prepare-cls`` (trials 14 to 19, D: the test reviews, copied with small changes, were trained
on)."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from finetune_lab.errors import UserError


K = TypeVar("K")


class Text(Protocol):
    """A review, as far as comparing it goes."""
    text: str


@dataclass(frozen=True)
class Passage:
    """A text that is not a parsed review (a novel's paragraph, a line of a prepared split),
    compared with the test reviews as a review would be."""

    text: str


MAX_SHARED = 0.05
"""The largest share of training reviews whose text may also be in the test file: Webis-CLS-10's
books share 48 of 2,000 word for word, 76 nearly (3.8 %); a training file made from the test
file shares nearly all (trial 20's D-z4: 120 test reviews put in passed under 10 %)."""
MIN_SHARED = 2
"""... or this many, in a split of fewer than 40 reviews: a few dozen drawn from Webis-CLS-10's
own training file (a GPU smoke call's 16) may hold one of its 48 shared reviews."""


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


_WIDE = re.compile(r"[^\x00-\x7f]+")


def _without(text: str, categories: tuple[str, ...]) -> str:
    """``text`` without its characters of the Unicode ``categories`` (none of them ASCII: only
    the runs of other characters are looked at, which keeps a long review quick)."""
    return _WIDE.sub(lambda m: "".join(c for c in m.group(0)
                                       if unicodedata.category(c) not in categories), text)


def comparable(text: str) -> str:
    """A review's words, lowercased, without punctuation or spacing, accents, invisible or
    look-alike characters: the same review with a character added or changed in case (trial
    15's D-n1: " ." after each test text), hidden inside its words or disguised compares
    equal."""
    text = _without(unicodedata.normalize("NFKD", text.translate(LOOKALIKE)), UNSEEN)
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


FRENCH_LETTERS = frozenset("œŒæÆ")
"""Letters of French texts beyond ASCII once accents are apart (NFKD): Webis-CLS-10's books
files hold no other."""
MAX_ODD = 0.005
"""The largest share of a file's letters that may be odd (:func:`odd_characters`): Webis-CLS-10's
books files have 0.08 %; any letter of more than 0.5 % of French text replaced throughout by
something that looks like it (trials 20 and 20b: Armenian, dotless i, Latin alpha, a symbol, a
digit) is more, and a rarer one leaves the words :func:`near_test_reviews` compares."""
_LETTER = r"[^\W\d_]"
_JOINED = re.compile(rf"(?<={_LETTER})(?:[^\w\s'’\-]|_)(?={_LETTER})"
                     rf"|(?<={_LETTER})\d|\d(?={_LETTER})")
"""A character other than an apostrophe or a hyphen between two letters, or a digit beside a
letter: rare in French text ("M6", "etc.Mais"), everywhere in a disguised one ("l1vr3")."""


_NOT_ASCII, _ASCII_LETTER = re.compile(r"[^\x00-\x7f]"), re.compile(r"[A-Za-z]")
"""The characters :func:`odd_characters` looks at one by one, and the letters it only counts."""


def _odd(c: str) -> bool:
    """A letter outside the French alphabet, or a symbol or control (not ASCII, a space or
    punctuation)."""
    if c.isalpha():
        return not c.isascii() and c not in FRENCH_LETTERS
    return not (c.isascii() or c.isspace() or unicodedata.category(c).startswith("P"))


def odd_characters(text: str) -> tuple[int, str | None, int]:
    """How many characters of ``text`` (after NFKD, accents apart) French text rarely has, the
    first, and how many letters it has: odd are letters outside the French alphabet, symbols
    and controls (``℮``, ``○``, U+0085), and whatever is put inside a word (:data:`_JOINED`)."""
    text = _without(unicodedata.normalize("NFKD", text), ("Mn",))
    wide = _NOT_ASCII.findall(text)  # an ASCII character is never odd
    odd = [c for c in wide if _odd(c)]
    letters = len(_ASCII_LETTER.findall(text)) + sum(c.isalpha() for c in wide)
    joined = [m.group(0) for m in _JOINED.finditer(text)]
    first = odd[0] if odd else (joined[0] if joined else None)
    return len(odd) + len(joined), first, letters


def check_french_text(path: Path, reviews: Sequence[Text]) -> None:
    """Refuse a reviews file that does not read as French text, naming the first odd character:
    a file disguised letter by letter compares with no other, whatever look-alikes a list
    knows."""
    letters, odd, first = 0, 0, None
    for i, review in enumerate(reviews, 1):
        n, c, alpha = odd_characters(review.text)
        odd, letters = odd + n, letters + alpha
        first = first or (c and (i, c))
    if first and odd > MAX_ODD * letters:
        item, c = first
        raise UserError(f"{path}: {odd} of its characters (for {letters} letters) are not French "
                        f"text's (the first, in review {item}: {c!r}, "
                        f"{unicodedata.name(c, hex(ord(c)))}): restore Webis-CLS-10's file")


GRAM, WINDOW = 16, 8
"""A review's letters are compared by fingerprints: the least hash of every :data:`WINDOW`
consecutive runs of :data:`GRAM` letters (winnowing), so two texts sharing a run of
``GRAM + WINDOW - 1`` letters share a fingerprint."""


def skeleton(text: str) -> bytes:
    """A review's letters alone, lowercased, without accents, with look-alikes as their Latin
    letter: whatever is put between or inside its words (trial 20's D-z2 and D-z3: a control, a
    line separator, a hyphen or a dot inside every word; 20b's D-b7: a digit), the same review
    gives the same skeleton."""
    text = unicodedata.normalize("NFKD", text.translate(LOOKALIKE)).casefold()
    return text.encode("ascii", "ignore").translate(None, _NOT_ALPHA)


_NOT_ALPHA = bytes(c for c in range(128) if not chr(c).isalpha())


def fingerprints(text: str) -> set[int]:
    """The winnowed fingerprints of a review's :func:`skeleton` (its one hash when short)."""
    letters = np.frombuffer(skeleton(text), dtype=np.uint8).astype(np.uint64)
    if len(letters) < GRAM + WINDOW:
        return {hash(letters.tobytes())}
    view = np.lib.stride_tricks.sliding_window_view
    hashes = view(letters, GRAM) @ _POWERS  # a polynomial hash, modulo 2**64
    return set(view(hashes, WINDOW).min(axis=1).tolist())


_POWERS = np.array([pow(1_000_003, k, 2**64) for k in range(GRAM)], dtype=np.uint64)


def _telling(index: dict[K, list[int]]) -> dict[K, list[int]]:
    """An index of test reviews without its keys found in more than :data:`COMMON` of them,
    which say nothing of which review a text is."""
    return {key: found for key, found in index.items() if len(found) <= COMMON}


@functools.lru_cache(maxsize=4)
def _test_index(test: tuple[str, ...]) -> tuple[Any, ...]:
    """The test reviews' runs of words, words and fingerprints, and which reviews hold each:
    built once per set of test texts in a process (every split, corpus and run is compared with
    the same 2,000), and only read."""
    test_words = [comparable(text).split() for text in test]
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
    prints = [fingerprints(text) for text in test]
    by_print: dict[int, list[int]] = {}
    for j, held in enumerate(prints):
        for fp in held:
            by_print.setdefault(fp, []).append(j)
    return runs, words, _telling(by_run), by_word, prints, _telling(by_print)


def near_test_reviews(train: Sequence[Text], test: Sequence[Text]) -> int:
    """How many training reviews are a test review, word for word or nearly: :data:`NEAR` of
    the shorter one's runs of words in common, :data:`WORDS_NEAR` of its distinct words, or
    :data:`NEAR` of its letters' fingerprints (the real training file shares 48 of its 2,000
    word for word, 76 nearly)."""
    runs, words, by_run, by_word, prints, by_print = _test_index(tuple(r.text for r in test))
    near = 0
    for review in train:
        text = comparable(review.text).split()
        mine = shingles(text)
        hits = Counter(chain.from_iterable(by_run[run] for run in mine if run in by_run))
        if any(n >= NEAR * min(len(mine), len(runs[j])) for j, n in hits.items()):
            near += 1
            continue
        bag = set(text)
        shared = Counter(j for word in bag for j in by_word.get(word, ()))
        if len(bag) >= MIN_WORDS and any(
                len(bag & words[j]) >= WORDS_NEAR * min(len(bag), len(words[j]))
                for j in sorted(shared, key=lambda j: (-shared[j], j))[:3]):
            near += 1
            continue
        mine_prints = fingerprints(review.text)
        hits = Counter(chain.from_iterable(by_print[fp] for fp in mine_prints if fp in by_print))
        near += any(n >= NEAR * min(len(mine_prints), len(prints[j])) for j, n in hits.items())
    return near


def check_overlap(sources: Mapping[str, Path], train: Sequence[Text], test: Sequence[Text],
                  fix: str = "restore Webis-CLS-10's training file") -> None:
    """Refuse a training file that is mostly the test file's reviews (trial 14's D1: the test
    file plus one byte passed the check that the two files differ); ``fix``: what to do."""
    check_french_text(sources["train"], train)
    check_french_text(sources["test"], test)
    shared = near_test_reviews(train, test)
    if train and shared > max(MAX_SHARED * len(train), MIN_SHARED):
        raise UserError(f"{sources['train']} shares {shared} of its {len(train)} reviews with "
                        f"{sources['test']}: the test reviews would be trained on; {fix}")
