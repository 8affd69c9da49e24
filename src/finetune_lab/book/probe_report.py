"""What weights hold before fine-tuning: the linear probes, and the ablation of the ``<s>`` objective.

The probes (``finetune-lab probe``) score frozen features in minutes; this module reads them
beside the lab-recipe fine-tuning of the same weights, and sets the runs that trained on whole
lines with and without the ``<s>`` bag-of-words objective side by side.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from finetune_lab.book import fairseq_report as fr
from finetune_lab.book.report import fmt_seeds
from finetune_lab.book.summary_files import (
    NUMBER,
    PERCENT,
    device_problem,
    read_records,
    weights_record_problem,
)
from finetune_lab.config import paths
from finetune_lab.data.cls_books import default_output as default_cls_dir
from finetune_lab.data.cls_splits import split_sizes
from finetune_lab.models.sizing import SMALL
from finetune_lab.runs.crosscheck import packaged_origin
from finetune_lab.runs.record_names import known_name_problem, other_record_problem
from finetune_lab.runs.registry import RunRecord, discover_runs
from finetune_lab.runs.run_inputs import cached_sha256, recorded_checkpoint_sha
from finetune_lab.train.finetune_fairseq import candidate_experiments
from finetune_lab.train.linear_probe import SPLIT_FILES, probe_dir

PROBE_FIELDS = ((("name",), str), (("init",), str), (("wall_time_s",), NUMBER, (0, 1e7)),
                (("probes", "<s>", "test_accuracy"), NUMBER, PERCENT),
                (("probes", "mean", "test_accuracy"), NUMBER, PERCENT))


def _probe_problem(record: dict, lab: dict[str, int], runs_base: Path,
                   packaged: tuple[str, str] | None) -> str | None:
    """A pretrained probe names its weights; every probe was run on the lab's splits (a probe
    of a few reviews was a number in the table like any other), its accuracies are counts of
    their test reviews, and it is no older than the weights it names."""
    sizes = record.get("sizes")
    if not isinstance(sizes, dict) or any(sizes.get(s) != lab[s] for s in lab):
        return (f"probed splits of {sizes} reviews, not CLS-Books' ({lab['train']} train, "
                f"{lab['valid']} valid, {lab['test']} test)")
    grid = record.get("C_grid")
    for feature in ("<s>", "mean"):  # each accuracy is a count of its reviews, in %, and C
        probe = record["probes"][feature]  # was chosen from the record's own grid (trial 10)
        for split in ("valid", "test"):
            value = probe.get(f"{split}_accuracy")
            correct = value * lab[split] / 100 if isinstance(value, (int, float)) else 0.5
            if abs(correct - round(correct)) > 0.01:
                return (f"has probes.{feature}.{split}_accuracy = {value}, which no count of "
                        f"{lab[split]} {split} reviews gives")
        if not isinstance(grid, list) or probe.get("C") not in grid:
            return f"has probes.{feature}.C = {probe.get('C')}, not one of its C_grid {grid}"
    if not isinstance(record.get("max_tokens"), int) or not 0 < record["max_tokens"] <= \
            SMALL.max_positions:
        return (f"reads {record.get('max_tokens')!r} tokens of each review, which no model of "
                f"{SMALL.max_positions} positions reads")
    if record.get("threads") != (record.get("device") or {}).get("threads"):
        return (f"says threads {record.get('threads')} but device.threads "
                f"{(record.get('device') or {}).get('threads')}")
    if (problem := device_problem(record)) is not None:
        return problem
    seed = record.get("seed")
    if (record["init"] == "random") != (isinstance(seed, int) and not isinstance(seed, bool)):
        # `probe --random` records the seed of the initialisation it probed; weights have none
        return (f"says init {record['init']!r} with seed {seed!r}: a random initialisation "
                "has a seed, trained weights have none")
    if record["init"] == "random":
        return known_name_problem(record.get("name"), runs_base, packaged) or (
            other_record_problem(record["name"], None, "probes")
            if isinstance(record.get("name"), str) else None)
    return weights_record_problem(record, runs_base, packaged)


def _same_splits(probes: list[dict], bad: list[str]) -> list[dict]:
    """The probes of the book's splits: those whose recorded split files (their sha256) are the
    prepared ones where they are here, else the ones most probes name; the others go to ``bad``
    (trial 19's P-y1: a probe of another split, 88.0 %, stood in the table)."""
    names = SPLIT_FILES

    def said(p: dict) -> str:  # the split files only (19b's P2, P3: another key, or no map)
        inputs = p.get("inputs")
        return json.dumps({n: inputs.get(n) for n in names} if isinstance(inputs, dict)
                          else repr(inputs), sort_keys=True)
    folder = default_cls_dir()
    if all((folder / n).is_file() for n in names):
        expected, source = json.dumps({n: cached_sha256(folder / n) for n in names},
                                      sort_keys=True), "the prepared ones"
    else:
        shared = Counter(said(p) for p in probes).most_common(1)
        expected, source = (shared[0][0] if shared else ""), "the ones the other probes read"
    kept = [p for p in probes if said(p) == expected]
    bad += [f"`{p['name']}.json` probed other split files than {source} (their sha256 "
            "differ): re-run `finetune-lab probe` on the prepared CLS-Books"
            for p in probes if said(p) != expected]
    return kept


def fine_tuning_runs(runs_root: Path | None = None) -> list[RunRecord]:
    """Every run of the lab's fairseq recipe that the probe and candidate tables read (the
    grid's and the candidates'), valid or not: the chapter's footer names them."""
    base = Path(runs_root) if runs_root is not None else paths().runs
    return discover_runs(base, [fr.EXPERIMENT, *candidate_experiments(runs_root)])


def probe_table(probes_dir: Path | None = None, runs_root: Path | None = None,
                set_aside: list[str] | None = None,
                excluded: list[str] | None = None) -> pd.DataFrame:
    """Every linear probe of ``data/summaries/probes/`` (``finetune-lab probe``) beside the
    lab-recipe fine-tuning of the same weights: the candidates' and the packaged checkpoint's,
    matched by the checkpoint's sha256; a random initialisation's beside the grid's random runs.
    A damaged probe file is left out, with one line in ``set_aside`` naming it; the fine-tuning
    runs the registry excluded go to ``excluded`` (their weights are not read, so a probe
    without a valid run reads "no valid run" while any is: trial 19's G-e4).
    """
    folder = Path(probes_dir) if probes_dir is not None else probe_dir()
    lab = split_sizes()  # the lab's splits, read once for every record
    base = Path(runs_root) if runs_root is not None else paths().runs
    packaged = packaged_origin()
    probes, bad = read_records(folder, PROBE_FIELDS,
                               more=lambda r: _probe_problem(r, lab, base, packaged))
    probes = _same_splits(probes, bad)
    if set_aside is not None:
        set_aside += bad
    # checkpoint sha256 (or "random") -> seed -> test accuracy; the same weights fine-tuned
    # with the same seed in two experiments (a candidate, then the packaged checkpoint's grid)
    # count once, the grid's first
    tuned: dict[str, dict[int, float]] = {}
    dropped: list[str] = []
    for experiment in [fr.EXPERIMENT, *candidate_experiments(runs_root)]:
        res = fr.load_results(runs_root, experiment)
        dropped += [r.key for r in res.loaded.runs if not r.valid and not r.unfinished]
        if not res.ready:
            continue
        for rec in res.loaded.runs:
            if not rec.valid:
                continue
            key = "random" if rec.init == "random" else recorded_checkpoint_sha(rec.manifest)
            if key == "random" and experiment != fr.EXPERIMENT:
                continue
            test = res.best.loc[(res.best["init"] == rec.init) & (res.best["seed"] == rec.seed),
                                "test"].astype(float)
            for value in test.tolist():
                tuned.setdefault(key, {}).setdefault(int(rec.seed), value)
    rows = []
    for p in probes:
        key = "random" if p["init"] == "random" else p["checkpoint"]["sha256"]
        acc = pd.Series(list(tuned.get(key, {}).values()), dtype=float)
        rows.append({"weights": p["name"], "init": p["init"],
                     "probe on <s> (%)": p["probes"]["<s>"]["test_accuracy"],
                     "probe on the mean (%)": p["probes"]["mean"]["test_accuracy"],
                     "fine-tuned (%)": (fmt_seeds(acc.mean(), acc.std(ddof=1), len(acc))
                                        if len(acc) else "no valid run" if dropped
                                        else "no run cached"),
                     "probe time (min)": round(p["wall_time_s"] / 60, 1),
                     "fine-tuned mean": acc.mean() if len(acc) else float("nan")})
    if excluded is not None:
        excluded += dropped
    return pd.DataFrame(rows, columns=["weights", "init", "probe on <s> (%)",
                                       "probe on the mean (%)", "fine-tuned (%)",
                                       "probe time (min)", "fine-tuned mean"])


@dataclass(frozen=True)
class ProbeReading:
    """What :func:`probe_table` says: random's frozen features against the best pretrained."""

    random_mean: float
    random_s: float
    random_tuned: str
    best: str
    best_mean: float
    best_s: float
    best_gain: float
    minutes: float


def probe_reading(table: pd.DataFrame) -> ProbeReading | None:
    """The reading of the probe table, or None until both random and pretrained were probed."""
    rand, pre = table[table["init"] == "random"], table[table["init"] == "pretrained"]
    if rand.empty or pre.empty:
        return None
    r = rand.iloc[0]
    b = pre.loc[pre["probe on the mean (%)"].idxmax()]
    return ProbeReading(
        random_mean=float(r["probe on the mean (%)"]), random_s=float(r["probe on <s> (%)"]),
        random_tuned=r["fine-tuned (%)"], best=b["weights"],
        best_mean=float(b["probe on the mean (%)"]), best_s=float(b["probe on <s> (%)"]),
        best_gain=float(b["probe on the mean (%)"] - r["probe on the mean (%)"]),
        minutes=float(table["probe time (min)"].median()))


def objective_table(cand: pd.DataFrame, probes: pd.DataFrame) -> pd.DataFrame:
    """The candidates that trained on whole lines (``--sample-break-mode eos``), with and without
    the ``<s>`` bag-of-words objective: its weight, the held-out reviews' masked-LM loss, the
    probes of their frozen features and their fine-tuning (from the chapter's candidate and
    probe tables; NaN where a run was not probed or not fine-tuned)."""
    columns = ["run", "continues", "<s> bag-of-words weight", "tokens (M, all runs)",
               "tokens per update (measured)", "valid loss, reviews (bits)", "probe on <s> (%)", "probe on the mean (%)",
               "fine-tuned (%)", "fine-tuned mean", "minus random (points)", "ci_low", "ci_high"]
    if cand.empty or "samples" not in cand:
        return pd.DataFrame(columns=columns)
    probed = {row["weights"]: row for _, row in probes.iterrows()}
    rows = []
    for _, c in cand[cand["samples"] == "whole lines"].iterrows():
        probe = probed.get(c["run"].strip("`").split(" ")[0].split("/")[-1])
        rows.append([c["run"], c["continued"] if isinstance(c["continued"], str) else "",
                     c["bag weight"], c["tokens (M, all runs)"],
                     c["tokens per update (measured)"], c["valid loss, reviews (bits)"],
                     float("nan") if probe is None else probe["probe on <s> (%)"],
                     float("nan") if probe is None else probe["probe on the mean (%)"],
                     c["test acc. (%)"] if isinstance(c["test acc. (%)"], str)
                     else "not fine-tuned", c["acc mean"], c["minus random (points)"],
                     c["ci_low"], c["ci_high"]])
    return pd.DataFrame(rows, columns=columns)


@dataclass(frozen=True)
class ObjectiveReading:
    """The bag-of-words run against its control (same start, corpus, budget and seed): the
    differences of their probes and of their fine-tuning (NaN where one side lacks it), and the
    bag run's fine-tuning against random initialisation (difference and 95 % Welch interval)."""

    bag: str
    control: str
    weight: float
    probe_s: float
    probe_mean: float
    tuned: float
    bag_vs_random: float
    bag_ci: tuple[float, float]


def objective_reading(table: pd.DataFrame) -> ObjectiveReading | None:
    """The first bag-of-words run against its control: a run without the objective that
    continues the same weights with the same budget (the same tokens behind it); None until
    such a pair is recorded."""
    bag = table[table["<s> bag-of-words weight"] > 0]
    control = table[table["<s> bag-of-words weight"] == 0]
    pairs = [(b, c) for _, b in bag.iterrows() for _, c in control.iterrows()
             if b["continues"] == c["continues"]
             and abs(b["tokens (M, all runs)"] - c["tokens (M, all runs)"]) < 0.05]
    if not pairs:
        return None
    b, c = pairs[0]
    return ObjectiveReading(
        bag=b["run"], control=c["run"], weight=float(b["<s> bag-of-words weight"]),
        probe_s=float(b["probe on <s> (%)"] - c["probe on <s> (%)"]),
        probe_mean=float(b["probe on the mean (%)"] - c["probe on the mean (%)"]),
        tuned=float(b["fine-tuned mean"] - c["fine-tuned mean"]),
        bag_vs_random=float(b["minus random (points)"]) if pd.notna(b["minus random (points)"])
        else float("nan"), bag_ci=(b["ci_low"], b["ci_high"]))
