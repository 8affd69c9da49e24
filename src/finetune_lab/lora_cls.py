"""LoRA against full fine-tuning of RoBERTa-small-fr on CLS-Books (``finetune-lab finetune lora``).

One experiment, ``data/runs/lora/<method>-seed<seed>/``, whose runs differ by *method* only:

* ``lora-qv``: LoRA (r 16, alpha 32, the lab's dropout 0.05, no bias) on the query and value
  projections of every layer;
* ``lora-attn``: the same on every attention projection (query, key, value and the attention
  output ``attention.output.dense``);
* ``full``: plain full fine-tuning. This is exactly a Transformers run from the pretrained
  checkpoint (same function, same recipe), so by default the table takes that row from the
  Transformers experiment's ``pretrained-seed*`` runs (:data:`FULL_BASELINE`) instead of making
  the same runs twice; they are checked against this experiment's recipe, and
  ``--methods full`` still makes separate ones, which then take precedence;
* ``qlora-qv``: ``lora-qv`` on a base model loaded in 4-bit NF4 with the lab's
  ``BitsAndBytesConfig`` (meant for a GPU; the classifier stays in full precision).

Under LoRA the classification head is new, so it is trained in full (peft's
``modules_to_save=["classifier"]``). Everything else is the Transformers runs' recipe, reused,
not copied: :func:`finetune_lab.hf_finetune.finetune_transformers` builds the same Trainer
(batch 8, 5 epochs, linear warm-up over 6 % of the updates and linear decay to 0, Adam
(0.9, 0.98), eps 1e-8, weight decay 0.01 on every trained parameter, no clipping, valid and test
accuracy after every epoch, TensorBoard into the run folder, :func:`record_run`). The one
recipe value that differs is the peak learning rate of the LoRA methods, :data:`LORA_LR`.

The methods differ on purpose, so the experiment carries an ``experiment.json`` (pinned from its
first run) that gives the registry the shared hyperparameters and names what varies
(:data:`VARYING`); within one method the runs must agree on everything but the seed
(:func:`check_methods`).

Each manifest's ``extra`` records the method, trainable and total parameters (peft's
``get_nb_trainable_parameters()``), the peak memory of the run (``torch.cuda.max_memory_allocated``
on a GPU; on a CPU the process's peak resident set size from ``resource.getrusage``, reset at the
start of the run through ``/proc/self/clear_refs`` where Linux allows it; the manifest says
which) and the time of the Trainer part of the run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from finetune_lab.argtypes import non_negative_int, positive_int
from finetune_lab.errors import UserError
from finetune_lab.lora_configs import LAB_BNB, LAB_LORA
from finetune_lab.recipe import LAB_RECIPE, FinetuneRecipe
from finetune_lab.runmeasure import count_parameters

EXPERIMENT = "lora"
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_METHODS = ("lora-qv", "lora-attn")
"""What ``finetune lora`` makes by default; the ``full`` row comes from :data:`FULL_BASELINE`."""
FULL_BASELINE = "transformers"
"""The experiment whose ``pretrained`` runs are the full fine-tuning row when this experiment
has no ``full`` runs of its own (:func:`baseline_full_runs`)."""

LORA_R = 16
LORA_ALPHA = 32
LORA_DROPOUT = LAB_LORA["lora_dropout"]
LORA_LR = 5e-4
"""Peak learning rate of the LoRA methods. Full fine-tuning keeps the lab's 1e-5; a low-rank
update starting from B = 0 moves far more slowly at that rate, and the LoRA paper fine-tuned
RoBERTa-base with LoRA at 5e-4 (its Table 9, SST-2 and most GLUE tasks). The schedule (warm-up,
decay, epochs, batch) is the lab's; only its peak differs, and it is recorded as ``lr``."""

BNB_SKIP = ["classifier"]
"""Kept in full precision under 4-bit loading: the new head is trained in full."""

VARYING = ("method", "lr", "lora", "quantization")
"""The hyperparameters that differ between methods by design (seed and init aside)."""


@dataclass(frozen=True)
class Method:
    """One way of fine-tuning: which linear layers get adapters (``None``: all weights train)."""

    name: str
    label: str
    targets: tuple[str, ...] | None
    quantized: bool = False

    @property
    def is_lora(self) -> bool:
        return self.targets is not None

    def lr(self, recipe: FinetuneRecipe = LAB_RECIPE, lora_lr: float = LORA_LR) -> float:
        return lora_lr if self.is_lora else recipe.lr

    def lora_settings(self) -> dict[str, Any] | None:
        """The ``LoraConfig`` arguments (the lab's, with this method's targets and the head)."""
        if not self.is_lora:
            return None
        return {"r": LORA_R, "lora_alpha": LORA_ALPHA, "lora_dropout": LORA_DROPOUT,
                "bias": LAB_LORA["bias"], "target_modules": list(self.targets or ()),
                "modules_to_save": ["classifier"], "task_type": "SEQ_CLS"}

    def quantization(self) -> dict[str, Any] | None:
        return {**LAB_BNB, "llm_int8_skip_modules": list(BNB_SKIP)} if self.quantized else None


QV = ("query", "value")
ATTN = ("query", "key", "value", "attention.output.dense")
METHODS: dict[str, Method] = {
    "lora-qv": Method("lora-qv", "LoRA, query + value", QV),
    "lora-attn": Method("lora-attn", "LoRA, all attention projections", ATTN),
    "full": Method("full", "full fine-tuning", None),
    "qlora-qv": Method("qlora-qv", "QLoRA (4-bit NF4 base), query + value", QV, quantized=True),
}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"method {name!r} is not one of {', '.join(METHODS)}") from None


def run_name(method: str, seed: int) -> str:
    return f"{method}-seed{seed}"


def run_command(methods: Sequence[str] = DEFAULT_METHODS, seeds: Sequence[int] = DEFAULT_SEEDS
                ) -> str:
    """The command line that makes the runs this chapter reads."""
    return ("finetune-lab finetune lora --methods " + " ".join(methods)
            + " --seeds " + " ".join(str(s) for s in seeds))


RUN_COMMAND = run_command()
GPU_COMMAND = run_command((*DEFAULT_METHODS, "qlora-qv"))
FULL_COMMAND = "finetune-lab finetune transformers --init pretrained --seeds " + " ".join(
    str(s) for s in DEFAULT_SEEDS)
"""Makes the full fine-tuning row (the Transformers chapter's pretrained runs)."""


# --- parameter counts ----------------------------------------------------------------------


def head_parameters(size=None) -> int:
    """The classification head: ``dense`` d x d + d and ``out_proj`` d x C + C."""
    from finetune_lab.params import SMALL

    size = size if size is not None else SMALL
    return size.dim * size.dim + size.dim + size.dim * size.classes + size.classes


def analytic_counts(method: Method, dim: int, layers: int, classes: int, total: int
                    ) -> tuple[int, int]:
    """``(trainable, all)`` as peft counts them, from the formula.

    Every adapted RoBERTa projection maps ``d -> d``, so each adds ``r (d + d)``; the head
    (``dense`` d x d + d, ``out_proj`` d x C + C) is trained as a copy that peft counts in both
    numbers. ``total`` is the plain classifier's parameter count.
    """
    if not method.is_lora:
        return total, total
    lora = layers * len(method.targets or ()) * LORA_R * (dim + dim)
    head = dim * dim + dim + dim * classes + classes  # = head_parameters()
    return lora + head, total + lora + head


def wrap(model, method: Method):
    """peft-wrap ``model`` for ``method`` (the model itself for full fine-tuning)."""
    if not method.is_lora:
        return model
    from peft import get_peft_model

    from finetune_lab.lora_configs import lora_config

    return get_peft_model(model, lora_config(**method.lora_settings()))


def method_table(size=None, methods: Iterable[str] = METHODS) -> pd.DataFrame:
    """Per method: adapted layers, learning rate, trainable and total parameters (peft on a
    meta-device RoBERTa of ``size``, default RoBERTa-small-fr) and the formula's count.

    QLoRA is counted in full precision: 4-bit storage changes no count in peft's report.
    """
    import warnings

    import torch
    from transformers import RobertaForSequenceClassification

    from finetune_lab.hf_convert import hf_model_config
    from finetune_lab.params import SMALL

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


# --- one run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _record_method(handle, method: Method):
    """Name the method in the manifest's ``extra`` (counts, memory and time are recorded for
    every Transformers run by :func:`finetune_lab.runmeasure.measure_run`)."""
    handle.manifest.setdefault("extra", {})["method"] = method.name
    yield


def _four_bit_kwargs(method: Method, force_4bit: bool) -> dict[str, Any] | None:
    if not method.quantized:
        return None
    import torch

    from finetune_lab.lora_configs import bnb_config
    from finetune_lab.lora_counts import bitsandbytes_available

    if not bitsandbytes_available():
        raise UserError(f"{method.name} needs bitsandbytes, which does not import here")
    cuda = torch.cuda.is_available()
    if not cuda and not force_4bit:
        raise UserError(f"{method.name} loads the base model in 4 bits, meant for a GPU, and "
                        "none is visible; pass --force-4bit to quantise on the CPU anyway "
                        "(bitsandbytes' CPU kernels, slow)")
    return {"quantization_config": bnb_config(llm_int8_skip_modules=list(BNB_SKIP)),
            "device_map": {"": 0} if cuda else "cpu"}


def finetune_lora(
    method: str,
    seed: int,
    *,
    cls_dir: Path | None = None,
    tokenizer_dir: Path | None = None,
    model_dir: Path | None = None,
    recipe: FinetuneRecipe = LAB_RECIPE,
    lora_lr: float = LORA_LR,
    logging_steps: int | None = None,
    runs_root: Path | None = None,
    experiment: str = EXPERIMENT,
    overwrite: bool = False,
    force_4bit: bool = False,
) -> Path:
    """One recorded run ``<runs root>/<experiment>/<method>-seed<seed>/`` from the converted
    pretrained RoBERTa-small-fr (``model_dir``, default: converted from the packaged checkpoint).

    The Trainer recipe is :func:`finetune_lab.hf_finetune.finetune_transformers`'s, with the
    method's peak learning rate; the model is peft-wrapped for the LoRA methods.
    """
    from finetune_lab import hf_finetune

    m = get_method(method)
    run_recipe = dataclasses.replace(recipe, lr=m.lr(recipe, lora_lr))
    def adapt(model):
        if m.quantized:
            from peft import prepare_model_for_kbit_training

            from finetune_lab.lora_qa import _keep_cpu_4bit_trainable

            # bitsandbytes would repack the 4-bit weights for CPU inference at the first
            # evaluation, after which training fails; on a GPU this changes nothing
            _keep_cpu_4bit_trainable(model)
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        return wrap(model, m)

    run_dir = hf_finetune.finetune_transformers(
        "pretrained", seed, cls_dir=cls_dir, tokenizer_dir=tokenizer_dir, model_dir=model_dir,
        recipe=run_recipe,
        logging_steps=logging_steps if logging_steps is not None else hf_finetune.DEFAULT_LOGGING_STEPS,
        runs_root=runs_root, experiment=experiment, run=run_name(m.name, seed),
        overwrite=overwrite, model_kwargs=_four_bit_kwargs(m, force_4bit), adapt_model=adapt,
        extra_hyperparameters={"method": m.name, "lora": m.lora_settings(),
                               "quantization": m.quantization()},
        run_context=lambda handle: _record_method(handle, m))
    pin_experiment(run_dir)
    return run_dir


def pin_experiment(run_dir: Path) -> Path:
    """Write ``experiment.json`` from the first run (shared hyperparameters + what varies);
    later runs must agree with it, or the registry flags them (refused here, loudly)."""
    from finetune_lab.manifest import read_manifest, write_json_atomic
    from finetune_lab.registry import (EXPERIMENT_CONFIG, VARYING_KEYS,
                                       differing_hyperparameters, read_experiment_config)

    hp = read_manifest(run_dir)["hyperparameters"]
    varying = sorted(VARYING)
    shared = {k: v for k, v in hp.items() if k not in set(varying) | VARYING_KEYS}
    exp_dir = Path(run_dir).parent
    config = read_experiment_config(exp_dir)
    if config is None:
        write_json_atomic(exp_dir / EXPERIMENT_CONFIG, {
            "hyperparameters": shared, "varying": varying,
            "note": "pinned from the first run; the methods differ in 'varying' by design"})
    else:
        differ = differing_hyperparameters(config, shared)
        if differ:
            raise UserError(f"{run_dir} was trained with hyperparameters {differ} unlike the "
                            f"other runs ({exp_dir / EXPERIMENT_CONFIG}); the registry will "
                            "exclude it. Use another --runs-root or experiment to change them.")
    return exp_dir / EXPERIMENT_CONFIG


# --- reading cached runs (for the chapter) ---------------------------------------------------


def method_of(rec) -> str | None:
    """A run's method: its ``method`` hyperparameter, or ``full`` for a pretrained run of
    :data:`FULL_BASELINE` (a plain Transformers fine-tune)."""
    man = rec.manifest or {}
    hp = man.get("hyperparameters") or {}
    if "method" in hp:
        return hp["method"]
    if rec.experiment == FULL_BASELINE and man.get("init") == "pretrained":
        return "full"
    return None


def baseline_full_runs(base: Path, experiment_dir: Path) -> list:
    """The valid pretrained runs of :data:`FULL_BASELINE`, as this experiment's ``full`` row.

    Each must carry the measurements (parameters, peak memory, time) and agree with this
    experiment's pinned recipe and with the lab's learning rate; one that does not is returned
    with the reason, so the chapter lists it as excluded.
    """
    from finetune_lab.registry import (check_hyperparameters, differing_hyperparameters,
                                       discover_runs, read_experiment_config)

    if not (base / FULL_BASELINE).is_dir():
        return []
    config = read_experiment_config(experiment_dir)
    full_lr = METHODS["full"].lr()
    out = []
    for rec in discover_runs(base, [FULL_BASELINE]):
        if not rec.valid or rec.init != "pretrained":
            continue  # the Transformers chapter lists those; they are no full fine-tuning row
        hp = (rec.manifest or {}).get("hyperparameters") or {}
        extra = (rec.manifest or {}).get("extra") or {}
        missing = [k for k in ("parameters", "peak_memory", "time_s") if k not in extra]
        if missing:
            rec.problems.append(f"as the full fine-tuning row: manifest extra lacks {missing} "
                                "(made before runs were measured; re-run it)")
        elif hp.get("lr") != full_lr:
            rec.problems.append(f"as the full fine-tuning row: lr {hp.get('lr')} is not the "
                                f"lab's {full_lr:g}")
        elif config is not None and (differ := differing_hyperparameters(config, hp)):
            rec.problems.append("as the full fine-tuning row: hyperparameters "
                                f"{differ} differ from {experiment_dir.name}'s experiment.json")
        out.append(rec)
    check_hyperparameters([r for r in out if r.valid], None)
    return out


def check_methods(records) -> None:
    """Per method, the runs must agree on every hyperparameter but the seed; each run must
    name a known method and carry its measurements. Problems are added to the records."""
    from collections import defaultdict

    from finetune_lab.registry import check_hyperparameters

    groups = defaultdict(list)
    for rec in records:
        if not rec.valid:
            continue
        man = rec.manifest or {}
        name = method_of(rec)
        extra = man.get("extra") or {}
        if name not in METHODS:
            rec.problems.append(f"hyperparameter 'method' = {name!r} is not one of "
                                f"{', '.join(METHODS)}")
            continue
        missing = [k for k in ("parameters", "peak_memory", "time_s") if k not in extra]
        if missing:
            rec.problems.append(f"manifest extra lacks {missing}")
            continue
        groups[name].append(rec)
    for group in groups.values():
        check_hyperparameters(group, None)


def cached_runs(root: Path | str | None = None, experiment: str = EXPERIMENT):
    """Every recorded run of the experiment (valid or not) with the valid ones' scalars;
    ``None`` when none was ever recorded under the runs root (the Transformers pretrained runs
    count, as the full fine-tuning row)."""
    from finetune_lab.config import paths
    from finetune_lab.registry import discover_runs, valid_runs
    from finetune_lab.tblogs import LoadedRuns, load_scalars

    base = Path(root) if root is not None else paths().runs
    exp = base / experiment
    recorded = exp.is_dir() and any(p.is_dir() and p.name[0] not in "._" for p in exp.iterdir())
    records = discover_runs(base, [experiment]) if recorded else []
    check_methods(records)
    if not any(r.valid and method_of(r) == "full" for r in records):
        records += baseline_full_runs(base, exp)
    if not records:
        return None
    return LoadedRuns(scalars=load_scalars(valid_runs(records)), runs=records)


def per_run_table(loaded) -> pd.DataFrame:
    """One row per valid run: method, seed, best valid epoch, valid and test accuracy there,
    parameters, time and peak memory (from the manifest)."""
    from finetune_lab.seedstats import best_epochs

    best = best_epochs(loaded.scalars)
    info = []
    for rec in loaded.used:
        extra = (rec.manifest or {}).get("extra") or {}
        info.append({"run": rec.name, "method": method_of(rec),
                     "trainable": extra["parameters"]["trainable"],
                     "total": extra["parameters"]["total"],
                     "time_s": extra["time_s"], "peak_bytes": extra["peak_memory"]["bytes"],
                     "peak_device": extra["peak_memory"]["device"],
                     "lr": (rec.manifest or {})["hyperparameters"]["lr"]})
    out = best.merge(pd.DataFrame(info), on="run", how="left")
    order = {name: i for i, name in enumerate(METHODS)}
    return out.sort_values(["method", "seed"], key=lambda s: s.map(order) if s.name == "method"
                           else s).reset_index(drop=True)


def summary(loaded, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per method (numbers): n, mean/std of best-valid and test-at-best-epoch accuracy,
    trainable and total parameters, mean time per run and mean peak memory. ``runs``: the
    :func:`per_run_table` of ``loaded`` when the caller has it already."""
    from finetune_lab.seedstats import seed_summary

    runs = per_run_table(loaded) if runs is None else runs
    # seedstats groups by (experiment, framework, init); every run here is "pretrained", and
    # the method is what varies, so the method takes the init column's place
    stats = seed_summary(runs.assign(init=runs["method"])).rename(columns={"init": "method"})
    agg = runs.groupby("method").agg(
        trainable_min=("trainable", "min"), trainable_max=("trainable", "max"),
        total=("total", "max"), lr=("lr", "first"), time_s=("time_s", "mean"),
        peak_bytes=("peak_bytes", "mean"),
        peak_device=("peak_device", lambda v: "/".join(sorted(set(v))))).reset_index()
    out = stats.drop(columns=["experiment", "framework"]).merge(agg, on="method")
    order = {name: i for i, name in enumerate(METHODS)}
    return out.sort_values("method", key=lambda s: s.map(order)).reset_index(drop=True)


def results_table(loaded) -> pd.DataFrame:
    """The LoRA-vs-full table: one row per method, accuracy as ``mean ± std (n=…)``."""
    from finetune_lab.report import fmt_int
    from finetune_lab.seedstats import fmt_mean_std

    s = summary(loaded)

    def params(lo: int, hi: int) -> str:
        return fmt_int(lo) if lo == hi else f"{fmt_int(lo)}–{fmt_int(hi)}"

    return pd.DataFrame({
        "method": s["method"],
        "peak lr": [f"{x:g}" for x in s["lr"]],
        "trainable params": [params(a, b) for a, b in zip(s["trainable_min"], s["trainable_max"])],
        "trainable %": [f"{100 * a / t:.2f} %" for a, t in zip(s["trainable_max"], s["total"])],
        "best valid acc. (%)": [fmt_mean_std(m, sd, n) for m, sd, n in
                                zip(s["valid_mean"], s["valid_std"], s["n"])],
        "test acc. at best valid epoch (%)": [fmt_mean_std(m, sd, n) for m, sd, n in
                                              zip(s["test_mean"], s["test_std"], s["n"])],
        "time per run (min)": [f"{t / 60:.1f}" for t in s["time_s"]],
        "peak memory (MiB)": [f"{b / 2**20:,.0f} ({d})" for b, d in
                              zip(s["peak_bytes"], s["peak_device"])],
    })


TRAINING_STATE_BYTES = 4 + 2 * 4
"""Per trainable parameter, in fp32 (how every run here trains): its gradient and Adam's two
moments. What LoRA saves, per parameter it freezes."""


def gaps_to_full(loaded) -> pd.DataFrame:
    """Each LoRA method against full fine-tuning: test accuracy difference at the best-valid
    epoch with its 95 % Welch interval, the ratios of trainable parameters, time per run and
    peak memory, and the training state the frozen parameters no longer need beside the peak
    memory actually saved. A method with fewer than two seeds (or no full row) gets no line."""
    from finetune_lab.seedstats import init_gap

    columns = ["method", "n", "n full", "test gap (points)", "ci_low", "ci_high",
               "trainable / full", "time / full", "peak memory / full", "state saved (MiB)",
               "peak saved (MiB)", "peak device", "lr", "lr full"]
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
            "method": method, "n": g.n_a, "n full": g.n_b, "test gap (points)": g.diff,
            "ci_low": g.ci_low, "ci_high": g.ci_high,
            "trainable / full": m["trainable_max"] / full["trainable_max"],
            "time / full": m["time_s"] / full["time_s"],
            "peak memory / full": m["peak_bytes"] / full["peak_bytes"],
            "state saved (MiB)": (full["trainable_max"] - m["trainable_max"])
            * TRAINING_STATE_BYTES / 2**20,
            "peak saved (MiB)": (full["peak_bytes"] - m["peak_bytes"]) / 2**20,
            "peak device": m["peak_device"], "lr": m["lr"], "lr full": full["lr"]})
    return pd.DataFrame(rows, columns=columns)


def gaps_markdown(loaded) -> str:
    """What the LoRA-vs-full table says, one sentence per method, from :func:`gaps_to_full`."""
    if loaded is None or not loaded.used:
        return ""
    gaps = gaps_to_full(loaded)
    if gaps.empty:
        return ("The comparison with full fine-tuning needs at least two seeds of a LoRA method "
                "and of the full row; the cache does not hold them yet.")
    out = []
    for g in gaps.to_dict("records"):
        lo, hi = g["ci_low"], g["ci_high"]
        if lo > 0:
            verdict = "better than full fine-tuning, by a margin the seeds show"
        elif hi < 0:
            verdict = "worse than full fine-tuning, by a margin the seeds show"
        else:
            verdict = "not distinguishable from full fine-tuning with these seeds"
        out.append(
            f"`{g['method']}` − `full`: {g['test gap (points)']:+.2f} points of test accuracy "
            f"(95 % Welch CI {lo:.2f} to {hi:.2f}; n = {g['n']} and {g['n full']} seeds), "
            f"{verdict}. It trains {100 * g['trainable / full']:.2f} % of full fine-tuning's "
            f"parameters, and takes {g['time / full']:.2f}× its time per run and "
            f"{g['peak memory / full']:.2f}× its peak memory.")
    measured = ", ".join(
        f"{'drops' if g['peak saved (MiB)'] >= 0 else 'rises'} by "
        f"{abs(g['peak saved (MiB)']):,.0f} MiB under `{g['method']}`"
        for g in gaps.to_dict("records"))
    on_cpu = (gaps["peak device"] == "cpu").all()
    out.append(f"Freezing the base model saves its gradients and Adam moments "
               f"({TRAINING_STATE_BYTES} bytes per frozen parameter in fp32): up to "
               f"{gaps['state saved (MiB)'].max():,.0f} MiB here. The measured peak {measured}"
               + (": the peak resident set of a CPU process also holds the Python and torch "
                  "runtime, the data and the activations, which LoRA does not shrink."
                  if on_cpu else "."))
    lora_lrs = sorted({f"{lr:g}" for lr in gaps["lr"]})
    full_lr = f"{gaps['lr full'].iloc[0]:g}"
    if lora_lrs != [full_lr]:
        out.append(f"Each gap is the method and its learning rate together (LoRA at "
                   f"{', '.join(lora_lrs)}, full fine-tuning at the lab's {full_lr}): "
                   "these runs do not separate the two.")
    return "\n\n".join(out)


def memory_note(loaded) -> str:
    """How the peak memory of the used runs was measured (one sentence per distinct measure)."""
    measures = sorted({((r.manifest or {}).get("extra") or {})["peak_memory"]["measure"]
                       for r in loaded.used})
    return "; ".join(measures)


def not_run_text(recorded: bool = False) -> str:
    """The chapter's statement when no usable run exists, with what the runs need;
    ``recorded``: runs exist but every one is excluded (listed after this text)."""
    from finetune_lab.checkpoints import MODEL_FILE, packaged_dir
    from finetune_lab.config import paths

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


def state_markdown(loaded) -> str:
    """What the chapter says about the runs: the command when none is usable, else how many,
    plus every excluded run with its reason."""
    from finetune_lab.registry import exclusions_markdown

    if loaded is None or not loaded.used:
        recorded = loaded is not None and bool(loaded.excluded)
        text = (f"{not_run_text(recorded)}\n\n```bash\n{RUN_COMMAND}\n```\n\nThe full fine-tuning row is "
                f"the Transformers runs from the pretrained checkpoint:\n\n```bash\n"
                f"{FULL_COMMAND}\n```\n\nOn a machine with a GPU, add "
                f"QLoRA (a 4-bit NF4 base model through bitsandbytes):\n\n```bash\n"
                f"{GPU_COMMAND}\n```")
    else:
        n = len(loaded.used)
        methods = summary(loaded)["method"].tolist()
        borrowed = [r for r in loaded.used if r.experiment == FULL_BASELINE]
        text = (f"{n} valid run{'s' if n != 1 else ''} are used "
                f"({', '.join(f'`{m}`' for m in methods)}; each manifest holds the command "
                f"that made it; `{RUN_COMMAND}` makes any LoRA run that is missing). "
                f"Peak memory: {memory_note(loaded)}.")
        if borrowed:
            text += (f"\n\nThe `full` row is the {len(borrowed)} Transformers run"
                     f"{'s' if len(borrowed) != 1 else ''} from the pretrained checkpoint "
                     f"(`data/runs/{FULL_BASELINE}/`: "
                     f"{', '.join(f'`{r.name}`' for r in borrowed)}): the function and recipe "
                     "that `--methods full` would run, so the same runs are not made twice; "
                     + (f"each agrees with the LoRA runs' pinned recipe (`data/runs/{EXPERIMENT}/"
                        "experiment.json`) in everything but what the methods vary."
                        if any(r.experiment == EXPERIMENT for r in loaded.used) else
                        "once LoRA runs exist, each is checked against their pinned recipe."))
        elif "full" not in methods:
            text += (f"\n\nNo full fine-tuning run is recorded yet: `{FULL_COMMAND}` makes "
                     "the row.")
        missing = [m for m in DEFAULT_METHODS if m not in methods]
        if missing:
            text += (f"\n\n**Not run yet:** {', '.join(f'`{m}`' for m in missing)}, so the "
                     f"table has no row for {'it' if len(missing) == 1 else 'them'}; "
                     f"`{run_command(missing)}` makes the runs.")
    if loaded is not None and loaded.excluded:
        text += "\n\nExcluded from the table:\n\n" + exclusions_markdown(loaded.runs)
    return text


# --- CLI ------------------------------------------------------------------------------------


def add_finetune_parser(finetune_subparsers: argparse._SubParsersAction) -> None:
    """Register ``finetune lora`` under the lead's ``finetune`` group."""
    p = finetune_subparsers.add_parser(
        "lora", help="LoRA vs full fine-tuning of RoBERTa-small-fr on CLS-Books (same recipe)",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(DEFAULT_METHODS),
                   help="qlora-qv needs bitsandbytes and (unless --force-4bit) a GPU")
    p.add_argument("--seeds", type=non_negative_int, nargs="+", default=list(DEFAULT_SEEDS))
    p.add_argument("--lora-lr", type=float, default=LORA_LR,
                   help=f"peak learning rate of the LoRA methods (default {LORA_LR:g}; "
                        f"full fine-tuning keeps the lab's {LAB_RECIPE.lr:g})")
    p.add_argument("--cls-dir", type=Path, default=None, help="cls.books folder (default: work dir)")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="converted model (default: <work dir>/hf/roberta-small-fr)")
    p.add_argument("--tokenizer-dir", type=Path, default=None)
    p.add_argument("--logging-steps", type=int, default=None)
    p.add_argument("--runs-root", type=Path, default=None)
    p.add_argument("--epochs", type=positive_int, default=LAB_RECIPE.epochs,
                   help="shorter runs for a smoke test, recorded as lora-<N>ep (the lab: 5)")
    p.add_argument("--force-4bit", action="store_true",
                   help="run qlora-qv without a GPU (bitsandbytes' CPU kernels, slow)")
    p.add_argument("--experiment", help=f"run-cache folder (default: {EXPERIMENT}, with "
                   "-<N>ep and -lr<LR> for other epochs and LoRA learning rates)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from finetune_lab.recording import run_dir_for
    from finetune_lab.registry import validate_run

    recipe = dataclasses.replace(LAB_RECIPE, epochs=args.epochs)
    experiment = EXPERIMENT
    if args.epochs != LAB_RECIPE.epochs:
        experiment += f"-{args.epochs}ep"
    if args.lora_lr != LORA_LR:  # another LoRA learning rate is another experiment
        experiment += f"-lr{args.lora_lr:g}"
    experiment = args.experiment or experiment
    for method in args.methods:
        for seed in args.seeds:
            target = run_dir_for(experiment, run_name(method, seed), args.runs_root)
            if (target / "manifest.json").is_file() and validate_run(target).valid:
                print(f"finetune lora: {experiment}/{target.name} is complete; skipped")
                continue
            out = finetune_lora(
                method, seed, cls_dir=args.cls_dir, tokenizer_dir=args.tokenizer_dir,
                model_dir=args.model_dir, recipe=recipe, lora_lr=args.lora_lr,
                logging_steps=args.logging_steps, runs_root=args.runs_root,
                experiment=experiment, overwrite=True, force_4bit=args.force_4bit)
            print(f"finetune lora: wrote {out}")
    return 0
