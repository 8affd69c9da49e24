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
    (["pretrain", "--run", ""], "--run", "is empty"),  # trial 20's X-z1: ran as the default
    (["pretrain", "--minutes", "-5"], "--minutes", "must be more than 0"),
    (["pretrain-ablations", "--jobs", "0"], "--jobs", "must be 1 or more"),
    # the fault trial's second round: each was accepted, and failed hours later or on the GPU
    (["train-tokenizer", "--vocab-size", "0"], "--vocab-size", "must be 1 or more"),
    (["train-tokenizer", "--threads", "0"], "--threads", "must be 1 or more"),
    (["train-tokenizer", "--sample-sentences", "-1"], "--sample-sentences", "must be 1 or more"),
    (["pretrain", "--lr", "nan"], "--lr", "must be more than 0, not nan"),
    (["pretrain", "--dropout", "2"], "--dropout", "must be at least 0 and less than 1"),
    (["pretrain", "--batch-size", "0"], "--batch-size", "must be 1 or more"),
    (["pretrain", "--update-freq", "-1"], "--update-freq", "must be 1 or more"),
    (["pretrain", "--bow-weight", "-3"], "--bow-weight", "must be a finite number, 0 or more, not -3"),
    (["reproduce", "--pretrain-minutes", "nan"], "--pretrain-minutes", "must be more than 0, not nan"),
    (["reproduce", "--pretrain-minutes", "-5"], "--pretrain-minutes", "must be more than 0, not -5"),
    (["gpu-bundle", "--seeds", "-1"], "--seeds", "must be 0 or more"),
    (["gpu-bundle", "--pretrain-lr", "nan"], "--pretrain-lr", "must be more than 0"),
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
    assert f"write {root}" in err and "FINETUNE_LAB_RUNS_DIR" in err


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


# --- issue 35: data loss and races (output folders, gpu-unpack, the run lock, interrupts) ----

import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from conftest import needs_data_root, terminal_signals  # noqa: E402
from finetune_lab import _files  # noqa: E402
from finetune_lab.cli import main  # noqa: E402
from finetune_lab.errors import UserError  # noqa: E402


def _users_folder(root: Path) -> Path:
    """The issue's reproduction: a folder of the user's, with a note and a sub-folder."""
    root.mkdir(parents=True)
    (root / "sub").mkdir()
    (root / "notes.txt").write_text("notes\n")
    return root


def _untouched(folder: Path) -> None:
    assert (folder / "notes.txt").read_text() == "notes\n" and (folder / "sub").is_dir()


def _one_line_naming(err: str, folder: Path) -> None:
    assert len(err.strip().splitlines()) == 1, err
    assert str(folder) in err and "--force" in err, err


@needs_data_root
def test_prepare_cls_never_wipes_a_folder_it_did_not_make(tmp_path, capsys):
    """Issue 35.1: `prepare-cls --out <a user's folder>` deleted notes.txt and sub/."""
    user = _users_folder(tmp_path / "u")
    assert main(["prepare-cls", "--out", str(user)]) == 2
    _one_line_naming(capsys.readouterr().err, user)
    _untouched(user)
    # its own folder it replaces, as before; with --force, the user's too
    own = tmp_path / "cls.books"
    assert main(["prepare-cls", "--out", str(own)]) == 0
    assert main(["prepare-cls", "--out", str(own)]) == 0
    assert (own / "train.review").is_file()
    assert main(["prepare-cls", "--out", str(user), "--force"]) == 0
    assert not (user / "notes.txt").exists() and (user / "train.review").is_file()


@pytest.mark.parametrize("argv", [
    ["train-tokenizer"], ["convert-hf"], ["gpu-bundle"],
], ids=lambda a: a[0])
def test_every_command_that_writes_a_folder_refuses_a_foreign_one(argv, tmp_path, monkeypatch,
                                                                  capsys):
    """The same class, in each command that writes a whole folder: refused before any work."""
    work = tmp_path / "work"
    for sub in ("cls.books", "tokenizer"):  # gpu-bundle asks for them before anything else
        (work / sub).mkdir(parents=True)
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(work))
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))  # no call's run taken
    monkeypatch.setenv("FINETUNE_LAB_DATA_ROOT", str(_files_root(tmp_path)))
    user = _users_folder(tmp_path / "u")
    assert main([*argv, "--out", str(user)]) == 2
    _one_line_naming(capsys.readouterr().err, user)
    _untouched(user)
    file = tmp_path / "a-file"
    file.write_text("keep\n")
    with pytest.raises(SystemExit) as stopped:  # a file for --out: refused as it is read
        main([*argv, "--out", str(file)])
    assert stopped.value.code == 2
    assert "is a file" in capsys.readouterr().err and file.read_text() == "keep\n"


def _files_root(tmp_path: Path) -> Path:
    """A data root with the folders train-tokenizer checks for (empty: it is refused first)."""
    from finetune_lab.data.eltec import ELTEC_DIRS

    root = tmp_path / "data-root"
    for d in ELTEC_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    return root


def _write(dest: Path, owner: str, **kw) -> None:
    with _files.atomic_dir(dest, owner, **kw) as tmp:
        (tmp / "data.txt").write_text(owner)
        (tmp / "part").mkdir()
        (tmp / "part" / "x.bin").write_bytes(b"x")


@pytest.mark.parametrize("make, why", [
    (lambda d: _users_folder(d), "not made by"),
    (lambda d: (d.parent.mkdir(parents=True, exist_ok=True), d.write_text("keep")), "is a file"),
    (lambda d: (d.parent.mkdir(parents=True, exist_ok=True), (d.parent / "t").mkdir(),
                d.symlink_to(d.parent / "t")), "is a link"),
    (lambda d: _write(d, "train-tokenizer"), "was made by `finetune-lab train-tokenizer`"),
    (lambda d: (_write(d, "prepare-cls"), (d / "part" / "mine.txt").write_text("u")),
     "holds part/mine.txt"),
    (lambda d: (_write(d, "prepare-cls"), (d / _files.OUTPUT_MARKER).write_text("{")),
     "damaged"),
    (lambda d: (d.mkdir(parents=True), (d / "manifest.json").write_text(
        json.dumps({"step": "prepare-cls", "outputs": {"a": "0"}})), (d / "b").write_text("u")),
     "not made by"),
], ids=["user-folder", "file", "link", "other-command", "file-added", "damaged-marker",
        "old-manifest-plus-a-file"])
def test_atomic_dir_replaces_only_what_its_command_made(make, why, tmp_path):
    dest = tmp_path / "out"
    make(dest)
    before = _files.tree_entries(tmp_path)
    with pytest.raises(UserError, match=why) as refused:
        _write(dest, "prepare-cls")
    assert "\n" not in str(refused.value) and "--force" in str(refused.value)
    assert _files.tree_entries(tmp_path) == before  # nothing moved, nothing left behind
    _write(dest, "prepare-cls", force=True)
    assert (dest / "data.txt").read_text() == "prepare-cls" and not dest.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_atomic_dir_replaces_its_own_and_older_outputs(tmp_path):
    """What a command made itself is replaced without --force: a marked folder (files deleted
    from it are fine), an empty folder, and a data folder from before markers (its manifest
    names the step and lists every file it holds)."""
    own = tmp_path / "own"
    _write(own, "prepare-cls")
    (own / "part" / "x.bin").unlink()
    _write(own, "prepare-cls")
    (tmp_path / "empty").mkdir()
    _write(tmp_path / "empty", "prepare-cls")
    old = tmp_path / "old"
    old.mkdir()
    (old / "train.review").write_text("r\n")
    (old / "input0").mkdir()
    (old / "input0" / "train.bin").write_bytes(b"\0")
    (old / "input0" / "preprocess.log").write_text("log\n")
    (old / "manifest.json").write_text(json.dumps(
        {"step": "prepare-cls", "outputs": {"train.review": _files.sha256_file(old / "train.review"),
                                            "input0/train.bin": _files.sha256_file(old / "input0" / "train.bin")}}))
    _write(old, "prepare-cls")
    for folder in (own, tmp_path / "empty", old):
        assert (folder / "data.txt").is_file() and not (folder / "train.review").exists()


def test_the_output_marker_is_not_data(tmp_path):
    """The marker never changes a data folder's hashes, its up-to-date check, or a run's
    inputs: data rebuilt with it keeps every committed run valid."""
    from finetune_lab.data import binarize
    from finetune_lab.runs import manifest as mf

    out = tmp_path / "bin"
    with _files.atomic_dir(out, "binarize-cls") as tmp:
        (tmp / "train.bin").write_bytes(b"\0\1")
        _files.write_json_atomic(tmp / "manifest.json", {
            "step": "binarize-cls", "inputs": {"a": "1"}, "parameters": {},
            "outputs": _files.sha256_tree(tmp, exclude=("manifest.json",))})
    assert (out / _files.OUTPUT_MARKER).is_file()
    assert binarize.up_to_date(out, {"a": "1"}, {})
    assert set(mf.input_record(out)["sha256"]) == {"train.bin"}
    assert mf.is_build_record(_files.OUTPUT_MARKER)


def test_the_committed_checkpoint_is_a_packaged_folder():
    """The checkpoint committed before markers existed is recognized by its exact files, so
    `package-checkpoint` and `pretrain` may still replace it."""
    from finetune_lab.models import checkpoints

    folder = checkpoints.packaged_dir()
    assert checkpoints.packaged_output(folder)
    assert not (folder / _files.OUTPUT_MARKER).exists()


def test_package_checkpoint_is_atomic_and_byte_for_byte(tmp_path, monkeypatch):
    """Issue 35.17: the old folder was deleted before the new one moved in, so a failure in
    between left no checkpoint. Now the swap fails whole (the old checkpoint stays), a user's
    folder is refused, and packaging the committed weights again gives the same bytes."""
    from finetune_lab.models import checkpoints

    committed = checkpoints.packaged_dir()
    dest = tmp_path / "pkg"
    shutil.copytree(committed, dest)

    def package(target: Path) -> Path:
        return checkpoints.package_checkpoint(
            committed / "model.pt", committed / checkpoints.SPM_FILE,
            committed / checkpoints.DICT_FILE, target,
            manifests=[committed / "manifest.json"])

    real_replace, failed = os.replace, []

    def crash_once(src, dst, *a, **k):  # the move of the new folder into place fails once
        if Path(dst) == dest and not failed:
            failed.append(src)
            raise OSError(5, "Input/output error", str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", crash_once)
    monkeypatch.setattr(_files, "_swap", lambda a, b: False, raising=False)  # two renames
    with pytest.raises(OSError):
        package(dest)
    assert failed, "the swap was never attempted"
    assert _files.sha256_tree(dest) == _files.sha256_tree(committed)  # the old one, whole
    monkeypatch.undo()
    assert package(dest) == dest
    for name in ("model.pt", checkpoints.DICT_FILE, checkpoints.SPM_FILE):
        assert (dest / name).read_bytes() == (committed / name).read_bytes(), name
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in committed.iterdir())
    # no temp folder left, and the old one kept beside it (trial 23's A-f1: its lineage)
    assert [p.name.split("-")[0] for p in sorted(tmp_path.iterdir())] == ["pkg", "pkg.replaced"]
    user = _users_folder(tmp_path / "u")
    with pytest.raises(UserError, match="--force"):
        package(user)
    _untouched(user)


# --- gpu-unpack: products stay under the run cache, a damaged gpu-lab.json is one line ------


def _device_result(tmp_path: Path, products: list[str] | None = None,
                   link: bool = False) -> tuple[Path, Path]:
    """A device call's files (``pack`` over a tiny run cache) and an empty project to unpack
    into: ``(files, project)``."""
    from finetune_lab.runs import gpu_archive

    there = tmp_path / "device"
    run = there / "data" / "runs" / "fairseq-gpu" / "random-seed0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}\n")
    if link:
        (run / "up").symlink_to("../../..")
    files = tmp_path / "files"
    gpu_archive.pack([there / "data" / "runs" / "fairseq-gpu"], files, root=there,
                     extra={"products": products or ["data/runs/fairseq-gpu"]})
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    return files, project


@pytest.mark.parametrize("product", [
    "data/runs/../../..", "/tmp", "data/runs", "data/runs/fairseq-gpu/../../../x",
    "data/work/tokenizer", "./data/runs/fairseq-gpu",
])
def test_gpu_unpack_keeps_products_inside_the_project(product, tmp_path):
    """Issue 35.4: `"products": ["data/runs/../../.."]` moved files out of the project."""
    from finetune_lab.runs import gpu_archive

    files, project = _device_result(tmp_path, [product])
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UserError, match="not one folder directly under"):
        gpu_archive.unpack(files, root=project)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert [p.name for p in (project / "data").iterdir()] == []


def test_gpu_unpack_refuses_links_in_products(tmp_path):
    from finetune_lab.runs import gpu_archive

    files, project = _device_result(tmp_path, link=True)
    with pytest.raises(UserError, match="is a link"):
        gpu_archive.unpack(files, root=project)
    assert not (project / "data" / "runs").exists()
    files2, project2 = _device_result(tmp_path / "ok")
    assert gpu_archive.unpack(files2, root=project2) == [
        project2 / "data" / "runs" / "fairseq-gpu" / "random-seed0"]


@pytest.mark.parametrize("damage, says", [
    (lambda m: m.write_text(m.read_text()[:40]), "is not valid JSON"),
    (lambda m: m.write_text(json.dumps({k: v for k, v in json.loads(m.read_text()).items()
                                        if k != "products"})), "lacks 'products'"),
    (lambda m: m.write_text(json.dumps({**json.loads(m.read_text()),
                                        "products": ["data/runs/lora-gpu"]})),
     "which the archive does not hold"),
], ids=["truncated", "no-products", "product-not-in-archive"])
def test_a_damaged_gpu_lab_json_is_one_line_and_exit_2(damage, says, tmp_path, monkeypatch,
                                                       capsys):
    """Issue 35.12: JSONDecodeError, KeyError and FileNotFoundError tracebacks before."""
    import functools

    from finetune_lab import gpu_lab
    from finetune_lab.runs import gpu_archive

    files, project = _device_result(tmp_path)
    damage(files / gpu_archive.RESULT_FILE)
    monkeypatch.setattr(gpu_lab, "unpack", functools.partial(gpu_archive.unpack, root=project))
    assert main(["gpu-unpack", str(files)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert not (project / "data" / "runs").exists()


# --- the run lock: one holder, even when a holder lets go mid-race ----------------------------


def _hold_then_release(run_dir, held, let_go, result) -> None:
    from finetune_lab.runs.runlock import run_lock

    with run_lock(run_dir):
        held.set()
        let_go.wait(20)
    result.put(("A", "released"))


def _open_before_the_delete(run_dir, opened, go_on, done, result) -> None:
    """A launcher that opened the lock file before its holder deleted it, and locks it after."""
    import fcntl as real

    from finetune_lab.runs import runlock

    class SlowFlock:
        calls = 0

        def __getattr__(self, name):
            return getattr(real, name)

        def flock(self, handle, flags):
            SlowFlock.calls += 1
            if SlowFlock.calls == 1:
                opened.set()
                go_on.wait(20)
            return real.flock(handle, flags)

    runlock.fcntl = SlowFlock()
    try:
        with runlock.run_lock(run_dir):
            result.put(("B", "held"))
    except runlock.RunLockedError:
        result.put(("B", "refused"))
    done.set()


def _lock_fresh(run_dir, wait_for, held, until, result) -> None:
    from finetune_lab.runs.runlock import RunLockedError, run_lock

    wait_for.wait(20)
    try:
        with run_lock(run_dir):
            result.put(("C", "held"))
            held.set()
            until.wait(20)
    except RunLockedError:
        result.put(("C", "refused"))
        held.set()


def test_three_launchers_never_hold_one_run_at_once(tmp_path):
    """Issue 35.16: A holds the lock; B opens the file; A deletes it and lets go; C locks a new
    file at the path; B then locks the deleted one. Before: B and C both wrote the run."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded test process
    run_dir = tmp_path / "exp" / "run"
    a_held, b_opened, a_gone, c_held, b_done = (ctx.Event() for _ in range(5))
    result = ctx.Queue()
    procs = [
        ctx.Process(target=_hold_then_release, args=(run_dir, a_held, b_opened, result)),
        ctx.Process(target=_open_before_the_delete,
                    args=(run_dir, b_opened, c_held, b_done, result)),
        ctx.Process(target=_lock_fresh, args=(run_dir, a_gone, c_held, b_done, result)),
    ]
    procs[0].start()
    assert a_held.wait(30), "A never took the lock"
    procs[1].start()
    procs[2].start()
    procs[0].join(30)
    a_gone.set()
    for p in procs[1:]:
        p.join(30)
    got = dict(result.get(timeout=5) for _ in range(3))
    for p in procs:
        if p.is_alive():  # pragma: no cover
            p.kill()
    assert got == {"A": "released", "B": "refused", "C": "held"}, got
    assert not list(run_dir.parent.glob(".*.lock"))  # no lock file left beside the runs


# --- trainer processes: the pre-exec hook, the process tree, the thread split, interrupts -----


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_pre_exec_hook_loads_nothing(monkeypatch):
    """Issue 35.18: die_with_parent loaded libc with ctypes in the forked child. Now prctl is
    resolved at import; with loading made impossible the hook still sets the death signal."""
    import ctypes

    from finetune_lab.data import child

    def no_loading(*_a, **_k):
        raise OSError("a library was loaded between fork and exec")

    monkeypatch.setattr(ctypes, "CDLL", no_loading)
    read = ("import ctypes; v = ctypes.c_int(); "
            "ctypes.CDLL('libc.so.6').prctl(2, ctypes.byref(v)); print(v.value)")  # GET
    out = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True,
                         preexec_fn=child.die_with_parent, check=True).stdout
    assert int(out) == signal.SIGTERM


def test_kill_tree_finds_the_children_without_proc(tmp_path, monkeypatch):
    """Issue 35.19: kill_tree read /proc by hand, so without it only the parent died."""
    import psutil

    from finetune_lab.runs import trainer_process

    class NoProc:  # a system without /proc
        def __init__(self, *_a):
            pass

        def glob(self, _pattern):
            return iter(())

    monkeypatch.setattr(trainer_process, "Path", NoProc)
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 20
    while not (pid_file.is_file() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child = psutil.Process(int(pid_file.read_text()))
    try:
        trainer_process.kill_tree(parent.pid)
        parent.wait(10)
        gone, _ = psutil.wait_procs([child], timeout=5)
        assert gone, "the grandchild outlived kill_tree"
    finally:
        if child.is_running():
            child.kill()


def test_jobs_split_the_cpus_this_process_may_use(tmp_path, monkeypatch):
    """Issue 35.19: threads per job came from os.cpu_count(), ignoring affinity (taskset, a
    container's cpuset); a deadline is a monotonic time, not a wall-clock one."""
    from finetune_lab.runs import jobs

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    out = tmp_path / "threads"
    job = jobs.Job("t", [sys.executable, "-c",
                         f"import os; open({str(out)!r}, 'w').write(os.environ['OMP_NUM_THREADS'])"],
                   tmp_path / "t.log")
    (res,) = jobs.run_parallel([job], 1, gpus=0, deadline=time.monotonic() + 60,
                               say=lambda _s: None)
    assert res.exit_code == 0 and out.read_text() == "1"
    assert 0 <= res.seconds < 60


INTERRUPTED_RUN = """
import argparse, sys
from finetune_lab import cli
from finetune_lab.runs import manifest
from finetune_lab.runs.recording import record_run

manifest.device_info = lambda: {{"cpu": "cpu", "cpu_count": 1, "threads": 1, "type": "cpu",
                                "name": "cpu", "count": 1}}  # no torch import: seconds saved

def body(_args):
    with record_run("exp", "run", framework="fairseq", init="random", seed=1,
                    hyperparameters={{"lr": 1e-3}}, runs_root={root!r}) as h:
        h.run([sys.executable, "-c", "import os, time; open({pid!r}, 'w').write(str(os.getpid()));"
               " time.sleep(60)"])
    return 0

parser = argparse.ArgumentParser()
parser.parse_args = lambda argv=None: argparse.Namespace(command="finetune", func=body)
cli.build_parser = lambda *_: parser
sys.exit(cli.main([]))
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                       (signal.SIGHUP, 129), (signal.SIGQUIT, 131),
                                       (signal.SIGUSR1, 138), (signal.SIGXCPU, 152),
                                       (signal.SIGABRT, 134), (signal.SIGRTMIN + 16, 178)],
                         ids=["ctrl-c", "sigterm", "sighup", "sigquit", "sigusr1", "sigxcpu",
                              "sigabrt", "sigrtmin+16"])
def test_an_interrupted_run_is_one_line_and_128_plus_the_signal(sig, code, tmp_path):
    """Issue 35.12: Ctrl-C or SIGTERM on a single run printed a 25-line traceback, exit 1;
    trial 20's X-z6: a closed terminal (SIGHUP) said nothing and left the scratch folder, and
    trial 21's X-c4 and 21b's X-d4 the same for SIGQUIT (Ctrl-\\), SIGUSR1, SIGALRM and SIGXCPU
    (`timeout -s`, a CPU limit), and trial 22's X-e1 for SIGABRT, SIGSYS and the real-time
    signals."""
    from finetune_lab.runs import manifest as mf

    pid = tmp_path / "trainer.pid"
    script = INTERRUPTED_RUN.format(root=str(tmp_path / "runs"), pid=str(pid))
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True,
                            preexec_fn=terminal_signals)
    deadline = time.monotonic() + 30
    while not (pid.is_file() and pid.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the run never started"
        time.sleep(0.05)
    proc.send_signal(sig)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [
        f"finetune-lab finetune: interrupted; the run is marked interrupted "
        f"({tmp_path / 'runs' / 'exp' / 'run'})"], err
    manifest = mf.read_manifest(tmp_path / "runs" / "exp" / "run")
    assert manifest["status"] == "failed" and manifest["error"] == f"interrupted (signal {int(sig)})"


def test_a_run_folder_without_a_manifest_is_moved_aside_not_deleted(tmp_path):
    """Same class as 35.1, in the run cache: `overwrite` deleted whatever sat at a run's path
    unless its manifest said complete, a folder of the user's (no manifest) included."""
    from finetune_lab.runs.recording import SUPERSEDED, record_run

    user = _users_folder(tmp_path / "runs" / "exp" / "r1")
    with record_run("exp", "r1", framework="fairseq", init="random", seed=1,
                    hyperparameters={"lr": 1e-3}, runs_root=tmp_path / "runs", overwrite=True):
        pass
    (kept,) = (tmp_path / "runs" / SUPERSEDED / "exp").iterdir()
    _untouched(kept)
    assert (user / "manifest.json").is_file()


def test_a_rejected_run_vouches_for_no_checkpoint(tiny_pipeline, tmp_path, monkeypatch):
    """A run manifest lists its checkpoint's sha256, which lets the file be unpickled; once the
    registry rejects that run (an event file changed after it finished), the same listing
    vouches for nothing, and the refusal names the run. A process that never judged its runs
    trusts no run manifest at all."""
    import shutil

    from finetune_lab.models import trust
    from finetune_lab.runs import registry

    runs = tmp_path / "runs"
    shutil.copytree(tiny_pipeline["runs"], runs)
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(runs))
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tiny_pipeline["root"] / "work"))
    best = next((tiny_pipeline["root"] / "work").rglob("checkpoint_best.pt"))
    manifest = next(runs.glob("*/tiny/manifest.json"))
    assert trust.check_trusted(best) == trust.sha256_file(best)  # the registry accepts the run

    monkeypatch.setattr(trust, "_run_gate", None)  # nothing judged the runs: fail closed
    with pytest.raises(trust.UntrustedCheckpointError, match="no run was judged"):
        trust.check_trusted(best)
    monkeypatch.setattr(trust, "_run_gate", registry.accepted_manifests)

    event = next(manifest.parent.rglob("events.out.tfevents.*"))
    with open(event, "ab") as fh:
        fh.write(b"\0" * 16)
    assert registry.accepted_manifests([manifest]) == []
    with pytest.raises(trust.UntrustedCheckpointError,
                       match=f"run {manifest.parent.parent.name}/tiny, which the registry rejects"):
        trust.check_trusted(best)
    assert manifest not in trust.default_manifests()


def test_sigterm_on_a_command_removes_its_half_made_folder(tmp_path, monkeypatch, capsys):
    """`train-tokenizer` stopped by SIGTERM left `data/work/.tokenizer.tmp-*` behind: SIGTERM
    now unwinds a command as Ctrl-C does, so its half-made output folder is removed."""
    import os
    import signal

    from finetune_lab import cli
    from finetune_lab._files import atomic_dir

    def writes_then_is_stopped(_args):
        with atomic_dir(tmp_path / "out", "test") as tmp:
            (tmp / "half.txt").write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # let the handler run here, inside the folder's block
        return 0

    parser = cli.build_parser()
    args = parser.parse_args(["user-dir"])
    monkeypatch.setattr(cli, "build_parser", lambda *_: parser)
    monkeypatch.setattr(parser, "parse_args",
                        lambda argv=None: (setattr(args, "func", writes_then_is_stopped), args)[1])
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main([]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary folder
    assert signal.getsignal(signal.SIGTERM) == before
