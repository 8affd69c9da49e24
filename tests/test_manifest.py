"""Manifests: hashing, atomic writes, environment capture and the honesty of record_run."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from runfixtures import EXPERIMENT, HYPERPARAMETERS, INITS, SEEDS

from finetune_lab import _files
from finetune_lab.book.records import digest_of
from finetune_lab.errors import UserError
from finetune_lab.runs import manifest as mf
from finetune_lab.runs.recording import (
    RunExistsError,
    TrainingFailedError,
    fairseq_train_command,
    record_run,
)


def test_sha256_file_and_tree(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_bytes(b"abc")
    (tmp_path / "d" / "sub" / "b.bin").write_bytes(b"\x00" * 10)
    assert _files.sha256_file(tmp_path / "d" / "a.txt") == hashlib.sha256(b"abc").hexdigest()
    tree = _files.sha256_tree(tmp_path / "d")
    assert tree == {"a.txt": hashlib.sha256(b"abc").hexdigest(),
                    "sub/b.bin": hashlib.sha256(b"\x00" * 10).hexdigest()}
    assert _files.sha256_tree(tmp_path / "d" / "a.txt") == {".": hashlib.sha256(b"abc").hexdigest()}
    with pytest.raises(UserError, match="no such file"):
        _files.sha256_tree(tmp_path / "nope")
    assert digest_of(tree) == digest_of(dict(reversed(list(tree.items()))))


def test_write_json_atomic_keeps_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    _files.write_json_atomic(target, {"a": 1})
    with pytest.raises(TypeError):
        _files.write_json_atomic(target, {"a": object()})  # not JSON-serialisable mid-write
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # no temp file left behind


def test_git_commit_tolerates_no_repository(tmp_path: Path) -> None:
    assert mf.git_commit(tmp_path) == {"commit": None, "dirty": None}


def test_device_info_names_the_cpu() -> None:
    info = mf.device_info()
    assert info["type"] in {"cpu", "cuda"}
    assert info["name"] and info["count"] >= 1
    if info["type"] == "cpu":
        assert info["name"] == mf.cpu_model()


def _record(tmp_path: Path, code: str, **kw):
    cm = record_run("exp", "r1", framework="fairseq", init="random", seed=3,
                    hyperparameters={"lr": 0.1}, runs_root=tmp_path, **kw)
    with cm as handle:
        handle.run([sys.executable, "-c", code])
    return handle


def test_record_run_complete_only_after_exit_zero(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("hello")
    handle = _record(tmp_path, "import time; time.sleep(0.2); print('trained')", data=[data])
    man = mf.read_manifest(handle.run_dir)
    assert man["status"] == "complete" and man["exit_code"] == 0
    assert man["wall_time_s"] >= 0.2
    assert man["start_time"] <= man["end_time"]
    assert man["command"][0] == "python"  # never the machine's interpreter path (issue 35)
    assert man["inputs"]["data"][0]["sha256"] == {".": hashlib.sha256(b"hello").hexdigest()}
    assert man["inputs"]["checkpoint"] is None
    assert (handle.run_dir / "train.log").read_text().strip() == "trained"
    assert mf.manifest_problems(man) == []


def test_record_run_failed_process(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError, match="exited with code 3") as info:
        _record(tmp_path, "print('the reason it failed'); raise SystemExit(3)")
    # the log's tail travels with the error, so a failure in CI can be read where it is reported
    assert "the reason it failed" in str(info.value)
    man = mf.read_manifest(tmp_path / "exp" / "r1")
    assert man["status"] == "failed" and man["exit_code"] == 3
    assert any("exited with code 3" in p for p in mf.manifest_problems(man))


def test_record_run_exception_in_body_marks_failed(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with record_run("exp", "r2", framework="transformers", init="random", seed=0,
                        hyperparameters={}, runs_root=tmp_path):
            raise RuntimeError("boom")
    man = mf.read_manifest(tmp_path / "exp" / "r2")
    assert man["status"] == "failed" and "boom" in man["error"]


def test_record_run_refuses_existing_run_and_bad_arguments(tmp_path: Path) -> None:
    _record(tmp_path, "pass")
    with pytest.raises(RunExistsError, match="already holds a run"):
        _record(tmp_path, "pass")
    first = mf.read_manifest(tmp_path / "exp" / "r1")
    handle = _record(tmp_path, "pass", overwrite=True)
    assert mf.read_manifest(handle.run_dir)["status"] == "complete"
    # the complete run it replaced was moved aside, not deleted (issue 19), out of the listings
    (kept,) = (tmp_path / ".superseded" / "exp").iterdir()
    assert kept.name.startswith("r1-") and mf.read_manifest(kept) == first
    # a failed run is moved aside too (trial 14's W1): no run is deleted
    with pytest.raises(TrainingFailedError):
        _record(tmp_path, "raise SystemExit(1)", overwrite=True)
    _record(tmp_path, "pass", overwrite=True)
    kept = sorted((tmp_path / ".superseded" / "exp").iterdir())
    assert [mf.read_manifest(k)["status"] for k in kept] == ["complete", "complete", "failed"]
    with pytest.raises(UserError, match="must not contain"):
        with record_run("exp", "r3", framework="fairseq", init="random", seed=1,
                        hyperparameters={"seed": 1}, runs_root=tmp_path):
            pass
    with pytest.raises(UserError, match="plain folder name"):
        with record_run("exp", "../x", framework="fairseq", init="random", seed=1,
                        hyperparameters={}, runs_root=tmp_path):
            pass
    with pytest.raises(UserError, match="no --tensorboard-logdir"):
        fairseq_train_command(["data", "--tensorboard-logdir", "x"], tmp_path)


def test_read_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(mf.ManifestError, match="manifest.json is missing"):
        mf.read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(mf.ManifestError, match="not valid JSON"):
        mf.read_manifest(tmp_path)


@pytest.mark.slow
def test_grid_manifests_record_everything(tiny_grid) -> None:
    runs = sorted((tiny_grid.experiment_dir).iterdir())
    assert [r.name for r in runs] == sorted(f"{i}-seed{s}" for i in INITS for s in SEEDS)
    data_hashes = _files.sha256_tree(tiny_grid.data_bin)
    ckpt_hash = _files.sha256_file(tiny_grid.checkpoint)
    for run_dir in runs:
        man = mf.read_manifest(run_dir)
        assert mf.manifest_problems(man) == []
        assert man["experiment"] == EXPERIMENT and man["framework"] == "fairseq"
        assert man["hyperparameters"] == HYPERPARAMETERS
        assert run_dir.name == f"{man['init']}-seed{man['seed']}"
        cmd = man["command"]
        assert cmd[1:3] == ["-m", "fairseq_cli.train"]
        assert cmd[cmd.index("--seed") + 1] == str(man["seed"])
        assert cmd[cmd.index("--tensorboard-logdir") + 1] == str(run_dir)
        assert man["inputs"]["data"][0]["sha256"] == data_hashes
        if man["init"] == "pretrained":
            assert man["inputs"]["checkpoint"]["sha256"] == {".": ckpt_hash}
            assert "--restore-file" in cmd
        else:
            assert man["inputs"]["checkpoint"] is None
        assert {"torch", "fairseq-fixed"} <= set(man["environment"]["packages"])
        assert man["device"]["type"] == "cpu" and man["device"]["name"]
        assert {Path(k).parts[0] for k in man["outputs"]} == {"train", "train_inner", "valid",
                                                              "test"}
        assert man["outputs"] == mf.output_hashes(run_dir)
        assert man["checkpoints"] == {}  # --no-save
        assert 0 < man["wall_time_s"] < 300


def test_the_schema_and_the_code_name_the_same_statuses_and_frameworks():
    import json

    schema = json.loads(mf.SCHEMA_FILE.read_text())["properties"]
    assert tuple(schema["status"]["enum"]) == mf.STATUSES
    assert tuple(schema["framework"]["enum"]) == mf.FRAMEWORKS


def test_schema_problems_name_each_wrong_place_once():
    from finetune_lab.config import paths

    man = mf.read_manifest(next(paths().runs.glob("fairseq/*-seed0")))
    assert mf.schema_problems(man) == []
    man["seed"] = True  # JSON true is not an integer seed
    man["command"] = []
    man["inputs"]["checkpoint"] = {"path": 3}
    del man["device"]
    assert mf.schema_problems(man) == [
        "manifest lacks key 'device'",
        "manifest 'command' is not a non-empty list of arguments",
        "manifest 'inputs.checkpoint' is not null or a {path, sha256} record",
        "manifest 'seed' is not a seed, an integer from 0 to 4294967295",
    ]


def test_schema_validator_skips_the_iri_grammars():
    """Reading a manifest must not compile rfc3987_syntax's lark grammars (over a second in each
    chapter's process), and the validator still reports what is wrong."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from finetune_lab.runs import manifest\n"
            "problems = manifest.schema_problems({'name': 3})\n"
            "print('rfc3987_syntax' in sys.modules, 'lark' in sys.modules, len(problems) > 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "True"]
