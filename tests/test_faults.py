"""Bad arguments are refused before anything starts (issue 19): a usage error naming the flag,
no fairseq traceback, no run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_lab.cli import build_parser


@pytest.mark.parametrize("argv, flag, says", [
    (["finetune", "fairseq", "--seeds", "-1"], "--seeds", "must be 0 or more, not -1"),
    (["finetune", "fairseq", "--epochs", "0"], "--epochs", "must be 1 or more, not 0"),
    (["finetune", "transformers", "--seeds", "0", "-2"], "--seeds", "must be 0 or more"),
    (["finetune", "lora", "--epochs", "0"], "--epochs", "must be 1 or more"),
    (["binarize-cls", "--workers", "0"], "--workers", "must be 1 or more, not 0"),
    (["prepare-pretrain", "--workers", "-3"], "--workers", "must be 1 or more"),
    (["pretrain", "--tokens", "0"], "--tokens", "must be more than 0"),
    (["pretrain", "--minutes", "-5"], "--minutes", "must be more than 0"),
    (["pretrain-ablations", "--jobs", "0"], "--jobs", "must be 1 or more"),
])
def test_bad_numbers_are_usage_errors(argv, flag, says, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert f"argument {flag}: {says}" in capsys.readouterr().err


def test_relative_paths_are_resolved_where_they_were_typed(tmp_path, monkeypatch):
    """``binarize-cls`` runs fairseq-preprocess in a scratch folder: a relative --tokenizer
    must already point where the user meant."""
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["binarize-cls", "--tokenizer", "tok", "--out", "out"])
    assert args.tokenizer == tmp_path.resolve() / "tok" and args.tokenizer.is_absolute()
    args = build_parser().parse_args(["prepare-pretrain", "--tokenizer", "../t"])
    assert args.tokenizer == (tmp_path / "../t").resolve()
    args = build_parser().parse_args(["finetune", "fairseq", "--data", "bin"])
    assert args.data == Path(tmp_path).resolve() / "bin"


def test_a_corrupted_checkpoint_is_told_from_a_foreign_one(tmp_path):
    """The committed checkpoint, one byte changed: it no longer matches its own manifest, which
    is what the message says (not 'in no manifest', with advice to use that same file)."""
    import shutil

    from finetune_lab.models import checkpoints
    from finetune_lab.models import trust

    folder = tmp_path / "roberta-small-fr"
    shutil.copytree(checkpoints.packaged_dir(), folder)
    with open(folder / "model.pt", "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(trust.UntrustedCheckpointError,
                       match="no longer matches its own manifest"):
        trust.check_trusted(folder / "model.pt")
    foreign = tmp_path / "model.pt"
    foreign.write_bytes(b"weights from elsewhere")
    with pytest.raises(trust.UntrustedCheckpointError, match="in no manifest"):
        trust.check_trusted(foreign)


def test_a_model_path_that_does_not_exist_is_named():
    from finetune_lab.errors import UserError
    from finetune_lab.train.lora_qa import check_model_argument

    with pytest.raises(UserError, match="--model /no/such/dir: no such folder"):
        check_model_argument("/no/such/dir")
    check_model_argument("bigscience/bloom-560m")  # a hub name is not a path


def test_a_closed_pipe_ends_quietly():
    """`finetune-lab runs | head`: no BrokenPipeError traceback when the reader stops early."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "finetune_lab.cli", "runs"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and err == "", err


def test_an_unwritable_runs_root_is_one_line_naming_it(tiny_pipeline, monkeypatch, capsys):
    import os

    from finetune_lab.cli import main

    root = Path("/sys/finetune-lab-runs")  # refused even to root (tests here run as root)
    try:
        os.makedirs(root / "probe")
    except OSError:
        pass
    else:  # pragma: no cover
        pytest.skip("/sys is writable on this machine, so it cannot stand for an unwritable root")
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(root))
    code = main(["finetune", "fairseq", "--init", "random", "--seeds", "0",
                 "--data", str(tiny_pipeline["cls_bin"])])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"cannot write {root}" in err and "FINETUNE_LAB_RUNS_DIR" in err


def test_a_full_disk_is_one_line_naming_the_file(monkeypatch, capsys):
    import errno

    from finetune_lab import cli

    def full(_args):
        raise OSError(errno.ENOSPC, "No space left on device", "data/work/x/model.pt")

    parser = cli.build_parser()
    args = parser.parse_args(["user-dir"])
    monkeypatch.setattr(cli, "build_parser", lambda *_: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: (setattr(args, "func", full), args)[1])
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write data/work/x/model.pt" in err
    assert "disk is full" in err


def test_a_foreign_checkpoint_can_be_packaged_as_the_refusal_says(tiny_pipeline, tmp_path,
                                                                  monkeypatch, capsys):
    """The refusal of an unlisted checkpoint names a command that accepts that very file."""
    import shutil

    from finetune_lab.models import checkpoints
    from finetune_lab.models import trust
    from finetune_lab.cli import main

    foreign = tmp_path / "elsewhere" / "checkpoint_best.pt"
    foreign.parent.mkdir()
    shutil.copy2(tiny_pipeline["packaged"] / "model.pt", foreign)  # listed only in tmp manifests
    shutil.copytree(tiny_pipeline["tok"], tmp_path / "work" / "tokenizer")
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    dest = tmp_path / "packaged"
    with pytest.raises(trust.UntrustedCheckpointError) as refused:
        trust.check_trusted(foreign)
    assert f"package-checkpoint {foreign} --trust --dest DIR" in str(refused.value)
    assert main(["package-checkpoint", str(foreign), "--dest", str(dest)]) == 2
    assert "in no manifest" in capsys.readouterr().err and not dest.exists()
    assert main(["package-checkpoint", str(foreign), "--dest", str(dest), "--trust"]) == 0
    manifest = checkpoints.package_manifest(dest)
    assert manifest["trusted_by"].startswith("the user")
    trust.check_trusted(dest / "model.pt", [dest / "manifest.json"])  # usable downstream
