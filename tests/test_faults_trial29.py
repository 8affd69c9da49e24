"""Fault trial 29 and what trial 28 left: children that outlive a killed command (P-m3); a
run's recipe against the configuration fairseq printed (R-11 to R-14); lineages that leave a
run out or add one (R-15 to R-17)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.runs.log_config import config_problems
from finetune_lab.runs.registry import discover_runs

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="PR_SET_PDEATHSIG is Linux's")

SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
"""A child that names itself in a file, then works for two minutes: a stand-in for a long one."""

LAUNCHERS = {
    # fairseq-preprocess, as binarize starts it
    "binarize": """
        from finetune_lab.data import binarize
        binarize._preprocess_executable = lambda: [sys.executable, "-c", SLEEPER, PIDFILE]
        binarize.run_preprocess([], Path("."))
    """,
    # a --jobs launcher, as run_parallel starts it
    "jobs": """
        from finetune_lab.runs import jobs
        job = jobs.Job("one", [sys.executable, "-c", SLEEPER, PIDFILE], Path(PIDFILE + ".log"))
        jobs.run_parallel([job], 1, say=lambda s: None)
    """,
    # sentencepiece's trainer, in a forked child
    "in_child": """
        from finetune_lab.data import child
        def work():
            open(PIDFILE, "w").write(str(os.getpid()))
            time.sleep(120)
        child.in_child(work)
    """,
}


@linux_only
@pytest.mark.parametrize("how", sorted(LAUNCHERS))
def test_a_child_dies_with_its_killed_command(tmp_path, how):
    """Trial 28's P-m3: a SIGKILLed `binarize-cls` left `fairseq-preprocess` running (a
    trainer already died with its launcher). Every long child of a command now gets the
    parent-death signal: `fairseq-preprocess`, a `--jobs` launcher, sentencepiece's forked
    trainer, a pretraining run's calibration."""
    pidfile = tmp_path / "child.pid"
    script = (f"import os, sys, time\nfrom pathlib import Path\nSLEEPER = {SLEEPER!r}\n"
              f"PIDFILE = {str(pidfile)!r}\n" + textwrap.dedent(LAUNCHERS[how]))
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()):
            assert parent.poll() is None, f"the launcher ended first (exit {parent.returncode})"
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.1)
        child = psutil.Process(int(pidfile.read_text()))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        try:
            child.wait(timeout=10)
        except psutil.TimeoutExpired:
            child.kill()
            pytest.fail(f"{how}: the child outlived its killed command")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()



# --- trial 29's R-11 to R-14: the manifest against the configuration its train.log prints -------

def _edit(manifest: Path, change: Callable[[dict[str, Any]], None]) -> None:
    man = json.loads(manifest.read_text())
    change(man)
    manifest.write_text(json.dumps(man, indent=2))


def _set_flag(flag: str, value: str, key: str, hp_value: Any) -> Callable[[dict], None]:
    """Relabel a run's recipe value in its command and its hyperparameters alike."""
    def change(man: dict[str, Any]) -> None:
        man["command"][man["command"].index(flag) + 1] = value
        man["hyperparameters"][key] = hp_value
    return change


def _phases(general_until: int, share: float) -> Callable[[dict], None]:
    def change(man: dict[str, Any]) -> None:
        hp = man["hyperparameters"]
        hp["tapt_fraction"] = share
        hp["phases"] = [{"name": "general", "until_update": general_until},
                        {"name": "tapt", "until_update": hp["max_update"]}]
    return change


def _fp32(man: dict[str, Any]) -> None:
    man["hyperparameters"]["precision"] = "fp32"
    man["command"].remove("--bf16")


def _no_flag(flag: str, key: str, hp_value: Any) -> Callable[[dict], None]:
    """The flag dropped from the command (fairseq's default ran), the recipe relabelled."""
    def change(man: dict[str, Any]) -> None:
        i = man["command"].index(flag)
        del man["command"][i:i + 2]
        man["hyperparameters"][key] = hp_value
    return change


RELABELLED = {
    # the long run's task-adaptive share, 10.0 M tokens shown as 5.0 M
    "pretrain/cpu-long2": (_phases(3662, 0.25), "hyperparameters.phases"),
    # the ablation's dropout, 0.1 shown as 0.0
    "pretrain-ablation/fp32-dropout": (_set_flag("--dropout", "0.0", "dropout", 0.0),
                                       "configured with dropout=0.1"),
    # the ablation's precision, bf16 shown as fp32
    "pretrain-ablation/bf16": (_fp32, "configured for bf16"),
    # the packaged run's bag-of-words weight, 8.0 shown as 4.0
    "pretrain/cpu-sinpos1-bow": (_set_flag("--bow-weight", "4.0", "bow_weight", 4.0),
                                 "configured with bow_weight=8.0"),
    # the same class where the flag is gone: fairseq's default dropout is what ran
    "fairseq/pretrained-seed1": (_no_flag("--dropout", "dropout", 0.3),
                                 "configured with dropout=0.1"),
    # a phase on one corpus only, relabelled as two
    "pretrain/cpu-tapt3": (_phases(489, 0.5), "hyperparameters.phases"),
}


def test_a_recipe_relabelled_against_its_train_log_is_rejected(cache):
    """Trial 29's R-11 to R-14: each run relabelled consistently (command and recipe) stayed
    valid and changed a table of the pretraining chapter; fairseq printed what really ran."""
    for key, (change, _why) in RELABELLED.items():
        _edit(cache / key / "manifest.json", change)
    judged = {r.key: r for r in discover_runs(cache)}
    for key, (_change, why) in RELABELLED.items():
        assert not judged[key].valid, key
        assert any(why in p for p in judged[key].problems), (key, judged[key].problems)
    assert judged["pretrain/cpu-long"].valid and judged["pretrain-ablation/bf16-dropout"].valid


def test_every_committed_fairseq_run_agrees_with_its_printed_configuration():
    """The check holds for all 83 committed fairseq runs, their phases and launches included
    (a long run's processes differ in corpus, last update and plug-in folder only)."""
    runs = PROJECT_ROOT / "data" / "runs"
    checked = 0
    for manifest in sorted(runs.glob("*/*/manifest.json")):
        man = json.loads(manifest.read_text())
        if man.get("framework") == "fairseq":
            assert config_problems(manifest.parent, man) == [], manifest.parent.name
            checked += 1
    assert checked >= 80


# --- a copied lineage names every run behind the weights ---------------------------

def _drop_step(field: str, index: int) -> Callable[[dict], None]:
    def change(man: dict[str, Any]) -> None:
        del man["extra"][field]["lineage"][index]
    return change


def test_a_lineage_with_a_step_left_out_is_rejected(cache):
    """R-16, R-17: a continued run's lineage and two fine-tuning runs' with one step deleted
    made the candidate table's updates and tokens smaller, each remaining step agreeing with
    its run. Runs built on a run whose lineage lost a step are rejected with it (which of the
    two copies was changed the records cannot say)."""
    _edit(cache / "pretrain/cpu-tapt1/manifest.json", _drop_step("continued_from", 1))
    for seed in (0, 1):
        _edit(cache / f"fairseq-candidate-5/pretrained-seed{seed}/manifest.json",
              _drop_step("checkpoint_source", 1))
    judged = {r.key: r for r in discover_runs(cache)}
    for key in ("pretrain/cpu-tapt1", "fairseq-candidate-5/pretrained-seed0",
                "fairseq-candidate-5/pretrained-seed1"):
        assert not judged[key].valid
        assert any("lineage names" in p for p in judged[key].problems), judged[key].problems
    assert judged["pretrain/cpu-long2"].valid and judged["fairseq/pretrained-seed0"].valid


@pytest.mark.parametrize("change", [
    lambda m: m["lineage"].pop(1),  # 2.89 h of pretraining shown as 2.17 h
    lambda m: m["lineage"].insert(3, {"run": "data/runs/pretrain/cpu-tapt1",
                                      "tokens": 4001792, "updates": 977}),  # as 3.32 h
    lambda m: m["lineage"].pop(),  # ends before the package's own run
])
def test_a_package_lineage_with_a_step_left_out_or_added_is_damaged(package, change):
    """R-15: the packaged checkpoint's lineage with a step deleted or inserted changed the
    front page's cost of the stand-in; it is held to its run's own copy."""
    from finetune_lab.models.checkpoints import package_manifest

    package()
    assert package_manifest()["lineage"]
    package(change)
    with pytest.raises(UserError, match=r"manifest.json is damaged \(its lineage"):
        package_manifest()


# --- R-1: a run's minutes stretched inside the clocks' slack ----------------------------------

def _stretched(start: str, end: str, wall: float) -> Callable[[dict], None]:
    def change(man: dict[str, Any]) -> None:
        man["start_time"], man["end_time"], man["wall_time_s"] = start, end, wall
    return change


STRETCHED = {  # each run's start moved earlier and its end later, its wall time to match
    "transformers-gpu/pretrained-seed0": _stretched(  # 140.7 s as 160 s: 2.3 min as 2.4
        "2026-11-26T04:20:25+00:00", "2026-11-26T04:23:05+00:00", 160.0),
    "transformers/pretrained-seed0": _stretched(  # the CPU run by 56 s
        "2026-11-25T15:12:07+00:00", "2026-11-25T15:42:59+00:00", 1852.0),
}


def test_a_runs_wall_time_stretched_within_the_old_slack_is_rejected(cache):
    """Trial 29's R-1: 30 s allowed on each side of a Transformers run's events, and 20 % of
    its wall time outside its timed part, let a GPU run's time grow 14 % and the device
    table's minutes with it; the committed runs need 1.3 s, 2.4 s and 2 %."""
    for key, change in STRETCHED.items():
        _edit(cache / key / "manifest.json", change)
    judged = {r.key: r for r in discover_runs(cache)}
    for key in STRETCHED:
        assert not judged[key].valid, key
        assert any("start_time" in p or "time_s" in p for p in judged[key].problems), \
            judged[key].problems


# --- a device call's record that lost a product ------------------------------------------

def test_a_call_record_that_lost_a_product_is_set_aside_not_its_runs(tmp_path):
    """Trial 29's R-23: with `data/runs/transformers-gpu` gone from a call's products, the six
    runs its jobs made were rejected ("that call never ran ...") and the record was read on;
    the record contradicts its own jobs, which ended well, and is set aside by name."""
    import shutil

    from finetune_lab.book.devices import call_records_set_aside
    from finetune_lab.runs.gpu_archive import CALL_RECORDS

    stem = "20261127T163332Z"
    here, there = PROJECT_ROOT / CALL_RECORDS, tmp_path / CALL_RECORDS
    there.mkdir(parents=True)
    for name in (f"{stem}.json", f"{stem}-nvidia-smi.csv"):
        shutil.copy2(here / name, there / name)
    assert call_records_set_aside(tmp_path) == ""
    _edit(there / f"{stem}.json", lambda m: m["products"].remove("data/runs/transformers-gpu"))
    said = call_records_set_aside(tmp_path)
    assert f"{stem}.json" in said and "brought back no experiment transformers-gpu" in said


# --- where a chapter runs ------------------------------------------------------------------

def test_execute_dir_project_is_an_option_and_moves_the_matplotlibrc(tmp_path, capsys,
                                                                     monkeypatch):
    """Trial 29's R-10: `execute-dir: project` in `_quarto.yml` and a `matplotlibrc` at the
    project's root left every chapter but `index.qmd` up to date, though each then runs in the
    root and draws with that file."""
    from test_freeze_env import _project, _render_all

    from finetune_lab.cli import main

    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mplconfig"))
    monkeypatch.delenv("MATPLOTLIBRC", raising=False)
    root = _project(tmp_path / "project")
    (root / "matplotlibrc").write_text("axes.facecolor: red\n")
    _render_all(root)
    assert main(["check-freeze", "--project", str(root)]) == 0
    capsys.readouterr()
    (root / "_quarto.yml").write_text("project:\n  type: book\n  execute-dir: project\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    said = capsys.readouterr().err
    assert said.count("option _quarto.yml: project.execute-dir (new)") == 2
    assert said.count("matplotlibrc matplotlibrc (new)") == 2


# --- L-30: a copy's name too long for the disk; L-4, L-22: a lock or a log written through a link -

@pytest.mark.parametrize("length", [235, 241, 250])
def test_force_on_a_folder_with_a_long_name_keeps_what_it_held(tmp_path, length):
    """Trial 29's L-30: `prepare-cls --out <235 characters> --force` swapped its output in,
    then failed to keep the old folder as NAME.replaced-<time> (too long a name) and removed
    it, the user's notes with it. The copy's name is shortened to fit; nothing is lost."""
    from finetune_lab._files import atomic_dir

    dest = tmp_path / ("u" * length)
    dest.mkdir()
    (dest / "notes.txt").write_text("my thesis notes")
    with atomic_dir(dest, "prepare-cls", force=True) as tmp:
        (tmp / "train.review").write_text("new\n")
    assert (dest / "train.review").read_text() == "new\n"
    kept = [p for p in tmp_path.iterdir() if p != dest]
    assert len(kept) == 1 and (kept[0] / "notes.txt").read_text() == "my thesis notes"
    assert ".replaced-" in kept[0].name and len(kept[0].name.encode()) <= 255


def test_a_copy_that_cannot_be_kept_is_left_where_it_is_said_to_be(tmp_path, monkeypatch):
    """The class behind L-30: once the swap is done, the old folder is never removed because
    keeping it failed; the one line names where it is."""
    from finetune_lab import _files
    from finetune_lab._files import atomic_dir

    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")

    def fails(*_a, **_k):
        raise OSError(36, "File name too long")

    monkeypatch.setattr(_files, "keep_beside", fails)
    with pytest.raises(UserError, match=r"out was replaced, but what it held could not be kept "
                                        r"beside it .*it is in .*\.out\.old-"):
        with atomic_dir(dest, "prepare-cls", force=True) as tmp:
            (tmp / "train.review").write_text("new\n")
    held = [p for p in tmp_path.iterdir() if p.name.startswith(".out.old-")]
    assert len(held) == 1 and (held[0] / "notes.txt").read_text() == "mine"
    # no half-written folder's name: the next write, this process gone, leaves it alone
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]


def test_a_lock_is_never_taken_through_a_link(tmp_path):
    """Trial 29's L-4: a link at `.<run>.lock` (or `data/.gpu-unpack.lock`) had the lock's
    "pid N on HOST" written over the committed train.log it pointed to."""
    from finetune_lab.runs.runlock import run_lock

    target = tmp_path / "train.log"
    target.write_text("a committed log\n")
    run = tmp_path / "exp" / "random-seed0"
    run.parent.mkdir()
    (run.parent / ".random-seed0.lock").symlink_to(target)
    with pytest.raises(UserError, match=r"random-seed0.lock is a link: .*remove the link"):
        with run_lock(run):
            pass
    assert target.read_text() == "a committed log\n"
    os.mkfifo(run.parent / ".other.lock")  # a pipe there would block every launch
    with pytest.raises(UserError, match=r"other.lock is not a regular file"):
        with run_lock(run.parent / "other"):
            pass


def test_a_jobs_log_is_never_written_through_a_link(tmp_path):
    """Trial 29's L-22: with `--jobs 2`, a link at a job's log had the job's output written
    over the committed train.log it pointed to."""
    from finetune_lab.runs import jobs

    target = tmp_path / "train.log"
    target.write_text("a committed log\n")
    log = tmp_path / "job-logs" / "one.log"
    log.parent.mkdir()
    log.symlink_to(target)
    job = jobs.Job("one", [sys.executable, "-c", "print('output')"], log)
    with pytest.raises(UserError, match=r"one.log is a link"):
        jobs.run_parallel([job], 1, say=lambda s: None)
    assert target.read_text() == "a committed log\n"


# --- trial 29's minor ones: refused before any work, and exit codes ------------------------------

def test_a_folder_where_a_record_goes_is_refused_before_any_work(tmp_path):
    """L-2: `fill-mask --name t2 --force` with a folder `t2.json` there ran the whole probe,
    then failed writing; now `check_new_record` says so first, `--force` included."""
    from finetune_lab.config import check_new_record

    (tmp_path / "t2.json").mkdir()
    for force in (False, True):
        with pytest.raises(UserError, match="t2.json is a folder or other non-file"):
            check_new_record(tmp_path / "t2.json", "a fill-mask record", force=force)


@pytest.mark.parametrize("inside", ["fairseq", "fairseq/random-seed0"])
def test_a_runs_root_inside_an_experiment_or_a_run_is_refused(cache, inside):
    """L-14: FINETUNE_LAB_RUNS_DIR pointing at a committed experiment or run folder put a new
    run inside it; `finetune-lab runs` already refused such a root."""
    from finetune_lab.runs.recording import run_dir_for

    with pytest.raises(UserError, match=r"runs root .* (is inside the run or experiment folder|"
                                        r"is an experiment folder)"):
        run_dir_for("tl", "random-seed0", cache / inside)
    assert run_dir_for("tl", "random-seed0", cache) == cache / "tl" / "random-seed0"


def test_a_run_named_as_the_experiments_file_is_refused_at_once(capsys):
    """L-15: `pretrain --run experiment.json` worked 70 s, then failed on a file for a folder."""
    from finetune_lab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["pretrain", "--run", "experiment.json", "--max-update", "2"])
    assert exit_.value.code == 2
    assert "the file that pins the experiment's recipe" in capsys.readouterr().err


def test_gpu_unpack_of_a_run_that_fails_its_checks_exits_2(tmp_path, monkeypatch, capsys):
    """L-21: a placed run the registry rejects made `gpu-unpack` exit 1, a code no other fault
    gives; it is placed all the same, named, and the command exits 2."""
    from test_faults_trial27_files import _call_with_run

    from finetune_lab import gpu_lab
    from finetune_lab.cli import main
    from finetune_lab.runs import gpu_archive

    files, project = _call_with_run(tmp_path)  # a GPU run filed under `zz-gpu`, made by no call
    monkeypatch.setattr(gpu_lab, "unpack", lambda f: gpu_archive.unpack(f, root=project))
    monkeypatch.setattr(gpu_lab, "PROJECT_ROOT", project)
    assert main(["gpu-unpack", str(files)]) == 2
    out, err = capsys.readouterr()
    assert "data/runs/zz-gpu/random-seed0: INVALID" in out
    assert "1 of the placed folders failed the checks above" in err
    assert (project / "data" / "runs" / "zz-gpu" / "random-seed0" / "manifest.json").is_file()


def test_a_half_written_folder_a_killed_command_left_is_cleared_next_time(tmp_path, capsys):
    """L-1: `prepare-cls` SIGKILLed mid-write left `.NAME.tmp-*` (510 MB for the pretraining
    corpus) for good. The next write of that output removes those whose process is gone."""
    from finetune_lab._files import atomic_dir

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f".out.tmp-{gone.pid}-x1"
    running = tmp_path / f".out.tmp-{os.getpid()}-x2"  # this process: still at work
    unknown = tmp_path / ".out.tmp-x3"  # no process in its name (made before they had one)
    for folder in (stale, running, unknown):
        folder.mkdir()
        (folder / "train.review").write_text("half\n")
    with atomic_dir(tmp_path / "out", "prepare-cls") as tmp:
        (tmp / "train.review").write_text("whole\n")
    assert not stale.exists() and running.is_dir() and unknown.is_dir()
    assert f"removed {stale}, which an interrupted command left half-written" in \
        capsys.readouterr().err


# --- trial 29's E-14 and E-18: tracebacks where one line was due -------------------------------

def test_a_file_size_limit_while_safetensors_writes_is_one_line(tmp_path):
    """E-14: under `ulimit -f`, `convert-hf` (and a Transformers run's conversion) ended in a
    16-line traceback: safetensors' SafetensorError "File too large (os error 27)" is no
    OSError. `library_write` turns Rust's I/O errors into one, named with the output."""
    code = textwrap.dedent(f"""
        import resource, signal, sys
        import torch
        from safetensors.torch import save_file
        from finetune_lab.errors import library_write
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            with library_write({str(tmp_path / 'hf')!r}):
                save_file({{"w": torch.zeros(200_000)}}, {str(tmp_path / 'm.safetensors')!r})
        except OSError as exc:
            print(exc.errno, exc.filename)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["27", str(tmp_path / "hf")], out.stderr


def test_an_archive_cut_short_inside_pieces_that_match_is_refused(tmp_path):
    """E-18: pieces whose sha256s match an archive whose gzip stream was cut short ended in a
    33-line EOFError traceback; it is refused like any archive that cannot be unpacked."""
    import hashlib
    import tarfile

    from finetune_lab.runs import gpu_archive

    src = tmp_path / "src" / "data" / "runs" / "t29exp" / "r1"
    src.mkdir(parents=True)
    (src / "manifest.json").write_text("{}")
    (src / "blob").write_bytes(os.urandom(300_000))
    whole = tmp_path / "full.tgz"
    with tarfile.open(whole, "w:gz") as tar:
        tar.add(tmp_path / "src" / "data", arcname="data")
    cut = whole.read_bytes()[: whole.stat().st_size // 2]
    files = tmp_path / "files"
    files.mkdir()
    (files / "gpu-lab.tar.000").write_bytes(cut)
    digest = hashlib.sha256(cut).hexdigest()
    (files / "gpu-lab.json").write_text(json.dumps({
        "archive_sha256": digest, "products": ["data/runs/t29exp"],
        "pieces": [{"file": "gpu-lab.tar.000", "bytes": len(cut), "sha256": digest}]}))
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    with pytest.raises(UserError, match="cannot be unpacked safely .*refused, nothing was "
                                        "unpacked"):
        gpu_archive.unpack(files, root=project)
    assert not (project / "data" / "runs").exists()


@pytest.mark.parametrize("command", [
    ["finetune", "fairseq", "--init", "random", "--seeds", "0"],
    ["finetune", "transformers", "--seeds", "0"],
    ["finetune", "lora", "--seeds", "0"],
    ["pretrain", "--max-update", "2"],
])
def test_an_empty_experiment_is_refused(command, capsys):
    """E-10: `--experiment ''` (an unset variable) ran in the default experiment, for fairseq
    the book's own grid; refused as `--run ''` is."""
    from finetune_lab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*command, "--experiment", ""])
    assert exit_.value.code == 2
    assert "--experiment: is empty: give a name" in capsys.readouterr().err


def test_a_record_name_that_starts_wrong_is_told_why():
    """E-11: `--name .hidden` was told to use letters, digits, '.', '_' and '-' only."""
    from finetune_lab.argtypes import record_name

    for name in (".hidden", "-x", ".."):
        with pytest.raises(UserError, match="beginning with a letter or a digit"):
            record_name(name)


# --- trial 29's E-7 and E-8: review files that read as something else ---------------------------

def test_markup_inside_a_review_is_refused_not_cut(tmp_path):
    """E-7: `<text>Début <b>gras</b> ...` was prepared as "Début" (the rest dropped), and
    `<text><b>gras</b> ...` refused as an empty review; no Webis-CLS-10 review holds markup."""
    from test_cls_books import BOOKS, _fake_root, _replace_in_item

    from finetune_lab.data.cls_books import ClsDataError, prepare_cls

    root = _fake_root(tmp_path, _replace_in_item(6, r"<text>", "<text>Début du texte <b>gras</b> "))
    with pytest.raises(ClsDataError, match=r"train\.review: item 6.*<text> holds markup \(<b>\)"):
        prepare_cls(root, tmp_path / "out")
    assert not (tmp_path / "out").exists() and (root / BOOKS / "train.review").is_file()


def test_a_training_file_of_one_class_is_refused(tmp_path):
    """E-8: a training file holding only positive reviews was prepared and binarized without a
    word; a sentiment classifier cannot be trained on it."""
    import re as regex

    from test_cls_books import _fake_root

    from finetune_lab.data.cls_books import ClsDataError, prepare_cls

    def positives_only(text: str) -> str:
        items = regex.findall(r"<item>.*?</item>", text, flags=regex.S)
        keep = [i for i in items if float(regex.search(r"<rating>([^<]*)<", i)[1]) > 3]
        return text[: text.index("<item>")] + "".join(keep) + text[text.rindex("</item>") + 7:]

    root = _fake_root(tmp_path, positives_only)
    with pytest.raises(ClsDataError, match=r"train\.review: every review is of class 1"):
        prepare_cls(root, tmp_path / "out", other_corpus=True)
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_a_loop_of_links_is_said_so(tmp_path):
    """E-17: `gpu-unpack LOOP` (a link to itself) said its gpu-lab.json "does not exist"."""
    from finetune_lab.runs import gpu_archive

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(UserError, match=r"gpu-lab.json is reached through a loop of links"):
        gpu_archive.unpack(loop, root=tmp_path)


# --- check 29b: other members of the classes fixed above ---------------------------------------

def test_a_hard_link_at_a_lock_or_a_log_is_refused_and_the_file_kept(tmp_path):
    """Check 29b's F3: `ln` without `-s` at a run's lock or a job's log had the command write
    over the committed file under its other name (O_NOFOLLOW stops symbolic links only)."""
    from finetune_lab.runs import jobs
    from finetune_lab.runs.runlock import run_lock

    target = tmp_path / "train.log"
    target.write_text("a committed log\n")
    (tmp_path / "exp").mkdir()
    os.link(target, tmp_path / "exp" / ".random-seed0.lock")
    with pytest.raises(UserError, match=r"random-seed0.lock is not a regular file of its own "
                                        r"\(a hard link: 2 names\)"):
        with run_lock(tmp_path / "exp" / "random-seed0"):
            pass
    os.link(target, tmp_path / "one.log")
    job = jobs.Job("one", [sys.executable, "-c", "print('output')"], tmp_path / "one.log")
    with pytest.raises(UserError, match=r"one.log is not a regular file of its own"):
        jobs.run_parallel([job], 1, say=lambda s: None)
    assert target.read_text() == "a committed log\n"


def test_a_lineage_whose_run_is_gone_is_no_lineage(cache, package):
    """Check 29b's F5, F6: with the weights' own run deleted (a continued run's
    `extra.continued_from.run`, the package's `run`), a lineage that left a step out passed:
    the chain was checked only where that run was named."""
    from finetune_lab.models.checkpoints import package_manifest

    def no_run(man: dict[str, Any]) -> None:
        del man["extra"]["continued_from"]["run"]
        man["extra"]["continued_from"]["lineage"].pop(0)

    _edit(cache / "pretrain/cpu-seed1-c2/manifest.json", no_run)
    rec = {r.key: r for r in discover_runs(cache)}["pretrain/cpu-seed1-c2"]
    assert not rec.valid and any("run names none" in p for p in rec.problems), rec.problems
    package(lambda m: (m.update(run=None), m["lineage"].pop(1)))
    with pytest.raises(UserError, match="its lineage names runs, but it names no run of its own"):
        package_manifest()


def test_a_lost_product_is_found_whatever_experiments_share_its_first_word(tmp_path):
    """Check 29b's F7: a call record without `data/runs/fairseq-candidate-11` passed, since
    `fairseq-gpu` also begins with "fairseq"; a job is held to the experiment it wrote to."""
    import shutil

    from finetune_lab.book.devices import call_records_set_aside
    from finetune_lab.runs.gpu_archive import CALL_RECORDS

    stem = "20261126T051216Z"
    here, there = PROJECT_ROOT / CALL_RECORDS, tmp_path / CALL_RECORDS
    there.mkdir(parents=True)
    for name in (f"{stem}.json", f"{stem}-nvidia-smi.csv"):
        shutil.copy2(here / name, there / name)
    _edit(there / f"{stem}.json",
          lambda m: m["products"].remove("data/runs/fairseq-candidate-11"))
    assert "brought back no experiment fairseq-candidate-11" in call_records_set_aside(tmp_path)


def test_a_manifest_of_another_program_above_the_runs_root_is_no_run(tmp_path):
    """Check 29b's F2: any `manifest.json` above the project (a web app's) refused every run."""
    from finetune_lab.runs.recording import run_dir_for

    (tmp_path / "manifest.json").write_text('{"name": "webapp"}')
    root = tmp_path / "proj" / "runs"
    assert run_dir_for("t1", "random-seed0", root) == root / "t1" / "random-seed0"


@pytest.mark.parametrize(("key", "change", "said"), [
    # F8: gpu4 trained with fairseq's plain masked LM; relabelled as the bag-of-words recipe
    ("pretrain-gpu/gpu4", lambda m: m["hyperparameters"].update(bow_weight=8.0),
     "bow_weight 8.0, but"),
    # and the other way: the bag-of-words run relabelled as having none
    ("pretrain/cpu-docbow1", lambda m: m["hyperparameters"].update(bow_weight=0.0),
     "bow_weight 0.0, but"),
    # F10: a precision spelled as no precision is
    ("pretrain/cpu-clean-bow1", lambda m: m["hyperparameters"].update(precision="fp32 "),
     "precision 'fp32 ' is none of"),
])
def test_a_recipe_value_fairseq_prints_no_option_for_is_held_to_what_ran(cache, key, change,
                                                                         said):
    """Check 29b's F8, F10: `bow_weight` is printed only by the bag-of-words criterion, and an
    unknown precision skipped the precision check; both showed in the recipe tables."""
    _edit(cache / key / "manifest.json", change)
    rec = {r.key: r for r in discover_runs(cache)}[key]
    assert not rec.valid and any(said in p for p in rec.problems), rec.problems
