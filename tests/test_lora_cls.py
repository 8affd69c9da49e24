"""LoRA vs full fine-tuning on CLS-Books: counts, tiny real runs per method, manifests, report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random

import pytest

from finetune_lab.book import lora_cls_report, lora_cls_runs
from finetune_lab.models import hf_convert
from finetune_lab.train import lora_cls
from finetune_lab.train.recipe import LAB_RECIPE

EPOCHS = 2
TINY_RECIPE = dataclasses.replace(LAB_RECIPE, epochs=EPOCHS, max_positions=64)
SEEDS = {"lora-qv": (0, 1), "lora-attn": (0, 1), "full": (0, 1)}


def _reviews(n: int) -> list[tuple[str, int]]:
    """Two-class lines, each with its own filler words: no training line is a test line
    (``split_checks.check_split`` refuses a split that shares them)."""
    rng = random.Random(0)
    good, bad = ["superbe", "magnifique", "passionnant"], ["ennuyeux", "raté", "décevant"]

    def filler() -> str:
        return "".join(rng.choice("bcdfglmnprstv") + rng.choice("aeiou") for _ in range(3))
    return [(" ".join([*(rng.choice(good if y else bad) for _ in range(3)),
                       *(filler() for _ in range(6))]) + " livre", y)
            for y in (rng.randint(0, 1) for _ in range(n))]


def test_peft_counts_equal_the_formula_for_roberta_small_and_a_tiny_model():
    for size in (None, hf_convert.tiny_size()):
        table = lora_cls_report.method_table(size).set_index("method")
        assert (table["trainable (peft)"] == table["analytic"]).all(), table
        assert table.loc["full", "trainable %"] == 100
    table = lora_cls_report.method_table().set_index("method")
    # RoBERTa-small-fr: d = 512, 4 layers; head 512·512 + 512 + 512·2 + 2 = 263,682
    assert table.loc["lora-qv", "trainable (peft)"] == 4 * 2 * 16 * 1024 + 263_682
    assert table.loc["lora-attn", "trainable (peft)"] == 4 * 4 * 16 * 1024 + 263_682
    assert table.loc["lora-qv", "peak lr"] == lora_cls.LORA_LR
    assert table.loc["full", "peak lr"] == LAB_RECIPE.lr
    # one trainable share: trainable over all parameters of the wrapped model, as peft reports
    # it (the head's saved copy counts in the total): 394,754 / 23,488,004
    assert lora_cls_report.trainable_share("lora-qv") == pytest.approx(394_754 / 23_488_004)
    assert f"{100 * lora_cls_report.trainable_share():.2f}" == "1.68"


def test_not_run_state_gives_the_exact_command(tmp_path):
    assert lora_cls_runs.cached_runs(tmp_path) is None
    text = lora_cls_report.state_markdown(None)
    assert "has not been run yet" in text
    assert "finetune-lab finetune lora --methods lora-qv lora-attn qlora-qv --seeds 0 1 2" in text
    assert "finetune-lab finetune transformers --init pretrained --seeds 0 1 2" in text
    # runs recorded but all excluded (e.g. made from a replaced checkpoint) are not "not run"
    recorded = lora_cls_report.not_run_text(recorded=True)
    assert recorded.startswith("**No usable run.**") and "not been run" not in recorded


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random 'pretrained' RoBERTa folder (as convert-hf writes one) and tiny CLS-Books."""
    from transformers import RobertaForMaskedLM

    from conftest import make_tiny_cls
    from finetune_lab.models.hf_tokenizer import FairseqIdTokenizer

    root = tmp_path_factory.mktemp("lora-cls")
    tok_dir, cls_dir = make_tiny_cls(root, _reviews(48), vocab_size=60)
    tok = FairseqIdTokenizer.from_dir(tok_dir)
    size = hf_convert.tiny_size(tok.vocab_size)
    model_dir = root / "hf"
    RobertaForMaskedLM(hf_convert.hf_model_config(size)).save_pretrained(model_dir)
    tok.save(model_dir)
    return {"root": root, "model_dir": model_dir, "cls_dir": cls_dir, "size": size}


@pytest.fixture(scope="module")
def tiny_runs(tiny):
    runs_root = tiny["root"] / "runs"
    dirs = {}
    for method, seeds in SEEDS.items():
        for seed in seeds:
            dirs[(method, seed)] = lora_cls.finetune_lora(
                method, seed, cls_dir=tiny["cls_dir"], model_dir=tiny["model_dir"],
                recipe=TINY_RECIPE, logging_steps=2, runs_root=runs_root)
    return runs_root, dirs


def _base_total(size) -> int:
    from transformers import RobertaForSequenceClassification

    model = RobertaForSequenceClassification(hf_convert.hf_model_config(size))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_manifests_record_method_parameters_memory_and_time(tiny, tiny_runs):
    from finetune_lab.runs.registry import validate_run

    _, dirs = tiny_runs
    size = tiny["size"]
    base = _base_total(size)
    for (method, seed), run_dir in dirs.items():
        assert run_dir.name == f"{method}-seed{seed}" and run_dir.parent.name == "lora"
        rec = validate_run(run_dir)
        assert rec.valid, rec.reason
        man = json.loads((run_dir / "manifest.json").read_text())
        assert man["status"] == "complete" and man["init"] == "pretrained"
        assert man["framework"] == "transformers" and man["seed"] == seed
        hp, extra = man["hyperparameters"], man["extra"]
        m = lora_cls.METHODS[method]
        assert hp["method"] == extra["method"] == method
        assert hp["lr"] == (lora_cls.LORA_LR if m.is_lora else LAB_RECIPE.lr)
        assert hp["epochs"] == EPOCHS and hp["batch_size"] == 8 and hp["adam_betas"] == [0.9, 0.98]
        assert hp["trainer_max_grad_norm"] == 0.0 and hp["warmup_updates"] == 0
        assert hp["lora"] == m.lora_settings() and hp["quantization"] is None
        trainable, total = lora_cls.analytic_counts(m, size.dim, size.layers, size.classes, base)
        assert extra["parameters"]["trainable"] == trainable
        assert extra["parameters"]["total"] == total
        if m.is_lora:
            assert extra["parameters"]["counted_by"].startswith("peft")
            assert 0 < trainable < base
        else:
            assert trainable == total == base
        peak = extra["peak_memory"]
        assert peak["device"] in ("cpu", "cuda") and peak["bytes"] > 0 and peak["measure"]
        assert extra["time_s"] > 0 and man["wall_time_s"] >= extra["time_s"]


@pytest.mark.slow
def test_valid_and_test_accuracy_are_logged_every_epoch(tiny_runs):
    runs_root, dirs = tiny_runs
    loaded = lora_cls_runs.cached_runs(runs_root)
    assert len(loaded.used) == len(dirs) and not loaded.excluded
    df = loaded.scalars
    for run, one in df.groupby("run"):
        for subset in ("eval", "test"):
            acc = one[(one["subset"] == subset) & (one["tag"] == "accuracy")]
            assert set(acc["epoch"].round(6)) == {float(e) for e in range(1, EPOCHS + 1)}, run
            assert acc["value"].between(0, 100).all()


@pytest.mark.slow
def test_report_table_has_one_row_per_method_with_n_seeds(tiny_runs, monkeypatch):
    runs_root, dirs = tiny_runs
    loaded = lora_cls_runs.cached_runs(runs_root)
    summ = lora_cls_runs.summary(loaded)
    assert summ["method"].tolist() == list(SEEDS)
    assert dict(zip(summ["method"], summ["n"])) == {m: len(s) for m, s in SEEDS.items()}
    table = lora_cls_report.results_table(loaded)
    assert table["method"].tolist() == list(SEEDS)
    for method, cell in zip(table["method"], table["test acc. at best valid epoch (%)"]):
        assert cell.endswith(f"(n={len(SEEDS[method])})")
    text = lora_cls_report.state_markdown(loaded)
    assert f"{len(dirs)} valid runs" in text and "not been run" not in text
    per_run = lora_cls_runs.per_run_table(loaded)
    assert per_run["best_epoch"].between(1, EPOCHS).all()
    # each LoRA method against full: the mean difference of the runs' own test accuracies
    gaps = lora_cls_report.gaps_to_full(loaded).set_index("method")
    assert list(gaps.index) == ["lora-qv", "lora-attn"]
    mean = per_run.groupby("method")["test"].mean()
    trainable = per_run.groupby("method")["trainable"].max()
    total = per_run.groupby("method")["total"].max()
    for method in gaps.index:
        g = gaps.loc[method]
        assert g["test gap (points)"] == pytest.approx(mean[method] - mean["full"])
        assert g["ci_low"] <= g["test gap (points)"] <= g["ci_high"]
        assert g["trainable share"] == pytest.approx(trainable[method] / total[method])
        assert 0 < g["trainable share"] < 1
        assert g["test mean"] - g["full mean"] == pytest.approx(g["test gap (points)"])
    shown = lora_cls_report.gaps_table(loaded)
    assert shown["difference"].tolist() == ["lora-qv − full", "lora-attn − full"]
    assert (gaps["n"] == 2).all() and (gaps["n full"] == 2).all()
    assert shown["LoRA − full (points)"].str.match(r"^[+−]?\d+\.\d$").all()  # as the index
    text = lora_cls_report.gaps_markdown(loaded)
    assert "LoRA at 5e-4, full fine-tuning at the lab's 1e-5" in text
    # the training state LoRA drops: 12 bytes (fp32 gradient + two Adam moments) per frozen one
    frozen = trainable["full"] - trainable["lora-qv"]
    assert gaps.loc["lora-qv", "state saved (MiB)"] == pytest.approx(frozen * 12 / 2**20)
    assert "MiB under `lora-qv`" in text
    # a peak that drops by more than freezing can save is said not to be the method's alone
    real = lora_cls_report.gaps_to_full(loaded)
    for saved, said in ((real["state saved (MiB)"] - 1, False),
                        (real["state saved (MiB)"] + 1, True)):
        monkeypatch.setattr(lora_cls_report, "gaps_to_full",
                            lambda _, saved=saved: real.assign(**{"peak saved (MiB)": saved}))
        beyond = "Under `lora-qv`, `lora-attn` it drops by more than freezing saves"
        assert (beyond in lora_cls_report.gaps_markdown(loaded)) is said
    monkeypatch.undo()
    # the runs were made one after the other on one setting: their times compare
    assert "so their times compare" in text and "shared the machine" not in text
    # two runs side by side: the time ratios measure the load too, and the text says so. (The
    # overlap is given, not staged in the manifests: tiny runs made one after the other cannot be
    # moved in time without contradicting their event files' creation times, which the registry
    # checks; runspeed.overlapping itself is tested in tests/test_runspeed.py.)
    pair = {"lora/lora-qv-seed0", "lora/lora-attn-seed0"}
    monkeypatch.setattr(lora_cls_report, "overlapping", lambda rec, runs: [
        o for o in runs if o is not rec and {rec.key, o.key} == pair])
    shared = lora_cls_runs.cached_runs(runs_root)
    text = lora_cls_report.gaps_markdown(shared)
    assert "and 2 of them shared the machine with other runs of this chapter" in text
    assert "the table gives no time ratio" in text
    assert "time / full" in shown and "time / full" not in lora_cls_report.gaps_table(shared)


@pytest.mark.slow
def test_registry_accepts_the_methods_and_flags_a_changed_recipe(tiny_runs):
    from finetune_lab.runs.manifest import read_manifest, write_manifest
    from finetune_lab.runs.registry import discover_runs

    runs_root, dirs = tiny_runs
    config = json.loads((runs_root / "lora" / "experiment.json").read_text())
    assert set(config["varying"]) == set(lora_cls.VARYING)
    assert "lr" not in config["hyperparameters"] and config["hyperparameters"]["epochs"] == EPOCHS
    assert all(r.valid for r in discover_runs(runs_root))
    # a LoRA run whose shared recipe differs is flagged by the registry
    run = dirs[("lora-qv", 1)]
    original = read_manifest(run)
    try:
        changed = json.loads(json.dumps(original))
        changed["hyperparameters"]["weight_decay"] = 0.1
        write_manifest(run, changed)
        bad = [r for r in discover_runs(runs_root) if not r.valid]
        assert [r.name for r in bad] == ["lora-qv-seed1"]
        assert "'weight_decay' = 0.1 differs from experiment.json" in bad[0].reason
        # within a method the varying keys must agree too; with two seeds nothing says which
        # LoRA config is the method's, so both runs are excluded (the registry's rule)
        changed = json.loads(json.dumps(original))
        changed["hyperparameters"]["lora"]["lora_alpha"] = 16  # (r would change the count)
        write_manifest(run, changed)
        loaded = lora_cls_runs.cached_runs(runs_root)
        assert [r.name for r in loaded.excluded] == ["lora-qv-seed0", "lora-qv-seed1"]
        assert all("hyperparameter 'lora'" in r.reason for r in loaded.excluded)
        assert "lora-qv-seed1" in lora_cls_report.state_markdown(loaded)
        assert lora_cls_runs.summary(loaded)["method"].tolist() == ["lora-attn", "full"]
    finally:
        write_manifest(run, original)


@pytest.mark.slow
def test_full_row_comes_from_the_transformers_runs_when_checked(tiny, tiny_runs, tmp_path):
    """Without ``full`` runs of its own, the table takes the Transformers pretrained runs,
    which must carry the measurements and this experiment's recipe."""
    import shutil

    from finetune_lab.train import hf_finetune
    from finetune_lab.runs.manifest import read_manifest, write_manifest

    runs_root, dirs = tiny_runs
    root = tmp_path / "runs"
    hf = [hf_finetune.finetune_transformers(
        "pretrained", seed, cls_dir=tiny["cls_dir"], model_dir=tiny["model_dir"],
        recipe=TINY_RECIPE, logging_steps=2, runs_root=root) for seed in (0, 1)]
    # before any LoRA run: the full row alone, and the command for the missing methods
    loaded = lora_cls_runs.cached_runs(root)
    assert lora_cls_runs.summary(loaded)["method"].tolist() == ["full"]
    text = lora_cls_report.state_markdown(loaded)
    assert "**Not run yet:** `lora-qv`, `lora-attn`, `qlora-qv`" in text
    assert "finetune-lab finetune lora --methods lora-qv lora-attn qlora-qv --seeds 0 1 2" in text
    assert "once a valid LoRA run is in the cache (none is now), each is checked" in text

    (root / "lora").mkdir(parents=True)
    shutil.copy(runs_root / "lora" / "experiment.json", root / "lora" / "experiment.json")
    for seed in SEEDS["lora-qv"]:
        shutil.copytree(dirs[("lora-qv", seed)], root / "lora" / f"lora-qv-seed{seed}")

    loaded = lora_cls_runs.cached_runs(root)
    assert lora_cls_runs.summary(loaded)["method"].tolist() == ["lora-qv", "full"]
    per_run = lora_cls_runs.per_run_table(loaded).set_index("run")
    assert per_run.loc["pretrained-seed0", "method"] == "full"
    assert per_run.loc["pretrained-seed1", "trainable"] == _base_total(tiny["size"])
    text = lora_cls_report.state_markdown(loaded)
    assert "The `full` row is the 2 Transformers runs" in text and "`pretrained-seed1`" in text
    assert "each agrees with the LoRA runs' pinned recipe" in text
    assert lora_cls_report.gaps_to_full(loaded)["method"].tolist() == ["lora-qv"]
    assert "**Not run yet:** `lora-attn`, `qlora-qv`, so" in text
    # runs of a method made from an earlier checkpoint: that method waits for a re-run
    from finetune_lab.runs.registry import RunRecord
    from finetune_lab.runs.tblogs import LoadedRuns

    stale = RunRecord(path=root / "lora" / "lora-attn-seed0", experiment="lora",
                      name="lora-attn-seed0", manifest={"hyperparameters": {"method": "lora-attn"}},
                      problems=["the checkpoint was replaced"], stale_checkpoint="0" * 64)
    text = lora_cls_report.state_markdown(LoadedRuns(scalars=loaded.scalars,
                                                     runs=[*loaded.runs, stale]))
    assert ("**To be re-run:** `lora-attn` (their runs were made from an earlier stand-in "
            "checkpoint, listed below), so the table has no row for it;") in text
    assert "**Not run yet:** `qlora-qv`, so the table has no row for it;" in text
    # two seeds of the three planned: each row says which seed it lacks
    assert lora_cls_report.seeds_missing(loaded) == {"lora-qv": [2], "full": [2]}
    assert ("**Fewer seeds than planned** (3 per method): `lora-qv` lacks seed 2; `full` lacks "
            "seed 2, so their rows stand on fewer runs") in text
    with pytest.MonkeyPatch.context() as mp:  # had the plan been these two seeds: nothing to say
        mp.setattr(lora_cls_report, "DEFAULT_SEEDS", (0, 1))
        assert lora_cls_report.seeds_missing(loaded) == {}
        assert "Fewer seeds" not in lora_cls_report.state_markdown(loaded)

    # a run without the measurements is excluded with the reason
    original = read_manifest(hf[1])
    try:
        bare = json.loads(json.dumps(original))
        del bare["extra"]
        write_manifest(hf[1], bare)
        loaded = lora_cls_runs.cached_runs(root)
        assert [r.name for r in loaded.excluded] == ["pretrained-seed1"]
        assert "manifest extra lacks" in loaded.excluded[0].reason
        assert lora_cls_runs.summary(loaded).set_index("method").loc["full", "n"] == 1
    finally:
        write_manifest(hf[1], original)

    # runs made with another recipe than this experiment's are no baseline for it
    config_path = root / "lora" / "experiment.json"
    config = json.loads(config_path.read_text())
    config["hyperparameters"]["epochs"] = EPOCHS + 3
    config_path.write_text(json.dumps(config))
    loaded = lora_cls_runs.cached_runs(root)
    full = [r for r in loaded.runs if r.experiment == "transformers"]
    assert len(full) == 2 and not any(r.valid for r in full)
    assert all("['epochs'] differ from lora's experiment.json" in r.reason for r in full)


@pytest.mark.slow
def test_cli_runs_then_skips_complete_runs(tiny, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    lora_cls.add_finetune_parser(parser.add_subparsers(dest="framework"))
    argv = ["lora", "--methods", "lora-attn", "--seeds", "3", "--epochs", "1",
            "--cls-dir", str(tiny["cls_dir"]), "--model-dir", str(tiny["model_dir"]),
            "--runs-root", str(tmp_path)]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    run = tmp_path / "lora-1ep" / "lora-attn-seed3"
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    assert args.func(parser.parse_args(argv)) == 0
    assert "lora-1ep/lora-attn-seed3 is complete; skipped" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["lora", "--methods", "adapters"])


@pytest.mark.slow
def test_qlora_runs_on_cpu_with_bitsandbytes(tiny, tmp_path):
    """No GPU needed: the base model is quantised to NF4 by bitsandbytes' CPU kernels."""
    from finetune_lab.models.four_bit import bitsandbytes_available

    if not bitsandbytes_available():
        pytest.skip("bitsandbytes does not import here")
    import torch

    common = {"cls_dir": tiny["cls_dir"], "model_dir": tiny["model_dir"], "logging_steps": 2,
              "recipe": dataclasses.replace(TINY_RECIPE, epochs=1), "runs_root": tmp_path}
    run = lora_cls.finetune_lora("qlora-qv", 0, **common)
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "complete"
    assert man["device"]["type"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert man["hyperparameters"]["quantization"]["bnb_4bit_quant_type"] == "nf4"
    size = tiny["size"]
    m = lora_cls.METHODS["qlora-qv"]
    trainable, total = lora_cls.analytic_counts(m, size.dim, size.layers, size.classes,
                                                _base_total(size))
    assert man["extra"]["parameters"]["trainable"] == trainable
    assert man["extra"]["parameters"]["total"] == total  # peft counts a 4-bit weight in full
