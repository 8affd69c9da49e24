"""Fault trial 27's defects 4 and 8, on real small inputs: a converted Transformers model is
held to what its conversion recorded before any work (E-m6, E-m11, E-m12), and `reproduce`
refuses, before its first step, what a planned step would refuse, a packaged checkpoint whose
weights are gone among it (P-m4), with advice whose commands do what they say (P-m2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_conversion
from test_hf_finetune import _texts

from finetune_lab.cli import build_parser, main
from finetune_lab.config import PROJECT_ROOT, RUNS_DIR_ENV, WORK_DIR_ENV
from finetune_lab.models import trust
from finetune_lab.train import hf_finetune


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One real conversion and a tiny CLS-Books split; tests damage copies of the conversion."""
    return tiny_conversion(tmp_path_factory.mktemp("t27-convert"), _texts(48))


def _copy(tiny, tmp_path: Path, name: str = "hf") -> Path:
    out = tmp_path / name
    shutil.copytree(tiny["model_dir"], out)
    return out


def _finetune(tiny, model_dir: Path, tmp_path: Path, capsys, kind: str = "transformers") -> str:
    """`finetune transformers` (or `lora`) from ``model_dir``: exit 2 in one line, no run."""
    runs = tmp_path / "runs"
    what = ["--init", "pretrained"] if kind == "transformers" else ["--methods", "lora-qv"]
    code = main(["finetune", kind, *what, "--seeds", "0", "--epochs", "1",
                 "--cls-dir", str(tiny["cls_dir"]), "--model-dir", str(model_dir),
                 "--runs-root", str(runs), "--experiment", "t27"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (runs / "t27").exists()
    return err


def test_a_conversion_records_each_files_size_and_sha256(tiny):
    """What the loader holds a conversion to is written with it."""
    from finetune_lab._files import sha256_file

    record = json.loads((tiny["model_dir"] / "conversion.json").read_text(encoding="utf-8"))
    files = record["files"]
    assert {"config.json", "model.safetensors", "spm.model", "dict.txt"} <= set(files)
    for name, want in files.items():
        path = tiny["model_dir"] / name
        assert want == {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


@pytest.mark.parametrize("kind", ["transformers", "lora"])
def test_weights_cut_short_in_model_dir_are_one_line(tiny, tmp_path, capsys, kind):
    """E-m6: a `model.safetensors` cut short was a SafetensorError traceback, exit 1; LoRA and
    QLoRA load through the same loader."""
    hf = _copy(tiny, tmp_path)
    weights = hf / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    err = _finetune(tiny, hf, tmp_path, capsys, kind)
    assert f"{weights} is " in err and f"convert-hf --out {hf} --force" in err


@pytest.mark.parametrize("edit, says", [
    (lambda hf: (hf / "config.json").write_text((hf / "config.json").read_text().replace(
        '"num_hidden_layers": 2', '"num_hidden_layers": 1')), "config.json"),
    (lambda hf: (hf / "spm.model").write_bytes(
        (b := (hf / "spm.model").read_bytes())[:-1] + bytes([b[-1] ^ 1])), "spm.model"),
])
def test_a_file_changed_since_its_conversion_is_refused(tiny, tmp_path, capsys, edit, says):
    """E-m12: a `config.json` that claims other layers trained a model that was not the
    conversion; any file changed since (same size, other bytes) is the same fault."""
    hf = _copy(tiny, tmp_path)
    edit(hf)
    assert f"{hf / says} " in _finetune(tiny, hf, tmp_path, capsys)


def test_a_conversion_without_its_file_list_is_held_to_its_weights(tiny, tmp_path, capsys):
    """Conversions made before the list (the work dir's, today): the weights' own header says
    how long the file is, and which layers it holds."""
    hf = _copy(tiny, tmp_path)
    record = json.loads((hf / "conversion.json").read_text(encoding="utf-8"))
    del record["files"]
    (hf / "conversion.json").write_text(json.dumps(record), encoding="utf-8")
    (hf / ".finetune-lab-output").unlink()
    weights = hf / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 100)
    assert f"{weights} is cut short" in _finetune(tiny, hf, tmp_path, capsys)


def test_weights_that_do_not_load_are_one_line_naming_the_folder(tiny, tmp_path, capsys):
    """What no check before it sees (a user's `save_pretrained`, no conversion record, one
    tensor's shape edited in its header) fails in `from_pretrained`: one line, not a
    traceback."""
    hf = _copy(tiny, tmp_path)
    (hf / "conversion.json").unlink()
    (hf / ".finetune-lab-output").unlink()
    weights = hf / "model.safetensors"
    data = weights.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = "roberta.encoder.layer.0.attention.self.query.bias"
    was = json.dumps(header[name]["shape"])
    text = data[8:8 + n].decode().replace(f'"{name}":{{"dtype":"F32","shape":{was}',
                                          f'"{name}":{{"dtype":"F32","shape":[16]', 1)
    assert len(text) == n and text != data[8:8 + n].decode()
    weights.write_bytes(data[:8] + text.encode() + data[8 + n:])
    err = _finetune(tiny, hf, tmp_path, capsys)
    assert f"{hf} does not load as a converted model" in err


@pytest.mark.parametrize("drop", [None, "config.json"])
def test_a_model_dir_lacking_files_names_how_to_make_one_there(tiny, tmp_path, capsys, drop):
    """E-m11: `adopt-tokenizer` and `convert-hf` write the work dir, not the --model-dir given:
    the advice names `convert-hf --out DIR`."""
    if drop is None:
        hf = tmp_path / "nothing"
        hf.mkdir()
    else:
        hf = _copy(tiny, tmp_path)
        (hf / drop).unlink()
    err = _finetune(tiny, hf, tmp_path, capsys)
    assert f"{hf / 'config.json'} is missing" in err
    assert f"convert-hf --out {hf}" in err and "adopt-tokenizer" not in err


def test_a_damaged_default_conversion_is_converted_again(tiny, tmp_path, monkeypatch, capsys):
    """The work dir's conversion is scratch: cut short, it is converted again (said in one
    line), and what it held is kept beside it, since its files were changed."""
    from finetune_lab.models.conversion_check import conversion_problem

    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    monkeypatch.setenv(trust.TRUSTED_DIRS_ENV, str(tiny["package"]))
    monkeypatch.setattr(hf_finetune, "packaged_dir", lambda: tiny["package"])
    out = hf_finetune.ensure_converted()
    assert out == tmp_path / "work" / "hf" / "roberta-small-fr"
    weights = out / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    capsys.readouterr()
    assert hf_finetune.ensure_converted() == out
    said = capsys.readouterr()
    assert f"{weights} is " in said.out and f"converting {out} again" in said.out
    assert conversion_problem(out) is None
    kept = [p for p in out.parent.iterdir() if p.name.startswith("roberta-small-fr.replaced-")]
    assert len(kept) == 1 and (kept[0] / "model.safetensors").is_file()


# --- defect 8: reproduce -----------------------------------------------------------------------


def _project(tmp_path: Path, weights: str | None) -> Path:
    """A copy of the project's code and packaged checkpoint (``model.pt`` linked, never
    written), with the packaged weights moved out (``weights`` None), replaced ("other") or
    the whole folder gone ("no folder")."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT_ROOT / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__"))
    package = project / "data" / "checkpoints" / "roberta-small-fr"
    if weights != "no folder":
        shutil.copytree(PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr", package,
                        copy_function=os.link)
        (package / "model.pt").unlink()  # the link only: the committed file is untouched
        if weights == "other":
            (package / "model.pt").write_bytes(b"not the packaged weights")
    return project


def _reproduce(project: Path, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(project / "src"),
           WORK_DIR_ENV: str(tmp_path / "work"), RUNS_DIR_ENV: str(tmp_path / "runs")}
    return subprocess.run([sys.executable, "-m", "finetune_lab.cli", "reproduce", *flags],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags", [("--dry-run",), ("--from-scratch", "--dry-run")])
def test_reproduce_without_the_packaged_weights_says_so_before_any_step(tmp_path, flags):
    """P-m4: `model.pt` moved out (the GPU recipe does) made `reproduce` plan a tokenizer and a
    pretraining that `pretrain` refused 2.5 minutes later, never naming the missing file."""
    project = _project(tmp_path, None)
    done = _reproduce(project, tmp_path, *flags)
    missing = project / "data" / "checkpoints" / "roberta-small-fr" / "model.pt"
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{missing} is missing: restore it (`git checkout -- data/checkpoints/" \
           "roberta-small-fr`, or move it back)" in done.stderr
    assert "reproduce: finetune-lab" not in done.stdout  # not one step planned aloud, or run


def test_reproduce_with_other_weights_in_the_package_is_refused(tmp_path):
    project = _project(tmp_path, "other")
    done = _reproduce(project, tmp_path, "--dry-run")
    assert done.returncode == 2 and "model.pt is not the file its manifest lists" in done.stderr


def test_reproduce_refuses_a_pretraining_its_pretrain_step_would_refuse(tmp_path):
    """No package at all, but runs that fine-tuned its weights: `pretrain` refuses to package
    there, so `reproduce` refuses before its first step, whatever the flags."""
    project = _project(tmp_path, "no folder")
    run = "fairseq/pretrained-seed0"
    (tmp_path / "runs" / run).mkdir(parents=True)
    shutil.copyfile(PROJECT_ROOT / "data" / "runs" / run / "manifest.json",
                    tmp_path / "runs" / run / "manifest.json")
    done = _reproduce(project, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "found the weights it fine-tuned" in done.stderr and "ran nothing" in done.stderr
    assert "reproduce: finetune-lab" not in done.stdout
    assert not (tmp_path / "work").exists()


def test_the_from_scratch_advice_fine_tunes_only_the_candidate(tmp_path, monkeypatch, capsys):
    """P-m2: the advised `finetune fairseq --checkpoint …` lacked `--init pretrained`, so it
    also ran the three random seeds (1.5 hours that say nothing about the candidate)."""
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    assert main(["reproduce", "--from-scratch", "--dry-run"]) == 2
    err = capsys.readouterr().err
    commands = [c.split()[1:] for c in err.split("`")[1::2] if c.startswith("finetune-lab ")]
    assert [c[0] for c in commands] == ["pretrain", "finetune"]
    parser = build_parser()
    fine_tune = parser.parse_args([w.replace("NAME", "x").replace("-N", "-1")
                                   for w in commands[1]])
    assert fine_tune.init == ["pretrained"] and fine_tune.checkpoint is not None
    help_text = " ".join(parser._subparsers._group_actions[0].choices["pretrain"]
                         .format_help().split())
    assert "`finetune fairseq --init pretrained --checkpoint DIR" in help_text
