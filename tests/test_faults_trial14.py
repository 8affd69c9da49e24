"""The fourteenth fault trial's open defects, fixed by class: no run in the store is deleted, a
failed one included; a pretraining run never continues state that is not its own; hidden files
are read by no reader; a linked run folder is a change to the freeze as it is to the registry;
the data the runs name as inputs is an input of the chapters that judge them; the frozen results
themselves are recorded; a value the book's reader cannot see is damage to the registry; and a
claim that no longer holds names the excluded runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError


def test_a_failed_run_is_set_aside_never_deleted(tmp_path, capsys):
    """W1: `pretrain --experiment pretrain-gpu --run gpu2 --overwrite` deleted the committed
    failed run (its event files, which the front page's status table counts)."""
    from finetune_lab.runs.recording import set_aside

    run = tmp_path / "runs" / "pretrain-gpu" / "gpu2"
    shutil.copytree(PROJECT_ROOT / "data" / "runs" / "pretrain-gpu" / "gpu2", run)
    files = sorted(p.relative_to(run) for p in run.rglob("*") if p.is_file())
    moved = set_aside(run)
    assert not run.exists() and moved.parent == tmp_path / "runs" / ".superseded" / "pretrain-gpu"
    assert sorted(p.relative_to(moved) for p in moved.rglob("*") if p.is_file()) == files
    assert "held a failed run" in capsys.readouterr().out


def test_a_new_run_never_continues_state_left_under_its_name(tmp_path, monkeypatch, capsys):
    """W2: `pretrain --run zzs` resumed `pretrain-checkpoints/zzs/checkpoint_last.pt`, another
    run's state, and recorded the result as a random init from update 0."""
    from finetune_lab.train.pretrain_recipe import fresh_state_dir, state_dir

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    left = state_dir("zzs")
    left.mkdir(parents=True)
    (left / "checkpoint_last.pt").write_bytes(b"another run's state")
    save_dir = fresh_state_dir("zzs")
    assert save_dir == left and list(save_dir.iterdir()) == []
    (kept,) = (tmp_path / "work" / "pretrain-checkpoints" / ".superseded").iterdir()
    assert (kept / "checkpoint_last.pt").read_bytes() == b"another run's state"
    assert "held the state of an earlier run named zzs" in capsys.readouterr().out


def test_a_paused_run_resumes_only_its_own_state(tmp_path):
    """W2: a paused run records the sha256 of the state it paused with; other state there, or
    state behind its last pause, is refused."""
    from finetune_lab._files import sha256_file
    from finetune_lab.train.pretrain_long import check_own_state

    run, last = tmp_path / "run", tmp_path / "checkpoint_last.pt"
    run.mkdir()
    last.write_bytes(b"own state")
    man = {"status": "paused", "resume_state": {"updates": 8, "sha256": sha256_file(last)}}
    (run / "manifest.json").write_text(json.dumps(man))
    check_own_state(run, last, 8)
    last.write_bytes(b"another run's state")
    with pytest.raises(UserError, match="is not the state .* paused with"):
        check_own_state(run, last, 8)
    man["status"] = "running"  # killed after its pause: the state may have gone further...
    (run / "manifest.json").write_text(json.dumps(man))
    check_own_state(run, last, 12)
    with pytest.raises(UserError, match="update count differs"):  # ... never back
        check_own_state(run, last, 4)


def test_a_hidden_file_in_prepared_data_rejects_no_run(tmp_path):
    """CF1: a `.DS_Store` in `data/work/cls-books-bin` rejected its 53 runs ("a new file the run
    never saw"), and the freeze, which reads no hidden file, saw no change."""
    from finetune_lab._files import sha256_tree
    from finetune_lab.runs import manifest as mf
    from finetune_lab.runs.run_inputs import input_differences

    data = tmp_path / "bin"
    data.mkdir()
    (data / "train.bin").write_bytes(b"tokens")
    record = mf.input_record(data)
    (data / ".DS_Store").write_bytes(b"finder")
    (data / ".cache").mkdir()
    (data / ".cache" / "x").write_bytes(b"x")
    assert sha256_tree(data) == record["sha256"]

    class Rec:
        experiment, manifest, problems, warnings, stale_checkpoint = "fairseq", {}, [], [], None
    assert input_differences("data", record, Rec()) == []
    (data / "valid.bin").write_bytes(b"more")  # a new file that is data is still one
    assert input_differences("data", record, Rec()) == [
        f"data folder {record['path']} has a new file valid.bin the run never saw"]


@pytest.mark.parametrize("level", ["experiment", "run"])
def test_a_folder_replaced_by_a_link_to_a_copy_changes_the_freeze(level, tmp_path):
    """L3: the registry reads no run through a link (it lists the folder as bad), and the freeze
    followed the link and hashed the copy's files under the same names: no change."""
    from finetune_lab.book.chapter_inputs import LINK, hash_inputs

    runs = tmp_path / "data" / "runs"
    for name in ("random-seed0", "random-seed1"):
        (runs / "fairseq" / name).mkdir(parents=True)
        (runs / "fairseq" / name / "manifest.json").write_text(json.dumps({"run": name}))
    patterns = ["data/runs/fairseq/**", "data/runs/*/*/manifest.json"]
    before = hash_inputs(tmp_path, patterns)
    folder = runs / "fairseq" / ("random-seed1" if level == "run" else "")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    shutil.rmtree(folder)
    os.symlink(copy, folder.as_posix().rstrip("/"), target_is_directory=True)
    after = hash_inputs(tmp_path, patterns)
    link = folder.relative_to(tmp_path).as_posix().rstrip("/")
    assert after != before and after[link] == LINK + str(copy)
    assert not [k for k in after if k.startswith(f"{link}/")]  # never entered


def test_the_data_runs_name_as_inputs_is_an_input_of_the_chapters_that_judge_them(tmp_path):
    """CF2: `data/work/pretrain-bin/bin` and `pretrain-gpu-bin/bin`, which the registry checks
    six runs against, were declared by no chapter: made, they rejected those runs and changed
    the front page, and no chapter was stale."""
    from finetune_lab.book.chapter_inputs import chapter_inputs
    from finetune_lab.runs.run_inputs import work_inputs

    inputs = chapter_inputs(PROJECT_ROOT, "index.qmd")
    for corpus in ("pretrain-bin", "pretrain-gpu-bin", "pretrain-tapt-bin", "pretrain-dapt-bin"):
        assert f"data/work/{corpus}/bin/**" in inputs
    assert "data/work/candidates/gpu4/model.pt" in inputs  # a single file as itself
    # derived from the runs' own manifests, a damaged one skipped (the registry rejects it)
    runs = tmp_path / "data" / "runs" / "exp"
    for name, text in (("a", {"inputs": {"data": [{"path": "data/work/x-bin", "sha256": {
            "dict.txt": "0" * 64}}], "checkpoint": {"path": "data/work/../work/c/model.pt",
                                                    "sha256": {".": "1" * 64}}}}),
                       ("b", "{"), ("c", {"inputs": {"data": [{"path": "/elsewhere/bin"}]}})):
        (runs / name).mkdir(parents=True)
        (runs / name / "manifest.json").write_text(text if isinstance(text, str)
                                                   else json.dumps(text))
    assert work_inputs(tmp_path) == ["data/work/c/model.pt", "data/work/x-bin/**"]


def _frozen_chapter(root: Path) -> str:
    from finetune_lab.book import freeze as fz

    chapter = "chapters/c.qmd"
    (root / "chapters").mkdir(parents=True)
    (root / "_quarto.yml").write_text("project:\n  type: book\n")
    (root / "data").mkdir()
    (root / "data" / "d.json").write_text("{}")
    (root / chapter).write_text("---\ninputs:\n  - data/d.json\n---\n\nText.\n")
    fz.pre_render(root, {}, log=lambda *_: None)
    entry = fz.freeze_entry(root, chapter)
    (entry / "execute-results").mkdir(parents=True)
    (entry / "figure-html").mkdir()
    md = "78.1 ± 0.9 ![a](c_files/figure-html/a.svg) ![b](c_files/figure-html/b.svg)"
    (entry / "execute-results" / "html.json").write_text(
        json.dumps({"hash": _md5(root / chapter), "result": {"markdown": md}}))
    (entry / "figure-html" / "a.svg").write_text("<svg>a</svg>")
    (entry / "figure-html" / "b.svg").write_text("<svg>b</svg>")
    fz.post_render(root, log=lambda *_: None)
    assert fz.check_freeze(root) == []
    return chapter


def _md5(path: Path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("edit", ["number", "figure", "removed"])
def test_frozen_results_edited_after_the_render_are_stale(edit, tmp_path):
    """CF4, CF5: a number edited in `execute-results/html.json`, or one whole figure copied over
    another, passed check-freeze and would have been published."""
    from finetune_lab.book import freeze as fz

    chapter = _frozen_chapter(tmp_path)
    entry = fz.freeze_entry(tmp_path, chapter)
    results = entry / "execute-results" / "html.json"
    if edit == "number":
        results.write_text(results.read_text().replace("78.1", "99.9"))
        changed = "_freeze/chapters/c/execute-results/html.json (changed)"
    elif edit == "figure":
        shutil.copyfile(entry / "figure-html" / "a.svg", entry / "figure-html" / "b.svg")
        changed = "_freeze/chapters/c/figure-html/b.svg (changed)"
    else:
        (entry / "figure-html" / "extra.svg").write_text("<svg/>")
        changed = "_freeze/chapters/c/figure-html/extra.svg (new)"
    (stale,) = fz.check_freeze(tmp_path)
    assert "frozen results changed after it was executed" in stale.describe()
    assert changed in stale.describe()


def test_a_format_rendered_later_is_added_to_the_record_and_an_edit_is_not(tmp_path):
    """A Typst render after an HTML one adds `typ.json` to the results: post-render records
    what was added, and never what was changed."""
    from finetune_lab.book import freeze as fz

    chapter = _frozen_chapter(tmp_path)
    results = fz.freeze_entry(tmp_path, chapter) / "execute-results"
    (results / "typ.json").write_text((results / "html.json").read_text())
    fz.post_render(tmp_path, log=lambda *_: None)
    assert fz.check_freeze(tmp_path) == []
    (results / "typ.json").write_text("{}")
    fz.post_render(tmp_path, log=lambda *_: None)
    assert [s.chapter for s in fz.check_freeze(tmp_path)] == [chapter]


def test_an_accuracy_logged_as_a_tensor_is_damage(tmp_path):
    """E1: `test/accuracy` rewritten as a string tensor "0.78" was read as 0.78 by the registry
    (valid) and dropped by the book's reader (n=3 over two values)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    from finetune_lab.runs.eventfiles import checked_events

    def write(folder: Path, value: summary_pb2.Summary.Value) -> Path:
        writer = EventFileWriter(str(folder))
        writer.add_event(event_pb2.Event(wall_time=1.0, step=3, summary=summary_pb2.Summary(
            value=[value])))
        writer.close()
        return next(folder.iterdir())

    plain = write(tmp_path / "a", summary_pb2.Summary.Value(tag="test/accuracy",
                                                            simple_value=78.0))
    assert checked_events(plain) == (3, None)
    tensor = write(tmp_path / "b", summary_pb2.Summary.Value(
        tag="test/accuracy", tensor=tensor_util.make_tensor_proto("78")))
    last, problem = checked_events(tensor)
    assert "logs test/accuracy at update 3 as a tensor" in problem


def test_a_claim_that_no_longer_holds_names_the_excluded_runs(tmp_path, monkeypatch):
    """M3: one rejected random run stopped the front page with "AssertionError: the text says
    pretraining wins by a margin the seeds show", naming no run."""
    from finetune_lab.book.claims import ClaimError, holds
    from finetune_lab.config import RUNS_DIR_ENV

    root = tmp_path / "runs"
    shutil.copytree(PROJECT_ROOT / "data" / "runs" / "fairseq" / "random-seed1",
                    root / "fairseq" / "random-seed1")
    with open(root / "fairseq" / "random-seed1" / "train.log", "a") as log:
        log.write("\n")
    monkeypatch.setenv(RUNS_DIR_ENV, str(root))
    holds(True, "anything", "fairseq")
    with pytest.raises(ClaimError) as err:
        holds(False, "pretraining wins by a margin the seeds show", "fairseq")
    message = str(err.value)
    assert message.startswith("the sentence 'pretraining wins by a margin the seeds show' no "
                              "longer holds with the valid runs of fairseq; excluded there: "
                              "fairseq/random-seed1 (")
    assert "train.log" in message and str(PROJECT_ROOT) not in message
    with pytest.raises(ClaimError, match="no run there is excluded"):
        holds(False, "a claim", "lora")
