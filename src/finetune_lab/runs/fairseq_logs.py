"""Reading fairseq's own training log: the rates it prints, for run manifests.

Pretraining and fine-tuning both record fairseq's median throughput from ``train.log``, and a
long pretraining run echoes its progress from the lines fairseq adds to it.

This reads fairseq's text log ("simple" format) rather than its TensorBoard scalars or its JSON
log format, although every run recorded under ``data/runs`` has ``wps`` and ``ups`` among its
``train_inner`` scalars:

- the calibration run that turns a time budget into updates writes no event files: its captured
  output is all there is to read;
- the scalars are fairseq's values before it prints them to 6 significant digits, in float32,
  while the manifests and the book hold the printed ones: ``pretrain-gpu/gpu``'s median read
  335,469.66 tokens/s from its scalars and 335,469.5 from its log and manifest (the two agree,
  on all 27 runs recorded, only once each scalar is rounded back to 6 digits);
- ``--log-format json`` would change the layout of ``train.log``, into which a long run's later
  segments append (``pretrain/cpu-long3``'s earlier segments are in the simple format), and the
  progress shown while a run trains reads the new lines as fairseq writes them.
"""

from __future__ import annotations

import functools
import re
import statistics

# fairseq's "simple" log writes "wps=123.4, ups=5.6" to files and "| wps 123.4 | ups 5.6" to ttys.
_NUMBER = r"([0-9.]+(?:e[+-]?[0-9]+)?)"  # fairseq writes 1.34e+06 past a million
_STAT_RE = {name: re.compile(rf"\b{name}[=\s]+" + _NUMBER)
            for name in ("ups", "wps", "wpb", "num_updates")}
_UPDATES_RE = re.compile(r"\bnum_updates[=\s]+([0-9]+)")
_EPOCH_SIZE_RE = re.compile(r"\| epoch [0-9]+:\s+[0-9]+ / ([0-9]+) ")
TRAIN_INNER = "| INFO | train_inner |"
"""What marks the lines fairseq logs every ``--log-interval`` updates while it trains: at level
INFO, as the lines the event files are checked against (check 25b's M-l6: WARNING copies with
rates tripled moved the median the manifest's throughput is held to)."""


def line_stat(line: str, name: str) -> float | None:
    """The value of ``name`` (``ups``, ``wps``, ``wpb`` or ``num_updates``) in one log line, or None."""
    found = _STAT_RE[name].search(line)
    return float(found.group(1)) if found else None


def log_rates(log_text: str) -> dict[str, float]:
    """Median updates/s and words (tokens)/s over fairseq's ``train_inner`` log lines."""
    lines = [ln for ln in log_text.splitlines() if TRAIN_INNER in ln]
    ups = [v for ln in lines if (v := line_stat(ln, "ups")) is not None]
    wps = [v for ln in lines if (v := line_stat(ln, "wps")) is not None]
    if not ups:
        return {}
    # The first interval includes start-up; leave it out when there are others.
    ups, wps = (ups[1:], wps[1:]) if len(ups) > 1 else (ups, wps)
    return {"updates_per_s": statistics.median(ups), "tokens_per_s": statistics.median(wps)}


def mean_tokens_per_update(log_text: str) -> float | None:
    """The mean of fairseq's ``wpb`` (tokens per update, padding included) over its
    ``train_inner`` lines: what an update held when batches are by tokens, not sequences."""
    wpb = [v for ln in log_text.splitlines() if TRAIN_INNER in ln
           and (v := line_stat(ln, "wpb")) is not None]
    return statistics.fmean(wpb) if wpb else None


def updates_per_epoch(log_text: str) -> int | None:
    """Updates in one pass over the training data, from fairseq's ``epoch 001:  10 / 469``
    progress: with batches by tokens (whole-line samples) the only exact count of it."""
    found = _EPOCH_SIZE_RE.findall(log_text)
    return int(found[-1]) if found else None


def last_update(log_text: str) -> int | None:
    """The last ``num_updates`` fairseq logged (below ``max_update`` if the time budget hit)."""
    found = _UPDATES_RE.findall(log_text)
    return int(found[-1]) if found else None


_SUBSET_LINE = re.compile(r"^(?P<stamp>.*?) ?\| INFO \| (?P<subset>\w+) \| (?P<rest>.*)$")
_PRINTED = re.compile(r"\b(loss|accuracy|ups|wps|wpb|train_wall|wall)[=\s]+"
                      r"(-?[0-9.]+(?:e[+-]?[0-9]+)?)")
"""The values of a subset's line that its event files log too (``wall``: fairseq's wall meter,
the seconds since training started; ``train_wall``: the seconds the interval trained)."""


def _decimals(text: str) -> int:
    """The decimals a printed number is rounded to: negative for 1.34e+06 (ten thousands)."""
    mantissa, _, exponent = text.partition("e")
    return len(mantissa.partition(".")[2]) - (int(exponent) if exponent else 0)


@functools.lru_cache(maxsize=256)
def printed_metrics(log_text: str) -> dict[tuple[str, int], dict[str, list[tuple[float, int]]]]:
    """Each loss and accuracy fairseq printed, by subset (its logger: ``train_inner``, ``train``,
    ``valid``, ``test``, ...) and update: the value and its decimals (printed rounded). A long
    run's later launches append to the log, so an update may be printed more than once. Parsed
    once per process and text (a copied run store's logs are read again): never change it."""
    found: dict[tuple[str, int], dict[str, list[tuple[float, int]]]] = {}
    for _stamp, subset, update, rest in _subset_lines(log_text):
        at, seen = found.setdefault((subset, update), {}), set()
        for name, text in _PRINTED.findall(rest):
            if name in seen:  # the first of each name in a line, as fairseq prints one
                continue
            seen.add(name)
            try:
                at.setdefault(name, []).append((float(text), _decimals(text)))
            except ValueError:  # "1.2.3": printed by no fairseq
                continue
    return found


@functools.lru_cache(maxsize=4)
def _subset_lines(log_text: str) -> tuple[tuple[str, str, int, str], ...]:
    """``(stamp, subset, update, rest)`` of each line fairseq logs for a subset at an update
    (parsed once for the registry's several checks of one log)."""
    found = []
    for line in log_text.splitlines():
        if (match := _SUBSET_LINE.search(line)) is not None \
                and (updates := _UPDATES_RE.search(match["rest"])) is not None:
            found.append((match["stamp"], match["subset"], int(updates.group(1)), match["rest"]))
    return tuple(found)


def held_line(level: str, logger: str, message: str) -> bool:
    """Whether a line (its level, logger and message) is one fairseq logs for a subset at an
    update, as :func:`_subset_lines` reads them: its values and stamp are held to the event
    files."""
    return level == "INFO" and logger.isidentifier() and _UPDATES_RE.search(message) is not None


def printed_times(log_text: str) -> dict[tuple[str, int], list[str]]:
    """The stamps of the lines fairseq logged for a subset at an update (by subset and update;
    a long run's later launches log an update again)."""
    found: dict[tuple[str, int], list[str]] = {}
    for stamp, subset, update, _rest in _subset_lines(log_text):
        found.setdefault((subset, update), []).append(stamp)
    return found
