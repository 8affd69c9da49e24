"""The front page's "results at a glance": one row per headline result, computed live from the
same functions the chapters call, each linking to the chapter that explains it."""

from __future__ import annotations

import pandas as pd

from finetune_lab.book import fairseq_report, hf_compare
from finetune_lab.book.lora_cls_report import gaps_to_full
from finetune_lab.book.lora_cls_runs import cached_runs as lora_cached_runs
from finetune_lab.book.pretrain_budget import checkpoint_tag, pretrain_budget
from finetune_lab.book.report import fmt_int
from finetune_lab.models import params


def _link(text: str, chapter: str) -> str:
    return f"[{text}](chapters/{chapter}.qmd)"


def _gap(diff: float, low: float, high: float) -> str:
    return f"{diff:+.1f} points (95 % CI {low:+.1f} to {high:+.1f})"


def glance_table() -> pd.DataFrame:
    """Q1's count per convention; fairseq pretrained against random; Transformers against
    fairseq; LoRA's trainable share and its gap to full fine-tuning. A result the run cache
    cannot give yet says so instead."""
    rows = []
    conv = params.convention_table()
    for _, c in conv[conv["writeup answer"].notna()].iterrows():
        rows.append({"question": "Q1: parameters, " + c["convention"].split(":")[0],
                     "result": fmt_int(int(c["total"])),
                     "chapter": _link("Architecture", "architecture")})
    res = fairseq_report.load_results()
    if res.has_gap:
        g = fairseq_report.gap(res)
        tag = checkpoint_tag(pretrain_budget())
        rows.append({"question": "fairseq: pretrained stand-in" + (f" ({tag})" if tag else "")
                                 + " vs random initialisation",
                     "result": f"{g.mean_a:.1f} % vs {g.mean_b:.1f} % (n = {g.n_a}, {g.n_b}); "
                               + _gap(g.diff, g.ci_low, g.ci_high),
                     "chapter": _link("fairseq", "fairseq")})
    else:
        rows.append({"question": "fairseq: pretrained vs random", "result": "not run yet",
                     "chapter": _link("fairseq", "fairseq")})
    fw = hf_compare.framework_gaps(hf_compare.load_comparison())
    pre = fw[(fw["init"] == "pretrained") & fw["difference"].notna()]
    rows.append({"question": "Transformers vs fairseq, same recipe (pretrained)",
                 "result": (_gap(*pre[["difference", "ci_low", "ci_high"]].iloc[0]) + ", "
                            + ("within seed noise" if pre["within seed noise"].iloc[0]
                               else "beyond seed noise")) if not pre.empty else "not run yet",
                 "chapter": _link("Transformers", "transformers")})
    loaded = lora_cached_runs()  # None without LoRA runs
    gaps = gaps_to_full(loaded) if loaded is not None else pd.DataFrame()
    for _, g in gaps.iterrows():
        rows.append({"question": f"LoRA ({g['method']}): trainable share, gap to full fine-tuning",
                     "result": f"{100 * g['trainable / full']:.2f} % of the parameters; "
                               + _gap(g["test gap (points)"], g["ci_low"], g["ci_high"]),
                     "chapter": _link("LoRA", "lora")})
    if gaps.empty:
        stale = loaded is not None and any(r.stale_checkpoint for r in loaded.excluded)
        rows.append({"question": "LoRA vs full fine-tuning",
                     "result": ("to be re-run: its runs were made from an earlier checkpoint"
                                if stale else "not run yet"),
                     "chapter": _link("LoRA", "lora")})
    return pd.DataFrame(rows)
