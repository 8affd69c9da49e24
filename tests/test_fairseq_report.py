"""The fairseq chapter's code on a real tiny grid (2 seeds x 2 inits) and with no runs at all:
its results (fairseq_report), command and schedule (fairseq_command), figure (fairseq_figure),
pretraining budget (pretrain_budget) and the course's reference figures (course_reference)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import CLS_GRID_RECIPE, CLS_GRID_SEEDS, TINY_ARCH, needs_data_root
from finetune_lab.book import course_reference as cr
from finetune_lab.book import fairseq_command as fc
from finetune_lab.book import fairseq_report as fr
from finetune_lab.book.fairseq_figure import plot_curves
from finetune_lab.book.report import signed
from finetune_lab.book.pretrain_budget import budget_table, pretrain_budget
from finetune_lab.train import finetune_fairseq as ff
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.train.recipe import LAB_RECIPE

RECIPE, SEEDS = CLS_GRID_RECIPE, CLS_GRID_SEEDS


@pytest.fixture(scope="module")
def grid(tiny_pipeline, cls_grid):
    """The shared tiny grid (conftest's ``cls_grid``): its runs root and what the chapter loads."""
    return {**tiny_pipeline, "report_runs": cls_grid, "res": fr.load_results(cls_grid)}


def _raw(run_dir: Path, subset: str, tag: str = "accuracy") -> dict[int, float]:
    """``{update: value}`` straight from one subset's event files (tbparse, no project code)."""
    from tbparse import SummaryReader

    df = SummaryReader(str(run_dir / subset)).scalars
    df = df[df["tag"] == tag]
    return dict(zip(df["step"].astype(int), df["value"].astype(float)))


# --- the grid, through the chapter's functions ----------------------------------------------


@needs_data_root
@pytest.mark.slow
def test_summary_has_two_seeds_per_init(grid):
    res = grid["res"]
    assert res.ready and res.has_gap and not res.loaded.excluded
    summ = fr.seed_summary(grid["res"]).set_index("init")
    assert summ.loc["pretrained", "n"] == 2 and summ.loc["random", "n"] == 2
    assert list(fr.seed_table(res)["init"]) == ["pretrained", "random"]


@needs_data_root
@pytest.mark.slow
def test_best_epoch_table_matches_the_raw_event_files(grid):
    table = fr.best_epoch_table(grid["res"])
    assert len(table) == 4
    assert list(zip(table["init"], table["seed"])) == [
        (i, s) for i in ("pretrained", "random") for s in SEEDS]
    for row in table.itertuples(index=False):
        run_dir = grid["report_runs"] / "fairseq" / ff.run_name(row.init, row.seed)
        valid, test = _raw(run_dir, "valid"), _raw(run_dir, "test")
        steps = sorted(valid)
        assert len(steps) == RECIPE.epochs
        best = max(valid.values())
        first = next(s for s in steps if valid[s] == best)  # ties: the earliest epoch
        assert row[3] == first  # best update
        assert row[2] == steps.index(first) + 1  # best epoch
        assert row[4] == pytest.approx(best)
        assert row[5] == pytest.approx(test[first])  # test logged at the best valid epoch


@needs_data_root
@pytest.mark.slow
def test_test_accuracy_per_epoch_is_mean_and_std_over_seeds(grid):
    res = grid["res"]
    num = fr.test_by_epoch(res)
    assert sorted(num["epoch"].unique()) == [1, 2, 3]
    for init in fc.INITS:
        per_seed = [sorted(_raw(grid["report_runs"] / "fairseq" / ff.run_name(init, s),
                                "test").items()) for s in SEEDS]
        for epoch in (1, 2, 3):
            values = [run[epoch - 1][1] for run in per_seed]
            row = num[(num["init"] == init) & (num["epoch"] == epoch)].iloc[0]
            assert row["n"] == 2
            assert row["mean"] == pytest.approx(np.mean(values))
            assert row["std"] == pytest.approx(np.std(values, ddof=1))
    shown = fr.test_by_epoch_table(res)
    assert list(shown.columns) == ["epoch", "pretrained", "random"]
    assert list(shown["epoch"]) == [1, 2, 3]
    assert all(cell.endswith("(n=2)") for cell in shown["pretrained"])


@needs_data_root
@pytest.mark.slow
def test_gap_is_welch_on_the_best_epoch_test_accuracies(grid):
    from scipy import stats

    res = grid["res"]
    g = fr.gap(res)
    best = fr.best_epoch_table(res)
    a = best.loc[best["init"] == "pretrained", "test acc (%) at that epoch"].to_numpy()
    b = best.loc[best["init"] == "random", "test acc (%) at that epoch"].to_numpy()
    assert (g.n_a, g.n_b) == (2, 2)
    assert g.diff == pytest.approx(a.mean() - b.mean())
    # no spread in either init: no test (NaN), as scipy's own answer would be
    spread = np.ptp(a) > 0 or np.ptp(b) > 0
    welch_p = stats.ttest_ind(a, b, equal_var=False).pvalue if spread else float("nan")
    assert g.p_value == pytest.approx(welch_p, nan_ok=True)
    gap_row = fr.comparison_table(res).iloc[-1]
    assert gap_row["this project"] == (f"{signed(g.diff)} (95 % Welch CI {signed(g.ci_low)} "
                                       f"to {signed(g.ci_high)})")
    assert gap_row.iloc[2] == cr.course_gap_cell()
    # the gap is said once, in the Answer; the section after it says how it was computed
    answer = fr.answer_markdown(res)
    assert f"**{signed(g.diff)} points**" in answer and fr.gap_verdict(g) in answer
    assert answer.startswith("::: {.callout-tip}\n## Answer\nWith the lab's recipe and 2 seeds")
    how = fr.gap_markdown(res)
    assert f"t = {g.t:.1f}, df = {g.dof:.1f}" in how and "n = 2 and 2 seeds" in how
    results = fr.results_markdown(res)
    assert results.startswith("The 2 pretrained runs reach ")
    assert f"{signed(g.diff)} points" not in how and fr.gap_verdict(g) not in results


@needs_data_root
@pytest.mark.slow
def test_figure_draws_every_run_and_a_band_per_init(grid):
    import matplotlib.pyplot as plt

    res = grid["res"]
    p = fc.plan(res.loaded.used)
    assert (p.n_train, p.source, p.recipe, p.arch) == (64, None, RECIPE, TINY_ARCH)
    differences = fc.recipe_differences(p)
    assert "lr = 0.001 (the lab: 1e-05)" in differences and "epochs = 3 (the lab: 5)" in differences
    fig = plot_curves(res, p)
    axes = fig.axes
    assert [ax.get_ylabel() for ax in axes] == [
        "validation accuracy (%)", "test accuracy (%)", "train loss (bits, per log interval)",
        "learning rate"]
    for ax in axes:
        # 4 runs (thin) + 2 init means (thick); the learning-rate panel adds the planned schedule
        assert len(ax.lines) == 4 + 2 + (ax is axes[3])
        assert len(ax.collections) == 2  # one mean ± std band per init
    # one legend, the learning-rate panel's: both inits and the planned schedule
    assert [ax.get_legend() is not None for ax in axes] == [False, False, False, True]
    assert [t.get_text() for t in axes[3].get_legend().get_texts()][-1] == "planned schedule"
    # the thin valid-accuracy lines are the logged values at the logged updates
    raw = [_raw(grid["report_runs"] / "fairseq" / ff.run_name(i, s), "valid")
           for i in fc.INITS for s in SEEDS]
    drawn = sorted((tuple(line.get_xdata()), tuple(line.get_ydata())) for line in axes[0].lines
                   if line.get_linewidth() < 1.5)
    assert drawn == sorted((tuple(float(k) for k in r), tuple(r.values())) for r in raw)
    # the planned schedule is the recipe's: 24 updates, warm-up int(0.06 * 24) = 1
    planned = axes[3].lines[-1]
    assert len(planned.get_xdata()) == RECIPE.total_updates(64) == 24
    assert max(planned.get_ydata()) == pytest.approx(RECIPE.lr)
    # and the logged learning rate follows it
    logged = _raw(grid["report_runs"] / "fairseq" / "random-seed0", "train_inner", "lr")
    plan_at = dict(zip(planned.get_xdata(), planned.get_ydata()))
    for step, lr in logged.items():
        assert lr == pytest.approx(plan_at[step], rel=1e-3)
    plt.close(fig)


@needs_data_root
@pytest.mark.slow
def test_speed_table_reads_the_manifests(grid):
    t = fr.speed_table(grid["res"])
    assert len(t) == 4
    for row in t.itertuples(index=False):
        m = read_manifest(grid["report_runs"] / "fairseq" / ff.run_name(row.init, row.seed))
        assert row[5] == pytest.approx(m["wall_time_s"] / 60)
        assert row[6] == pytest.approx(m["throughput"]["updates_per_s"])
        assert row.device == m["device"]["name"]
        assert row.threads == m["device"]["threads"] >= 1
        assert row.updates == 24
    assert fr.speed_markdown(grid["res"]).startswith("The 4 runs took ")


@needs_data_root
@pytest.mark.slow
def test_pretraining_budget_comes_from_the_pretraining_manifest(grid):
    budget = pretrain_budget(checkpoint_dir=grid["packaged"])
    m = read_manifest(grid["pretrain_run"])
    assert budget.updates == m["hyperparameters"]["max_update"] == 30
    assert budget.tokens_seen == 30 * m["hyperparameters"]["tokens_per_update"]
    assert budget.wall_time_s == m["wall_time_s"]
    # without a packaged checkpoint, the last complete run of the runs root is used
    assert pretrain_budget(grid["report_runs"], checkpoint_dir=grid["root"] / "none").updates == 30
    table = budget_table(budget)
    assert f"{budget.tokens_seen:,}" in set(table["this project's stand-in"])


@needs_data_root
@pytest.mark.slow
def test_chapter_executes_on_the_grid(grid, monkeypatch):
    """The chapter itself, run in Jupyter against the tiny grid: the tables are the grid's."""
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.book.qmd import execute_chapter

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(grid["report_runs"]))
    nb = execute_chapter(PROJECT_ROOT / "chapters" / "fairseq.qmd")
    outputs = [o["data"].get("text/markdown", "") for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []) if "data" in o]
    md = "\n".join(outputs)
    # inline values are display data; paragraphs are printed Markdown (`output: asis`)
    text = "\n".join(str(o["data"].get("text/plain", "")) if "data" in o else o.get("text", "")
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "--total-num-update 24" in md and "--encoder-layers 1" in md
    best = next(out for out in outputs if "best update" in out)
    assert len([ln for ln in best.splitlines() if ln.startswith("|")]) == 2 + 4  # header + 4 runs
    assert "(n=2)" in md
    assert "These runs do not follow the lab's recipe exactly" in text
    assert "have not been made" not in text
    # (no image to look for: the tests run matplotlib headless; the figure has its own test)


# --- no runs --------------------------------------------------------------------------------


@pytest.fixture
def repo_paths(monkeypatch):
    """The repository's own run cache and work dir (the session fixture may point elsewhere)."""
    monkeypatch.delenv("FINETUNE_LAB_RUNS_DIR", raising=False)
    monkeypatch.delenv("FINETUNE_LAB_WORK_DIR", raising=False)


def test_no_runs_state_shows_the_commands_and_schedule(tmp_path, repo_paths):
    res = fr.load_results(tmp_path)
    assert not res.ready and not res.has_gap
    status = fr.status_markdown(res)
    assert "have not been made" in status and fc.FINETUNE_COMMAND in status
    assert fc.FINETUNE_COMMAND == "finetune-lab finetune fairseq --init pretrained random --seeds 0 1 2"
    p = fc.plan(res.loaded.used)  # from the committed data summary: the lab's 1800 reviews
    assert (p.n_train, p.recipe) == (1800, LAB_RECIPE) and fc.recipe_differences(p) == []
    assert p.source is not None and p.source.name == "data.json"
    cmd = fc.render_command(fc.train_command(p))
    assert cmd.startswith("fairseq-train data/work/cls-books-bin \\\n    --user-dir ")
    for flags in ("--total-num-update 1125", "--warmup-updates 67", "--max-epoch 5",
                  "--restore-file data/checkpoints/roberta-small-fr/model.pt",
                  "--tensorboard-logdir data/runs/fairseq/pretrained-seed0"):
        assert flags in cmd
    argv = fc.train_command(p, "random", 2)
    assert "--restore-file" not in argv and argv[argv.index("--seed") + 1] == "2"
    assert fc.init_flags(p) == ["--restore-file", "--reset-optimizer", "--reset-dataloader",
                                "--reset-meters", "--reset-lr-scheduler"]
    schedule = fc.schedule_table(p).set_index("quantity")
    assert schedule.loc["total updates", "value"] == "1,125"
    assert schedule.loc["warm-up updates", "value"] == "67"
    assert schedule.loc["training reviews", "how"].endswith("`data/summaries/data.json`")
    for table in (fr.best_epoch_table(res), fr.test_by_epoch_table(res), fr.speed_table(res)):
        assert table.empty
    assert "not run yet" in set(fr.comparison_table(res)["this project"])
    assert "not computed yet" in fr.gap_markdown(res)
    assert "Not known yet: the run cache does not hold two valid seeds" in fr.answer_markdown(res)
    assert fr.results_markdown(res).startswith("No result can be discussed")
    assert fr.speed_markdown(res) == "There is no run to time yet."


def test_no_runs_figure_is_the_planned_schedule(tmp_path, repo_paths):
    import matplotlib.pyplot as plt

    res = fr.load_results(tmp_path)
    fig = plot_curves(res, fc.plan(res.loaded.used))
    (ax,) = fig.axes
    (line,) = ax.lines
    assert len(line.get_xdata()) == 1125 and max(line.get_ydata()) == pytest.approx(1e-5)
    # x is the update after which the rate applies (as fairseq logs it): the peak follows the
    # last of the 67 warm-up updates
    assert line.get_xdata()[int(np.argmax(line.get_ydata()))] == 67
    plt.close(fig)


def test_course_figures_are_labelled_external_references():
    assert cr.COURSE_SOURCE == "course writeups of this lab"
    assert cr.COURSE_COLUMN == "course writeups of this lab (external reference)"
    assert cr.COURSE_TEST_ACCURACY["pretrained"].text() == "79–80 %"
    assert cr.COURSE_TEST_ACCURACY["random"].text() == "63–68 %"
    assert cr.course_gap().text() == "11–17 points"
    assert all(r.source == cr.COURSE_SOURCE for r in cr.COURSE_TEST_ACCURACY.values())


@pytest.mark.parametrize("pretrained, verdict", [
    ([78.0, 79.0, 80.0], "a margin the seeds clearly show"),
    ([66.0, 67.5, 65.0], "a difference the seeds cannot tell from noise"),
    ([55.0, 56.0, 57.0], "worse than random, by a margin the seeds show"),
])
def test_gap_verdict_reads_the_welch_interval(pretrained, verdict):
    from finetune_lab.runs import seedstats

    best = pd.DataFrame({"init": ["pretrained"] * 3 + ["random"] * 3,
                         "test": pretrained + [66.0, 67.0, 68.0]})
    assert fr.gap_verdict(seedstats.init_gap(best)).startswith(verdict)
