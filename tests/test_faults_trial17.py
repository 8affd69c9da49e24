"""The sixteenth fault trial's last open defects and the seventeenth's, fixed by class: a run
that other runs or the packaged checkpoint are built on is never replaced, and a run built on
another run of the same name is rejected; the book reads no checkpoint folder outside the
project, and the folders its records name inside it are freeze inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError

RUNS = PROJECT_ROOT / "data" / "runs"


def test_a_run_others_are_built_on_is_not_overwritten():
    """O-1: `pretrain --run cpu-seed1 --overwrite` replaced the first run behind the packaged
    checkpoint; three chapters then advised a `git checkout` of an unchanged file."""
    from finetune_lab.train.pretrain import refuse_built_on
    from finetune_lab.train.pretrain_lineage import runs_built_on

    built = runs_built_on(RUNS / "pretrain" / "cpu-seed1", RUNS)
    assert built[0] == "the packaged checkpoint data/checkpoints/roberta-small-fr"
    assert {"run pretrain/cpu-seed1-c1", "run pretrain/cpu-sinpos1-bow",
            "run fairseq/pretrained-seed0"} <= set(built)
    assert "run pretrain/cpu-seed1" not in built
    with pytest.raises(UserError, match=r"cpu-seed1: the packaged checkpoint .* and \d+ more "
                                        "are built on this run"):
        refuse_built_on(RUNS / "pretrain" / "cpu-seed1", RUNS)
    assert runs_built_on(RUNS / "pretrain" / "cpu-long4", RUNS) == []
    refuse_built_on(RUNS / "pretrain" / "cpu-long4", RUNS)  # nothing cites it


def test_a_run_built_on_another_run_under_its_name_is_rejected(tmp_path):
    """O-1's registry side: a continued run whose lineage names a run that started after it
    (the first run replaced) is rejected, naming the replaced run."""
    from finetune_lab.runs.crosscheck import lineage_time_problems
    from finetune_lab.runs.registry import RunRecord

    def record(name: str, **edit) -> RunRecord:
        man = json.loads((RUNS / "pretrain" / name / "manifest.json").read_text())
        return RunRecord(tmp_path / name, "pretrain", name, {**man, **edit})

    child = record("cpu-seed1-c1")
    lineage_time_problems([child], [child, record("cpu-seed1")])
    assert child.problems == []
    replaced = record("cpu-seed1", start_time="2026-11-27T09:00:00+00:00")
    lineage_time_problems([child], [child, replaced])
    (said,) = child.problems
    assert said.startswith("extra.continued_from.lineage names pretrain/cpu-seed1, but the run "
                           "there started at 2026-11-27 09:00, after this run started")


def test_the_lineage_check_names_the_run_as_a_side_that_may_have_changed():
    """O-1: the package's lineage disagreeing with its run blamed only the package's manifest."""
    from finetune_lab.models.checkpoints import lineage_step_updates

    run = json.loads((RUNS / "pretrain" / "cpu-seed1" / "manifest.json").read_text())
    with pytest.raises(UserError) as err:
        lineage_step_updates({"run": "data/runs/pretrain/cpu-seed1", "updates": 2}, run)
    said = str(err.value)
    assert "another one under its name" in said and "data/runs/.superseded/" in said
    assert "git checkout -- data/checkpoints/roberta-small-fr/manifest.json" in said


def test_weights_outside_the_project_are_not_recorded_nor_read(tmp_path, monkeypatch):
    """CF-v2: `fill-mask --checkpoint /tmp/h/zzpk` was recorded; the book then read that folder,
    and whether it existed decided whether a damaged record was shown."""
    from finetune_lab.book import fill_mask as fm
    from finetune_lab.book.summary_files import read_records, weights_outside
    from finetune_lab.runs import manifest
    from finetune_lab.runs.manifest import outside_project, weights_record

    outside = tmp_path / "zzpk"
    outside.mkdir()
    (outside / "model.pt").write_bytes(b"weights")
    book_record = PROJECT_ROOT / "data" / "summaries" / "fill-mask" / "zzout.json"
    with pytest.raises(UserError, match="zzpk lies outside the project"):
        weights_record(outside, book_record)
    assert weights_record(outside, tmp_path / "zzout.json")["path"] == str(outside / "model.pt")
    with pytest.raises(UserError, match="lies outside the project"):
        fm.record_fill_mask(outside, "zz-never-written")
    assert not (book_record.parent / "zz-never-written.json").exists()
    assert outside_project(str(outside)) and outside_project("data/../../x")
    assert not outside_project("data/work/candidates/cpu-long/model.pt")
    record = json.loads((PROJECT_ROOT / "data" / "summaries" / "fill-mask" /
                         "cpu-sinpos1.json").read_text())
    moved = {**record, "checkpoint": {**record["checkpoint"], "path": str(outside / "model.pt")}}
    assert "names weights outside the project" in weights_outside(moved)
    assert weights_outside(record) is None
    # records kept outside the project are read as they are; the book's own are set aside
    # before any folder is read
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cpu-sinpos1.json").write_text(json.dumps(moved))
    kept, bad = read_records(elsewhere, fm.RECORD_FIELDS)
    assert len(kept) == 1 and bad == []
    project = tmp_path / "project"
    book = project / "data" / "summaries" / "fill-mask"
    book.mkdir(parents=True)
    (book / "cpu-sinpos1.json").write_text(json.dumps(moved))
    monkeypatch.setattr(manifest, "PROJECT_ROOT", project)
    kept, bad = read_records(book, fm.RECORD_FIELDS)
    (said,) = bad
    assert kept == [] and "names weights outside the project" in said


def test_the_folders_records_name_are_inputs_of_the_chapters_that_show_them(tmp_path):
    """CF-v2: a record's checkpoint folder inside the project was read by the book and hashed by
    no freeze record."""
    from finetune_lab.book.chapter_inputs import chapter_inputs
    from finetune_lab.runs.run_inputs import record_folders

    records = tmp_path / "data" / "summaries" / "fill-mask"
    records.mkdir(parents=True)
    for name, path in (("a", "data/work/candidates/zz/model.pt"), ("b", "/tmp/zzpk/model.pt"),
                       (".c", "data/work/candidates/hidden/model.pt")):
        (records / f"{name}.json").write_text(json.dumps({"checkpoint": {"path": path}}))
    (records / "d.json").write_text("{")
    assert record_folders(tmp_path) == ["data/work/candidates/zz/dict.txt",
                                        "data/work/candidates/zz/manifest.json"]
    inputs = chapter_inputs(PROJECT_ROOT, "chapters/standin-build.qmd")
    assert set(record_folders(PROJECT_ROOT)) <= set(inputs)
    assert all(Path(p).name in ("dict.txt", "manifest.json") for p in record_folders(PROJECT_ROOT))


def test_the_training_size_is_read_from_the_index_as_fairseq_reads_it(tiny_pipeline, tmp_path):
    """Issue 36: every fine-tuning launch imported fairseq (five seconds) to count the training
    reviews; the count is the index header's, the same as fairseq's own reader gives."""
    from finetune_lab.models.fairseq_compat import quiet_import
    from finetune_lab.train.finetune_fairseq import train_size

    quiet_import()
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    bin_dir = tiny_pipeline["cls_bin"]
    assert train_size(bin_dir) == len(MMapIndexedDataset(str(bin_dir / "label" / "train"))) > 0
    damaged = tmp_path / "bin" / "label"
    damaged.mkdir(parents=True)
    (damaged / "train.idx").write_bytes(b"TNTIDX\x00\x00" + bytes(30))
    with pytest.raises(UserError, match=r"train.idx is no fairseq mmap index"):
        train_size(tmp_path / "bin")
    (damaged / "train.idx").unlink()
    with pytest.raises(UserError, match=r"train.idx cannot be read"):
        train_size(tmp_path / "bin")


def test_test_reviews_with_words_added_at_both_ends_or_dropped_inside_are_found(tmp_path):
    """D-v3, D-v4: each test review wrapped in "Bref : … Voilà.", or with its third and
    third-from-last words dropped, passed the first/last-eight-words check."""
    from finetune_lab.data.cls_books import Review
    from finetune_lab.data.overlap import check_overlap, near_test_reviews

    words = ("le roman raconte une histoire simple mais la fin surprend et les personnages "
             "restent en mémoire longtemps après la dernière page").split()
    tag = "abcdefghijklmnopqrst"  # a word of its own per review (digits in words are refused)
    test = [Review(" ".join([f"livre{tag[i]}", *words[i % 5:], f"fin{tag[i]}"]), 1, 5.0, i)
            for i in range(20)]

    def dropped(text: str) -> str:
        w = text.split()
        del w[-3], w[2]
        return " ".join(w)

    sources = {"train": tmp_path / "train.review", "test": tmp_path / "test.review"}
    for made in (lambda t: f"Bref : {t} Voilà.", dropped):
        train = [Review(made(r.text), 1, 5.0, r.position) for r in test]
        assert near_test_reviews(train, test) == 20
        with pytest.raises(UserError, match="shares 20 of its 20 reviews"):
            check_overlap(sources, train, test)
    others = [Review(f"Un tout autre avis, numéro {i}, sur un autre livre lu cet été", 0, 1.0, i)
              for i in range(20)]
    assert near_test_reviews(others, test) == 0
    check_overlap(sources, others, test)


@pytest.mark.parametrize("kind", ["long", "loop"])
def test_a_name_too_long_or_a_loop_of_links_is_one_line(kind, tmp_path, monkeypatch, capsys):
    """X-nl1, X-nl2, X-lp1: `File name too long` and pathlib's `Symlink loop` were tracebacks."""
    from finetune_lab.cli import main

    if kind == "long":
        where = tmp_path / ("a" * 300)
    else:
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        where = tmp_path / "loop" / "x"
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(where))
    assert main(["runs"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert ("leads back to itself" if kind == "loop" else "File name too long") in err
    monkeypatch.delenv("FINETUNE_LAB_RUNS_DIR")
    assert main(["prepare-cls", "--out", str(where), "--force"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err


def test_a_checkpoint_cut_anywhere_is_one_line_naming_it(tmp_path):
    """X-t2, X-t3: cut to 5 to 50 KB, torch's reader ran past the end (`OSError: [Errno 22]`),
    a traceback; a run's own state cut short named no file and advised a `git checkout`."""
    from finetune_lab.models.trust import load_trusted
    from finetune_lab.train.pretrain_long import resume_point

    whole = (PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr" / "model.pt").read_bytes()
    for size in (100, 5000, 8000, 20000, 50000):
        cut = tmp_path / f"cut{size}.pt"
        cut.write_bytes(whole[:size])
        with pytest.raises(UserError, match=rf"cut{size}.pt cannot be read: the file is damaged"):
            load_trusted(cut, trust=True)
    state = tmp_path / "zA" / "checkpoint_last.pt"
    state.parent.mkdir()
    state.write_bytes(whole[:8000])
    with pytest.raises(UserError) as err:
        resume_point(state.parent)
    assert str(state) in str(err.value) and "git checkout" not in str(err.value)


def test_a_store_of_state_or_packages_of_any_name_is_never_replaced(tmp_path):
    """A-v7, A-v8, A-v9: a failed run whose manifest names its experiment past its first 4 KiB,
    a run five levels down, and a work folder of an unset FINETUNE_LAB_WORK_DIR (a paused run's
    state, a candidate's package) were replaced by `prepare-cls --out … --force`."""
    from finetune_lab._files import check_replaceable

    run = tmp_path / "myruns" / "pretrain" / "zfail"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(
        {"command": ["x"] * 2000, "error": "y" * 5000, "experiment": "pretrain",
         "framework": "fairseq", "run": "zfail"}, sort_keys=True))
    deep = tmp_path / "stash" / "a" / "b" / "c" / "myruns" / "lora" / "lora-qv-seed0"
    shutil.copytree(RUNS / "lora" / "lora-qv-seed0", deep)
    state = tmp_path / "w17" / "pretrain-checkpoints" / "zA"
    state.mkdir(parents=True)
    (state / "checkpoint_last.pt").write_bytes(b"state")
    package = tmp_path / "w18" / "candidates" / "cpu-x"
    package.mkdir(parents=True)
    for name in ("model.pt", "manifest.json"):
        (package / name).write_bytes(b"{}")
    for dest, what in ((tmp_path / "myruns", "a run"), (run, "a run"),
                       (tmp_path / "stash", "a run"), (tmp_path / "w17", "a run.s training state"),
                       (tmp_path / "w18", "packaged weights")):
        with pytest.raises(UserError, match=f"holds or lies in {what}.*--force included"):
            check_replaceable(dest, "prepare-cls", force=True)
    check_replaceable(package, "package-checkpoint", force=True)  # a package itself: its owner's
    assert (run / "manifest.json").is_file() and (state / "checkpoint_last.pt").is_file()


def test_a_value_tagged_for_another_plugin_is_damage(tmp_path):
    """E-p1: an accuracy given the "text" plugin passed the registry; tbparse filed it as text
    and the fairseq chapter stopped at a KeyError."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from finetune_lab.runs.eventfiles import checked_events

    def write(folder: Path, plugin: str) -> Path:
        writer = EventFileWriter(str(folder))
        value = Summary.Value(tag="accuracy", simple_value=75.0)
        value.metadata.plugin_data.plugin_name = plugin
        writer.add_event(Event(wall_time=1.0, step=5, summary=Summary(value=[value])))
        writer.close()
        return next(folder.glob("events.out.tfevents.*"))

    assert checked_events(write(tmp_path / "scalars", "scalars")) == (5, None)
    step, problem = checked_events(write(tmp_path / "text", "text"))
    assert "logs accuracy at update 5 for the 'text' plugin" in problem


def test_a_long_run_resumes_only_state_it_saved_itself(tmp_path):
    """W2-v3: after an interrupted launch (status failed) another run's state passed; R-W2-v1:
    a paused run without a recorded sha256 took another run's state at the same update."""
    import torch

    from finetune_lab._files import sha256_file
    from finetune_lab.train.pretrain_long import check_own_state, keep_resume_state, resume_point

    def state(folder: Path, seed: int, updates: int) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({"optimizer_history": [{"num_updates": updates}], "extra_state": {},
                    "cfg": {"common": {"seed": seed}, "checkpoint": {"save_dir": str(folder)}}},
                   folder / "checkpoint_last.pt")
        return folder / "checkpoint_last.pt"

    run = tmp_path / "runs" / "zA"
    run.mkdir(parents=True)
    mine = state(tmp_path / "work" / "zA", 1, 4)
    man = {"status": "failed", "seed": 1, "updates_done": 2}
    keep_resume_state(man, mine)  # what an interrupted launch now records on its way out
    assert man["resume_state"] == {"path": str(mine), "updates": 4, "sha256": sha256_file(mine)}
    (run / "manifest.json").write_text(json.dumps(man))
    check_own_state(run, mine, 4, made=resume_point(mine.parent))
    other = state(tmp_path / "work" / "zB", 2, 4)
    shutil.copyfile(other, mine)
    with pytest.raises(UserError, match="is not the state"):
        check_own_state(run, mine, 4)
    # without a recorded sha256, fairseq's own record of the seed and the save folder
    (run / "manifest.json").write_text(json.dumps({"status": "paused", "seed": 1,
                                                   "updates_done": 4}))
    with pytest.raises(UserError, match=r"was saved by another run \(seed 2"):
        check_own_state(run, mine, 4, made=resume_point(mine.parent))
    state(tmp_path / "work" / "zA", 1, 4)
    check_own_state(run, mine, 4, made=resume_point(mine.parent))


def test_a_record_under_a_known_name_holds_the_weights_known_by_it():
    """W3-v4, W3-v5: other weights packaged into a candidate's folder, or recorded under a
    candidate's path, were shown as that candidate's (cpu-long3-u2750 is no run's name)."""
    from finetune_lab.book.summary_files import name_problem

    other = "2503c209" + "0" * 56
    for name in ("cpu-sinpos1", "cpu-docbow1", "cpu-long3-u2750"):
        record = {"name": name, "checkpoint": {
            "path": f"data/work/candidates/{name}/model.pt", "sha256": other}}
        assert f"not the weights runs here know as {name}" in name_problem(record, RUNS, None)
    probe = json.loads((PROJECT_ROOT / "data" / "summaries" / "probes" /
                        "cpu-long3-u3930.json").read_text())
    assert name_problem(probe, RUNS, None) is None  # known as cpu-long3, the run it is of
    mine = {"name": "my-own", "checkpoint": {"path": "data/work/mine/model.pt", "sha256": other}}
    assert name_problem(mine, RUNS, None) is None


def test_a_hidden_input_is_checked_by_neither_the_registry_nor_the_freeze(tmp_path, monkeypatch):
    """CF-v3: `pretrain --data data/.pp` was checked by the registry and hashed by no record."""
    from types import SimpleNamespace

    from finetune_lab.runs import manifest, run_inputs

    project = tmp_path / "project"
    corpus = project / "data" / ".pp" / "bin"
    corpus.mkdir(parents=True)
    (corpus / "dict.txt").write_text("a 1\n")
    run = project / "data" / "runs" / "pretrain-gpu" / "zzhid"
    run.mkdir(parents=True)
    record = {"path": "data/.pp/bin", "sha256": {"dict.txt": "0" * 64}}
    (run / "manifest.json").write_text(json.dumps({"inputs": {"data": [record]}}))
    monkeypatch.setattr(manifest, "PROJECT_ROOT", project)
    monkeypatch.setattr(run_inputs, "PROJECT_ROOT", project)
    assert run_inputs.work_inputs(project) == []
    rec = SimpleNamespace(path=run, experiment="pretrain-gpu", problems=[], warnings=[])
    assert run_inputs.input_differences("data", record, rec) == []
    assert "lies in a hidden folder" in rec.warnings[0]


def test_an_answer_the_runs_no_longer_give_names_the_excluded_runs(monkeypatch):
    """G-c: with every lora-qv run rejected the front page stopped at `KeyError: 'lora-qv'`."""
    import pandas as pd

    from finetune_lab.book import claims

    monkeypatch.setattr(claims, "discover_runs", lambda: [])
    assert claims.needs(3, "a fact", "lora*") == 3
    for missing in (None, pd.DataFrame()):
        with pytest.raises(claims.ClaimError, match="the sentence 'a fact' no longer holds"):
            claims.needs(missing, "a fact", "lora*")


def test_a_reading_judges_each_experiment_once_and_ends_with_its_table(monkeypatch):
    """Issue 36: Appendix A's tables looked up 167 named runs, each judging its whole
    experiment again (65 s); within one reading an experiment is judged once."""
    from finetune_lab.runs import registry
    from finetune_lab.runs.reading import one_reading, reads_once

    calls = []
    real = registry.discover_runs
    monkeypatch.setattr(registry, "discover_runs",
                        lambda *a, **k: calls.append(a) or real(*a, **k))
    with one_reading():
        first = registry.find_run("pretrain/cpu-seed1", RUNS)
        with one_reading():  # nested: the outer reading's
            assert registry.find_run("pretrain/cpu-seed1-c1", RUNS).valid
        assert registry.find_run("pretrain/cpu-seed1", RUNS) is first and first.valid
    assert len(calls) == 1
    registry.find_run("pretrain/cpu-seed1", RUNS)  # after the reading: judged again
    assert len(calls) == 2
    lookups = reads_once(lambda: [registry.find_run(f"pretrain/{n}", RUNS).name
                                  for n in ("cpu-seed1", "cpu-docbow1", "cpu-sinpos1")])
    assert lookups() == ["cpu-seed1", "cpu-docbow1", "cpu-sinpos1"] and len(calls) == 3


def test_gpu_unpack_refuses_hidden_products_and_control_characters(tmp_path):
    """G-h4: a product `data/runs/.superseded` was placed; G-h5: a run folder named with a
    newline was placed; GL2: a killed unpack's staging folder under data/ stayed, not ignored."""
    from finetune_lab.runs import gpu_archive as ga

    meta = tmp_path / "gpu-lab.json"
    with pytest.raises(UserError, match="not one folder directly under"):
        ga.check_product_path("data/runs/.superseded", meta)
    assert ga.check_product_path("data/runs/fairseq-gpu", meta) == "data/runs/fairseq-gpu"
    stage = tmp_path / "stage"
    (stage / "data" / "runs" / "zz-gpu" / "random-seed\n9").mkdir(parents=True)
    with pytest.raises(UserError, match="has a control character in its name"):
        ga._staged(stage, "data/runs/zz-gpu", meta)
    left = tmp_path / "root" / "data" / f"{ga.STAGING_PREFIX}abc"
    left.mkdir(parents=True)
    with pytest.raises(UserError, match="gpu-lab.json does not exist"):
        ga.unpack(tmp_path / "nothing", root=tmp_path / "root")
    assert not left.exists()
    ignored = (PROJECT_ROOT / ".gitignore").read_text()
    assert f"/data/{ga.STAGING_PREFIX}*/" in ignored


def test_test_reviews_with_fillers_replacements_or_reversed_words_are_found(tmp_path):
    """Trial 18's D-w: a filler after every third word, every fourth word replaced, or the words
    reversed shared no run of four words with the test review."""
    from finetune_lab.data.cls_books import Review
    from finetune_lab.data.overlap import near_test_reviews

    words = ("le roman raconte une histoire simple mais la fin surprend et les personnages "
             "restent en mémoire longtemps après la dernière page").split()
    test = [Review(" ".join([f"livre{i}", f"auteur{i}", *words[i % 5:]]), 1, 5.0, i)
            for i in range(20)]
    made = (lambda w: [x for i, v in enumerate(w) for x in ([v, "bof"] if i % 3 == 2 else [v])],
            lambda w: ["truc" if i % 4 == 3 else v for i, v in enumerate(w)],
            lambda w: w[::-1])
    for change in made:
        train = [Review(" ".join(change(r.text.split())), 1, 5.0, r.position) for r in test]
        assert near_test_reviews(train, test) == 20
    others = [Review(f"Un tout autre avis, numéro {i}, sur un autre livre lu cet été", 0, 1.0, i)
              for i in range(20)]
    assert near_test_reviews(others, test) == 0


def test_trial_18s_state_of_another_lr_and_a_candidates_name_elsewhere(tmp_path):
    """W2-w1: a same-name, same-seed state trained at 5x the lr was resumed after a SIGKILL;
    W3-v6: other weights recorded from data/work/mine under a candidate's name were shown."""
    import torch

    from finetune_lab.book.summary_files import name_problem
    from finetune_lab.train.pretrain_long import check_own_state, resume_point

    folder = tmp_path / "work" / "zA"
    folder.mkdir(parents=True)
    torch.save({"optimizer_history": [{"num_updates": 4}], "extra_state": {},
                "cfg": {"common": {"seed": 1}, "checkpoint": {"save_dir": str(folder)},
                        "optimization": {"lr": [5e-3]}}}, folder / "checkpoint_last.pt")
    run = tmp_path / "runs" / "zA"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(
        {"status": "running", "seed": 1, "updates_done": 2, "hyperparameters": {"lr": 1e-3}}))
    with pytest.raises(UserError, match=r"lr 0.005.*lr 0.001"):
        check_own_state(run, folder / "checkpoint_last.pt", 4, made=resume_point(folder))
    record = {"name": "cpu-long3-u2750", "checkpoint": {"path": "data/work/mine/model.pt",
                                                        "sha256": "9" * 64}}
    assert "the candidate of the pretraining run cpu-long3" in name_problem(record, RUNS, None)


def test_a_run_without_its_manifest_and_a_package_itself_are_never_replaced(tmp_path):
    """Trial 18's A-x (a run whose manifest is cut short or gone) and A-p (packaged weights
    named as `--out` themselves) were replaced by `prepare-cls --out … --force`."""
    from finetune_lab._files import check_replaceable

    run = tmp_path / "store" / "fairseq" / "random-seed0"
    shutil.copytree(RUNS / "fairseq" / "random-seed0", run)
    (run / "manifest.json").unlink()
    package = tmp_path / "pk1"
    package.mkdir()
    for name in ("model.pt", "manifest.json"):
        (package / name).write_bytes(b"{}")
    for dest in (tmp_path / "store", run, package):
        with pytest.raises(UserError, match="--force included"):
            check_replaceable(dest, "prepare-cls", force=True)
    check_replaceable(package, "package-checkpoint", force=True)


def test_runs_never_made_are_told_from_runs_excluded(tmp_path, monkeypatch):
    """Trial 18's G-d: with the GPU runs rejected, a chapter said none had been made."""
    from finetune_lab.book import claims
    from finetune_lab.runs.registry import RunRecord

    bad = RunRecord(tmp_path / "r", "transformers-gpu", "random-seed0", None, ["its log changed"])
    good = RunRecord(tmp_path / "g", "fairseq", "random-seed0", {"x": 1})
    monkeypatch.setattr(claims, "discover_runs", lambda: [bad, good])
    assert claims.excluded_in("transformers*") == ["transformers-gpu/random-seed0"]
    assert claims.excluded_in("fairseq*") == []
