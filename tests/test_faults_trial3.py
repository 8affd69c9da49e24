"""The third and fourth fault trials (faults no test covered), fixed by class: a user's
folder or record is never replaced, work is refused before it starts, and every fault is one
line naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from finetune_lab import cli
from finetune_lab._files import check_replaceable
from finetune_lab.cli import main
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.runs import gpu_bundle
from finetune_lab.runs.gpu_plan import GPU_CORPUS
from finetune_lab.runs.recording import RunExistsError
from finetune_lab.train import linear_probe as lp
from finetune_lab.train import pretrain
from finetune_lab.train.pretrain_recipe import state_dir

PACKAGED = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr"


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def test_a_users_folder_that_looks_like_a_corpus_slice_is_not_replaced(tmp_path, monkeypatch):
    """D1: `gpu-bundle --out DIR` deleted a user's bin/dict.txt and bin/train.bin: any folder
    holding only bin/... passed for an old corpus slice."""
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    user = tmp_path / "u"
    (user / "bin").mkdir(parents=True)
    (user / "bin" / "dict.txt").write_text("mine")
    (user / "bin" / "train.bin").write_text("data")
    assert not gpu_bundle.bundle_output(user)
    with pytest.raises(UserError, match="was not made by `finetune-lab gpu-bundle`"):
        check_replaceable(user, gpu_bundle.COMMAND, earlier=gpu_bundle.bundle_output)
    assert (user / "bin" / "train.bin").read_text() == "data"
    slice_dir = tmp_path / "work" / GPU_CORPUS  # where an old slice lies: still replaceable
    (slice_dir / "bin").mkdir(parents=True)
    (slice_dir / "bin" / "dict.txt").write_text("d")
    (slice_dir / "bin" / "train.idx").write_text("i")
    assert gpu_bundle.bundle_output(slice_dir)
    (slice_dir / "bin" / "notes.txt").write_text("mine")
    assert not gpu_bundle.bundle_output(slice_dir)


def test_a_probe_record_is_replaced_only_with_force(tmp_path, capsys):
    """D5: `probe --name cpu-long --cls-dir SMALL` overwrote the committed record the book
    cites; fill-mask refused the same thing."""
    record = tmp_path / "cpu-long.json"
    record.write_text('{"kept": true}')
    with pytest.raises(UserError, match="exists .*choose another --name, or pass --force"):
        lp.run_probe(tmp_path / "no-weights-needed", name="cpu-long", out_dir=tmp_path,
                     cls_dir=tmp_path)
    assert json.loads(record.read_text()) == {"kept": True}
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    assert "--force" in capsys.readouterr().out


@pytest.fixture
def tiny_corpus(tiny_pipeline, tmp_path, monkeypatch):
    """A runs root holding a LoRA experiment, and a work dir, both in ``tmp_path``."""
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    runs = tmp_path / "runs"
    (runs / "lora" / "lora-qv-seed0").mkdir(parents=True)
    (runs / "lora" / "lora-qv-seed0" / "manifest.json").write_text("{}")
    (runs / "lora" / "experiment.json").write_text(json.dumps(
        {"hyperparameters": {"lora_r": 8}, "varying": []}))
    return {"runs": runs, "corpus": tiny_pipeline["corpus"], "tok": tiny_pipeline["tok"]}


def _pretrain(tiny_corpus, **kw) -> Path:
    return pretrain.pretrain(max_update=1, data_dir=tiny_corpus["corpus"],
                             tokenizer_dir=tiny_corpus["tok"], runs_root=tiny_corpus["runs"],
                             quiet=True, precision="fp32", **kw)


def test_pretraining_into_a_run_or_experiment_it_may_not_touch_changes_nothing(tiny_corpus):
    """D6: `pretrain --experiment lora --run lora-qv-seed0` was refused, but only after it had
    rewritten lora/experiment.json with the pretraining recipe (every LoRA run then BAD) and
    left a scratch folder; M4: its message said `overwrite=True`, not `--overwrite`."""
    config = (tiny_corpus["runs"] / "lora" / "experiment.json").read_text()
    with pytest.raises(RunExistsError, match="choose another --run, or pass --overwrite"):
        _pretrain(tiny_corpus, experiment="lora", run="lora-qv-seed0", package=False)
    with pytest.raises(UserError, match="pins another recipe .* choose another --experiment"):
        _pretrain(tiny_corpus, experiment="lora", run="new", package=False)
    assert (tiny_corpus["runs"] / "lora" / "experiment.json").read_text() == config
    assert sorted(p.name for p in (tiny_corpus["runs"] / "lora").iterdir()) == [
        "experiment.json", "lora-qv-seed0"]
    assert not (state_dir("lora-new")).exists()


def test_a_package_folder_the_user_made_is_refused_before_training(tiny_corpus, tmp_path):
    """D8: `pretrain --package-to USER_DIR` was refused only after the whole training, and
    advised `--force`, which pretrain does not have."""
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as refused:
        _pretrain(tiny_corpus, run="x", package_to=user)
    assert "move it away first" in str(refused.value) and "--force" not in str(refused.value)
    assert not (tiny_corpus["runs"] / "pretrain" / "x").exists()
    assert (user / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("content", ["text", "mapping"])
def test_a_file_that_is_no_checkpoint_is_one_line(tmp_path, capsys, monkeypatch, content):
    """T10, T11: `package-checkpoint FILE --trust` of a text file (KeyError: 101) or of a torch
    file without weights (KeyError: 'model') printed a traceback."""
    tok = tmp_path / "work" / "tokenizer"  # the tokenizer it packages with (a clean clone has none)
    tok.mkdir(parents=True)
    shutil.copy2(PACKAGED / "sentencepiece.bpe.model", tok / "spm.model")
    shutil.copy2(PACKAGED / "dict.txt", tok / "dict.txt")
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    source = tmp_path / "t.pt"
    if content == "text":
        source.write_text("hello\n")
    else:
        torch.save({"a": 1}, source)
    assert main(["package-checkpoint", str(source), "--trust", "--dest",
                 str(tmp_path / "pk")]) == 2
    err = _one_line(capsys)
    assert str(source) in err and ("not a file torch.save wrote" in err
                                   or "is not a fairseq checkpoint" in err)
    assert not (tmp_path / "pk").exists()


def test_ctrl_c_while_the_commands_load_is_one_line(monkeypatch, capsys):
    """I1: Ctrl-C 2 s after `finetune-lab runs` started (importing the commands' modules) gave
    a 38-line KeyboardInterrupt traceback and exit -2."""
    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["runs"]) == 130
    assert _one_line(capsys).startswith("finetune-lab runs: interrupted")


def test_a_folder_for_a_file_and_a_file_for_a_folder_are_named_so(tmp_path, capsys):
    """M1, M2: a `gpu-lab.json` that is a folder "does not exist"; `fill-mask --checkpoint
    model.pt` looked for model.pt/model.pt."""
    (tmp_path / "g" / "gpu-lab.json").mkdir(parents=True)
    assert main(["gpu-unpack", str(tmp_path / "g")]) == 2
    assert "gpu-lab.json is a folder, not a file" in _one_line(capsys)
    with pytest.raises(SystemExit):  # refused as the command line is read
        main(["fill-mask", "--checkpoint", str(PACKAGED / "model.pt"), "--name", "zz"])
    assert "model.pt is a file, not a folder" in _one_line(capsys)
    from finetune_lab.models.checkpoints import load_hub_model  # and by the function itself
    with pytest.raises(UserError, match="is a file, not a folder: pass the folder that holds"):
        load_hub_model(PACKAGED / "model.pt")


def test_adopt_tokenizer_has_the_force_its_refusal_names(tmp_path, capsys):
    """M3: adopt-tokenizer refused a user's folder and advised `--force`, which it rejected."""
    user = tmp_path / "u"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    assert main(["adopt-tokenizer", "--out", str(user)]) == 2
    assert "pass --force" in _one_line(capsys) and (user / "notes.txt").exists()
    assert main(["adopt-tokenizer", "--out", str(user), "--force"]) == 0
    assert sorted(p.name for p in user.iterdir()) == [
        ".finetune-lab-output", "dict.txt", "manifest.json", "spm.model"]


# --- fault trial 4 -------------------------------------------------------------------------


def test_data_summary_keeps_a_file_that_is_not_a_summary(tmp_path, capsys):
    """f06: `data-summary --out notes.txt` replaced the user's file, exit 0."""
    notes = tmp_path / "notes.txt"
    notes.write_text("notes")
    assert main(["data-summary", "--out", str(notes)]) == 2
    assert "is not a data summary: it was left as it is" in _one_line(capsys)
    assert notes.read_text() == "notes"


@pytest.mark.parametrize("argv", [
    ["finetune", "lora", "--runs-root", "FILE"], ["finetune", "transformers", "--cls-dir", "FILE"],
    ["finetune", "lora", "--model-dir", "FILE"], ["finetune", "fairseq", "--data", "FILE"],
    ["data-summary", "--work", "FILE"], ["probe", "--name", "x", "--cls-dir", "FILE"],
    ["convert-hf", "--tokenizer-dir", "FILE"], ["gpu-unpack", "FILE"]])
def test_a_file_given_for_a_folder_is_named_before_any_work(tmp_path, capsys, argv):
    """f11, f13, f23-f26, f34: a file where a folder is wanted was "missing", "lacks
    input0/train.bin", or a NotADirectoryError traceback after a run folder was made."""
    file = tmp_path / "passwd"
    file.write_text("root:x:0:0")
    with pytest.raises(SystemExit) as stopped:
        main([str(file) if a == "FILE" else a for a in argv])
    assert stopped.value.code == 2
    assert f"{file} is a file, not a folder" in _one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]


@pytest.mark.parametrize("argv, says", [
    (["finetune", "lora", "--lora-lr", "nan"], "must be more than 0"),
    (["finetune", "lora", "--lora-lr", "-1"], "must be more than 0"),
    (["finetune", "lora", "--logging-steps", "0"], "must be 1 or more"),
    (["finetune", "transformers", "--logging-steps", "0"], "must be 1 or more"),
    (["pretrain", "--tapt-fraction", "1.5"], "must be from 0 to 1")])
def test_bad_values_of_the_fine_tuning_flags_are_refused_at_once(argv, says, capsys):
    """f08-f10, f15: NaN and negative learning rates and 0 logging steps made a run folder, then
    a torch or transformers traceback (and a manifest holding NaN)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and says in _one_line(capsys)


def test_a_tapt_fraction_without_a_long_run_is_refused(capsys):
    """f15: without --tokens, --tapt-fraction was ignored and a short run started."""
    assert main(["pretrain", "--tapt-fraction", "0.5"]) == 2
    assert "--tapt-fraction needs a long run (--tokens N)" in _one_line(capsys)


def test_a_path_through_a_file_is_one_line(monkeypatch, capsys):
    """f11: a path whose folder part is a file (`/etc/passwd/x`) ended in a NotADirectoryError
    traceback: it is a fault of the machine's kind, one line with the fix."""
    import argparse

    def parser(_modules):
        p = argparse.ArgumentParser()
        p.set_defaults(command="runs", func=lambda _a: (_ for _ in ()).throw(
            NotADirectoryError(20, "Not a directory", "/etc/passwd/x")))
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    assert main([]) == 2
    assert "/etc/passwd/x: Not a directory; a part of that path is a file" in _one_line(capsys)


def test_damaged_prepared_data_is_one_line(tmp_path):
    """f18, f19, f21: a `cls.books/manifest.json` of `[]`, a garbage `spm.model` and `"counts":
    "many"` gave a TypeError, a sentencepiece RuntimeError, and a data.json that broke a
    chapter."""
    from finetune_lab.book.records import read_record
    from finetune_lab.data import tokenizer
    from finetune_lab.errors import DamagedFileError

    manifest = tmp_path / "manifest.json"
    for text, says in (("[]", "it holds a list, not an object"),
                       ('{"counts": "many", "commands": []}', "its 'counts' is 'many'")):
        manifest.write_text(text)
        with pytest.raises(DamagedFileError, match=says):
            read_record(manifest, {"counts": dict, "commands": list})
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "spm.model").write_bytes(b"garbage")
    (tok / "dict.txt").write_text("a 1\n")
    with pytest.raises(UserError, match="spm.model is not a sentencepiece model"):
        tokenizer.load_processor(tok)
