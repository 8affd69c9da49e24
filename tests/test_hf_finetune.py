"""Task 5: the Trainer recipe equals fairseq's, and a tiny real run leaves logs the chapter reads."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pandas as pd
import pytest

from finetune_lab.book import hf_compare
from finetune_lab.config import WORK_DIR_ENV
from finetune_lab.models import conversion_record, hf_convert
from finetune_lab.train import hf_finetune
from finetune_lab.train.hf_defaults import hf_vs_fairseq_defaults
from finetune_lab.train.recipe import LAB_RECIPE

EPOCHS = 2
TINY_RECIPE = dataclasses.replace(LAB_RECIPE, epochs=EPOCHS, lr=5e-4, max_positions=64)


def test_every_setting_matches_the_fairseq_recipe():
    table = hf_vs_fairseq_defaults()
    assert table["matched"].all(), table[~table["matched"]].to_string()
    rows = table.set_index("setting")
    # the Trainer defaults are read live, and they do differ from the lab's recipe
    assert rows.loc["Adam betas", "Trainer default"] == "(0.9, 0.999)"
    assert rows.loc["gradient clipping (max norm)", "Trainer default"] == "1.0"
    assert rows.loc["weight decay", "Trainer default"] == "0.0"
    assert rows.loc["warm-up updates", "Transformers run"] == "67"
    assert rows.loc["total updates", "Transformers run"] == "1125"


def test_a_warmup_ratio_is_a_float_warmup_steps_rounded_up():
    """transformers 5 has no ``warmup_ratio``: a float ``warmup_steps`` in [0, 1) is the ratio,
    and the Trainer rounds ⌈0.06 × 1125⌉ = 68, not the recipe's int(67.5) = 67."""
    import dataclasses as dc

    from transformers import TrainingArguments

    from finetune_lab.train.hf_defaults import ratio_warmup_steps

    assert "warmup_ratio" not in {f.name for f in dc.fields(TrainingArguments)}
    assert ratio_warmup_steps(0.06, 1125) == 68 and LAB_RECIPE.warmup_updates(1800) == 67
    assert ratio_warmup_steps(0.05, 80) == 4  # the FAQ fine-tune's warm-up
    note = hf_vs_fairseq_defaults().set_index("setting").loc["warm-up updates", "note"]
    assert "warmup_ratio" not in note and "would give 68" in note


def test_token_check_names_the_missing_prepared_data(monkeypatch, tmp_path):
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "no-work"))
    check = hf_compare.token_check()
    assert check.table is None and (check.identical, check.reviews) == (0, 0)
    assert any(p.endswith("cls.books/train.review") for p in check.missing), check.missing


def test_lr_schedules_are_identical_update_by_update():
    df = hf_compare.lr_schedules(1800)
    assert len(df) == 1125
    assert df["fairseq"].max() == pytest.approx(LAB_RECIPE.lr)
    assert df["difference"].abs().max() < 1e-15


def test_weight_decay_covers_every_parameter(tmp_path):
    from transformers import RobertaForSequenceClassification

    model = RobertaForSequenceClassification(hf_convert.hf_model_config(hf_convert.tiny_size()))
    args = hf_finetune.training_arguments(LAB_RECIPE, 1800, 0, tmp_path)
    data = hf_finetune.ReviewDataset([[0, 5, 2]], [1])
    trainer = hf_finetune._parity_trainer_class()(model=model, args=args, eval_dataset=data)
    opt = trainer.create_optimizer()
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == LAB_RECIPE.weight_decay
               for p in g["params"]}
    assert decayed == {id(p) for p in model.parameters()}
    assert args.max_grad_norm == 0


def _texts(n: int) -> list[tuple[str, int]]:
    """Real CLS-Books reviews when the data root is present, else synthetic two-class lines."""
    from finetune_lab.config import default_data_root

    path = default_data_root() / "webis-cls-10/fr/books/train.review"
    if path.is_file():
        from finetune_lab.data.cls_books import read_reviews

        reviews = read_reviews(path)[::40][:n]
        return [(r.text, r.label) for r in reviews]
    rng = random.Random(0)
    good, bad = ["superbe", "magnifique", "passionnant"], ["ennuyeux", "raté", "décevant"]
    return [(" ".join(rng.choice(good if y else bad) for _ in range(6)) + " livre", y)
            for y in (rng.randint(0, 1) for _ in range(n))]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Two real tiny Trainer runs: a random init and one from a converted fairseq model."""
    import torch

    from conftest import make_tiny_cls
    from finetune_lab.models import trust
    from finetune_lab.models.params import fairseq_model

    root = tmp_path_factory.mktemp("hf-runs")
    tok_dir, cls_dir = make_tiny_cls(root, _texts(48), vocab_size=200)

    from finetune_lab.models.hf_tokenizer import FairseqIdTokenizer

    size = hf_convert.tiny_size(FairseqIdTokenizer.from_dir(tok_dir).vocab_size)
    fs = fairseq_model(size, classification_head=False)
    ckpt = root / "ckpt" / "model.pt"
    ckpt.parent.mkdir()
    torch.save({"model": fs.state_dict(), "args": None,
                "cfg": {"model": {"encoder_attention_heads": size.heads}}}, ckpt)
    import os

    os.environ[trust.TRUSTED_DIRS_ENV] = str(ckpt.parent)
    try:
        model_dir = hf_convert.convert_checkpoint(ckpt, root / "hf", tok_dir)
    finally:
        del os.environ[trust.TRUSTED_DIRS_ENV]

    runs_root = root / "runs"
    common = dict(cls_dir=cls_dir, recipe=TINY_RECIPE, logging_steps=2, runs_root=runs_root)
    dirs = [
        hf_finetune.finetune_transformers("random", 0, tokenizer_dir=tok_dir, size=size, **common),
        hf_finetune.finetune_transformers("pretrained", 0, model_dir=model_dir, **common),
    ]
    return runs_root, dirs


@pytest.mark.slow
def test_manifests_are_complete_and_valid(tiny_runs):
    from finetune_lab.runs.registry import validate_run

    _, dirs = tiny_runs
    for run_dir in dirs:
        rec = validate_run(run_dir)
        assert rec.valid, rec.reason
        man = json.loads((run_dir / "manifest.json").read_text())
        assert man["status"] == "complete" and man["framework"] == "transformers"
        assert man["experiment"] == "transformers" and man["seed"] == 0
        assert man["wall_time_s"] > 0 and man["outputs"]
        hp = man["hyperparameters"]
        assert hp["adam_betas"] == [0.9, 0.98] and hp["trainer_max_grad_norm"] == 0.0
        assert hp["epochs"] == EPOCHS and hp["total_updates"] == 4 * EPOCHS
        # measured like the LoRA runs, so the LoRA chapter can use them as full fine-tuning
        extra = man["extra"]
        params = extra["parameters"]
        assert params["trainable"] == params["total"] > 0
        assert params["counted_by"].startswith("numel()")
        assert extra["peak_memory"]["bytes"] > 0 and extra["peak_memory"]["measure"]
        assert 0 < extra["time_s"] <= man["wall_time_s"]
        assert man["device"]["threads"] >= 1
    pretrained = json.loads((dirs[1] / "manifest.json").read_text())
    assert pretrained["init"] == "pretrained" and pretrained["inputs"]["checkpoint"]
    # the fairseq checkpoint behind the converted model, which the registry checks on any clone
    from finetune_lab._files import sha256_file

    source = pretrained["extra"][conversion_record.CONVERTED_FROM]
    ckpt = Path(source["path"])
    assert ckpt.name == "model.pt" and source["sha256"] == sha256_file(ckpt)
    assert conversion_record.CONVERTED_FROM not in json.loads((dirs[0] / "manifest.json").read_text()).get("extra", {})


@pytest.mark.slow
def test_logs_hold_loss_valid_and_test_for_every_epoch(tiny_runs):
    runs_root, _ = tiny_runs
    comp = hf_compare.load_comparison(runs_root)
    assert comp.present == {"fairseq": 0, "transformers": 2}
    assert not comp.ready  # no fairseq runs here: the chapter must say so
    df = comp.loaded.scalars
    for run, one in df.groupby("run"):
        for subset, tag in (("train", "loss"), ("train", "epoch_loss"), ("eval", "accuracy"),
                            ("test", "accuracy")):
            epochs = set(one[(one["subset"] == subset) & (one["tag"] == tag)]["epoch"].round(6))
            assert {float(e) for e in range(1, EPOCHS + 1)} <= epochs, (run, subset, tag, epochs)
    acc = df[df["tag"] == "accuracy"]["value"]
    assert acc.between(0, 100).all() and (acc > 1).any()  # percent, as fairseq logs it
    table = hf_compare.per_seed_table(comp)
    assert set(table["init"]) == {"random", "pretrained"}
    assert (table["wall time (min)"] > 0).all()
    assert table["best epoch"].between(1, EPOCHS).all()
    fig = hf_compare.plot_framework_curves(comp, "random")
    assert fig.axes[0].lines


def test_framework_gap_says_whether_it_is_within_seed_noise():
    best = pd.DataFrame({
        "experiment": ["fairseq"] * 3 + ["transformers"] * 3,
        "framework": ["fairseq"] * 3 + ["transformers"] * 3,
        "init": ["pretrained"] * 6, "seed": [0, 1, 2] * 2, "run": ["r"] * 6,
        "best_epoch": [1] * 6, "best_step": [1] * 6, "valid": [80.0] * 6,
        "test": [80.0, 81.0, 82.0, 80.5, 81.5, 79.5],
    })
    comp = hf_compare.Comparison(loaded=None, best=best, present={})
    row = hf_compare.framework_gaps(comp).iloc[0]
    assert row["difference"] == pytest.approx(80.5 - 81.0)
    assert bool(row["within seed noise"])
    assert row["ci_low"] < row["difference"] < row["ci_high"]
    assert row["95 % CI"] == "−2.8 to +1.8"  # one decimal and signed, as the book prints gaps
    far = best.assign(test=[80.0, 80.1, 80.2, 90.0, 90.1, 90.2])
    row = hf_compare.framework_gaps(hf_compare.Comparison(None, far, {})).iloc[0]
    assert not bool(row["within seed noise"])
    # an init one framework never ran (random Transformers runs need a GPU) is named, not failed
    fs_random = best[best["framework"] == "fairseq"].assign(init="random")
    both = hf_compare.Comparison(None, pd.concat([best, fs_random]), {})
    rows = hf_compare.framework_gaps(both).set_index("init")
    assert rows.loc["random", "95 % CI"] == "no transformers random runs to compare"
    assert bool(rows.loc["pretrained", "within seed noise"])
    assert hf_compare.inits_without_transformers(both) == ["random"]
    assert hf_compare.inits_without_transformers(comp) == []


def test_the_loss_figure_gives_both_libraries_in_bits():
    """fairseq logs bits and Transformers nats: the figure shows bits, as every other loss."""
    import math

    df = pd.DataFrame({"framework": ["fairseq", "transformers", "transformers"],
                       "subset": ["train"] * 3, "tag": ["loss", "epoch_loss", "loss"],
                       "value": [1.5, math.log(2) * 2.0, 9.0], "epoch": [1, 1, 1]})
    bits = hf_compare.loss_in_bits(df).set_index("framework")["value"]
    assert bits.to_dict() == {"fairseq": 1.5, "transformers": pytest.approx(2.0)}
