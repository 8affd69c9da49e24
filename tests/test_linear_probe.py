"""The linear probe of frozen features (issue 14): real tiny checkpoint, real split files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from finetune_lab._files import sha256_file
from finetune_lab.data.cls_books import ClsDataError
from finetune_lab.errors import UserError
from finetune_lab.train import linear_probe as lp


def test_probe_reads_a_separable_feature_and_not_noise():
    rng = np.random.default_rng(0)
    labels, features = {}, {}
    for split, n in (("train", 200), ("valid", 50), ("test", 100)):
        y = rng.integers(0, 2, n)
        signal = np.c_[y * 2.0 - 1.0 + rng.normal(0, 0.1, n), rng.normal(size=(n, 7))]
        labels[split] = y.tolist()
        features[split] = {"<s>": rng.normal(size=(n, 8)), "mean": signal}
    got = lp.probe_accuracy(features, labels)
    assert got["mean"]["test_accuracy"] == 100.0  # one column holds the label
    assert got["<s>"]["test_accuracy"] < 70  # noise: about chance on 100 reviews
    assert {got[f]["C"] for f in lp.FEATURES} <= set(lp.C_GRID)


def test_probe_of_a_real_checkpoint_and_of_its_random_initialisation(tiny_pipeline, tmp_path):
    out = lp.run_probe(tiny_pipeline["packaged"], name="tiny", cls_dir=tiny_pipeline["cls"],
                       out_dir=tmp_path)
    rec = json.loads(out.read_text())
    assert out == tmp_path / "tiny.json"
    assert rec["init"] == "pretrained" and rec["seed"] is None
    assert rec["sizes"] == {"train": 64, "valid": 16, "test": 32}
    assert rec["checkpoint"]["sha256"] == sha256_file(tiny_pipeline["packaged"] / "model.pt")
    assert rec["inputs"]["test.label"] == sha256_file(tiny_pipeline["cls"] / "test.label")
    for name in lp.FEATURES:
        test = rec["probes"][name]["test_accuracy"]
        # a share of the 32 test reviews, rounded to 2 decimals
        assert 0 <= test <= 100 and abs(round(test * 32 / 100) - test * 32 / 100) < 0.01
    rand = json.loads(lp.run_probe(tiny_pipeline["packaged"], name="tiny-random",
                                   random_init=True, seed=3, cls_dir=tiny_pipeline["cls"],
                                   out_dir=tmp_path).read_text())
    assert (rand["init"], rand["seed"]) == ("random", 3)
    assert rand["checkpoint"] == rec["checkpoint"]  # the architecture it was drawn for


def test_random_initialisation_replaces_every_weight(tiny_pipeline):
    import torch

    from finetune_lab.models.checkpoints import load_hub_model

    trained = load_hub_model(tiny_pipeline["packaged"])
    before = {k: v.clone() for k, v in trained.model.state_dict().items()}
    drawn = lp.randomised(trained, seed=0).model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], drawn[k])]
    layer_norms = [k for k in before if "layer_norm" in k and k.endswith(".weight")]
    assert layer_norms and all(torch.all(drawn[k] == 1) for k in layer_norms)
    # what was not redrawn is what fairseq's init does not touch: none of the trained matrices
    unchanged = set(before) - set(changed)
    assert not [k for k in unchanged if k.endswith(".weight") and "layer_norm" not in k]
    assert len(changed) > len(before) // 2


def test_bad_inputs_are_named(tiny_pipeline, tmp_path):
    with pytest.raises(UserError, match="--name"):
        lp.run_probe(tiny_pipeline["packaged"], name="../x", cls_dir=tiny_pipeline["cls"],
                     out_dir=tmp_path)
    with pytest.raises(ClsDataError, match="train.review is missing"):
        lp.run_probe(tiny_pipeline["packaged"], name="x", cls_dir=tmp_path, out_dir=tmp_path)
    assert not list(tmp_path.glob("*.json"))  # nothing half-written


def test_the_objective_ablation_reads_both_runs_from_the_cache():
    """The chapter's ablation of the ``<s>`` objective joins the committed whole-line runs to
    their probes by name; the reading is the difference of the two probes' JSON values."""
    from finetune_lab.book import pretrain_candidates as pc
    from finetune_lab.book import pretrain_report as pr
    from finetune_lab.book import probe_report as prp

    runs = pr.load_pretrain_runs()
    table = prp.objective_table(pc.candidate_table(runs), prp.probe_table())
    weights = dict(zip(table["run"], table["<s> bag-of-words weight"]))
    # the ablation's pair, the candidate that ran the same objective after sinusoids, and the
    # clean lineage's (the same objective on other reviews)
    assert weights == {"`pretrain/cpu-docbow1`": 8.0, "`pretrain/cpu-docmlm1`": 0.0,
                       "`pretrain/cpu-sinpos1-bow`": 8.0, "`pretrain/cpu-clean-bow1`": 8.0}
    parents = dict(zip(table["run"], table["continues"]))
    assert parents == {"`pretrain/cpu-docbow1`": "pretrain/cpu-seed1",
                       "`pretrain/cpu-docmlm1`": "pretrain/cpu-seed1",
                       "`pretrain/cpu-sinpos1-bow`": "pretrain/cpu-sinpos1",
                       "`pretrain/cpu-clean-bow1`": "pretrain/cpu-clean-general1"}
    probes = {name: json.loads((lp.probe_dir() / f"{name}.json").read_text())["probes"]
              for name in ("cpu-docbow1", "cpu-docmlm1")}
    reading = prp.objective_reading(table)
    # paired by start and budget, not by table order (the packaged cpu-sinpos1-bow comes first)
    assert reading.weight == 8.0 and reading.bag == "`pretrain/cpu-docbow1`"
    assert reading.control == "`pretrain/cpu-docmlm1`"
    alone = table[table["run"] != "`pretrain/cpu-docmlm1`"]
    assert prp.objective_reading(alone) is None  # no control shares cpu-sinpos1-bow's start
    assert reading.probe_s == pytest.approx(probes["cpu-docbow1"]["<s>"]["test_accuracy"]
                                            - probes["cpu-docmlm1"]["<s>"]["test_accuracy"])
    # whole-line updates hold fewer tokens than the 4,096 a full batch of 256-token samples does
    assert all(3000 < v < 4096 for v in table["tokens per update (measured)"])


def test_weights_fine_tuned_twice_count_each_seed_once():
    """The packaged checkpoint's weights were first fine-tuned as a candidate (the experiment
    :func:`packaged_rehearsal` finds), then again by the grid once packaged: the same weights
    (sha256) and seeds, which the probe table must not count twice."""
    from finetune_lab.book import pretrain_replacement as prl
    from finetune_lab.book import probe_report as prp
    from finetune_lab.models.checkpoints import MODEL_FILE, packaged_dir
    from finetune_lab.runs.registry import discover_runs
    from finetune_lab.runs.run_inputs import cached_sha256, recorded_checkpoint_sha

    sha = cached_sha256(packaged_dir() / MODEL_FILE)
    rehearsal = prl.packaged_rehearsal()
    assert rehearsal is not None
    seeds = {experiment: {r.seed for r in discover_runs(None, [experiment])
                          if r.valid and r.init == "pretrained"
                          and recorded_checkpoint_sha(r.manifest) == sha}
             for experiment in ("fairseq", rehearsal.experiment)}
    assert all(seeds.values())  # both experiments fine-tuned these very weights
    probed = [json.loads(p.read_text()) for p in lp.probe_dir().glob("*.json")]
    name = next(p["name"] for p in probed if p["init"] != "random"
                and p["checkpoint"]["sha256"] == sha)
    row = prp.probe_table().set_index("weights").loc[name]
    both = set().union(*seeds.values())
    assert row["fine-tuned (%)"].endswith(f"(n={len(both)})")
    assert len(both) < sum(len(s) for s in seeds.values())  # some seed was run twice
