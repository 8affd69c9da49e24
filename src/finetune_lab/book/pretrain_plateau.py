"""The masked-LM plateau: every pretraining run's held-out loss against the tokens behind it.

Runs of every device and state are read (a run the GPU call's deadline killed keeps its logs,
though its weights are lost), so that the chapter can say which runs left the plateau and after
how many tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from finetune_lab.book.pretrain_report import continued_lineage
from finetune_lab.models.checkpoints import MANIFEST_FILE, MODEL_FILE, package_manifest, packaged_dir
from finetune_lab.models.position_init import (
    PADDING_IDX,
    POSITIONS_KEY,
    neighbour_similarity,
    sinusoidal_table,
)
from finetune_lab.models.trust import load_trusted
from finetune_lab.render_cache import per_render
from finetune_lab.runs.fairseq_logs import log_rates
from finetune_lab.runs.manifest import run_key
from finetune_lab.runs.registry import RunRecord, discover_runs
from finetune_lab.runs.tblogs import event_scalars
from finetune_lab.train.pretrain_lineage import sinusoids_in
from finetune_lab.train.pretrain_recipe import EXPERIMENT
from finetune_lab.runs.reading import reads_once

GPU_EXPERIMENT = "pretrain-gpu"
"""Where runs made on a lent GPU go (``gpu-bundle --steps pretrain``)."""
ESCAPE_BITS = 3.0
"""A run has left the plateau once its held-out loss is this far under the unigram entropy: the
plateau lies 1 to 1.5 bits under it (what token frequencies and positions alone are worth), and
the H100 runs fell from there to 5 bits and below within a few hundred updates."""
KEPT_BITS, SINE_BITS = "table kept (bits)", "sinusoids (bits)"
"""The held-out losses :func:`position_comparison` sets side by side."""
POSITIONS = "positions"
"""The column of :func:`plateau_table` that says how a run's position table started: ``kept``
(as the weights it continues had it, or fairseq's random initialisation), ``sinusoidal``, or
``sinusoidal (NAME)`` for weights that continue those of a run NAME that started so."""
UNKNOWN = "not known (a run behind it is excluded)"
"""The :data:`POSITIONS` of a run whose lineage holds a run the registry excluded."""
LEFT = "left the plateau at (M tokens)"
"""The column of :func:`plateau_table` that says where a run left the plateau (NaN: it did not, or not yet)."""


STRANDED = "not committed"
"""The weights of a run stopped before the end of its budget: its resumable state lives in the
git-ignored ``data/work/`` of the machine that ran it, and it never packaged them. Said from
the manifest alone: the book reads no machine-local state (trial 15's CF-n1). Short, for a
table cell; the caption of the table says the rest."""


def weights_state(rec: RunRecord) -> str:
    """``kept`` (a complete run's), :data:`STRANDED` (paused or running), or ``lost`` (the run
    failed: a GPU call's deadline, say)."""
    status = (rec.manifest or {}).get("status")
    if rec.valid:
        return "kept"
    return STRANDED if status in ("running", "paused") else "lost"


def all_pretraining_runs(runs_root=None) -> list[RunRecord]:
    """Every pretraining run folder, valid or not (a run the GPU call's deadline killed keeps its
    logs, though its weights are lost)."""
    return discover_runs(runs_root, [EXPERIMENT, GPU_EXPERIMENT])


@reads_once
def token_curves(records: list[RunRecord], subsets: tuple[str, ...] = ("valid",)) -> pd.DataFrame:
    """Held-out loss (bits) of every run on ``subsets`` against the tokens behind the weights at
    that point: the run's own updates times its tokens per update, plus every run it
    continues (their tokens from their own records where the cache has them, the copy in the
    run's manifest checked: :func:`~finetune_lab.book.pretrain_report.continued_lineage`).
    Each run's event files are read once."""
    frames = []
    for rec in records:
        man = rec.manifest or {}
        hp = man.get("hyperparameters") or {}
        per_update = int(hp.get("tokens_per_update") or 0)
        if not per_update:
            continue
        df = event_scalars(rec.path)
        df = df[df["subset"].isin(subsets) & (df["tag"] == "loss")]
        if df.empty:
            continue
        before = sum(int(step.get("tokens") or 0) for step in continued_lineage(man, rec.path))
        frames.append(pd.DataFrame({
            "run": f"{rec.experiment}/{rec.name}", "status": man.get("status"),
            "device": "GPU" if rec.experiment == GPU_EXPERIMENT else "CPU",
            "subset": df["subset"].to_numpy(),
            "tokens": before + df["step"].astype(int) * per_update,
            "bits": df["value"].astype(float)}).sort_values("tokens"))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "status", "device", "subset", "tokens", "bits"])


def position_start(rec: RunRecord, records: list[RunRecord]) -> str:
    """:data:`POSITIONS` of ``rec``: from its own hyperparameters, else from the runs behind
    its weights (its lineage, as run paths), the nearest first. Only the lineage's run names
    are read here, never its copied updates or tokens."""

    def own(r: RunRecord | None) -> str | None:
        return (((r.manifest if r else None) or {}).get("hyperparameters") or {}).get(
            "position_init")

    if own(rec) == "sinusoidal":
        return "sinusoidal"
    by_key = {r.key: r for r in records}
    lineage = _continued(rec).get("lineage") or []
    behind = sinusoids_in(lineage, lambda run: own(by_key.get(run_key(run))))
    if behind:
        return f"sinusoidal ({Path(behind).name})"
    # "kept" only when every run behind the weights is read: a rejected one (no manifest) could
    # have restarted the table, so the fact is not known (trial 15's R2-n1), never defaulted
    def read(step: dict) -> bool:
        found = by_key.get(run_key(str(step.get("run") or "")))
        return found is not None and found.manifest is not None

    return "kept" if all(read(step) for step in lineage) else UNKNOWN


@reads_once
def plateau_table(records: list[RunRecord], unigram: float | None) -> pd.DataFrame:
    """One row per run: device, batch, learning rate, loaders, throughput, tokens behind the
    weights, last held-out losses, and the tokens at which the novels' loss first fell
    :data:`ESCAPE_BITS` under the unigram entropy (none: still on the plateau)."""
    both = token_curves(records, ("valid", "valid1"))
    novels, reviews = both[both["subset"] == "valid"], both[both["subset"] == "valid1"]
    rows = []
    for rec in records:
        name = f"{rec.experiment}/{rec.name}"
        mine = novels[novels["run"] == name]
        if mine.empty:
            continue
        man = rec.manifest or {}
        hp = man.get("hyperparameters") or {}
        log = rec.path / "train.log"
        rate = log_rates(log.read_text(encoding="utf-8", errors="replace")) if log.is_file() else {}
        below = mine[mine["bits"] < unigram - ESCAPE_BITS] if unigram is not None else mine[:0]
        theirs = reviews[reviews["run"] == name]
        rows.append({
            "run": f"`{name}`",
            "status": (f"{man.get('status')}: {man['error']}" if man.get("error")
                       else str(man.get("status"))),
            "weights": weights_state(rec),
            "device": "GPU" if rec.experiment == GPU_EXPERIMENT else "CPU",
            POSITIONS: position_start(rec, records),
            "tokens per update": int(hp.get("tokens_per_update") or 0),
            "lr": hp.get("lr"), "loaders": hp.get("num_workers", 1),
            "tokens/s": rate.get("tokens_per_s"),
            "tokens behind (M)": float(mine["tokens"].iloc[-1]) / 1e6,
            "novels (bits)": float(mine["bits"].iloc[-1]),
            "reviews (bits)": float(theirs["bits"].iloc[-1]) if len(theirs) else None,
            LEFT: float(below["tokens"].iloc[0]) / 1e6 if len(below) else None})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class PlateauFacts:
    """What :func:`plateau_table` shows: how many runs stayed on the plateau (``stuck``) and how
    low and how far they got, how many left it, where and how far they went, how many of those
    lost their weights, the most tokens behind a CPU run, and the paused runs (``stranded``);
    then the same for the runs that left it with their position table as trained, by device
    (``left_cpu``, ``left_gpu``: how many, and the tokens at which they left), and for those
    that started from sinusoids (``left_sinusoidal``). A bound is None where no run is of its
    kind."""

    runs: int
    stuck: int
    stuck_lowest_bits: float | None
    stuck_most_tokens_m: float | None
    left: int
    left_from_m: float | None
    left_to_m: float | None
    left_best_bits: float | None
    left_most_tokens_m: float | None
    left_lost: int
    cpu_most_tokens_m: float | None
    left_cpu: int = 0
    left_cpu_from_m: float | None = None
    left_gpu: int = 0
    left_gpu_from_m: float | None = None
    left_gpu_to_m: float | None = None
    stranded: tuple[str, ...] = ()
    left_sinusoidal: int = 0
    left_sinusoidal_from_m: float | None = None


def plateau_facts(table: pd.DataFrame) -> PlateauFacts:
    """:class:`PlateauFacts` of :func:`plateau_table`."""
    if table.empty:
        return PlateauFacts(0, 0, None, None, 0, None, None, None, None, 0, None)
    left = table.dropna(subset=[LEFT])
    stuck = table[table[LEFT].isna()]
    cpu = table[table["device"] == "CPU"]
    sines = left[left[POSITIONS].str.startswith("sinusoidal")]
    kept = left[left[POSITIONS] == "kept"]  # the by-device counts: tables as trained

    def bound(part: pd.DataFrame, col: str, how: str) -> float | None:
        return float(getattr(part[col], how)()) if len(part) else None

    return PlateauFacts(
        runs=len(table), stuck=len(stuck),
        stuck_lowest_bits=bound(stuck, "novels (bits)", "min"),
        stuck_most_tokens_m=bound(stuck, "tokens behind (M)", "max"),
        left=len(left), left_from_m=bound(left, LEFT, "min"), left_to_m=bound(left, LEFT, "max"),
        left_best_bits=bound(left, "novels (bits)", "min"),
        left_most_tokens_m=bound(left, "tokens behind (M)", "max"),
        left_lost=int((left["weights"] == "lost").sum()),
        cpu_most_tokens_m=bound(cpu, "tokens behind (M)", "max"),
        left_cpu=int((kept["device"] == "CPU").sum()),
        left_cpu_from_m=bound(kept[kept["device"] == "CPU"], LEFT, "min"),
        left_gpu=int((kept["device"] == "GPU").sum()),
        left_gpu_from_m=bound(kept[kept["device"] == "GPU"], LEFT, "min"),
        left_gpu_to_m=bound(kept[kept["device"] == "GPU"], LEFT, "max"),
        stranded=tuple(str(r).strip("`") for r in table.loc[table["weights"] == STRANDED, "run"]),
        left_sinusoidal=len(sines), left_sinusoidal_from_m=bound(sines, LEFT, "min"))


def plot_plateau(records: list[RunRecord], unigram: float | None):
    """Held-out novels' loss of every run against the tokens behind its weights (log scale):
    the runs behind the packaged weights in colour, the others grey by device (so the legend
    stays short), runs whose weights were lost dashed."""
    from finetune_lab.book.plots import check_legend  # heavy: matplotlib
    import matplotlib.pyplot as plt

    df = token_curves(records)
    fig, ax = plt.subplots(figsize=(8, 4.4), layout="constrained")
    if df.empty:
        ax.text(0.5, 0.5, "no pretraining run recorded yet", ha="center", va="center")
        ax.set_axis_off()
        return check_legend(fig)
    gone = {f"{r.experiment}/{r.name}" for r in records
            if weights_state(r) in ("lost", STRANDED)}
    package = package_manifest() or {}
    lineage = [run_key(step["run"]) for step in package.get("lineage") or []]
    shown = set()
    for run, part in df.groupby("run", sort=False):
        lost = run in gone
        ours = run in lineage
        gpu = part["device"].iloc[0] == "GPU"
        label = (run.split('/')[-1] if ours
                 else "other GPU runs" if gpu else "other CPU runs")
        ax.plot(part["tokens"] / 1e6, part["bits"], marker="o", ms=2.5 if ours else 1.5,
                ls="--" if lost else "-", lw=1.8 if ours else 0.9,
                color=f"C{lineage.index(run)}" if ours else ("0.35" if gpu else "0.7"),
                label=None if label in shown else label, zorder=3 if ours else 2)
        shown.add(label)
    if gone:
        ax.plot([], [], color="0.5", ls="--", lw=0.9, label="weights lost")
    if unigram is not None:
        ax.axhline(unigram, color="grey", ls=":", lw=1.2,
                   label=f"no context (unigram entropy, {unigram:.2f} bits)")
    ax.set_xscale("log")
    ax.set_xlabel("tokens behind the weights (millions, log scale)")
    ax.set_ylabel("held-out novels, MLM loss (bits)")
    fig.legend(frameon=False, fontsize="small", loc="outside lower center", ncol=4)
    return check_legend(fig)


DISPLAY_COLUMNS = ("run", "weights", "device", POSITIONS, "tokens per update",
                   "tokens behind (M)", "novels (bits)", "reviews (bits)", LEFT)


def plateau_display(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`plateau_table` formatted for the chapter."""
    if table.empty:
        return table

    def num(fmt: str):
        return lambda v: "n/a" if v is None or pd.isna(v) else format(v, fmt)

    out = table.copy()
    for col, fmt in (("tokens/s", ",.0f"), ("tokens behind (M)", ".1f"), ("novels (bits)", ".2f"),
                     ("reviews (bits)", ".2f"), ("tokens per update", ",d"), ("lr", "g")):
        out[col] = out[col].map(num(fmt))
    out[LEFT] = out[LEFT].map(lambda v: "not reached" if v is None or pd.isna(v) else f"{v:.0f}")
    # a page's width: status, learning rate, loaders and speed are in the other tables
    return out[[c for c in DISPLAY_COLUMNS if c in out.columns]]


def position_init_runs(records: list[RunRecord]) -> list[RunRecord]:
    """The runs that started from sinusoids written into their weights' position table."""
    return [r for r in records if ((r.manifest or {}).get("hyperparameters") or {})
            .get("position_init") == "sinusoidal"]


def _continued(rec: RunRecord) -> dict:
    return ((rec.manifest or {}).get("extra") or {}).get("continued_from") or {}


def started_from(rec: RunRecord) -> str | None:
    """The sha256 of the packaged weights ``rec`` continues (None: a random start)."""
    return _continued(rec).get("sha256")


def continued_run(rec: RunRecord) -> str | None:
    """The name of the run whose packaged weights ``rec`` continues (None: a random start)."""
    parent = _continued(rec).get("run")
    return str(parent).rstrip("/").rsplit("/", 1)[-1] if parent else None


def position_control(rec: RunRecord, records: list[RunRecord]) -> RunRecord | None:
    """The run that continued the same weights with their position table kept, the same
    tokens per update, peak learning rate, samples and seed (so the same sample order; the
    longest such run), or None."""

    def hp(r: RunRecord) -> dict:
        return (r.manifest or {}).get("hyperparameters") or {}

    same = ("tokens_per_update", "lr", "sample_break_mode", "tapt_fraction", "dropout")
    found = [r for r in records
             if r is not rec and started_from(r) == started_from(rec)
             and (r.manifest or {}).get("seed") == (rec.manifest or {}).get("seed")
             and hp(r).get("position_init") is None
             and all(hp(r).get(k) == hp(rec).get(k) for k in same)]
    return max(found, key=lambda r: len(token_curves([r])), default=None)


def position_comparison(rec: RunRecord, control: RunRecord) -> pd.DataFrame:
    """Held-out novels' loss (bits) of a sinusoidal-position run and of its control at the
    updates both validated at (each counted from the weights they both continue)."""

    def novels(r: RunRecord) -> pd.Series:
        df = event_scalars(r.path)
        df = df[(df["subset"] == "valid") & (df["tag"] == "loss")]
        return df.groupby(df["step"].astype(int))["value"].last().astype(float)

    both = pd.concat({"kept": novels(control), "sinusoidal": novels(rec)}, axis=1,
                     join="inner").sort_index()
    per_update = int(rec.manifest["hyperparameters"]["tokens_per_update"])
    return pd.DataFrame({"sinusoids": f"`{rec.name}`", "table kept": f"`{control.name}`",
                         "update": both.index.to_numpy(),
                         "tokens (M)": both.index.to_numpy() * per_update / 1e6,
                         KEPT_BITS: both["kept"].to_numpy(), SINE_BITS: both["sinusoidal"].to_numpy(),
                         "difference (bits)": (both["sinusoidal"] - both["kept"]).to_numpy()})


@per_render
def position_similarity(lags: tuple[int, ...] = (1, 50)) -> dict[str, dict[int, float]]:
    """Mean cosine similarity of position rows ``lag`` apart, in the committed checkpoint's
    table and in a sinusoidal table of the same shape (what ``--position-init`` writes)."""
    folder = packaged_dir()
    table = load_trusted(folder / MODEL_FILE, [folder / MANIFEST_FILE])["model"][POSITIONS_KEY]
    sines = table.double().clone()
    first = PADDING_IDX + 1  # the row of position 0
    sines[first:] = sinusoidal_table(table.shape[0] - first, table.shape[1])
    return {"committed": {lag: neighbour_similarity(table, lag) for lag in lags},
            "sinusoidal": {lag: neighbour_similarity(sines, lag) for lag in lags}}
