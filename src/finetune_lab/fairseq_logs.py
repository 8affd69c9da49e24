"""Reading fairseq's own training log: the rates it prints, for run manifests.

Pretraining and fine-tuning both record fairseq's median throughput from ``train.log``.
"""

from __future__ import annotations

import re

# fairseq's "simple" log writes "wps=123.4, ups=5.6" to files and "| wps 123.4 | ups 5.6" to ttys.
_NUMBER = r"([0-9.]+(?:e[+-]?[0-9]+)?)"  # fairseq writes 1.34e+06 past a million
_UPS_RE = re.compile(r"\bups[=\s]+" + _NUMBER)
_WPS_RE = re.compile(r"\bwps[=\s]+" + _NUMBER)


def log_rates(log_text: str) -> dict[str, float]:
    """Median updates/s and words (tokens)/s over fairseq's ``train_inner`` log lines."""
    import statistics

    lines = [ln for ln in log_text.splitlines() if "| train_inner |" in ln]
    ups = [float(m.group(1)) for ln in lines if (m := _UPS_RE.search(ln))]
    wps = [float(m.group(1)) for ln in lines if (m := _WPS_RE.search(ln))]
    if not ups:
        return {}
    # The first interval includes start-up; leave it out when there are others.
    ups, wps = (ups[1:], wps[1:]) if len(ups) > 1 else (ups, wps)
    return {"updates_per_s": statistics.median(ups), "tokens_per_s": statistics.median(wps)}


def last_update(log_text: str) -> int | None:
    """The last ``num_updates`` fairseq logged (below ``max_update`` if the time budget hit)."""
    found = re.findall(r"\bnum_updates[=\s]+([0-9]+)", log_text)
    return int(found[-1]) if found else None
