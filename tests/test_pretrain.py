"""Issue 5: a tiny pretraining run end to end on CPU, its packaged checkpoint, and safe loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import needs_data_root

from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints, trust
from finetune_lab.runs import fairseq_logs
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.train import pretrain
from finetune_lab.train.pretrain_fairseq import fairseq_args, require_corpus
from finetune_lab.train.pretrain_lineage import (
    checkpoint_metadata,
    continuation_source,
    continued_run_name,
)
from finetune_lab.train.pretrain_recipe import (
    Launch,
    PretrainRecipe,
    cpu_has_bf16,
    experiment_config,
    spread,
)
from finetune_lab.train.pretrain_throughput import (
    gpu_peak_flops,
    model_flops_per_token,
    throughput_record,
)

pytestmark = needs_data_root


@pytest.fixture(scope="module")
def tiny_pretrain(tiny_pipeline):
    return {"run_dir": tiny_pipeline["pretrain_run"], "packaged": tiny_pipeline["packaged"]}


@pytest.mark.slow
def test_run_is_complete_with_curves_and_checkpoint_hash(tiny_pretrain):
    m = read_manifest(tiny_pretrain["run_dir"])
    assert m["status"] == "complete" and m["experiment"] == "pretrain"
    assert m["hyperparameters"]["mask_prob"] == 0.15
    assert m["hyperparameters"]["warmup_updates"] == 1  # 6 % of 30, at least 1
    assert len(m["saved_checkpoints"]["checkpoint_best.pt"]["sha256"]) == 64
    assert m["throughput"]["tokens_per_s"] > 0
    for subset in ("train", "train_inner", "valid"):
        assert list((tiny_pretrain["run_dir"] / subset).glob("events.out.tfevents*")), subset


@pytest.mark.slow
def test_packaged_checkpoint_is_weights_only_fp16(tiny_pretrain):
    folder = tiny_pretrain["packaged"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["model.pt", "dict.txt", "sentencepiece.bpe.model", "manifest.json"])
    manifest = json.loads((folder / "manifest.json").read_text())
    state = trust.load_trusted(folder / "model.pt", [folder / "manifest.json"])
    assert state["last_optimizer_state"] is None and "criterion" not in state
    floats = [v for v in state["model"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float16 for v in floats)
    assert manifest["files"]["model.pt"]["sha256"] == checkpoints.sha256_file(folder / "model.pt")
    assert manifest["valid_perplexity"] == pytest.approx(2 ** manifest["valid_loss_bits"])
    assert manifest["run"].endswith("pretrain/tiny")
    # The tied LM-head decoder is stored once, as the token embedding it is.
    m = state["model"]
    assert m["encoder.lm_head.weight"].data_ptr() == \
        m["encoder.sentence_encoder.embed_tokens.weight"].data_ptr()


@pytest.mark.slow
def test_packaged_checkpoint_fills_a_mask(tiny_pretrain, monkeypatch):
    monkeypatch.setattr(trust, "default_manifests",
                        lambda: [tiny_pretrain["packaged"] / "manifest.json"])
    hub = checkpoints.load_hub_model(tiny_pretrain["packaged"])
    top = hub.fill_mask("Il était une fois un <mask> dans la forêt.", topk=3)
    assert len(top) == 3 and all(isinstance(score, float) for _, score, _ in top)
    assert all("<mask>" not in text for text, _, _ in top)


@pytest.mark.slow
def test_fill_mask_answers_of_uncommitted_weights_are_kept(tiny_pretrain, tmp_path):
    from finetune_lab.book import fill_mask as fm

    out = fm.record_fill_mask(tiny_pretrain["packaged"], "tiny", out_dir=tmp_path)
    record = json.loads(out.read_text())
    assert out == tmp_path / "tiny.json"
    assert record["checkpoint"]["sha256"] == checkpoints.sha256_file(
        tiny_pretrain["packaged"] / "model.pt")
    table = fm.recorded_fill_masks(tmp_path)["tiny"]["table"]
    assert set(table["sentence"]) == set(fm.DEMO_SENTENCES)
    # fairseq drops special pieces (</s>, <pad>) from the top 5, so a sentence may get fewer
    for _, part in table.groupby("sentence"):
        assert part["rank"].tolist() == list(range(1, len(part) + 1)) and len(part) <= 5
        # ranked by probability, a sentence's top 5 summing to at most 1
        assert part["probability"].is_monotonic_decreasing and part["probability"].sum() <= 1
    with pytest.raises(UserError, match="--name"):
        fm.record_fill_mask(tiny_pretrain["packaged"], "../x", out_dir=tmp_path)
    # a record the book may cite is kept unless --force (the fault trial's overwritten record)
    before = out.read_bytes()
    with pytest.raises(UserError, match="tiny.json exists .* --force"):
        fm.record_fill_mask(tiny_pretrain["packaged"], "tiny", out_dir=tmp_path)
    assert out.read_bytes() == before
    notes = {**record, "my_notes": "kept"}  # a user's annotations (trial 27's L-m6)
    out.write_text(json.dumps(notes))
    assert fm.record_fill_mask(tiny_pretrain["packaged"], "tiny", out_dir=tmp_path,
                               force=True) == out
    kept, = tmp_path.glob("tiny.json.replaced-*")  # --force keeps what it replaced beside it
    assert json.loads(kept.read_text()) == notes and "my_notes" not in json.loads(out.read_text())
    # once these weights are the committed file, their record is told apart from the others
    records = fm.recorded_fill_masks(tmp_path)
    mine, others = fm.split_committed(records, folder=tiny_pretrain["packaged"])
    assert list(mine) == ["tiny"] and others == {}
    mine, others = fm.split_committed(records, folder=tmp_path / "elsewhere")
    assert mine == {} and list(others) == ["tiny"]
    live = fm.fill_mask_table(folder=tiny_pretrain["packaged"])
    assert fm.differing_answers(table, live) == 0  # the same weights answer the same
    changed = live.copy()
    changed.loc[0, "predicted piece"] = "zzz"
    changed.loc[1, "probability"] += 0.02
    assert fm.differing_answers(table, changed) == 2
    assert fm.differing_answers(table, live.iloc[1:]) == 1


def test_unlisted_checkpoint_is_refused(tmp_path):
    ckpt = tmp_path / "model.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, ckpt)
    with pytest.raises(trust.UntrustedCheckpointError, match="in no manifest"):
        trust.load_trusted(ckpt, manifests=[])


@pytest.mark.slow
def test_tampered_packaged_checkpoint_is_refused(tiny_pretrain, tmp_path):
    copy = tmp_path / "model.pt"
    shutil.copyfile(tiny_pretrain["packaged"] / "model.pt", copy)
    with open(copy, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(trust.UntrustedCheckpointError, match="in no manifest"):
        trust.load_trusted(copy, [tiny_pretrain["packaged"] / "manifest.json"])


def test_missing_corpus_names_the_command(tmp_path):
    with pytest.raises(UserError, match="prepare-pretrain"):
        require_corpus(tmp_path)


def test_log_rates_skip_the_start_up_interval():
    log = "\n".join(
        f"x | INFO | train_inner | epoch 001:  {i} / 9 loss=9, wps={w}, ups={u}, wpb=1"
        for i, (w, u) in enumerate([(10, 0.1), (1000, 2.0), (1200, 2.2), (1100, 2.1)]))
    assert fairseq_logs.log_rates(log) == {"updates_per_s": 2.1, "tokens_per_s": 1100.0}


def test_mean_tokens_per_update_reads_wpb_of_every_interval():
    log = "\n".join(
        f"x | INFO | train_inner | epoch 001:  {i} / 9 loss=9, wps=10, ups=1, wpb={w}, bsz=20"
        for i, w in enumerate([3932, 3766, 3041.5]))
    assert fairseq_logs.mean_tokens_per_update(log) == pytest.approx((3932 + 3766 + 3041.5) / 3)
    assert fairseq_logs.mean_tokens_per_update("x | valid | loss 9 | wpb 1197") is None


def test_log_rates_read_the_exponent_fairseq_writes_past_a_million():
    # the H100 run's log: read as 1.34 tokens/s before the exponent was parsed
    log = "\n".join(
        f"x | INFO | train_inner | epoch 007: {i} / 9 loss=3, wps={w}, ups={u}, wpb=65536"
        for i, (w, u) in enumerate([("9e+05", "10"), ("1.34007e+06", "20.45"),
                                    ("1.32958e+06", "20.29"), ("1.4213e+06", "21.69")]))
    assert fairseq_logs.log_rates(log) == {"updates_per_s": 20.45, "tokens_per_s": 1340070.0}


def test_mfu_uses_the_gpu_peak():
    recipe = PretrainRecipe()
    log = "\n".join("x | INFO | train_inner | wps 1000000 | ups 10" for _ in range(3))
    rec = throughput_record(log, recipe, {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1})
    assert rec["peak_bf16_flops"] == 989e12
    assert rec["mfu"] == pytest.approx(rec["achieved_flops"] / 989e12)
    assert rec["parameters"] == 23_124_736
    assert gpu_peak_flops("NVIDIA H100 PCIe") == 756e12
    cpu = throughput_record(log, recipe, {"type": "cpu", "name": "Xeon", "count": 1})
    assert "mfu" not in cpu and cpu["tokens_per_s"] == 1_000_000


def test_flops_per_token_equal_torchs_count_on_the_real_model():
    """The analytic FLOPs behind MFU, asserted equal to torch's count of every matrix product
    in a forward and backward pass of fairseq's roberta_small with 15 % of 256 tokens masked."""
    from argparse import Namespace

    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY
    from fairseq.models.roberta import RobertaModel
    from torch.utils.flop_counter import FlopCounterMode

    import finetune_lab.models.fairseq_user_dir  # noqa: F401  (registers roberta_small)
    from finetune_lab.models import params

    vocab = Dictionary()
    for i in range(params.SMALL.vocab - len(vocab)):
        vocab.add_symbol(f"w{i}")
    args = Namespace(arch="roberta_small")
    ARCH_CONFIG_REGISTRY["roberta_small"](args)
    model = RobertaModel.build_model(args, Namespace(source_dictionary=vocab))
    tokens = torch.randint(5, len(vocab), (1, 256))
    masked = torch.zeros(1, 256, dtype=torch.bool)
    masked[0, :38] = True  # 15 % of 256, as fairseq rounds it
    with FlopCounterMode(display=False) as counter:
        logits, _ = model(tokens, masked_tokens=masked)
        logits.float().sum().backward()
    per_token = model_flops_per_token(params.SMALL, 256, 38 / 256)
    assert counter.get_total_flops() / 256 == pytest.approx(per_token, rel=1e-9)
    assert 55e6 < model_flops_per_token(params.SMALL, 256, 0.15) < 60e6


def test_time_budget_and_valid_prefix_reach_fairseq(tmp_path):
    recipe = PretrainRecipe(max_update=100, max_valid_steps=40)
    args = fairseq_args(tmp_path, tmp_path / "ckpt", recipe, seed=1, device="cpu",
                        precision="fp32", stop_minutes=90)
    assert args[args.index("--stop-time-hours") + 1] == "1.5000"
    assert args[args.index("--max-valid-steps") + 1] == "40"
    assert args[args.index("--warmup-updates") + 1] == "6" and "--cpu" in args
    gpu = fairseq_args(tmp_path, tmp_path, PretrainRecipe(), seed=1,
                       device="cuda", precision="bf16")
    assert "--bf16" in gpu and "--stop-time-hours" not in gpu and "--max-valid-steps" not in gpu
    assert "--valid-subset" not in gpu  # no held-out reviews: fairseq's default "valid"
    (tmp_path / "valid1.bin").write_bytes(b"")
    with_reviews = fairseq_args(tmp_path, tmp_path, recipe, seed=1, device="cpu",
                                precision="fp32")
    assert with_reviews[with_reviews.index("--valid-subset") + 1] == "valid,valid1"


def test_bf16_on_a_cpu_only_where_it_computes_bf16():
    assert cpu_has_bf16("flags\t: fpu avx512f amx_bf16 amx_tile")
    assert cpu_has_bf16("flags : avx512_bf16")
    assert not cpu_has_bf16("flags : fpu avx2 avx512f")
    args = fairseq_args(Path("bin"), Path("ckpt"), PretrainRecipe(), seed=1,
                        device="cpu", precision="bf16")
    assert "--cpu" in args and "--bf16" in args
    with pytest.raises(UserError, match="fp16 training needs a GPU"):
        fairseq_args(Path("bin"), Path("ckpt"), PretrainRecipe(), seed=1,
                     device="cpu", precision="fp16")


def test_bf16_is_not_a_tpu_without_torch_xla(tmp_path):
    """fairseq's own parsing of the project's --bf16 command turns on ``tpu`` in every section;
    the user dir's :func:`clear_tpu` turns it off everywhere."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from finetune_lab.models.fairseq_compat import clear_tpu, preserved_root_logger

    args = fairseq_args(tmp_path, tmp_path / "ckpt", PretrainRecipe(), seed=1,
                        device="cpu", precision="bf16")
    with preserved_root_logger():
        parsed = options.parse_args_and_arch(options.get_training_parser(), args)
        cfg = convert_namespace_to_omegaconf(parsed)
    assert cfg.common.tpu and cfg.criterion.tpu  # what fairseq 0.12 makes of --bf16
    assert {"common", "criterion"} <= set(clear_tpu(cfg))
    assert not cfg.common.tpu and not cfg.criterion.tpu and not cfg.optimizer.tpu
    assert cfg.common.bf16 and cfg.common.cpu


def test_continued_runs_are_named_after_the_first():
    assert continued_run_name("data/runs/pretrain/cpu-seed1", 1) == "cpu-seed1-c1"
    assert continued_run_name("data/runs/pretrain/cpu-seed1-c1", 2) == "cpu-seed1-c2"


def test_last_update_reads_both_log_formats():
    assert fairseq_logs.last_update("a | num_updates=120, lr=1\nb | num_updates 130 | lr 1") == 130
    assert fairseq_logs.last_update("no progress yet") is None


def test_experiment_config_fixes_the_recipe_and_lets_budget_vary():
    cfg = experiment_config(PretrainRecipe())
    assert cfg["hyperparameters"]["mask_prob"] == 0.15
    assert "max_update" not in cfg["hyperparameters"] and "max_update" in cfg["varying"]


def _valid_losses(run_dir) -> list[float]:
    from finetune_lab.runs.registry import validate_run
    from finetune_lab.runs.tblogs import run_scalars

    df = run_scalars(validate_run(run_dir))
    valid = df[(df["subset"] == "valid") & (df["tag"] == "loss")]
    return valid.sort_values("step")["value"].tolist()


@pytest.mark.slow
def test_pretraining_continues_from_the_packaged_weights(tiny_pipeline, tmp_path, monkeypatch):
    from conftest import TINY_ARCH

    from finetune_lab._files import sha256_file

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    parent = tiny_pipeline["packaged"]
    recipe = PretrainRecipe(tokens_per_sample=64, batch_size=8, max_update=10,
                            validate_every=5, log_interval=5, lr=1e-3, arch=TINY_ARCH)
    run_dir = pretrain.pretrain(max_update=10, data_dir=tiny_pipeline["corpus"],
                                tokenizer_dir=tiny_pipeline["tok"], recipe=recipe,
                                package_to=tmp_path / "pkg", quiet=True, continue_from=parent,
                                precision="bf16")
    assert run_dir.name == "tiny-c1"  # the parent run's name, continued once
    m = read_manifest(run_dir)
    assert m["status"] == "complete" and m["init"] == "continued"
    # not the parent's seed 1, which would replay the samples the weights were trained on
    assert m["seed"] == 2 and m["command"][m["command"].index("--seed") + 1] == "2"
    # fairseq 0.12's --bf16 means "TPU" (torch_xla); the project's user dir makes it bf16 here
    assert "--bf16" in m["command"] and "--cpu" in m["command"]
    assert m["hyperparameters"]["precision"] == "bf16"
    assert "bf16 on the CPU, not a TPU" in (run_dir / "train.log").read_text()
    assert m["extra"]["continued_from"]["sha256"] == sha256_file(parent / "model.pt")
    # the weights were loaded: the continued run starts where the parent's 30 updates ended,
    # not where a random initialisation starts
    parent_valid, valid = _valid_losses(tiny_pipeline["pretrain_run"]), _valid_losses(run_dir)
    assert valid[0] < parent_valid[0] and abs(valid[0] - parent_valid[-1]) < 0.05
    lineage = json.loads((tmp_path / "pkg" / "manifest.json").read_text())["lineage"]
    assert [step["updates"] for step in lineage] == [30, 10]
    assert [step["tokens"] for step in lineage] == [30 * 64 * 8, 10 * 64 * 8]
    assert lineage[1]["run"].endswith("tiny-c1")
    # packaging the same weights by hand (`package-checkpoint`) records the same lineage
    best = tmp_path / "work" / "pretrain-checkpoints" / "tiny-c1" / "checkpoint_best.pt"
    assert checkpoint_metadata(best, [run_dir / "manifest.json"])["lineage"] == lineage


def test_checkpoint_metadata_loads_an_unlisted_checkpoint_only_when_trusted(tmp_path):
    ckpt = tmp_path / "checkpoint_best.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "extra_state": {"best": 3.0}}, ckpt)
    with pytest.raises(trust.UntrustedCheckpointError, match="in no manifest"):
        checkpoint_metadata(ckpt, [])
    meta = checkpoint_metadata(ckpt, [], trust=True)
    assert meta == {"run": None, "lineage": None, "valid_loss_bits": 3.0, "valid_perplexity": 8.0,
                    "reads_task_texts": None}  # no lineage: not known


def test_a_checkpoint_saved_on_the_way_is_packaged_with_its_own_lineage(tmp_path, monkeypatch):
    """A long run's intermediate checkpoint (``package-checkpoint --trust`` of its save folder):
    the lineage is the run's, cut at the checkpoint's update, not the run's latest."""
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    run_dir = tmp_path / "runs" / "pretrain" / "long3"
    run_dir.mkdir(parents=True)
    earlier = [{"run": "data/runs/pretrain/long2", "updates": 100, "tokens": 409_600}]
    (run_dir / "manifest.json").write_text(json.dumps({
        "status": "paused", "updates_done": 900, "hyperparameters": {"tokens_per_update": 4096},
        "extra": {"continued_from": {"lineage": earlier}}}))
    saved = tmp_path / "work" / "pretrain-checkpoints" / "long3" / "checkpoint_1_750.pt"
    saved.parent.mkdir(parents=True)
    torch.save({"model": {}, "extra_state": {"best": 6.5},
                "optimizer_history": [{"num_updates": 750}]}, saved)
    meta = checkpoint_metadata(saved, [run_dir / "manifest.json"], trust=True)
    assert meta["run"].endswith("pretrain/long3")
    assert meta["lineage"] == [*earlier, {"run": meta["run"], "updates": 750,
                                          "tokens": 750 * 4096}]
    assert meta["valid_loss_bits"] == 6.5
    # elsewhere than a run's save folder, nothing is inferred
    other = tmp_path / "elsewhere.pt"
    other.write_bytes(saved.read_bytes())
    assert checkpoint_metadata(other, [run_dir / "manifest.json"], trust=True)["run"] is None


def test_continuing_needs_a_trusted_package_with_the_corpus_dictionary(tiny_pipeline, tmp_path):
    from finetune_lab.errors import UserError

    with pytest.raises(UserError, match="model.pt is missing"):
        continuation_source(tmp_path, tiny_pipeline["corpus"])
    other = tmp_path / "other"
    shutil.copytree(tiny_pipeline["packaged"], other)
    (other / "dict.txt").write_text("▁le 1\n")
    with pytest.raises(UserError, match="is not the dictionary of"):
        continuation_source(other, require_corpus(tiny_pipeline["corpus"]))
    # a package from before lineages were kept: its one run, read from its manifest
    shutil.copytree(tiny_pipeline["packaged"], tmp_path / "legacy")
    man = json.loads((tmp_path / "legacy" / "manifest.json").read_text())
    del man["lineage"]
    (tmp_path / "legacy" / "manifest.json").write_text(json.dumps(man))
    src = continuation_source(tmp_path / "legacy",
                              require_corpus(tiny_pipeline["corpus"]))
    assert src["lineage"] == [{"run": man["run"], "updates": 30, "tokens": 30 * 64 * 8}]


@pytest.mark.slow
def test_a_corpus_prepared_again_leaves_the_pretraining_run_valid(tiny_pipeline, tmp_path):
    """A pretraining run's product is weights: re-preparing the corpus (new files, changed
    files) is a warning on it, not an exclusion, while a fine-tuning run would be excluded."""
    from finetune_lab.runs import manifest as mf
    from finetune_lab.runs.registry import validate_run

    corpus = tmp_path / "bin"
    shutil.copytree(tiny_pipeline["corpus"] / "bin", corpus)
    run = tmp_path / "runs" / "pretrain" / "tiny"
    shutil.copytree(tiny_pipeline["pretrain_run"], run)
    man = mf.read_manifest(run)
    man["inputs"]["data"][0]["path"] = str(corpus)
    mf.write_manifest(run, man)
    assert validate_run(run).valid and not validate_run(run).warnings
    (corpus / "valid1.bin").write_bytes(b"held-out reviews")
    (corpus / "train.idx").write_bytes(b"another corpus")
    rec = validate_run(run)
    assert rec.valid and len(rec.warnings) == 2
    assert all(w.startswith("the corpus was prepared again after the run") for w in rec.warnings)
    assert "so re-run it" not in " ".join(rec.warnings)
    moved = tmp_path / "runs" / "fairseq" / "tiny"
    shutil.copytree(run, moved)
    man["experiment"] = "fairseq"
    mf.write_manifest(moved, man)
    assert not validate_run(moved).valid


def test_package_to_reaches_pretrain(monkeypatch, tmp_path):
    """`pretrain --package-to DIR` packages a candidate beside the committed checkpoint."""
    from finetune_lab import cli
    from finetune_lab.train import pretrain_cli

    for var in ("FINETUNE_LAB_RUNS_DIR", "FINETUNE_LAB_WORK_DIR"):  # never the real run cache
        monkeypatch.setenv(var, str(tmp_path / var))
    seen = {}
    monkeypatch.setattr(pretrain_cli, "pretrain", lambda **kw: seen.update(kw) or tmp_path)
    assert cli.main(["pretrain", "--max-update", "5", "--package-to", str(tmp_path / "c")]) == 0
    assert seen["package_to"] == tmp_path / "c" and seen["package"] is True


def test_weights_only_state_stores_the_tied_pair_once():
    """bf16 training saves the LM head and the token embedding as two equal tensors; the package
    keeps one (46 MB, not 79), and keeps two when they really differ."""
    head, embed = checkpoints.TIED_WEIGHTS
    emb = torch.randn(320, 8, dtype=torch.bfloat16)
    state = {"model": {embed: emb, head: emb.clone(), "other": torch.ones(3)},
             "optimizer_history": [{"num_updates": 5}]}
    model = checkpoints.weights_only_state(state)["model"]
    assert model[head] is model[embed] and model[head].dtype == torch.float16
    state["model"][head] = emb.clone() + 1
    model = checkpoints.weights_only_state(state)["model"]
    assert model[head] is not model[embed]


def _train_losses(run_dir) -> list[float]:
    from finetune_lab.runs.registry import validate_run
    from finetune_lab.runs.tblogs import run_scalars

    df = run_scalars(validate_run(run_dir))
    inner = df[(df["subset"] == "train_inner") & (df["tag"] == "loss")]
    return inner.sort_values("step")["value"].tolist()


def test_spread_keeps_the_tokens_per_update():
    r = PretrainRecipe(batch_size=128, update_freq=2)
    assert spread(r, 2).update_freq == 1 and spread(r, 2).batch_size == 128
    r = PretrainRecipe(batch_size=16, update_freq=1)
    assert spread(r, 2).batch_size == 8
    with pytest.raises(UserError, match="divisible by 3"):
        spread(r, 3)


@pytest.mark.slow
def test_two_processes_over_gloo_train_as_one_process_with_the_same_batch(
        tiny_pipeline, tmp_path, monkeypatch):
    """fairseq's data-parallel training through torchrun, on a CPU: two processes, each one
    step of 4 sequences per update, log the same losses, update for update, as one process
    accumulating two such steps (the same effective batch, the same batches), and write one
    checkpoint; the manifest records the world size."""
    import socket

    from conftest import TINY_ARCH

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    recipe = PretrainRecipe(tokens_per_sample=64, batch_size=4, update_freq=2,
                            max_update=4, validate_every=4, log_interval=1, lr=1e-3,
                            arch=TINY_ARCH, dropout=0.0, attention_dropout=0.0)
    common = dict(max_update=4, seed=3, data_dir=tiny_pipeline["corpus"],
                  tokenizer_dir=tiny_pipeline["tok"], recipe=recipe, package=False, quiet=True,
                  precision="fp32")
    one = pretrain.pretrain(run="one-process", **common)
    with socket.socket() as s:  # a free port for torchrun's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = pretrain.pretrain(run="two-processes", launch=Launch(nproc_per_node=2,
                                                                master_port=port),
                            **common)
    m = read_manifest(two)
    assert m["status"] == "complete" and m["hyperparameters"]["world_size"] == 2
    assert m["hyperparameters"]["batch_size"] == 4 and m["hyperparameters"]["update_freq"] == 1
    assert m["hyperparameters"]["tokens_per_update"] == 64 * 8
    assert "torch.distributed.run" in m["command"] and "gloo" in m["command"]
    single, pair = _train_losses(one), _train_losses(two)
    assert len(single) == len(pair) == 4
    assert pair == pytest.approx(single, abs=2e-3)
    saved = list((tmp_path / "work" / "pretrain-checkpoints" / "two-processes").glob("*.pt"))
    assert {p.name for p in saved} >= {"checkpoint_best.pt", "checkpoint_last.pt"}
