"""The fourteenth fault trial's open defects, and the fifteenth's and sixteenth's variants of
them, fixed by class: no run in the store is deleted, a
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
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 8)
    # killed after its pause: the state went further, as far as the launch recorded each save
    # (trial 18's W2-w1: an unrecorded state of the same seed and rate, put there, passed) ...
    last.write_bytes(b"own state, saved at update 12")
    man = {"status": "running", "resume_state": {"updates": 12, "sha256": sha256_file(last)}}
    (run / "manifest.json").write_text(json.dumps(man))
    check_own_state(run, last, 12)
    last.write_bytes(b"another run's state at update 12")
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 12)
    with pytest.raises(UserError, match="update count differs"):  # ... and never back
        check_own_state(run, last, 4)
    # trial 15's W2-n1: a run paused before the sha256 was kept (the committed cpu-long3 and
    # cpu-long4) takes only state at the very update it paused at, and only on its own corpora
    from finetune_lab.runs.manifest import input_record

    corpus = tmp_path / "corpus" / "bin"
    corpus.mkdir(parents=True)
    (corpus / "train.bin").write_bytes(b"tokens")
    old = {"status": "paused", "updates_done": 8056, "inputs": {"data": [input_record(corpus)]}}
    (run / "manifest.json").write_text(json.dumps(old))
    check_own_state(run, last, 8056, [corpus])
    with pytest.raises(UserError, match="update count differs"):
        check_own_state(run, last, 4)
    with pytest.raises(UserError, match="a run goes on with its own corpora"):
        check_own_state(run, last, 8056, [tmp_path / "pp" / "bin"])
    (corpus / "train.bin").write_bytes(b"tokens prepared again")  # trial 16: the same path
    with pytest.raises(UserError, match="or that data changed since"):
        check_own_state(run, last, 8056, [corpus])


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


def test_a_chapter_rendered_on_its_own_is_executed_and_recorded_again(tmp_path):
    """`quarto render chapters/x.qmd` executes the chapter even when it is frozen (Quarto's
    freeze holds for project renders only): its new results are recorded, not called edited."""
    from finetune_lab.book import freeze as fz

    chapter = _frozen_chapter(tmp_path)
    fz.pre_render(tmp_path, {"QUARTO_PROJECT_INPUT_FILES": chapter}, log=lambda *_: None)
    results = fz.freeze_entry(tmp_path, chapter) / "execute-results" / "html.json"
    results.write_text(results.read_text().replace("78.1", "78.2"))  # what the run gave now
    fz.post_render(tmp_path, log=lambda *_: None)
    assert fz.check_freeze(tmp_path) == []


# --- trial 13's minor defects --------------------------------------------------------------


def test_a_link_where_a_store_goes_is_that_store(tmp_path, monkeypatch):
    """A5: a link at the packaged checkpoint's folder was replaced with `--force`, because only
    its target, outside every store, was judged."""
    from finetune_lab.config import paths, protected

    target = tmp_path / "ckpt"
    target.mkdir()
    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    ckpt = paths().checkpoints / "roberta-small-fr"
    assert protected(ckpt) is not None
    assert protected(target) is None  # a folder of its own outside the stores
    # a link where a store goes (the work folder's candidates) is that store
    store = tmp_path / "work" / "candidates"
    store.parent.mkdir(parents=True)
    store.symlink_to(target, target_is_directory=True)
    assert protected(store) == (f"is or holds the candidates' weights {store}", True)


def test_gpu_unpack_moves_nothing_through_a_link_and_names_a_piece_that_is_no_file(tmp_path):
    """GL1: a link where the call's experiment goes moved its runs outside the project; GL6: a
    piece replaced by a named pipe was said to be missing."""
    from test_faults import _device_result

    from finetune_lab.runs import gpu_archive

    files, project = _device_result(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (project / "data" / "runs").mkdir(parents=True)
    (project / "data" / "runs" / "fairseq-gpu").symlink_to(victim, target_is_directory=True)
    with pytest.raises(UserError, match="fairseq-gpu is a link where the call's"):
        gpu_archive.unpack(files, root=project)
    assert list(victim.iterdir()) == []
    piece = next(files.glob(gpu_archive.ARCHIVE + ".*"))
    piece.unlink()
    os.mkfifo(piece)
    with pytest.raises(UserError, match="is not a regular file: every piece"):
        gpu_archive.unpack(files, root=project)


def test_a_full_disk_and_a_mount_point_are_one_line_naming_the_output(tmp_path, monkeypatch):
    """X4: "cannot write a file: No space left on device" named no path; A4: a mount point as
    `--out --force` was a traceback (EBUSY from the exchange)."""
    import errno

    from finetune_lab import _files

    out = tmp_path / "out"
    with pytest.raises(OSError) as err:
        with _files.atomic_dir(out, "prepare-cls"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert err.value.filename == str(out) and not out.exists()
    out.mkdir()
    (out / _files.OUTPUT_MARKER).write_text('{"command": "prepare-cls", "entries": []}')
    monkeypatch.setattr(_files, "_swap", lambda *a: (_ for _ in ()).throw(
        OSError(errno.EBUSY, "Device or resource busy", str(out))))
    with pytest.raises(UserError, match="is a mount point, which cannot be replaced"):
        with _files.atomic_dir(out, "prepare-cls", force=True) as tmp:
            (tmp / "x").write_text("x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing half-made left beside it


def test_convert_hf_names_a_checkpoint_that_is_no_file(capsys):
    """X9: `convert-hf --checkpoint /dev/zero` said "/dev/zero does not exist"."""
    from finetune_lab.cli import main

    assert main(["convert-hf", "--checkpoint", "/dev/zero"]) == 2
    assert "/dev/zero is not a regular file" in capsys.readouterr().err


def test_every_line_boundary_in_a_review_becomes_a_space():
    """D5: a review holding U+2028, U+0085 or U+2029 made its split file longer than its
    labels, which every reader then refused."""
    from finetune_lab.data.cls_books import single_line

    text = single_line("a\u2028b \x85 c\u2029d\x0be\nf")
    assert text == "a b c d e f" and len(text.splitlines()) == 1


def test_a_full_disk_in_a_librarys_writer_is_an_oserror_naming_the_output(tmp_path):
    """X-d3, X-d4 (trial 15): torch.save's RuntimeError and safetensors' SafetensorError on a
    full disk were tracebacks; the CLI says an OSError in one line."""
    import errno

    from finetune_lab.errors import library_write

    for raised in (RuntimeError("[enforce fail at inline_container.cc] . PytorchStreamWriter "
                                "failed writing file data/0: No space left on device"),
                   Exception('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                             'message: "No space left on device" })')):
        with pytest.raises(OSError) as err:
            with library_write(tmp_path / "out"):
                raise raised
        assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(tmp_path / "out"))
    with pytest.raises(ValueError):  # any other failure is what it is
        with library_write(tmp_path / "out"):
            raise ValueError("bad tensor")


def test_a_run_store_of_any_name_is_never_replaced(tmp_path):
    """A-n1 (trial 15): `prepare-cls --out data/work/myruns --force` deleted the runs of a
    `--runs-root data/work/myruns`: only `lora-runs` was protected, by name."""
    from finetune_lab._files import check_replaceable

    store = tmp_path / "myruns"
    run = store / "lora" / "lora-qv-seed0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"experiment": "lora", "framework": "transformers"}')
    # trial 16's A-v: the store, an experiment, a run, a folder in it, a store deeper down
    for dest in (store, store / "lora", run, run / "sub", tmp_path):
        with pytest.raises(UserError, match="is, holds or lies in a run .*--force included"):
            check_replaceable(dest, "prepare-cls", force=True)
    assert (run / "manifest.json").is_file()
    data = tmp_path / "cls"  # a data step's own record is no run's
    data.mkdir()
    (data / "manifest.json").write_text('{"command": "prepare-cls"}')
    check_replaceable(tmp_path / "elsewhere", "prepare-cls", force=True)


def test_sums_in_bsd_format_are_read_and_a_list_naming_no_books_file_is_refused(tmp_path):
    """D-n2 (trial 15): a SHA256SUMS in BSD (`--tag`) format was silently not read, and the DVD
    training file passed as CLS-Books'."""
    from finetune_lab.data.cls_books import BOOKS_DIR, check_sources

    books = tmp_path / BOOKS_DIR
    books.mkdir(parents=True)
    sources = {"train": books / "train.review", "test": books / "test.review"}
    sources["train"].write_text("<train/>")
    sources["test"].write_text("<test/>")
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(f"SHA256 (./{BOOKS_DIR}/train.review) = {'A' * 64}\n")
    with pytest.raises(UserError, match="train.review is not the file the data root's"):
        check_sources(tmp_path, sources)
    sums.write_text("garbage\n")
    with pytest.raises(UserError, match="lists neither books file in a format this reads"):
        check_sources(tmp_path, sources)
    from finetune_lab._files import sha256_file

    sums.write_text(f"SHA256 ({BOOKS_DIR}/train.review) = {sha256_file(sources['train']).upper()}\n")
    assert check_sources(tmp_path, sources, other_corpus=True)["train"] == sha256_file(
        sources["train"])


def test_test_reviews_with_a_character_added_are_still_the_test_reviews(tmp_path):
    """D-n1 (trial 15): a training file of the test texts, each with " ." added, passed."""
    from finetune_lab.data.cls_books import Review
    from finetune_lab.data.overlap import check_overlap

    test = [Review(f"Un livre numéro {i}, vraiment bien", 1, 5.0, i) for i in range(20)]
    train = [Review(r.text + " .", 1, 5.0, r.position) for r in test]
    sources = {"train": tmp_path / "train.review", "test": tmp_path / "test.review"}
    with pytest.raises(UserError, match="shares 20 of its 20 reviews"):
        check_overlap(sources, train, test)
    check_overlap(sources, [Review(f"Autre avis {i}", 0, 1.0, i) for i in range(20)], test)
    # trial 16's D-v: a word appended, or a few prefixed, to texts longer than the keys
    test = [Review(f"Un livre numéro {i}, vraiment bien écrit et très bien construit du début à "
                   "la fin", 1, 5.0, i) for i in range(20)]
    for made in (lambda t: t + " Voilà.", lambda t: "Bref : " + t):
        with pytest.raises(UserError, match="shares 20 of its 20 reviews"):
            check_overlap(sources, [Review(made(r.text), 1, 5.0, r.position) for r in test], test)


def test_a_fact_read_through_an_excluded_run_is_not_known(tmp_path):
    """R2-n1 (trial 15): with `pretrain/cpu-sinpos1` rejected, its valid child's position table
    read "kept", and the page said a run with its table kept left the plateau at 24 M tokens."""
    from finetune_lab.book import pretrain_plateau as pp
    from finetune_lab.runs.registry import RunRecord

    parent_path = "data/runs/pretrain/sin"
    child = RunRecord(tmp_path / "child", "pretrain", "child", {
        "hyperparameters": {}, "extra": {"continued_from": {"lineage": [{"run": parent_path}]}}})
    parent = RunRecord(tmp_path / "sin", "pretrain", "sin",
                       {"hyperparameters": {"position_init": "sinusoidal"}})
    assert pp.position_start(child, [child, parent]) == "sinusoidal (sin)"
    rejected = RunRecord(tmp_path / "sin", "pretrain", "sin", None, ["its log changed"])
    assert pp.position_start(child, [child, rejected]) == pp.UNKNOWN
    kept = RunRecord(tmp_path / "sin", "pretrain", "sin", {"hyperparameters": {}})
    assert pp.position_start(child, [child, kept]) == "kept"


def test_a_record_is_named_and_dated_as_its_weights_were_packaged(tmp_path):
    """W3 c, d (trials 14 and 15): a record dated after the packaging was said to be asked
    before it; a record holding cpu-sinpos1's packaged weights under the name `cpu-long` was
    shown as cpu-long's."""
    from finetune_lab.book import fill_mask as fm
    from finetune_lab.book.summary_files import name_problem

    package = {"created": "2026-11-25T15:07:30+00:00"}
    assert fm.asked_before_packaging({"time": "2026-11-25T13:23:17+00:00"}, package) is True
    assert fm.asked_before_packaging({"time": "2026-11-26T10:00:00+00:00"}, package) is False
    assert fm.asked_before_packaging({"time": "sometime"}, package) is None
    runs = PROJECT_ROOT / "data" / "runs"
    sinpos = json.loads((PROJECT_ROOT / "data" / "summaries" / "fill-mask" /
                         "cpu-sinpos1.json").read_text())
    as_long = {**sinpos, "name": "cpu-long", "checkpoint": {
        **sinpos["checkpoint"], "path": "data/checkpoints/roberta-small-fr/model.pt"}}
    assert "packaged by cpu-sinpos1" in name_problem(as_long, runs, None)
    assert name_problem(sinpos, runs, None) is None  # its own name
    # trial 16's W3-v: weights no run packaged, under a run's name; a candidate's folder holding
    # another candidate's weights (the sha256 its fine-tuning runs recorded)
    elsewhere = {**sinpos, "checkpoint": {"path": "/tmp/h/zzpk/model.pt", "sha256": "1" * 64}}
    assert "not the weights runs here know as cpu-sinpos1" in name_problem(elsewhere, runs, None)
    unknown = {**elsewhere, "name": "cpu-long4"}  # a run whose weights no run here names
    assert "weights no run here packaged" in name_problem(unknown, runs, None)
    tapt1 = json.loads((PROJECT_ROOT / "data" / "summaries" / "probes" /
                        "cpu-tapt1.json").read_text())
    swapped = {**tapt1, "name": "cpu-long2", "checkpoint": {
        **tapt1["checkpoint"], "path": "data/work/candidates/cpu-long2/model.pt"}}
    assert "packaged by cpu-tapt1" in name_problem(swapped, runs, None)
    assert name_problem(tapt1, runs, None) is None


def test_frozen_results_removed_a_time_out_of_era_and_a_home_of_no_user(tmp_path, monkeypatch):
    """Trial 15's minor R-CF6 (`rm -r _freeze/chapters/fairseq` passed check-freeze), PR1 (a
    record of year 1 at +14:00 crashed a chapter) and X-e2 (`~nosuchuser` was a traceback)."""
    from finetune_lab.book import freeze as fz
    from finetune_lab.config import paths
    from finetune_lab.runs.consistency import recorded_time

    chapter = _frozen_chapter(tmp_path)
    shutil.rmtree(fz.freeze_entry(tmp_path, chapter))
    (stale,) = fz.check_freeze(tmp_path)
    assert "its frozen results are gone" in stale.describe()
    assert recorded_time("0001-01-01T00:00:00+14:00") is None
    assert recorded_time("2026-11-25T15:07:30+00:00").year == 2026
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", "~nosuchuser-xyz/runs")
    with pytest.raises(UserError, match="has a ~ that names no home folder"):
        paths()


def test_a_library_error_on_a_full_disk_and_a_rejected_source_run(tmp_path, monkeypatch):
    """Trial 16's X-d4 (torch said "basic_ios::clear: iostream error" on a full disk) and R-v1
    (with the packaged checkpoint's own run rejected, another run's recipe was shown as the
    checkpoint's)."""
    import errno

    from finetune_lab import errors
    from finetune_lab.book import pretrain_report as pr

    monkeypatch.setattr(errors, "_disk_full", lambda dest: True)
    with pytest.raises(OSError) as err:
        with errors.library_write(tmp_path / "out"):
            raise RuntimeError("basic_ios::clear: iostream error")
    assert err.value.errno == errno.ENOSPC
    runs = pr.load_pretrain_runs()
    assert runs.latest is not None and runs.latest.name == "cpu-sinpos1-bow"
    others = pr.PretrainRuns(loaded=runs.loaded, checkpoint={**runs.checkpoint,
                                                             "run": "data/runs/pretrain/gone"})
    assert others.latest is None and pr.run_facts(others) == {}
