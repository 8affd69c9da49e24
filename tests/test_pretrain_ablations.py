"""Issue 14: the pretraining recipe ablations, as commands and as the chapter's table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from finetune_lab.train import pretrain, pretrain_ablations
from finetune_lab.train.pretrain_recipe import PretrainRecipe
from finetune_lab.book import pretrain_report
from finetune_lab.cli import build_parser

from conftest import TINY_ARCH, needs_data_root


def test_each_ablation_is_one_pretrain_command_that_the_cli_accepts():
    for name, flags in pretrain_ablations.ABLATIONS.items():
        cmd = pretrain_ablations.command(name, 8.0, Path("ckpt"))
        assert cmd[1:4] == ["-m", "finetune_lab.cli", "pretrain"]
        args = build_parser().parse_args(cmd[3:])
        assert args.experiment == "pretrain-ablation" and args.run == name
        assert args.minutes == 8.0 and args.no_package and args.seed == pretrain_ablations.SEED
        assert (args.precision, args.dropout, args.lr) == (
            flags["precision"], float(flags["dropout"]), float(flags["lr"]))
    # the first is the recipe of the runs so far: the baseline every other row is compared to
    first = pretrain_ablations.ABLATIONS[next(iter(pretrain_ablations.ABLATIONS))]
    assert (first["precision"], float(first["dropout"]), float(first["lr"])) == (
        "fp32", PretrainRecipe.dropout, PretrainRecipe.lr)


def test_unknown_ablation_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown ablation"):
        pretrain_ablations.run_ablations(["fp64"], 1.0, 1, tmp_path)


@needs_data_root
@pytest.mark.slow
def test_ablation_table_reads_real_runs(tiny_pipeline, tmp_path, monkeypatch):
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    assert pretrain_report.ablation_table(pretrain_report.load_ablations()).empty
    for name in ("fp32-dropout", "bf16"):
        flags = pretrain_ablations.ABLATIONS[name]
        dropout = float(flags["dropout"])
        # the second at a far higher rate: eight updates of a tiny model at the recipe's rate
        # move its loss on a short validation set less than the logged three decimals
        lr = float(flags["lr"]) * (1 if name == "fp32-dropout" else 20)
        recipe = PretrainRecipe(tokens_per_sample=64, batch_size=8, validate_every=4,
                                log_interval=2, lr=lr, arch=TINY_ARCH,
                                dropout=dropout, attention_dropout=dropout)
        pretrain.pretrain(max_update=8, run=name, experiment="pretrain-ablation",
                          data_dir=tiny_pipeline["corpus"], recipe=recipe, package=False,
                          quiet=True, continue_from=tiny_pipeline["packaged"], seed=2,
                          precision=flags["precision"])
    table = pretrain_report.ablation_table(pretrain_report.load_ablations())
    assert table["ablation"].tolist() == ["fp32-dropout", "bf16"]  # the configs' order
    assert table["precision"].tolist() == ["fp32", "bf16"]
    assert table["dropout"].tolist() == [0.1, 0.0]
    assert table["tokens (M)"].tolist() == [8 * 64 * 8 / 1e6] * 2
    base, other = table.iloc[0], table.iloc[1]
    assert base["minus fp32-dropout, novels"] == 0.0
    assert other["minus fp32-dropout, novels"] == pytest.approx(
        other["valid loss, novels (bits)"] - base["valid loss, novels (bits)"])
    assert math.isnan(base["valid loss, reviews (bits)"])  # the tiny corpus has no reviews
    assert other["valid loss, novels (bits)"] != base["valid loss, novels (bits)"]
