"""Fault trial 8, the book's readers: Z2 (a named pipe under a declared input hung
check-freeze), C1 (a dict.txt line in fairseq's own flag syntax was a traceback, read without
the manifest check), F1 (a recorded fill-mask answer that is no piece of its checkpoint's
vocabulary was shown)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from conftest import quarto_hash

from finetune_lab._files import sha256_file
from finetune_lab.book import fill_mask as fm
from finetune_lab.book import freeze as fz
from finetune_lab.book.chapter_inputs import BROKEN_LINK, MISSING, NOT_REGULAR
from finetune_lab.errors import UserError
from finetune_lab.models.checkpoints import DICT_FILE, MODEL_FILE, packaged_dir
from finetune_lab.models.trust import MANIFEST_FILE

HANG = 60
"""Seconds a command that must finish at once may take before the test calls it hung (it
took under 5 s on the whole project before the fault; with a pipe it never returned)."""

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, killed after :data:`HANG` s: a read blocked on a pipe
    fails the test instead of hanging the suite."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                              capture_output=True, text=True, timeout=HANG)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: still running after {HANG} s (a pipe or a device was opened)")


# --- Z2: a pipe, socket, device or dead link under a declared input --------------------------

CHAPTER = """---
title: "Runs"
inputs:
  - data/runs/**
  - data/plain-input
---

Text only.
"""


def _frozen_project(root: Path) -> Path:
    """A book with one chapter, executed and recorded with one run's manifest as its input."""
    (root / "chapters").mkdir(parents=True)
    (root / "_quarto.yml").write_text("project:\n  type: book\n")
    (root / "chapters" / "runs.qmd").write_text(CHAPTER)
    run = root / "data" / "runs" / "fairseq" / "r1"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    chapter = "chapters/runs.qmd"
    out = fz.freeze_entry(root, chapter) / "execute-results"
    out.mkdir(parents=True)
    (out / "html.json").write_text(json.dumps({"hash": quarto_hash(root / chapter),
                                               "result": {"markdown": "Text only.\n"}}))
    patterns = fz.chapter_inputs(root, chapter)
    record = fz.record_path(root, chapter)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({**fz.make_record(root, chapter, patterns),
                                  "outputs": fz.output_hashes(root, chapter)}))
    assert fz.check_freeze(root) == []
    return root


@needs_fifo
def test_check_freeze_names_a_pipe_under_a_declared_glob_and_returns(tmp_path):
    """Z2: `mkfifo data/runs/fairseq/zzfifo/manifest.json`; check-freeze hung for ever."""
    root = _frozen_project(tmp_path / "book")
    (root / "data" / "runs" / "fairseq" / "zzfifo").mkdir()
    os.mkfifo(root / "data" / "runs" / "fairseq" / "zzfifo" / "manifest.json")
    proc = _run("""
        import sys
        from finetune_lab.cli import main
        sys.exit(main(["check-freeze", "--project", sys.argv[1]]))
        """, str(root))
    assert proc.returncode == 1, proc.stderr
    assert "chapters/runs.qmd is stale (inputs changed since it was executed): " \
           "data/runs/fairseq/zzfifo/manifest.json (new)" in proc.stderr
    # pre-render hashes the same way: it sets the chapter to execute again, and returns
    proc = _run("""
        import sys
        from pathlib import Path
        from finetune_lab.book import freeze as fz
        print([s.describe() for s in fz.pre_render(Path(sys.argv[1]), {}, log=print)])
        """, str(root))
    assert proc.returncode == 0, proc.stderr
    assert "data/runs/fairseq/zzfifo/manifest.json (new)" in proc.stdout
    pending = json.loads(fz.record_path(root, "chapters/runs.qmd", pending=True).read_text())
    assert pending["files"]["data/runs/fairseq/zzfifo/manifest.json"] == NOT_REGULAR + "fifo"


@needs_fifo
def test_no_input_that_is_not_a_regular_file_is_opened(tmp_path):
    """The class: a pipe, a socket, a device (through a link: /dev/zero never ends), a dead link
    and a link loop, under a glob or named plainly, each hashed as a marker, promptly."""
    root = tmp_path / "p"
    runs = root / "data" / "runs" / "x"
    runs.mkdir(parents=True)
    (runs / "ok.json").write_text("{}")
    os.mkfifo(runs / "pipe")
    os.mkfifo(root / "data" / "plain-pipe")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(runs / "sock"))
    (runs / "zero").symlink_to("/dev/zero")
    (runs / "dead").symlink_to(runs / "gone")
    (runs / "loop").symlink_to(runs / "loop")
    proc = _run("""
        import json, sys
        from pathlib import Path
        from finetune_lab.book.chapter_inputs import hash_inputs
        print(json.dumps(hash_inputs(Path(sys.argv[1]),
                                     ["data/runs/**", "data/plain-pipe", "data/none"])))
        """, str(root))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "data/none": MISSING,
        "data/plain-pipe": NOT_REGULAR + "fifo",
        "data/runs/x/dead": BROKEN_LINK,
        "data/runs/x/loop": BROKEN_LINK,
        "data/runs/x/ok.json": sha256_file(runs / "ok.json"),
        "data/runs/x/pipe": NOT_REGULAR + "fifo",
        "data/runs/x/sock": NOT_REGULAR + "socket",
        "data/runs/x/zero": NOT_REGULAR + "char-device",
    }


@needs_fifo
def test_a_pipe_among_a_chapters_frozen_results_is_damage_not_a_read(tmp_path):
    """The same command reads the chapter's frozen results: a pipe there is named, not read."""
    root = _frozen_project(tmp_path / "book")
    os.mkfifo(fz.freeze_entry(root, "chapters/runs.qmd") / "execute-results" / "pdf.json")
    proc = _run("""
        import sys
        from finetune_lab.cli import main
        sys.exit(main(["check-freeze", "--project", sys.argv[1]]))
        """, str(root))
    assert proc.returncode == 1, proc.stderr
    assert "execute-results/pdf.json is not a regular file" in proc.stderr


# --- C1: the packaged checkpoint's dict.txt, read by the book ---------------------------------


def _checkpoint_copy(folder: Path, dict_text: str | None = None, listed: bool = True,
                     model_sha: str | None = None) -> Path:
    """A packaged-checkpoint folder without weights (the readers here need none): the
    committed ``dict.txt`` (or ``dict_text``) and a manifest listing it (or the committed one)."""
    folder.mkdir(parents=True)
    manifest = json.loads((packaged_dir() / MANIFEST_FILE).read_text())
    if dict_text is None:
        shutil.copy2(packaged_dir() / DICT_FILE, folder / DICT_FILE)
    else:
        (folder / DICT_FILE).write_text(dict_text, encoding="utf-8")
    files = {DICT_FILE: {"sha256": sha256_file(folder / DICT_FILE)}}
    if model_sha is not None:
        files[MODEL_FILE] = {"sha256": model_sha}
    if listed:
        manifest["files"] = files
    manifest["files"].pop("sentencepiece.bpe.model", None)
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    return folder


def test_an_edited_packaged_dictionary_is_one_line_naming_it(tmp_path, monkeypatch):
    """C1: `echo "▁zzpiece 12 #fairseq:overwrite" >> dict.txt`; frequent_pieces read it
    without the manifest check and died on int('#fairseq:overwrite')."""
    folder = _checkpoint_copy(tmp_path / "ckpt", listed=False)  # the committed manifest
    assert fm.frequent_pieces(20, folder=folder) == fm.frequent_pieces(20)
    with (folder / DICT_FILE).open("a", encoding="utf-8") as handle:
        handle.write("\u2581zzpiece 12 #fairseq:overwrite\n")
    with pytest.raises(UserError, match=r"dict.txt is not the file its manifest lists"):
        fm.frequent_pieces(20, folder=folder)
    # the chapter's call, on the default (the committed) checkpoint
    monkeypatch.setattr(fm, "packaged_dir", lambda: folder)
    top1 = pd.DataFrame({"sentence": ["Un <mask>."], "rank": [1], "predicted piece": ["."],
                         "probability": [0.5]})
    with pytest.raises(UserError, match=r"dict.txt is not the file its manifest lists"):
        fm.fill_mask_reading(top1)
    (folder / DICT_FILE).unlink()
    with pytest.raises(UserError, match=r"dict.txt does not exist"):
        fm.frequent_pieces(20)


def test_the_committed_frequent_pieces_are_read_as_before():
    rows = []
    for line in (packaged_dir() / DICT_FILE).read_text(encoding="utf-8").splitlines():
        piece, _, count = line.rpartition(" ")
        rows.append((int(count), piece.replace("\u2581", " ").strip()))
    assert fm.frequent_pieces(20) == {p for _, p in sorted(rows, reverse=True)[:20]}


def test_a_dictionary_is_read_as_fairseq_reads_it(tmp_path):
    """The flag fairseq accepts is parsed as fairseq parses it; a line fairseq refuses is one
    line naming the file and the line (the manifest lists the file: only its format is wrong)."""
    from fairseq.data import Dictionary

    good = "\u2581de 50\n, 40\n\u2581, 30\n\u2581de 7 #fairseq:overwrite\n\u2581zz 2\n"
    folder = _checkpoint_copy(tmp_path / "good", good)
    assert fm.dictionary_counts(folder) == [("\u2581de", 50), (",", 40), ("\u2581,", 30),
                                           ("\u2581de", 7), ("\u2581zz", 2)]
    ours = Dictionary.load(str(folder / DICT_FILE))  # fairseq accepts the same file
    assert ours.symbols[4:] == [p for p, _ in fm.dictionary_counts(folder)]
    assert ours.count[4:] == [c for _, c in fm.dictionary_counts(folder)]
    assert fm.frequent_pieces(2, folder=folder) == {"de", ","}
    for n, bad in enumerate(("\u2581zz twelve\n", "\u2581zz 12 #other:flag\n", "nospace\n",
                             "\n", "\u2581de 3\n")):
        folder = _checkpoint_copy(tmp_path / f"bad{n}", good + bad)
        with pytest.raises((ValueError, RuntimeError)):  # fairseq refuses each
            Dictionary.load(str(folder / DICT_FILE))
        with pytest.raises(UserError, match=rf"{folder / DICT_FILE}: line 6 ") as caught:
            fm.frequent_pieces(20, folder=folder)
        assert "\n" not in str(caught.value)


# --- F1: a recorded answer that is no piece of its checkpoint's vocabulary -------------------


def test_every_committed_fill_mask_record_is_accepted():
    bad: list[str] = []
    found = fm.recorded_fill_masks(set_aside=bad)
    assert bad == []
    assert sorted(found) == sorted(p.stem for p in fm.fill_mask_dir().glob("*.json"))


def _records(tmp_path: Path) -> Path:
    folder = tmp_path / "fill-mask"
    shutil.copytree(fm.fill_mask_dir(), folder)
    return folder


def test_an_answer_the_committed_vocabulary_lacks_is_set_aside(tmp_path):
    """F1: "vraiment" → "excellentissime" (`▁excellentissime` is <unk> in the 32k vocabulary),
    in the record of the committed weights (whose dictionary every clone has)."""
    folder = _records(tmp_path)
    path = folder / "cpu-sinpos1-bow.json"
    record = json.loads(path.read_text())
    committed = json.loads((packaged_dir() / MANIFEST_FILE).read_text())
    assert record["checkpoint"]["sha256"] == committed["files"][MODEL_FILE]["sha256"]
    assert record["predictions"][0]["predicted piece"] == "vraiment"
    record["predictions"][0]["predicted piece"] = "excellentissime"
    path.write_text(json.dumps(record))
    bad: list[str] = []
    kept = fm.recorded_fill_masks(folder, set_aside=bad)
    assert "cpu-sinpos1-bow" not in kept and "cpu-sinpos1" in kept
    assert bad == ["`cpu-sinpos1-bow.json` answers 'excellentissime' (item 0), which is no "
                   "piece of the dictionary of the checkpoint it names "
                   "(data/checkpoints/roberta-small-fr/dict.txt)"]


def test_answers_are_checked_against_the_dictionary_of_the_checkpoint_a_record_names(tmp_path):
    """A candidate's record is read against the candidate's own dictionary, where this machine
    has it: a piece shown twice ("," and "▁,", both ","), with or without "▁", and fairseq's
    symbols are pieces; a word it lacks is not; where the dictionary is not here, no check."""
    source = json.loads((fm.fill_mask_dir() / "cpu-sinpos1.json").read_text())
    shown = {row["predicted piece"] for row in source["predictions"]}
    pieces = sorted(shown - {","})
    text = "".join(f"{'' if i % 2 else chr(0x2581)}{p} {100 - i}\n" for i, p in enumerate(pieces))
    text += ", 5\n\u2581, 4\n"
    sha = "ab" * 32
    ckpt = _checkpoint_copy(tmp_path / "candidates" / "zz", text, model_sha=sha)
    folder = tmp_path / "fill-mask"
    folder.mkdir()

    def write(name: str, stored: Path, digest: str, change: dict[int, str]) -> None:
        record = json.loads(json.dumps(source))
        record["name"], record["checkpoint"] = name, {"path": str(stored), "sha256": digest}
        for i, piece in change.items():
            record["predictions"][i]["predicted piece"] = piece
        (folder / f"{name}.json").write_text(json.dumps(record))

    sentence = source["predictions"][0]["sentence"]
    same = [i for i, row in enumerate(source["predictions"]) if row["sentence"] == sentence]
    write("twice", ckpt / MODEL_FILE, sha, {same[0]: ",", same[1]: ",", same[2]: "<unk>"})
    write("unknown", ckpt / MODEL_FILE, sha, {3: "excellentissime"})
    write("elsewhere", tmp_path / "gone" / MODEL_FILE, "cd" * 32, {3: "excellentissime"})
    write("other-weights", ckpt / MODEL_FILE, "ef" * 32, {3: "excellentissime"})
    bad: list[str] = []
    kept = fm.recorded_fill_masks(folder, set_aside=bad)
    assert sorted(kept) == ["elsewhere", "other-weights", "twice"]
    assert bad == [f"`unknown.json` answers 'excellentissime' (item 3), which is no piece of "
                   f"the dictionary of the checkpoint it names ({(ckpt / DICT_FILE).resolve()})"]
    # the record of weights the candidate's manifest does not list is not read against it;
    # a candidate's dictionary that is not the file its manifest lists is no dictionary known
    with (ckpt / DICT_FILE).open("a", encoding="utf-8") as handle:
        handle.write("\u2581excellentissime 1\n")
    assert fm.record_vocabulary(kept["twice"]) is None
    bad = []
    assert "unknown" in fm.recorded_fill_masks(folder, set_aside=bad) and bad == []
