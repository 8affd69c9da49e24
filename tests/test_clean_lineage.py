"""Issue 37: a pretraining lineage can be checked for the task's own texts (CLS-Books), and a
clean one can start from a random initialisation with sinusoidal positions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import TINY_ARCH, needs_data_root, use_tiny_work_dir

from finetune_lab._files import sha256_file
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.data.pretrain_corpus import corpus_kind
from finetune_lab.models.trust import fairseq_safe_globals
from finetune_lab.runs.manifest import read_manifest
from finetune_lab.train import pretrain_long
from finetune_lab.train.pretrain_lineage import (
    lineage_of,
    reads_task_texts,
    step_reads_task_texts,
    task_text_steps,
)
from finetune_lab.train.pretrain_recipe import PretrainRecipe, state_dir

RUNS = PROJECT_ROOT / "data" / "runs" / "pretrain"
PACKAGED = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr" / "manifest.json"


def _committed_lineage(run: str) -> list[dict]:
    manifest = json.loads((RUNS / run / "manifest.json").read_text(encoding="utf-8"))
    return lineage_of(manifest, f"data/runs/pretrain/{run}")


@pytest.mark.skipif(not PACKAGED.is_file(), reason="no committed checkpoint")
def test_the_packaged_checkpoint_lineage_is_task_adaptive():
    lineage = json.loads(PACKAGED.read_text(encoding="utf-8"))["lineage"]
    steps = {Path(s["run"]).name: s["task_texts"] for s in task_text_steps(lineage)}
    # the bag-of-words phases read prepare-pretrain --tapt's corpus; the masked-LM ones did not
    assert steps == {"cpu-seed1": False, "cpu-docbow1": True, "cpu-sinpos1": False,
                     "cpu-sinpos1-bow": True}
    assert reads_task_texts(lineage) is True


@pytest.mark.parametrize("run, expected", [
    ("cpu-seed1-c2", False),   # general corpus only, three runs
    ("cpu-tapt1", True),       # a task-adaptive run at the end
    ("cpu-long3", True),       # general itself, but behind it cpu-long's tapt phase
    ("cpu-sinpos1", True),     # general itself, continued from cpu-docbow1
])
def test_committed_lineages(run, expected):
    if not (RUNS / run / "manifest.json").is_file():
        pytest.skip(f"{run} is not in the run cache")
    assert reads_task_texts(_committed_lineage(run)) is expected


def _manifest(corpora=None, phases=None, data=()):
    return {"extra": {"corpora": corpora} if corpora is not None else {},
            "hyperparameters": {"phases": phases or []},
            "inputs": {"data": [{"path": d} for d in data]}}


def test_recorded_corpora_decide_and_missing_manifests_leave_it_open():
    clean = {
        "a": _manifest([{"phase": "general", "path": "data/work/pretrain-bin/bin",
                         "kind": "general"}]),
        "b": _manifest([{"phase": "dapt", "path": "data/work/pretrain-dapt-bin/bin",
                         "kind": "dapt"}]),
    }
    lineage = [{"run": "a"}, {"run": "b"}]
    assert reads_task_texts(lineage, clean.get) is False
    assert "dapt" in task_text_steps(lineage, clean.get)[1]["evidence"]
    # a step whose manifest is not at hand: unknown, not clean
    assert reads_task_texts([*lineage, {"run": "gone"}], clean.get) is None
    # ... unless another step is known to be task-adaptive
    tapt = {**clean, "c": _manifest([{"phase": "tapt", "path": "x", "kind": "tapt"}])}
    assert reads_task_texts([{"run": "gone"}, {"run": "c"}], tapt.get) is True
    # runs from before the corpora were recorded: their phases, then their corpus paths
    assert step_reads_task_texts(_manifest(phases=[{"name": "tapt", "until_update": 9}]))[0]
    assert step_reads_task_texts(_manifest(data=["data/work/pretrain-tapt-bin/bin"]))[0]
    assert not step_reads_task_texts(_manifest(data=["data/work/pretrain-bin/bin"]))[0]


def test_the_first_phase_is_named_by_its_corpus():
    dapt, tapt = Path("d"), Path("t")
    assert pretrain_long.plan_phases(20, dapt, None, 0.0, general_kind="dapt") == [
        pretrain_long.Phase("dapt", dapt, 0, 20)]
    assert [p.name for p in pretrain_long.plan_phases(20, dapt, tapt, 0.5, "dapt")] == [
        "dapt", "tapt"]


def test_corpus_kind_reads_the_documents():
    dvd = ["webis-cls-10/fr/dvd/train.review", "webis-cls-10/fr/music/test.review"]
    assert corpus_kind(dvd) == "dapt"
    assert corpus_kind(["eltec-fra/level1/x.txt.xz", *dvd]) == "general"
    assert corpus_kind([*dvd, "webis-cls-10/fr/books/train.review"]) == "tapt"


def _long(tiny_pipeline, tmp_path, monkeypatch, run, **kw):
    use_tiny_work_dir(tiny_pipeline, tmp_path, monkeypatch)
    recipe = PretrainRecipe(tokens_per_sample=64, batch_size=8, validate_every=5,
                            log_interval=1, lr=1e-3, arch=TINY_ARCH, dropout=0.0,
                            attention_dropout=0.0)
    return pretrain_long.pretrain_long(
        run=run, tokens=6 * 64 * 8, data_dir=tiny_pipeline["corpus"], recipe=recipe,
        precision="fp32", quiet=True, package_to=tmp_path / f"pkg-{run}", **kw)


def _first_loss(run_dir: Path) -> float:
    for line in (run_dir / "train.log").read_text().splitlines():
        if "| train_inner |" in line and "num_updates=1," in line:
            return float(re.search(r"\bloss=([0-9.]+)", line).group(1))
    raise AssertionError("no first update logged")


@needs_data_root
@pytest.mark.slow
def test_a_run_from_scratch_can_start_from_sinusoidal_positions(tiny_pipeline, tmp_path,
                                                               monkeypatch):
    import torch

    from finetune_lab.models import position_init

    run_dir = _long(tiny_pipeline, tmp_path, monkeypatch, "scratch-sin",
                    position_init="sinusoidal")
    m = read_manifest(run_dir)
    assert m["status"] == "complete" and m["init"] == "random"
    assert m["hyperparameters"]["position_init"] == "sinusoidal"
    assert "continued_from" not in m["extra"]
    assert m["extra"]["random_init"]["init"] == "random"
    assert m["extra"]["corpora"][0]["kind"] == "general"
    record = m["extra"]["position_init"]
    assert record["neighbour_cosine_before"] < 0.5 < 0.9 < record["neighbour_cosine_after"]
    init = state_dir("scratch-sin") / "init_model.pt"
    assert record["sha256"] == sha256_file(init)
    with fairseq_safe_globals():
        rows = torch.load(init, weights_only=True)["model"][position_init.POSITIONS_KEY]
    assert position_init.neighbour_similarity(rows) > 0.9
    # the packaged weights say where they come from: no task text behind them
    package = json.loads((tmp_path / "pkg-scratch-sin" / "manifest.json").read_text())
    assert package["reads_task_texts"] is False
    assert [Path(s["run"]).name for s in package["lineage"]] == ["scratch-sin"]


@needs_data_root
@pytest.mark.slow
def test_the_random_init_file_is_fairseqs_own_initialisation(tiny_pipeline, tmp_path,
                                                             monkeypatch):
    # the file, positions kept, starts where fairseq's own random start does: same first loss
    monkeypatch.setattr(pretrain_long.position_inits, "write_sinusoidal_positions",
                        lambda path: {"position_init": "none (test)"})
    from_file = _long(tiny_pipeline, tmp_path, monkeypatch, "from-file",
                      position_init="sinusoidal", segment_updates=1)
    plain = _long(tiny_pipeline, tmp_path, monkeypatch, "plain", segment_updates=1)
    assert "--finetune-from-model" in read_manifest(from_file)["command"]
    assert "--finetune-from-model" not in read_manifest(plain)["command"]
    assert _first_loss(from_file) == pytest.approx(_first_loss(plain), abs=1e-3)
