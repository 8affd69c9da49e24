"""Room for a GPU call (trial 29's E-19): the tree had outgrown the call's 64 MiB, so what the
call never reads is set aside until the call is unpacked, and a call that would only redo
existing runs is refused before it is made."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.runs import gpu_bundle, gpu_room
from finetune_lab.runs.gpu_plan import Plan

FILES = {
    "src/a.py": "print(1)\n",
    "_freeze/chapters/x/html.json": "{}\n",
    "data/runs/fairseq/seed0/manifest.json": "{\"status\": \"complete\"}\n",
    "data/runs/fairseq/seed0/train.log": "epoch 1\n",
    "data/runs/fairseq/seed0/tb/train/events.out.tfevents.1": "\0\1\2",
    "data/runs/fairseq/experiment.json": "{}\n",
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / ".gitignore").write_text(f"/{gpu_room.ROOM_DIR}/\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    return tmp_path


def test_what_the_call_never_reads_is_set_aside_and_put_back_byte_for_byte(repo):
    moved, size = gpu_room.set_aside(repo)
    assert moved == 3 and size == len("{}\n") + len("epoch 1\n") + 3
    sent = set(gpu_room.sent_files(repo))
    assert sent == {".gitignore", "src/a.py", "data/runs/fairseq/seed0/manifest.json",
                    "data/runs/fairseq/experiment.json"}  # what the call reads, and no more
    assert gpu_room.room_note(repo) and "gpu-unpack" in gpu_room.room_note(repo)
    with pytest.raises(UserError, match="set aside for an earlier call"):
        gpu_room.set_aside(repo)
    assert gpu_room.put_back(repo) == (3, [])
    assert {rel: (repo / rel).read_text() for rel in FILES} == FILES
    assert not (repo / gpu_room.ROOM_DIR).exists() and gpu_room.room_note(repo) is None
    assert gpu_room.put_back(repo) == (0, [])  # nothing set aside: nothing done


def test_a_file_back_in_its_place_meanwhile_is_never_overwritten(repo):
    """`git checkout` puts a set-aside file back: its twin in the room is dropped. A file that
    differs is at its place: both are kept, and the room's list names what stays there."""
    gpu_room.set_aside(repo)
    subprocess.run(["git", "checkout", "--", "_freeze"], cwd=repo, check=True)
    log = repo / "data/runs/fairseq/seed0/train.log"
    log.write_text("my own notes\n")
    back, kept = gpu_room.put_back(repo)
    assert (back, kept) == (2, ["data/runs/fairseq/seed0/train.log"])
    assert log.read_text() == "my own notes\n"
    assert (repo / gpu_room.ROOM_DIR / kept[0]).read_text() == "epoch 1\n"
    assert gpu_room.room_note(repo)  # still said, until it is sorted out


def test_a_failed_bundle_puts_back_what_it_set_aside(tmp_path, monkeypatch, capsys):
    """A bundle that fails after the room was made leaves nothing set aside: no call follows."""
    from finetune_lab import cli

    calls: list[str] = []
    monkeypatch.setattr("finetune_lab.gpu_lab.set_aside", lambda: calls.append("aside") or (3, 9))
    monkeypatch.setattr("finetune_lab.gpu_lab.put_back", lambda: calls.append("back") or (3, []))

    def fails(*_args, **_kwargs):
        raise UserError("the sizes do not fit")

    monkeypatch.setattr("finetune_lab.gpu_lab.bundle", fails)
    assert cli.main(["gpu-bundle", "--make-room", "--out", str(tmp_path / "b")]) == 2
    assert calls == ["aside", "back"]
    assert "the sizes do not fit" in capsys.readouterr().err


def test_unpack_with_nothing_set_aside_and_no_folder_says_so():
    ran = subprocess.run([sys.executable, "-m", "finetune_lab.cli", "gpu-unpack"],
                         capture_output=True, text=True, check=False)
    assert ran.returncode == 2
    assert ran.stderr.strip().endswith("nothing is set aside: pass the folder the call's files "
                                       "came back in")


def test_a_call_that_would_redo_existing_runs_is_refused_with_free_seeds():
    """The committed GPU runs hold seeds 0 to 11 of the fairseq grid: a default plan would
    only skip them there (or redo a failed one and never send it back)."""
    taken = gpu_bundle.taken_runs(Plan())
    assert "fairseq-gpu/pretrained-seed0" in taken and "lora-gpu/lora-qv-seed0" in taken
    free = gpu_bundle.free_seeds(Plan())
    assert len(free) == 3 and min(free) > 11
    assert gpu_bundle.taken_runs(replace(Plan(), seeds=free)) == []
    with pytest.raises(UserError, match=r"exist here already .*--seeds " + " ".join(map(str, free))):
        gpu_bundle.bundle(Path("/nonexistent/b"), plan=Plan(), from_environment=True)


def test_the_whole_lab_fits_beside_the_tree_once_room_is_made():
    """The tree without what --make-room sets aside, and the whole lab's bundle (5.7 MiB, with
    bitsandbytes for QLoRA), fit the call; without the room they did not (E-19)."""
    tree = gpu_bundle.tree_bytes()
    aside = sum(gpu_bundle.disk_bytes(PROJECT_ROOT / p) for p in gpu_room.movable())
    assert tree - aside + 6 * 2**20 <= gpu_bundle.TRANSFER_LIMIT
    assert aside > 10 * 2**20  # the run cache's logs and events, and the freeze


def test_a_room_that_is_a_link_is_refused_and_nothing_moves(repo):
    """Check 30b's 30b-1: `.gpu-room` a link back to the project made each file its own twin,
    deleted as "put back" (553 files, a user's note among them)."""
    (repo / "data/runs/fairseq/NOTES.txt").write_text("my notes\n")
    (repo / gpu_room.ROOM_DIR).symlink_to(".")
    with pytest.raises(UserError, match="is a link or no folder"):
        gpu_room.set_aside(repo)
    with pytest.raises(UserError, match="is a link or no folder"):
        gpu_room.put_back(repo)
    assert {rel: (repo / rel).read_text() for rel in FILES} == FILES
    assert (repo / "data/runs/fairseq/NOTES.txt").read_text() == "my notes\n"


@pytest.mark.parametrize("listed", ["/etc/hostname", "../outside.txt", "src/a.py",
                                    "data/runs/fairseq/seed0/manifest.json"])
def test_a_list_naming_what_make_room_never_moves_is_refused(repo, listed):
    """Check 30b's 30b-2: an absolute path in the room's list was its own twin, deleted."""
    (repo / gpu_room.ROOM_DIR).mkdir()
    (repo / gpu_room.ROOM_DIR / gpu_room.LIST_FILE).write_text(json.dumps([listed]))
    with pytest.raises(UserError, match="is not a list of the paths --make-room moves"):
        gpu_room.put_back(repo)
    assert {rel: (repo / rel).read_text() for rel in FILES} == FILES
