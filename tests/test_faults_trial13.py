"""The thirteenth fault trial, fixed by class: in the work folder, the candidates' weights and the
long runs' resumable state are no scratch (`--force` emptied them); a paused run is set aside,
never deleted; the freeze hashes every file a run lists, bytecode-named or not, and every file of
the packaged checkpoint the registry hashes; a frozen figure cut short is damage; a render reads
the project's own stores or refuses; a data root's training file must be its own."""

from __future__ import annotations

import json
import shutil

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError


@pytest.mark.parametrize("store", ["candidates", "pretrain-checkpoints"])
def test_force_never_empties_cited_weights_or_resumable_state(store, tmp_path, monkeypatch):
    """A1, A2: `prepare-cls --out data/work/candidates/X --force` replaced weights runs cite;
    `adopt-tokenizer --out data/work/pretrain-checkpoints --force` deleted every long run's
    state."""
    from finetune_lab._files import check_replaceable

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    inside = tmp_path / "work" / store / "cpu-x"
    inside.mkdir(parents=True)
    (inside / "model.pt").write_bytes(b"weights")
    with pytest.raises(UserError) as err:
        check_replaceable(inside, "prepare-cls", force=True)
    assert "exists and was not made by" in str(err.value) and "--force" not in str(err.value)
    with pytest.raises(UserError) as err:
        check_replaceable(tmp_path / "work" / store, "adopt-tokenizer", force=True)
    assert "is or holds the" in str(err.value) and "--force included" in str(err.value)
    assert (inside / "model.pt").read_bytes() == b"weights"
    check_replaceable(tmp_path / "work" / "elsewhere", "prepare-cls", force=True)  # scratch


def test_a_paused_run_is_set_aside_never_deleted(tmp_path, capsys):
    """W1: `pretrain --run cpu-long3 --overwrite` deleted the committed paused run (resumable,
    and in the lineage of candidate runs)."""
    from finetune_lab.runs.recording import set_aside

    run = tmp_path / "runs" / "pretrain" / "cpu-long3"
    shutil.copytree(PROJECT_ROOT / "data" / "runs" / "pretrain" / "cpu-long3", run)
    files = sorted(p.relative_to(run) for p in run.rglob("*") if p.is_file())
    moved = set_aside(run)
    assert not run.exists() and moved is not None
    assert sorted(p.relative_to(moved) for p in moved.rglob("*") if p.is_file()) == files
    assert "held a paused run" in capsys.readouterr().out


def test_a_run_file_named_like_bytecode_is_hashed_by_the_freeze(tmp_path):
    """CF1: an event file renamed `….pyc` (its manifest too) was skipped by the freeze, while the
    registry read it: damaging it rejected the run and check-freeze passed."""
    from finetune_lab.book.chapter_inputs import hash_inputs

    run = tmp_path / "data" / "runs" / "fairseq" / "random-seed0"
    (run / "test").mkdir(parents=True)
    (run / "test" / "events.pyc").write_bytes(b"a")
    (tmp_path / "src" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "__pycache__" / "x.pyc").write_bytes(b"b")
    before = hash_inputs(tmp_path, ["data/runs/**", "src/**"])
    assert list(before) == ["data/runs/fairseq/random-seed0/test/events.pyc"]
    (run / "test" / "events.pyc").write_bytes(b"ab")
    assert hash_inputs(tmp_path, ["data/runs/**", "src/**"]) != before


@pytest.mark.parametrize("figure, cut", [("fig-a.svg", b""), ("fig-a.svg", b"<svg><g>"),
                                         ("fig-a.png", b"\x89PNG\r\n\x1a\n\x00\x00")])
def test_a_frozen_figure_cut_short_makes_its_chapter_stale(figure, cut, tmp_path):
    """CF5: an emptied SVG or a truncated PNG in _freeze passed check-freeze."""
    from finetune_lab.book import freeze as fz

    entry = fz.freeze_entry(tmp_path, "chapters/c.qmd")
    (entry / "execute-results").mkdir(parents=True)
    (entry / "figure-html").mkdir()
    md = f"![x](c_files/figure-html/{figure})"
    (entry / "execute-results" / "html.json").write_text(
        json.dumps({"hash": "h", "result": {"markdown": md}}))
    whole = (b"<svg>\n</svg>\n" if figure.endswith(".svg") else
             b"\x89PNG\r\n\x1a\n" + b"\x00" * 8 + b"IEND\xaeB`\x82")
    (entry / "figure-html" / figure).write_bytes(whole)
    assert fz.damaged_results(tmp_path, "chapters/c.qmd") is None
    (entry / "figure-html" / figure).write_bytes(cut)
    assert fz.damaged_results(tmp_path, "chapters/c.qmd") == (
        f"_freeze/chapters/c/execute-results/html.json shows c_files/figure-html/{figure}, "
        "which is cut short or empty")


@pytest.mark.parametrize("chapter", ["index.qmd", "chapters/fairseq.qmd"])
def test_the_checkpoints_weights_are_an_input_of_every_chapter_that_judges_runs(chapter):
    """CF6: model.pt replaced changed the fairseq chapter and the front page (their pretrained
    runs were rejected), and neither was called stale."""
    from finetune_lab.book.chapter_inputs import chapter_inputs, hash_inputs

    files = hash_inputs(PROJECT_ROOT, chapter_inputs(PROJECT_ROOT, chapter))
    assert "data/checkpoints/roberta-small-fr/model.pt" in files


@pytest.mark.parametrize("var, own", [("FINETUNE_LAB_RUNS_DIR", "data/runs"),
                                      ("FINETUNE_LAB_WORK_DIR", "data/work")])
def test_a_render_reads_the_projects_own_stores_or_refuses(var, own, tmp_path, monkeypatch):
    """X2: with FINETUNE_LAB_RUNS_DIR set, a render froze another store's numbers under the
    record of data/runs."""
    from finetune_lab.book.chapter_inputs import check_book_stores

    monkeypatch.setenv(var, str(PROJECT_ROOT / own))
    check_book_stores(PROJECT_ROOT)  # the project's own, named: nothing to refuse
    monkeypatch.setenv(var, str(tmp_path))
    with pytest.raises(UserError) as err:
        check_book_stores(PROJECT_ROOT)
    assert str(err.value) == (f"{var} points at {tmp_path}, but the book is rendered from the "
                              f"project's {own}, which its freeze records; unset {var} to render")


def test_a_training_file_that_is_not_the_data_roots_own_is_refused(tmp_path):
    """D8: a data root whose train.review is a copy of test.review went through prepare-cls:
    the test reviews were trained on. The data root's SHA256SUMS also names a changed file."""
    from finetune_lab.data.cls_books import BOOKS_DIR, check_sources

    books = tmp_path / BOOKS_DIR
    books.mkdir(parents=True)
    (books / "train.review").write_text("<a/>\n")
    (books / "test.review").write_text("<a/>\n")
    sources = {s: books / f"{s}.review" for s in ("train", "test")}
    with pytest.raises(UserError, match="is the same file as .*test.review: the test reviews"):
        check_sources(tmp_path, sources)
    (books / "train.review").write_text("<b/>\n")
    hashes = check_sources(tmp_path, sources, other_corpus=True)
    (tmp_path / "SHA256SUMS").write_text(
        f"{hashes['test']}  ./{BOOKS_DIR}/test.review\n{'0' * 64}  ./{BOOKS_DIR}/train.review\n")
    with pytest.raises(UserError, match=r"train.review is not the file the data root's .*SHA256SUMS"):
        check_sources(tmp_path, sources, other_corpus=True)
    from finetune_lab.config import default_data_root

    root = default_data_root()  # the real data root's sums agree with its files
    if (root / BOOKS_DIR / "train.review").is_file():
        assert set(check_sources(root, {s: root / BOOKS_DIR / f"{s}.review"
                                        for s in ("train", "test")})) == {"train", "test"}


def test_a_record_time_without_its_utc_offset_sets_the_record_aside():
    """PR-i, FM-a: a probe or fill-mask record whose time had no UTC offset crashed the
    stand-in appendix (a naive time compared with an aware one)."""
    from finetune_lab.book.summary_files import weights_record_problem
    from finetune_lab.runs.consistency import recorded_time

    assert recorded_time("2026-11-23T09:26:55") is None
    assert recorded_time("2026-11-23T09:26:55Z").utcoffset().total_seconds() == 0
    from finetune_lab.runs.crosscheck import packaged_origin

    packaged = packaged_origin()
    record = {"checkpoint": {"path": "data/checkpoints/roberta-small-fr/model.pt",
                             "sha256": packaged[0]},
              "time": "2026-11-27T09:26:55", "wall_time_s": 10}
    runs = PROJECT_ROOT / "data" / "runs"
    assert weights_record_problem({**record, "time": record["time"] + "+00:00"}, runs,
                                  packaged) is None
    problem = weights_record_problem(record, runs, packaged)
    assert problem is not None and problem.startswith("started at an unknown time")


def test_a_record_named_after_another_run_is_set_aside():
    """W3: `fill-mask --checkpoint data/checkpoints/roberta-small-fr --name cpu-long` was shown
    as cpu-long's answers, asked before its weights were packaged."""
    from finetune_lab.book.summary_files import name_problem
    from finetune_lab.runs.crosscheck import packaged_origin

    packaged, runs = packaged_origin(), PROJECT_ROOT / "data" / "runs"
    record = {"name": "cpu-long", "checkpoint": {
        "path": "data/checkpoints/roberta-small-fr/model.pt", "sha256": packaged[0]}}
    assert name_problem(record, runs, packaged) == (
        "is named after the pretraining run cpu-long, but holds other weights "
        "(data/checkpoints/roberta-small-fr/model.pt, packaged by cpu-sinpos1-bow, "
        "roberta-small-fr): record them under another --name")
    own = packaged[1].removeprefix("pretrain/")
    assert name_problem({**record, "name": own}, runs, packaged) is None
    # trial 17's W3-v4: a candidate's folder holding other weights than its name's
    assert "not the weights runs here know as cpu-long" in name_problem({**record, "checkpoint": {
        "path": "data/work/candidates/cpu-long/model.pt", "sha256": "0" * 64}}, runs, packaged)
    assert name_problem({**record, "name": "cpu-new", "checkpoint": {  # weights no run names
        "path": "data/work/candidates/cpu-new/model.pt", "sha256": "0" * 64}}, runs,
        packaged) is None
    assert name_problem({**record, "name": "my-weights"}, runs, packaged) is None


def test_an_excluded_runs_reason_names_no_machine_path(tmp_path, monkeypatch):
    """X1: an empty manifest in data/runs printed the checkout's absolute path in the book."""
    from finetune_lab.runs import listing
    from finetune_lab.runs.registry import discover_runs

    monkeypatch.setattr(listing, "PROJECT_ROOT", tmp_path)  # a project of its own
    run = tmp_path / "data" / "runs" / "zz-trial13" / "random-seed7"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    text = listing.exclusions_markdown(discover_runs(tmp_path / "data" / "runs"))
    assert text.startswith("- `zz-trial13/random-seed7` excluded: ")
    assert str(tmp_path) not in text and "data/runs/zz-trial13/random-seed7" in text


@pytest.mark.parametrize("argv", [["finetune", "fairseq", "--seeds", "4294967296"],
                                  ["probe", "--random", "--seed", "-1", "--name", "zz"]])
def test_a_seed_out_of_range_is_a_usage_error(argv, capsys):
    """X7, X8: a seed past 2**32 - 1 started fairseq and left a failed run in the store."""
    from finetune_lab.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and "must be" in capsys.readouterr().err


def test_trial_14s_variants_of_trial_13s_classes(tmp_path, monkeypatch):
    """Trial 14 re-tried trial 13's classes: the project's own candidates with the work folder
    pointed elsewhere (A1), a relative run store for a render (X2), a sha256sum -b list and a
    training file that is the test file plus a byte (D1, D2), a record named after a GPU
    pretraining run (W3)."""
    from finetune_lab._files import check_replaceable
    from finetune_lab.book.chapter_inputs import check_book_stores
    from finetune_lab.book.summary_files import name_problem
    from finetune_lab.data.cls_books import BOOKS_DIR, Review, check_sources
    from finetune_lab.data.overlap import check_overlap
    from finetune_lab.runs.crosscheck import packaged_origin

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    for store in ("candidates", "lora-runs"):
        with pytest.raises(UserError, match="--force included"):
            check_replaceable(PROJECT_ROOT / "data" / "work" / store, "prepare-cls", force=True)
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", "data/runs")
    with pytest.raises(UserError, match="FINETUNE_LAB_RUNS_DIR points at data/runs"):
        check_book_stores(PROJECT_ROOT)
    books = tmp_path / BOOKS_DIR
    books.mkdir(parents=True)
    (books / "train.review").write_text("<b/>\n")
    (books / "test.review").write_text("<a/>\n")
    sources = {s: books / f"{s}.review" for s in ("train", "test")}
    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64} *./{BOOKS_DIR}/train.review\n")
    with pytest.raises(UserError, match="is not the file the data root's"):
        check_sources(tmp_path, sources)
    test = [Review(text=f"review {i}", label=i % 2, rating=5.0, position=i) for i in range(20)]
    with pytest.raises(UserError, match="shares 20 of its 20 reviews"):
        check_overlap(sources, test, test)
    check_overlap(sources, test[:1] + [Review("other", 1, 5.0, 99)] * 19, test)  # 1 in 20
    packaged = packaged_origin()
    record = {"name": "gpu4", "checkpoint": {
        "path": "data/checkpoints/roberta-small-fr/model.pt", "sha256": packaged[0]}}
    assert name_problem(record, PROJECT_ROOT / "data" / "runs", packaged).startswith(
        "is named after the pretraining run gpu4")
