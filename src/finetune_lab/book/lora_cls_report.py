"""What the LoRA chapter shows of the CLS-Books experiment: methods, results, gaps to full.

The runs are made by :mod:`finetune_lab.train.lora_cls` and read by
:mod:`finetune_lab.book.lora_cls_runs`. This module gives the method table (peft's counts on a
meta-device RoBERTa-small-fr next to the formula), the results table, each LoRA method's gap to
full fine-tuning with its Welch interval (:func:`gaps_to_full`, shown by :func:`gaps_table`),
and the two state-dependent paragraphs the chapter prints: which runs are used
(:func:`state_markdown`) and what the memory and times say (:func:`gaps_markdown`).

The trainable share has one definition throughout: trainable parameters over all parameters
of the wrapped model, as peft's ``print_trainable_parameters()`` reports it
(:func:`trainable_share`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import pandas as pd

from finetune_lab.book.lora_cls_runs import method_of, per_run_table, summary
from finetune_lab.book.report import fmt_int, fmt_lr, signed
from finetune_lab.config import paths
from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
from finetune_lab.models.hf_convert import hf_model_config
from finetune_lab.models.params import SMALL, RobertaSize
from finetune_lab.render_cache import per_render
from finetune_lab.runs.listing import exclusions_markdown
from finetune_lab.runs.runmeasure import count_parameters
from finetune_lab.runs.runspeed import overlapping, settings_sentence, speed_table
from finetune_lab.runs.seedstats import fmt_mean_std, init_gap
from finetune_lab.runs.tblogs import LoadedRuns
from finetune_lab.train.lora_cls import (DEFAULT_METHODS, DEFAULT_SEEDS, EXPERIMENT,
                                         FULL_BASELINE, FULL_COMMAND, METHODS,
                                         RUN_COMMAND, analytic_counts, get_method, run_command,
                                         wrap)


@per_render
def method_table(size: RobertaSize | None = None, methods: Iterable[str] = METHODS
                 ) -> pd.DataFrame:
    """Per method: adapted layers, learning rate, trainable and total parameters (peft on a
    meta-device RoBERTa of ``size``, default RoBERTa-small-fr) and the formula's count.

    QLoRA is counted in full precision: 4-bit storage changes no count in peft's report.
    """
    import torch
    from transformers import RobertaForSequenceClassification

    size = size if size is not None else SMALL
    rows = []
    for name in methods:
        m = get_method(name)
        with torch.device("meta"):
            model = RobertaForSequenceClassification(hf_model_config(size))
        base_total = sum(p.numel() for p in model.parameters())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # peft warns about meta tensors
            trainable, total = count_parameters(wrap(model, m))
        analytic = analytic_counts(m, size.dim, size.layers, size.classes, base_total)[0]
        rows.append({"method": name, "description": m.label,
                     "adapted layers": ", ".join(m.targets) if m.targets else "all weights",
                     "peak lr": m.lr(), "trainable (peft)": trainable, "analytic": analytic,
                     "all params (peft)": total, "trainable %": 100 * trainable / total})
    return pd.DataFrame(rows)


def trainable_share(method: str = "lora-qv") -> float:
    """Trainable parameters over all parameters of the wrapped model (peft's
    ``print_trainable_parameters()`` definition), as a fraction: the one share the book gives."""
    row = method_table().set_index("method").loc[method]
    return float(row["trainable (peft)"] / row["all params (peft)"])


def results_table(loaded: LoadedRuns) -> pd.DataFrame:
    """The LoRA-vs-full table: one row per method, accuracy as ``mean ± std (n=…)``."""
    s = summary(loaded)

    def params(lo: int, hi: int) -> str:
        return fmt_int(lo) if lo == hi else f"{fmt_int(lo)}–{fmt_int(hi)}"

    return pd.DataFrame({
        "method": s["method"],
        "peak lr": [fmt_lr(x) for x in s["lr"]],
        "trainable params": [params(a, b) for a, b in zip(s["trainable_min"], s["trainable_max"])],
        "trainable %": [f"{100 * a / t:.2f} %" for a, t in zip(s["trainable_max"], s["total"])],
        "best valid acc. (%)": [fmt_mean_std(m, sd, n) for m, sd, n in
                                zip(s["valid_mean"], s["valid_std"], s["n"])],
        "test acc. at best valid epoch (%)": [fmt_mean_std(m, sd, n) for m, sd, n in
                                              zip(s["test_mean"], s["test_std"], s["n"])],
        "time per run (min)": [f"{t / 60:.1f}" if t == t else "–" for t in s["time_s"]],
        "peak memory (MiB)": [f"{b / 2**20:,.0f} ({d})" if b == b else "–" for b, d in
                              zip(s["peak_bytes"], s["peak_device"])],
    })


TRAINING_STATE_BYTES = 4 + 2 * 4
"""Per trainable parameter, in fp32 (how every run here trains): its gradient and Adam's two
moments. What LoRA saves, per parameter it freezes."""


def gaps_to_full(loaded: LoadedRuns) -> pd.DataFrame:
    """Each LoRA method against full fine-tuning: test accuracy (means and sample standard
    deviations) and the difference LoRA − full at the best-valid epoch with its 95 % Welch
    interval, the trainable share (:func:`trainable_share`'s definition), the ratios of time per
    run and peak memory, and the training state the frozen parameters no longer need beside the
    peak memory actually saved. A method with fewer than two seeds (or no full row) gets no
    line."""
    columns = ["method", "n", "n full", "test mean", "test std", "full mean", "full std",
               "test gap (points)", "ci_low", "ci_high", "trainable share", "time / full",
               "peak memory / full", "state saved (MiB)", "peak saved (MiB)", "peak device",
               "lr", "lr full"]
    if not loaded.used:  # every recorded run excluded (made from an earlier checkpoint, say)
        return pd.DataFrame(columns=columns)
    runs = per_run_table(loaded)
    s = summary(loaded, runs).set_index("method")
    if "full" not in s.index or s.loc["full", "n"] < 2:
        return pd.DataFrame(columns=columns)
    best = runs.assign(init=runs["method"])
    full = s.loc["full"]
    rows = []
    for method in s.index:
        m = s.loc[method]
        if method == "full" or m["n"] < 2:
            continue
        g = init_gap(best, method, "full", "test")
        rows.append({
            "method": method, "n": g.n_a, "n full": g.n_b, "test mean": m["test_mean"],
            "test std": m["test_std"], "full mean": full["test_mean"],
            "full std": full["test_std"], "test gap (points)": g.diff,
            "ci_low": g.ci_low, "ci_high": g.ci_high,
            "trainable share": m["trainable_max"] / m["total"],
            "time / full": m["time_s"] / full["time_s"],
            "peak memory / full": m["peak_bytes"] / full["peak_bytes"],
            "state saved (MiB)": (full["trainable_max"] - m["trainable_max"])
            * TRAINING_STATE_BYTES / 2**20,
            "peak saved (MiB)": (full["peak_bytes"] - m["peak_bytes"]) / 2**20,
            "peak device": m["peak_device"], "lr": m["lr"], "lr full": full["lr"]})
    return pd.DataFrame(rows, columns=columns)


def verdict(ci_low: float, ci_high: float) -> str:
    """What a 95 % interval of LoRA − full says, in words."""
    if ci_low > 0:
        return "LoRA better, by a margin the seeds show"
    if ci_high < 0:
        return "full fine-tuning better, by a margin the seeds show"
    return "the seeds cannot tell them apart"


def gaps_table(loaded: LoadedRuns | None) -> pd.DataFrame:
    """:func:`gaps_to_full` for display: one row per method, every number rounded. The time
    ratio is left out when runs shared the machine (:func:`time_caveat`): it would measure the
    load as much as the methods."""
    columns = ["difference", "LoRA − full (points)", "95 % Welch CI", "verdict", "time / full",
               "peak memory / full"]
    gaps = gaps_to_full(loaded) if loaded is not None else pd.DataFrame()
    if gaps.empty:
        return pd.DataFrame(columns=columns)
    if shared_or_unknown(loaded):
        columns.remove("time / full")
    return pd.DataFrame({
        "difference": [f"{m} − full" for m in gaps["method"]],
        "LoRA − full (points)": [signed(d) for d in gaps["test gap (points)"]],
        "95 % Welch CI": [f"{signed(lo)} to {signed(hi)}" for lo, hi in
                          zip(gaps["ci_low"], gaps["ci_high"])],
        "verdict": [verdict(lo, hi) for lo, hi in zip(gaps["ci_low"], gaps["ci_high"])],
        "time / full": [f"{x:.2f}" for x in gaps["time / full"]],
        "peak memory / full": [f"{x:.2f}" for x in gaps["peak memory / full"]],
    }, columns=columns)


def gaps_markdown(loaded: LoadedRuns | None) -> str:
    """What the measured memory and times say beside :func:`gaps_table`, and what the gaps
    cannot separate (the method from its learning rate)."""
    if loaded is None or not loaded.used:
        return ""
    gaps = gaps_to_full(loaded)
    if gaps.empty:
        return ("The comparison with full fine-tuning needs at least two seeds of a LoRA method "
                "and of the full row; the cache does not hold them yet.")
    out = []
    measured = ", ".join(
        f"{'drops' if g['peak saved (MiB)'] >= 0 else 'rises'} by "
        f"{abs(g['peak saved (MiB)']):,.0f} MiB under `{g['method']}`"
        for g in gaps.to_dict("records"))
    on_cpu = (gaps["peak device"] == "cpu").all()
    beyond = [g["method"] for g in gaps.to_dict("records")
              if g["peak saved (MiB)"] > g["state saved (MiB)"]]
    out.append(f"Freezing the base model saves its gradients and Adam moments "
               f"({TRAINING_STATE_BYTES} bytes per frozen parameter in fp32): up to "
               f"{gaps['state saved (MiB)'].max():,.0f} MiB here. The measured peak {measured}"
               + (": the peak resident set of a CPU process also holds the Python and torch "
                  "runtime, the data and the activations, which LoRA does not shrink."
                  if on_cpu else ".")
               + (f" Under {', '.join(f'`{m}`' for m in beyond)} it drops by more than "
                  "freezing saves, so part of that drop is not the method's: a peak also "
                  "moves with the memory allocator and what else the process held."
                  if beyond else ""))
    out.append(time_caveat(loaded))
    lora_lrs = sorted({fmt_lr(lr) for lr in gaps["lr"]})
    full_lr = fmt_lr(gaps["lr full"].iloc[0])
    if lora_lrs != [full_lr]:
        out.append(f"Each gap is the method and its learning rate together (LoRA at "
                   f"{', '.join(lora_lrs)}, full fine-tuning at the lab's {full_lr}): "
                   "these runs do not separate the two.")
    return "\n\n".join(out)


def shared_or_unknown(loaded: LoadedRuns) -> bool:
    """Whether a run used may have shared the machine: it overlapped another run, or a run of
    the chapter was rejected, whose times are not read (trial 19's M-y1: a run beside rejected
    runs read as alone)."""
    return any(r.manifest is None for r in loaded.runs) or any(
        overlapping(r, loaded.runs) for r in loaded.used)


def time_caveat(loaded: LoadedRuns) -> str:
    """Whether the time ratios above measure the methods: the runs' devices and threads
    (:func:`~finetune_lab.runs.runspeed.settings_sentence`), and how many of them shared the
    machine with another recorded run for at least half their wall time."""
    shared = [r for r in loaded.used if overlapping(r, loaded.runs)]
    unread = [r for r in loaded.runs if r.manifest is None]
    n = len(loaded.used)
    settings = settings_sentence(speed_table(loaded.used))
    text = f"Times per run are wall times; the {n} runs ran {settings}"
    if shared:
        text += (f", and {len(shared)} of them shared the machine with other runs of this "
                 "chapter for at least half of their time, which slows a run by as much as the "
                 "CPU is shared: their times would measure the methods and the load together, "
                 "so the table gives no time ratio")
    if unread:
        text += (f"{'; and' if shared else ', and'} the times of the {len(unread)} rejected "
                 f"{'run' if len(unread) == 1 else 'runs'} of this chapter are not read, so "
                 "whether a run shared the machine with them is not known: the table gives no "
                 "time ratio")
    return text + "."


def memory_note(loaded: LoadedRuns) -> str:
    """How the peak memory of the used runs was measured (one sentence per distinct measure)."""
    measures = sorted({((r.manifest or {}).get("extra") or {})["peak_memory"]["measure"]
                       for r in loaded.used})
    return "; ".join(measures)


def not_run_text(recorded: bool = False) -> str:
    """The chapter's statement when no usable run exists, with what the runs need;
    ``recorded``: runs exist but every one is excluded (listed after this text)."""
    ckpt = packaged_dir() / MODEL_FILE
    where = ckpt.relative_to(paths().project) if ckpt.is_relative_to(paths().project) else ckpt
    lead = ("**No usable run.** Every run recorded under "
            f"`data/runs/{EXPERIMENT}/` is excluded (listed below)." if recorded else
            "**This experiment has not been run yet.** No valid run is recorded under "
            f"`data/runs/{EXPERIMENT}/`.")
    return (f"{lead} It needs the stand-in pretrained RoBERTa-small-fr "
            f"(`{where}`, converted to Transformers on first use) and the prepared "
            "CLS-Books; then one command makes all "
            f"the runs ({len(DEFAULT_SEEDS)} seeds per method):")


def seeds_missing(loaded: LoadedRuns) -> dict[str, list[int]]:
    """Per method with at least one used run, the planned seeds (:data:`DEFAULT_SEEDS`) that
    have no used run: the rows that stand on fewer runs than the experiment plans."""
    used: dict[str, set[int]] = {}
    for rec in loaded.used:
        used.setdefault(method_of(rec) or "", set()).add(int((rec.manifest or {})["seed"]))
    return {m: missing for m, seeds in used.items()
            if (missing := [s for s in DEFAULT_SEEDS if s not in seeds])}


def state_markdown(loaded: LoadedRuns | None) -> str:
    """What the chapter says about the runs: the command when none is usable, else how many,
    plus every excluded run with its reason."""
    if loaded is None or not loaded.used:
        recorded = loaded is not None and bool(loaded.excluded)
        text = (f"{not_run_text(recorded)}\n\n```bash\n{RUN_COMMAND}\n```\n\nThe full fine-tuning row is "
                f"the Transformers runs from the pretrained checkpoint:\n\n```bash\n"
                f"{FULL_COMMAND}\n```")
    else:
        n = len(loaded.used)
        methods = summary(loaded)["method"].tolist()
        borrowed = [r for r in loaded.used if r.experiment == FULL_BASELINE]
        text = (f"{n} valid run{'s are' if n != 1 else ' is'} used "
                f"({', '.join(f'`{m}`' for m in methods)}; each manifest holds the command "
                f"that made it). Peak memory: {memory_note(loaded)}.")
        if borrowed:
            text += (f"\n\nThe `full` row is the {len(borrowed)} Transformers run"
                     f"{'s' if len(borrowed) != 1 else ''} from the pretrained checkpoint "
                     f"(`data/runs/{FULL_BASELINE}/`: "
                     f"{', '.join(f'`{r.name}`' for r in borrowed)}): the function and recipe "
                     "that `--methods full` would run, so the same runs are not made twice; "
                     + (f"each agrees with the LoRA runs' pinned recipe (`data/runs/{EXPERIMENT}/"
                        "experiment.json`) in everything but what the methods vary."
                        if any(r.experiment == EXPERIMENT for r in loaded.used) else
                        "once a valid LoRA run is in the cache (none is now), each is checked "
                        "against the LoRA runs' pinned recipe."))
        elif "full" not in methods:
            text += (f"\n\nNo full fine-tuning run is recorded yet: `{FULL_COMMAND}` makes "
                     "the row.")
        short = seeds_missing(loaded)
        if short:
            text += ("\n\n**Fewer seeds than planned** "
                     f"({len(DEFAULT_SEEDS)} per method): "
                     + "; ".join(f"`{m}` lacks seed{'s' if len(seeds) > 1 else ''} "
                                 f"{', '.join(map(str, seeds))}" for m, seeds in short.items())
                     + f", so {'its row stands' if len(short) == 1 else 'their rows stand'} "
                     "on fewer runs; the same command makes the missing ones.")
        missing = [m for m in DEFAULT_METHODS if m not in methods]
        # a method whose runs were all made from an earlier checkpoint was run: it waits for a
        # re-run from the current one
        stale = {method_of(r) for r in loaded.excluded if r.stale_checkpoint}
        # a method whose runs are there but were all rejected was run: the reasons come first
        # (trial 21's G-c3: "Not run yet", and a command that would run it over them); a
        # rejected manifest is not read, so its folder's name (METHOD-seedN) says which
        rejected = {r.name.rsplit("-seed", 1)[0] for r in loaded.excluded} - stale
        for heading, which, why, then in (
                ("To be re-run", [m for m in missing if m in stale],
                 " (their runs were made from an earlier stand-in checkpoint, listed below)",
                 f"`{run_command([m for m in missing if m in stale])}` makes the runs."),
                ("Rejected", [m for m in missing if m in rejected],
                 " (every run of it was excluded, for the reasons listed below)",
                 "see to the reasons before running it again."),
                ("Not run yet", [m for m in missing if m not in stale | rejected], "",
                 f"`{run_command([m for m in missing if m not in stale | rejected])}` makes "
                 "the runs.")):
            if which:
                text += (f"\n\n**{heading}:** {', '.join(f'`{m}`' for m in which)}{why}, so "
                         f"the table has no row for {'it' if len(which) == 1 else 'them'}; "
                         f"{then}")
    if loaded is not None and loaded.excluded:
        text += "\n\nExcluded from the table:\n\n" + exclusions_markdown(loaded.runs)
    return text
