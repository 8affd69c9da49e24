"""The lab's answers, one fact each, for the front page and the chapters' opening callouts.

Each field is a plain value read through the same functions the chapters use (the registry's
valid runs only), so that a page states an answer with inline values and guards its wording with
:func:`holds`: a render whose runs no longer support a sentence fails, naming the claim and the
runs the registry excluded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from finetune_lab.book import devices, fairseq_report, hf_compare, standin
from finetune_lab.book.claims import excluded_in, holds, needs  # noqa: F401  (the pages' guards)
from finetune_lab.book.course_reference import COURSE_TEST_ACCURACY
from finetune_lab.book.decomposition import decomposition_table
from finetune_lab.book.lora_cls_report import gaps_to_full
from finetune_lab.book.lora_cls_runs import cached_runs as lora_cached_runs
from finetune_lab.book.pretrain_candidates import candidate_table
from finetune_lab.book.pretrain_report import load_pretrain_runs
from finetune_lab.book.report import fmt_int, signed
from finetune_lab.models import params
from finetune_lab.runs import seedstats
from finetune_lab.runs.runspeed import device_name


@dataclass(frozen=True)
class Gap:
    """A difference of mean test accuracies (points) with its 95 % Welch interval."""

    diff: float
    low: float
    high: float

    @property
    def clear(self) -> bool:
        """Whether the seeds tell the two apart (the interval excludes 0)."""
        return self.low > 0 or self.high < 0

    def text(self, digits: int = 1) -> str:
        # no-break spaces keep a number with its unit on one line (and size a PDF column)
        return (f"{signed(self.diff, digits)}\u00a0points (95\u00a0% CI "
                f"{signed(self.low, digits)} to {signed(self.high, digits)})")


@dataclass(frozen=True)
class Accuracy:
    """Test accuracy at the best-validation epoch over seeds."""

    mean: float
    std: float
    n: int

    def text(self, digits: int = 1) -> str:
        return (f"{self.mean:.{digits}f}\u00a0±\u00a0{self.std:.{digits}f}\u00a0% "
                f"(n\u00a0=\u00a0{self.n})")


def q1_counts() -> dict[str, int]:
    """Question 1 under the lab's convention, and the two other totals writeups give."""
    conv = params.convention_table()
    lab, encoder, omission = (int(x) for x in conv["total"][:3])
    return {"lab": lab, "encoder": encoder, "omission": omission}


def fairseq_accuracies() -> tuple[Accuracy, Accuracy, Gap] | None:
    """fairseq pretrained and random (test at the best-validation epoch) and their gap."""
    res = fairseq_report.load_results()
    g = fairseq_report.gap(res)
    if g is None:
        return None
    best = res.best.assign(test=res.best["test"].astype(float))
    std = best.groupby("init")["test"].std(ddof=1)
    return (Accuracy(g.mean_a, float(std["pretrained"]), g.n_a),
            Accuracy(g.mean_b, float(std["random"]), g.n_b),
            Gap(g.diff, g.ci_low, g.ci_high))


def transformers_result() -> tuple[Accuracy, Gap] | None:
    """Transformers pretrained (test at the best-validation epoch) and Transformers − fairseq."""
    comp = hf_compare.load_comparison()
    fw = hf_compare.framework_gaps(comp)
    row = fw[(fw["init"] == "pretrained") & fw["difference"].notna()]
    best = comp.best
    mine = (best.loc[(best["framework"] == "transformers") & (best["init"] == "pretrained"),
                     "test"].astype(float) if not best.empty else pd.Series(dtype=float))
    if row.empty or len(mine) < 2:
        return None
    r = row.iloc[0]
    return (Accuracy(float(mine.mean()), float(mine.std(ddof=1)), len(mine)),
            Gap(float(r["difference"]), float(r["ci_low"]), float(r["ci_high"])))


def lora_results() -> pd.DataFrame:
    """Per LoRA method on RoBERTa: LoRA − full with its interval (empty without runs)."""
    loaded = lora_cached_runs()
    return gaps_to_full(loaded) if loaded is not None else pd.DataFrame()


def standin_cost() -> dict[str, Any] | None:
    """Tokens and recorded hours behind the packaged checkpoint, over every run of its lineage
    (read through the registry; None when a step's run is not valid), and their devices."""
    steps, found = standin.lineage_steps(), standin.lineage_records()
    if not steps or len(found) < len(steps):
        return None
    return {"hours": sum(float(r.manifest.get("wall_time_s") or 0) for _, r in found) / 3600,
            "tokens_m": sum(standin.step_tokens(s, r) for s, r in found) / 1e6,
            "runs": len(found),
            "devices": sorted({r.manifest.get("device", {}).get("type", "cpu") for _, r in found}),
            "device_names": sorted({device_name(r.manifest, cores=True) for _, r in found})}


def candidates() -> pd.DataFrame:
    """The packaged checkpoint and every set of weights tried beside it, fine-tuned
    (:func:`~finetune_lab.book.pretrain_candidates.candidate_table`)."""
    return candidate_table(load_pretrain_runs())


def decomposition(cand: pd.DataFrame | None = None) -> pd.DataFrame:
    """The appendix's decomposition of the stand-in's gain over random, step by step."""
    return decomposition_table(candidates() if cand is None else cand)


def _on_gpu(framework: str, group: str) -> pd.Series:
    """Test accuracies of one framework's valid GPU runs of one group (init)."""
    table = devices.runs_by_device(framework)
    return table[(table["device"] == "GPU") & (table["group"] == group)]["test"]


def _welch(a: tuple[str, pd.Series], b: tuple[str, pd.Series]) -> seedstats.InitGap | None:
    """a − b by Welch's method, or None without two values a side."""
    if min(len(a[1]), len(b[1])) < 2:
        return None
    both = pd.DataFrame({"init": [a[0]] * len(a[1]) + [b[0]] * len(b[1]),
                         "test": [*a[1], *b[1]]})
    return seedstats.init_gap(both, a[0], b[0])


def random_init_by_library() -> seedstats.InitGap | None:
    """Transformers − fairseq from random weights on the GPU, where both grids ran (each library
    draws the random weights with its own initialiser), or None without two seeds a side."""
    return _welch(("transformers", _on_gpu("transformers", "random")),
                  ("fairseq", _on_gpu("fairseq", "random")))


def pretrained_by_library() -> seedstats.InitGap | None:
    """Transformers − fairseq from the stand-in on the GPU, where each grid has more seeds than
    the lab's three on the CPU, or None without two seeds a side."""
    return _welch(("transformers", _on_gpu("transformers", "pretrained")),
                  ("fairseq", _on_gpu("fairseq", "pretrained")))


def init_gap_on_gpu(framework: str) -> seedstats.InitGap | None:
    """Pretrained − random of one framework's GPU runs, or None without two seeds a side."""
    return _welch(("pretrained", _on_gpu(framework, "pretrained")),
                  ("random", _on_gpu(framework, "random")))


def course_range(init: str) -> str:
    """The course writeups' test accuracy for an initialisation (an external reference)."""
    return COURSE_TEST_ACCURACY[init].text()


__all__ = ["Accuracy", "excluded_in", "holds", "needs", "Gap", "candidates", "course_range", "decomposition", "fairseq_accuracies", "fmt_int", "init_gap_on_gpu", "lora_results", "pretrained_by_library", "random_init_by_library",
           "q1_counts", "standin_cost", "transformers_result"]
