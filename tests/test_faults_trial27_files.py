"""Fault trial 27's defects in how files are kept and placed, by class, on real small inputs:
keeping what a command replaces never overwrites anything (L-m1, E-m1), no summary through a
link (L-m2), and one gpu-unpack at a time that places only whole folders (L-m10)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from finetune_lab.cli import main
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError

SUMMARY = {"cls": {"splits": {}}, "tokenizer": {"vocab_size": 1}}
"""What :func:`write_summary` is handed (it writes it as given)."""


def _stamps(seconds: int = 20) -> list[str]:
    """The ``.replaced-`` stamps of the next ``seconds`` seconds (a test's run fits in them)."""
    now = datetime.now(timezone.utc)
    return [f"{now + timedelta(seconds=i):%Y%m%dT%H%M%SZ}" for i in range(seconds)]


# --- L-m1, E-m1: keeping what --force replaces ---------------------------------------------


def test_data_summary_force_keeps_the_replaced_file_at_a_free_name(tmp_path, capsys):
    """L-m1: `data-summary --out a.json --force` kept the user's file as
    `a.json.replaced-<second>` over an earlier backup of that name, which was lost."""
    from finetune_lab.book.data_summary import write_summary

    dest = tmp_path / "a.json"
    dest.write_text('{"mine": 2}\n')
    planted = {s: tmp_path / f"a.json.replaced-{s}" for s in _stamps()}
    for stamp, path in planted.items():
        path.write_text(f"older backup {stamp}\n")
    write_summary(SUMMARY, dest, force=True)
    assert all(p.read_text() == f"older backup {s}\n" for s, p in planted.items())
    (kept,) = set(tmp_path.glob("a.json.replaced-*")) - set(planted.values())
    assert kept.name.endswith("-2") and kept.read_text() == '{"mine": 2}\n'
    assert f"what it held is kept in {kept}" in capsys.readouterr().err
    assert json.loads(dest.read_text()) == SUMMARY


def test_data_summary_force_steps_past_folders_and_links_at_the_kept_name(tmp_path, capsys):
    """E-m1: a folder at `c.json.replaced-<second>` was "cannot read or write …/c.json: Is a
    directory … give the file"; a link to nothing there is a name taken too."""
    from finetune_lab.book.data_summary import write_summary

    dest = tmp_path / "c.json"
    dest.write_text("my notes\n")
    for i, stamp in enumerate(_stamps()):
        name = tmp_path / f"c.json.replaced-{stamp}"
        if i % 2:
            name.symlink_to(tmp_path / "nowhere")
        else:
            name.mkdir()
            (name / "keep.txt").write_text(stamp)
    write_summary(SUMMARY, dest, force=True)
    kept = [p for p in tmp_path.glob("c.json.replaced-*") if p.is_file() and not p.is_symlink()]
    assert [p.read_text() for p in kept] == ["my notes\n"]
    assert all((p / "keep.txt").is_file() for p in tmp_path.glob("c.json.replaced-*")
               if p.is_dir())
    assert str(kept[0]) in capsys.readouterr().err


def test_a_superseded_run_is_never_moved_onto_a_name_already_taken(tmp_path):
    """The same class where a re-run keeps the run it replaces (`.superseded/`): a link left at
    the stamped name (`exists()` is False for it) made the move fail half-way."""
    from finetune_lab.runs.recording import set_aside

    run = tmp_path / "runs" / "fairseq" / "random-seed0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}\n")
    aside = tmp_path / "runs" / ".superseded" / "fairseq"
    aside.mkdir(parents=True)
    now = datetime.now(timezone.utc)
    for i in range(20):
        (aside / f"random-seed0-{now + timedelta(seconds=i):%Y%m%dT%H%M%S}").symlink_to(
            tmp_path / "nowhere")
    moved = set_aside(run)
    assert moved.name.endswith("-2") and (moved / "manifest.json").read_text() == "{}\n"
    assert not run.exists() and sum(p.is_symlink() for p in aside.iterdir()) == 20


def test_keeping_never_replaces_an_empty_folder_or_a_file(tmp_path):
    """`os.rename` replaces an empty folder and `os.replace` a file: the kept name is taken
    only where nothing is."""
    from finetune_lab._files import move_aside, rename_noreplace

    old = tmp_path / "old"
    old.mkdir()
    (old / "w.pt").write_text("weights")
    (tmp_path / "taken").mkdir()
    (tmp_path / "file").write_text("mine")
    assert not rename_noreplace(old, tmp_path / "taken")
    assert not rename_noreplace(tmp_path / "file", tmp_path / "taken")
    assert move_aside(old, tmp_path / "taken") == tmp_path / "taken-2"
    assert (tmp_path / "taken-2" / "w.pt").read_text() == "weights" and not old.exists()
    assert list((tmp_path / "taken").iterdir()) == []
    (tmp_path / "other").write_text("x")
    assert not rename_noreplace(tmp_path / "other", tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine"


# --- L-m2: no summary through a link ---------------------------------------------------------


def test_data_summary_out_a_link_is_refused_force_or_not(tmp_path, monkeypatch, capsys):
    """L-m2: `data-summary --out LINK` (to the committed data.json) rewrote it through the link."""
    from finetune_lab.book.data_summary import write_summary

    target = tmp_path / "data.json"
    target.write_text(json.dumps(SUMMARY | {"mark": "committed"}))
    link = tmp_path / "link.json"
    link.symlink_to(target)
    for force in (False, True):
        with pytest.raises(UserError, match=r"link\.json is a link .*not written through a link"):
            write_summary({**SUMMARY, "mark": "new"}, link, force=force)
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))  # nothing prepared
    assert main(["data-summary", "--out", str(link)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is a link" in err, err
    assert json.loads(target.read_text())["mark"] == "committed" and link.is_symlink()


# --- L-m10: gpu-unpack, one at a time, whole folders only -----------------------------------


def _call_with_run(tmp_path: Path, drop: str | None = None) -> tuple[Path, Path]:
    """A device call's files holding a copy of a committed GPU run (``drop``: one of its files
    left out of the archive), and an empty project: ``(files, project)``."""
    from finetune_lab.runs import gpu_archive

    there = tmp_path / "device"
    run = there / "data" / "runs" / "zz-gpu" / "random-seed0"
    shutil.copytree(PROJECT_ROOT / "data" / "runs" / "fairseq-gpu" / "random-seed0", run)
    if drop:
        (run / drop).unlink()
    files = tmp_path / "files"
    gpu_archive.pack([there / "data" / "runs" / "zz-gpu"], files, root=there,
                     extra={"products": ["data/runs/zz-gpu"]})
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    return files, project


def test_a_second_gpu_unpack_is_refused_and_leaves_the_first_ones_staging(tmp_path,
                                                                         monkeypatch, capsys):
    """L-m10: the second unpack cleared every `.gpu-unpack-*` (the first's staging too), and
    the first placed a run with files missing."""
    from finetune_lab import gpu_lab
    from finetune_lab.runs import gpu_archive

    files, project = _call_with_run(tmp_path)
    staging = project / "data" / ".gpu-unpack-first"  # the first unpack's, live
    staging.mkdir()
    (staging / "gpu-lab.tar").write_text("half reassembled")
    lock = project / "data" / ".gpu-unpack.lock"
    holder = subprocess.Popen(  # the first unpack, holding its lock
        [sys.executable, "-c", "import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); "
         "fcntl.flock(f, fcntl.LOCK_EX); f.write(f'pid {os.getpid()} on here'); f.flush(); "
         "print('held', flush=True); time.sleep(120)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"gpu-unpack\.lock is held by pid {holder.pid} "
                                            "on here: another `finetune-lab gpu-unpack`"):
            gpu_archive.unpack(files, root=project)
        monkeypatch.setattr(gpu_lab, "unpack", functools.partial(gpu_archive.unpack,
                                                                 root=project))
        assert main(["gpu-unpack", str(files)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(holder.pid) in err, err
        assert (staging / "gpu-lab.tar").read_text() == "half reassembled"
        assert not (project / "data" / "runs").exists()
    finally:
        holder.kill()
        holder.wait()
    placed = gpu_archive.unpack(files, root=project)  # the first has ended: its leftovers go
    assert placed == [project / "data" / "runs" / "zz-gpu" / "random-seed0"]
    assert not staging.exists() and not lock.exists()


@pytest.mark.parametrize("drop", ["train.log", "valid/events.out.tfevents.1795666878.vm.783.1"])
def test_gpu_unpack_places_no_run_that_lacks_what_its_manifest_lists(drop, tmp_path):
    """L-m10: a run placed with 5 of its 12 entries gone, said nothing; a rerun then said
    "exists; left as it is". A run is placed only whole against its manifest's hashes."""
    from finetune_lab.runs import gpu_archive

    files, project = _call_with_run(tmp_path, drop=drop)
    with pytest.raises(UserError, match=rf"zz-gpu/random-seed0 is not whole \({drop}, which "
                                        "its manifest's .* lists, is missing\): refused, "
                                        "nothing was unpacked"):
        gpu_archive.unpack(files, root=project)
    assert not (project / "data" / "runs").exists()
    assert not list((project / "data").glob(".gpu-unpack-*"))


def test_a_folder_that_lost_files_on_its_way_is_not_placed(tmp_path):
    """The check after the move, beside the destination: what the archive listed is there, or
    nothing is placed and nothing half-moved is left."""
    from finetune_lab.runs import gpu_place

    item = tmp_path / "stage" / "random-seed0"
    shutil.copytree(PROJECT_ROOT / "data" / "runs" / "fairseq-gpu" / "random-seed0", item)
    listed = {p.relative_to(item).as_posix(): p.stat().st_size
              for p in item.rglob("*") if p.is_file()}
    (item / "train.log").unlink()  # gone from under the unpack
    dest = tmp_path / "data" / "runs" / "zz-gpu" / "random-seed0"
    with pytest.raises(UserError, match="random-seed0 was not placed: after the move "
                                        "train.log is missing"):
        gpu_place.place(item, dest, listed, tmp_path)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_a_killed_unpacks_half_moved_folder_is_cleared_by_the_next(tmp_path):
    """A placement killed between its move and its rename leaves a hidden folder beside the
    run; the next unpack, holding the lock, removes it, and it was never read as a run."""
    from finetune_lab.runs import gpu_archive

    files, project = _call_with_run(tmp_path)
    left = project / "data" / "runs" / "zz-gpu" / f".gpu-unpack-{os.getpid() + 1}-random-seed0"
    left.mkdir(parents=True)
    (left / "manifest.json").write_text("{}")
    assert gpu_archive.unpack(files, root=project) == [left.parent / "random-seed0"]
    assert not left.exists()
