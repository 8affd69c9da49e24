"""Fault trial 28's defects in the conversion check, on real small inputs: a conversion made
before ``conversion.json`` listed its files (or whose list leaves out a file the model loads)
cannot be checked, so one edited byte of ``model.safetensors`` trained (E-m16): a
``--model-dir`` one is refused naming ``convert-hf --out DIR``, and the work dir's is converted
again, what it held kept beside it. And the advice on an unwritable ``package-checkpoint
--dest`` named ``--out``, a flag that command lacks (E-m7)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import tiny_conversion
from test_hf_finetune import _texts

from finetune_lab.cli import main
from finetune_lab.config import PROJECT_ROOT, WORK_DIR_ENV
from finetune_lab.models import trust
from finetune_lab.models.conversion_check import conversion_problem
from finetune_lab.train import hf_finetune

MARKER = ".finetune-lab-output"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One real conversion and a tiny CLS-Books split; tests make copies of it older."""
    return tiny_conversion(tmp_path_factory.mktemp("t28-convert"), _texts(48))


def _as_before_the_list(hf: Path, drop: str | None = None) -> None:
    """``hf`` as a conversion made before 2361dc6 (its ``conversion.json`` without ``files``,
    ``drop`` None) or with a list that leaves ``drop`` out; its marker's stamps kept true."""
    record = json.loads((hf / "conversion.json").read_text(encoding="utf-8"))
    if drop is None:
        del record["files"]
    else:
        del record["files"][drop]
    (hf / "conversion.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if (hf / MARKER).is_file():
        marker = json.loads((hf / MARKER).read_text(encoding="utf-8"))
        st = (hf / "conversion.json").stat()
        marker["stamps"]["conversion.json"] = [st.st_size, st.st_mtime_ns]
        (hf / MARKER).write_text(json.dumps(marker), encoding="utf-8")


def _flip(weights: Path) -> None:
    """One bit of a float in ``weights`` changed, size and modification time kept."""
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[len(data) - 101] ^= 0x40
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size


def _finetune(tiny, model_dir: Path, tmp_path: Path, capsys, kind: str) -> str:
    """`finetune transformers` (or `lora`) from ``model_dir``: exit 2 in one line, no run."""
    runs = tmp_path / "runs"
    what = ["--init", "pretrained"] if kind == "transformers" else ["--methods", "lora-qv"]
    code = main(["finetune", kind, *what, "--seeds", "0", "--epochs", "1",
                 "--cls-dir", str(tiny["cls_dir"]), "--model-dir", str(model_dir),
                 "--runs-root", str(runs), "--experiment", "t28"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (runs / "t28").exists()
    return err


@pytest.mark.parametrize("marker", [True, False])
@pytest.mark.parametrize("kind", ["transformers", "lora"])
def test_a_model_dir_converted_before_the_list_is_refused(tiny, tmp_path, capsys, kind, marker):
    """E-m16 (a): one bit of the weights changed, size kept; sizes (the marker's) or nothing
    were all that held such a conversion. LoRA loads through the same check."""
    hf = tmp_path / "hf"
    shutil.copytree(tiny["model_dir"], hf)
    if not marker:
        (hf / MARKER).unlink()
    _as_before_the_list(hf)
    _flip(hf / "model.safetensors")
    err = _finetune(tiny, hf, tmp_path, capsys, kind)
    assert f"{hf / 'conversion.json'} lists no files" in err
    assert f"convert-hf --out {hf} --force" in err


def test_a_list_without_the_weights_is_refused(tiny, tmp_path, capsys):
    """A list that leaves out a file the model loads holds nothing of that file."""
    hf = tmp_path / "hf"
    shutil.copytree(tiny["model_dir"], hf)
    _as_before_the_list(hf, drop="model.safetensors")
    _flip(hf / "model.safetensors")
    err = _finetune(tiny, hf, tmp_path, capsys, "transformers")
    assert "lists no sha256 for model.safetensors" in err and f"convert-hf --out {hf}" in err


def test_the_work_dirs_conversion_from_before_the_list_is_converted_again(
        tiny, tmp_path, monkeypatch, capsys):
    """E-m16 (b): the work dir's conversion (marker kept, one exponent bit flipped) is
    scratch: converted again, said in one line, and what it held kept beside it."""
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    monkeypatch.setenv(trust.TRUSTED_DIRS_ENV, str(tiny["package"]))
    monkeypatch.setattr(hf_finetune, "packaged_dir", lambda: tiny["package"])
    out = hf_finetune.ensure_converted()
    _as_before_the_list(out)
    _flip(out / "model.safetensors")
    flipped = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert hf_finetune.ensure_converted() == out
    said = capsys.readouterr()
    assert f"{out / 'conversion.json'} lists no files" in said.out
    assert f"converting {out} again" in said.out and len(said.out.strip().splitlines()) == 1
    assert conversion_problem(out) is None
    assert (out / "model.safetensors").read_bytes() != flipped
    kept = [p for p in out.parent.iterdir() if p.name.startswith("roberta-small-fr.replaced-")]
    assert len(kept) == 1 and (kept[0] / "model.safetensors").read_bytes() == flipped
    assert f"what it held is kept in {kept[0]}" in said.err


def test_package_checkpoint_advice_names_its_own_flag(tmp_path, monkeypatch, capsys):
    """E-m7: where --dest cannot be made, the advice named `--out`, which
    `package-checkpoint` does not have."""
    package = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr"
    tok = tmp_path / "work" / "tokenizer"
    tok.mkdir(parents=True)
    shutil.copyfile(package / "sentencepiece.bpe.model", tok / "spm.model")
    shutil.copyfile(package / "dict.txt", tok / "dict.txt")
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "work"))
    (tmp_path / "afile").write_text("not a folder\n")
    dest = tmp_path / "afile" / "pk"
    assert main(["package-checkpoint", str(package / "model.pt"), "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "Choose a writable location (--dest)" in err and "--out" not in err, err
    assert (tmp_path / "afile").read_text() == "not a folder\n"
