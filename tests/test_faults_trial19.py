"""Fault trial 19 (and trial 18's open W2-w1): each test reproduces one fault of a class."""

from __future__ import annotations

import json
import threading
import time

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError


def test_each_save_is_recorded_so_a_killed_launch_resumes_only_its_own_state(tmp_path):
    """W2-w1: after a SIGKILL (status "running"), another run's state of the same seed and
    learning rate, put in the run's save folder, was resumed. Each save is now recorded as
    fairseq logs it, so only the last state saved by the run itself passes."""
    import torch

    from finetune_lab._files import sha256_file
    from finetune_lab.train.pretrain_long import check_own_state, note_save

    run, last = tmp_path / "run", tmp_path / "state" / "checkpoint_last.pt"
    run.mkdir()
    last.parent.mkdir()

    def state(seed: int) -> None:  # what fairseq saves, as far as resuming reads it
        torch.save({"optimizer_history": [{"num_updates": 5}], "extra_state": {},
                    "cfg": {"common": {"seed": seed}, "optimization": {"lr": [1e-3]},
                            "checkpoint": {"save_dir": str(last.parent)}}}, last)
    state(1)
    manifest = {"status": "running"}
    note_save("2026-11-27 10:37:06 | INFO | fairseq.trainer | Saving checkpoint to x", manifest,
              run, last)
    assert not (run / "manifest.json").exists()  # not a save's end
    saved = (f"2026-11-27 10:37:06 | INFO | fairseq.checkpoint_utils | Saved checkpoint "
             f"{last.parent}/checkpoint_1_5.pt (epoch 1 @ 5 updates, score 14.4)")
    note_save(saved, manifest, run, last)
    on_disk = json.loads((run / "manifest.json").read_text())
    assert on_disk["resume_state"]["sha256"] == sha256_file(last)
    check_own_state(run, last, 5)
    assert on_disk["resume_state"]["updates"] == 5
    state(2)  # another run's, at the same update, put there after the kill
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 5)


def test_the_log_watcher_reads_whole_lines_and_the_last_ones(tmp_path):
    """A line caught half-written was shown (and so checked) as two lines; lines written in the
    last poll before training ended were never read."""
    from finetune_lab.train.pretrain_fairseq import echo_progress

    log = tmp_path / "train.log"
    log.write_text("an earlier launch's line\n")
    seen: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=echo_progress, args=(log, stop, seen.append))
    watcher.start()
    time.sleep(0.5)  # the watcher has taken the log's size: what follows is this launch's
    with open(log, "a") as fh:
        fh.write("half of a ")
        fh.flush()
        time.sleep(1.5)
        fh.write("line\nthe last line\n")
    stop.set()
    watcher.join()
    assert seen == ["half of a line", "the last line"]


def test_force_keeps_what_it_replaces_unless_the_command_made_it(tmp_path, capsys):
    """A-x2, A-y1 to A-y3: a run whose manifest was cut, emptied or lost (with no event file),
    and packaged weights without their manifest, were wiped by `prepare-cls --out DIR --force`:
    no check recognised them. `--force` now deletes nothing a command did not make."""
    from finetune_lab import _files

    out = tmp_path / "mine"
    (out / "pretrain" / "zfail").mkdir(parents=True)
    (out / "pretrain" / "zfail" / "manifest.json").write_text("")  # left empty by a full disk
    (out / "pkg").mkdir()
    (out / "pkg" / "model.pt").write_bytes(b"weights")  # its manifest lost
    with pytest.raises(UserError, match="not made by"):
        with _files.atomic_dir(out, "prepare-cls") as tmp:
            (tmp / "train.review").write_text("new\n")
    with _files.atomic_dir(out, "prepare-cls", force=True) as tmp:
        (tmp / "train.review").write_text("new\n")
    assert (out / "train.review").read_text() == "new\n"
    (kept,) = tmp_path.glob("mine.replaced-*")
    assert (kept / "pkg" / "model.pt").read_bytes() == b"weights"
    assert (kept / "pretrain" / "zfail" / "manifest.json").is_file()
    assert f"what it held is kept in {kept}" in capsys.readouterr().err
    # the command's own output is replaced outright, --force or not
    with _files.atomic_dir(out, "prepare-cls", force=True) as tmp:
        (tmp / "train.review").write_text("newer\n")
    assert len(list(tmp_path.glob("mine.replaced-*"))) == 1
    assert (out / "train.review").read_text() == "newer\n"


def test_test_reviews_with_invisible_characters_in_their_words_are_found():
    """D-x1: a soft hyphen (U+00AD) inside every word of the test file made each word two
    pieces, and the copy passed as a training file; so would a zero-width space, or accents
    added or dropped."""
    from finetune_lab.data.cls_books import Review
    from finetune_lab.data.overlap import comparable, near_test_reviews

    def review(text: str) -> Review:
        return Review(text=text, label=1, rating=5.0, position=1)

    test = [review("Un roman magnifique que je relirai volontiers cet été avec mes enfants"),
            review("Une intrigue confuse et des personnages sans relief du début à la fin")]
    hidden = [review(r.text.replace("an", "a\u00adn").replace("e", "e\u200b")) for r in test]
    assert comparable(hidden[0].text) == comparable(test[0].text)
    assert near_test_reviews(hidden, test) == 2
    assert near_test_reviews([review("Un tout autre avis sur un tout autre livre de poche")],
                             test) == 0


def test_a_candidates_name_holds_only_the_weights_of_its_folder(tmp_path):
    """W3-y1, R-W3-v7: `fill-mask --name cpu-long3-u3930` of other weights was accepted, and a
    probe record of that name pointing at other weights was shown as cpu-long3's candidate."""
    from finetune_lab.book.fill_mask import record_fill_mask
    from finetune_lab.book.summary_files import name_problem

    runs = PROJECT_ROOT / "data" / "runs"
    other = {"name": "cpu-long3-u3930", "checkpoint": {
        "path": "data/work/mine/model.pt", "sha256": "2503c209" + "0" * 56}}
    assert "the candidate of the pretraining run cpu-long3" in name_problem(other, runs, None)
    own = json.loads((PROJECT_ROOT / "data" / "summaries" / "probes" /
                      "cpu-long3-u3930.json").read_text())
    assert name_problem(own, runs, None) is None
    mine = {**other, "name": "my-own-u3930"}  # no run of that name: the user's own name
    assert name_problem(mine, runs, None) is None
    weights = tmp_path / "mine"
    weights.mkdir()
    (weights / "model.pt").write_bytes(b"other weights")  # refused before they are read
    with pytest.raises(UserError, match="--name cpu-long3-u3930 is named cpu-long3-u3930, the "
                                        "candidate of the pretraining run cpu-long3"):
        record_fill_mask(weights, "cpu-long3-u3930", out_dir=tmp_path / "records")
    # W3-y2: the packaged checkpoint's own name
    with pytest.raises(UserError, match="--name roberta-small-fr is named after the packaged "
                                        "checkpoint roberta-small-fr, but holds other weights"):
        record_fill_mask(weights, "roberta-small-fr", out_dir=tmp_path / "records")
    assert not (tmp_path / "records").exists()


def test_runs_whose_times_are_not_read_are_named_where_neighbours_are_counted(cache):
    """M-y1: three Transformers runs rejected for a byte added to their event files dropped out
    of "what else ran on the machine": three fairseq runs read as alone, and the appendix named
    none of them. The rejected runs are now named beside the table, and a chapter whose runs
    may have shared the machine with them gives no time ratio."""
    from types import SimpleNamespace

    from finetune_lab.book import fairseq_report as fr
    from finetune_lab.book.lora_cls_report import shared_or_unknown
    from finetune_lab.runs.registry import discover_runs

    assert fr.not_neighbours(discover_runs(cache)) == []
    (event,) = (cache / "transformers" / "pretrained-seed0").rglob("events.out.tfevents.*")
    damaged = event.read_bytes() + b"x"  # a new file: the cache's event files are hard links
    event.unlink()
    event.write_bytes(damaged)
    store = discover_runs(cache)
    assert [r.key for r in fr.not_neighbours(store)] == ["transformers/pretrained-seed0"]
    assert all(r.valid or r.unfinished for r in store if r.key != "transformers/pretrained-seed0")
    rejected = next(r for r in store if r.key == "transformers/pretrained-seed0")
    valid = [r for r in store if r.valid and r.experiment == "transformers"]
    assert not shared_or_unknown(SimpleNamespace(runs=valid[:1], used=valid[:1]))
    assert shared_or_unknown(SimpleNamespace(runs=[*valid[:1], rejected], used=valid[:1]))


def test_rejected_ablation_runs_are_named_not_called_never_run():
    """G-e1: with the four ablation runs rejected (a space added to each train.log), Appendix
    A's table read "no ablation run yet" and its text "No ablation has been run yet"."""
    import pandas as pd

    from finetune_lab.book import pretrain_report as pr

    none = pr.ablation_display(pd.DataFrame())
    assert none["state"].tolist() == ["no ablation run yet: `finetune-lab pretrain-ablations`"]
    gone = pr.ablation_display(pd.DataFrame(), ["pretrain-ablation/bf16"])
    assert gone["state"].tolist() == ["ablation runs excluded: `pretrain-ablation/bf16`"]
    text = (PROJECT_ROOT / "chapters" / "standin-build.qmd").read_text(encoding="utf-8")
    assert "pr.ablation_display(abl, abl_excluded)" in text
    assert "if abl_read is None and abl_excluded:" in text


def test_a_probe_of_other_splits_is_set_aside(tmp_path, monkeypatch):
    """P-y1: a probe record whose split files (sha256) are no prepared split's, with 88.0 %,
    stood in the probe table; the readers never compared a probe's inputs."""
    import shutil

    from finetune_lab.book import probe_report as prp
    from finetune_lab.config import WORK_DIR_ENV

    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path / "no-work"))  # no prepared split here
    records = tmp_path / "probes"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "probes", records)
    before = prp.probe_table(records)
    edited = json.loads((records / "cpu-seed1.json").read_text())
    edited["inputs"]["train.review"] = "0" * 64
    edited["probes"]["<s>"]["test_accuracy"] = 88.0
    (records / "cpu-seed1.json").write_text(json.dumps(edited))
    bad: list[str] = []
    after = prp.probe_table(records, set_aside=bad)
    assert "cpu-seed1" in set(before["weights"]) and "cpu-seed1" not in set(after["weights"])
    assert bad == ["`cpu-seed1.json` probed other split files than the ones the other probes "
                   "read (their sha256 differ): re-run `finetune-lab probe` on the prepared "
                   "CLS-Books"]
    assert len(after) == len(before) - 1


def test_a_folder_deep_inside_a_run_is_refused(tmp_path):
    """A-x1r: `adopt-tokenizer --out STORE/pretrain/zfail/q/r/s/t` wrote inside the run: the
    walk up looked three folders above the output only."""
    from finetune_lab.config import protected

    run = tmp_path / "store" / "pretrain" / "zfail"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"framework": "fairseq", "experiment": "pretrain"}')
    deep = run / "q" / "r" / "s" / "t"
    assert protected(deep) == (f"is, holds or lies in a run ({run / 'manifest.json'})", True)
    assert protected(tmp_path / "store" / "elsewhere" / "q" / "r" / "s" / "t") is None


def test_a_failed_fairseq_preprocess_is_one_line(tmp_path):
    """X-y3: a damaged dict.txt gave fairseq's 20-line traceback inside the error, naming the
    scratch folder; the error is now fairseq's own last line."""
    from finetune_lab.data.binarize import run_preprocess

    (tmp_path / "dict.txt").write_bytes(b"\xff\xfe not a dictionary \x00\n")
    with pytest.raises(UserError) as caught:
        run_preprocess(["--only-source", "--trainpref", str(tmp_path / "missing"),
                        "--srcdict", str(tmp_path / "dict.txt"), "--destdir",
                        str(tmp_path / "out"), "--workers", "1"], tmp_path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("fairseq-preprocess failed (exit 1): ")
    assert "Traceback" not in message


def test_a_run_killed_right_after_a_save_resumes_and_anothers_recipe_does_not(tmp_path):
    """19b's W2: killed within a second of a later save, before the watcher recorded it, the
    run could never resume; 19b's W3: another run's state of the same name, seed and lr but
    another dropout, put there after a kill, was resumed."""
    import torch

    from finetune_lab._files import sha256_file
    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zB"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"

    def state(updates: int, dropout: float) -> None:
        torch.save({"optimizer_history": [{"num_updates": updates}],
                    "extra_state": {"launch": "a1b2c3d4e5f60718"},  # the plugin's mark
                    "cfg": {"common": {"seed": 1}, "optimization": {"lr": [1e-3]},
                            "model": {"dropout": dropout, "attention_dropout": dropout},
                            "checkpoint": {"save_dir": str(save)}}}, last)
    state(2, 0.0)
    run = tmp_path / "runs" / "zB"
    run.mkdir(parents=True)
    manifest = {"status": "running", "seed": 1, "updates_done": 2,
                "segments": [{"launch": "a1b2c3d4e5f60718"}],
                "hyperparameters": {"lr": 1e-3, "dropout": 0.0, "attention_dropout": 0.0},
                "resume_state": {"updates": 2, "sha256": sha256_file(last)}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    state(4, 0.0)  # saved at update 4, killed before the save was recorded
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 4, made=resume_point(save))
    (run / "train.log").write_text(
        f"2026-11-27 12:00:00 | INFO | fairseq.checkpoint_utils | Saved checkpoint "
        f"{save}/checkpoint_1_4.pt (epoch 1 @ 4 updates, score 14.2) (writing took 0.1 s)\n")
    check_own_state(run, last, 4, made=resume_point(save))  # fairseq's log says it saved it
    state(4, 0.1)  # another run's recipe at that update
    with pytest.raises(UserError, match=r"saved by another run \(seed 1, lr 0.001, dropout 0.1"):
        check_own_state(run, last, 4, made=resume_point(save))


def test_test_reviews_in_look_alike_letters_or_with_fillers_are_found():
    """19b's D2 to D4: the test file in Cyrillic look-alike letters, or with a narrow no-break
    space (U+202F) or a Hangul filler (U+3164) inside each word, passed as the training file."""
    from finetune_lab.data.cls_books import Review
    from finetune_lab.data.overlap import near_test_reviews

    def review(text: str) -> Review:
        return Review(text=text, label=1, rating=5.0, position=1)

    test = [review("Un roman magnifique que je relirai volontiers cet été avec mes enfants"),
            review("Une intrigue confuse et des personnages sans relief du début à la fin")]
    cyrillic = str.maketrans("aeopcx", "аеорсх")
    for disguise in (lambda t: t.translate(cyrillic),
                     lambda t: " ".join(w[:2] + "\u202f" + w[2:] for w in t.split()),
                     lambda t: " ".join(w[:1] + "\u3164" + w[1:] for w in t.split())):
        assert near_test_reviews([review(disguise(r.text)) for r in test], test) == 2


def test_force_decides_what_to_keep_when_it_replaces(tmp_path):
    """19b's F8: a file the user added to the command's own output while the command ran was
    deleted with --force: whether to keep the old folder was decided before the work."""
    from finetune_lab import _files

    out = tmp_path / "out"
    with _files.atomic_dir(out, "prepare-cls") as tmp:
        (tmp / "train.review").write_text("first\n")
    with _files.atomic_dir(out, "prepare-cls", force=True) as tmp:
        (out / "notes.txt").write_text("the user's, written meanwhile")
        (tmp / "train.review").write_text("second\n")
    (kept,) = tmp_path.glob("out.replaced-*")
    assert (kept / "notes.txt").read_text() == "the user's, written meanwhile"


def test_a_random_initialisation_under_a_known_name_and_a_damaged_inputs_map(tmp_path):
    """19b's N4: `probe --random --name cpu-long3` stood in the probe table as cpu-long3; P3: a
    probe record whose inputs were 5 stopped Appendix A with a TypeError."""
    import shutil

    from finetune_lab.book import probe_report as prp
    from finetune_lab.train.linear_probe import run_probe

    with pytest.raises(UserError, match="--name cpu-long3 is a random initialisation under "
                                        "cpu-long3, a name the runs know"):
        run_probe(tmp_path, name="cpu-long3", random_init=True, out_dir=tmp_path / "records")
    records = tmp_path / "probes"
    shutil.copytree(PROJECT_ROOT / "data" / "summaries" / "probes", records)
    random = json.loads((records / "random.json").read_text())
    (records / "cpu-long3.json").write_text(json.dumps({**random, "name": "cpu-long3"}))
    damaged = json.loads((records / "cpu-seed1.json").read_text())
    (records / "cpu-seed1.json").write_text(json.dumps({**damaged, "inputs": 5}))
    bad: list[str] = []
    table = prp.probe_table(records, set_aside=bad)
    assert not {"cpu-long3", "cpu-seed1"} & set(table["weights"]) and len(table) == 12
    assert any("is a random initialisation under cpu-long3" in line for line in bad)
    assert any(line.startswith("`cpu-seed1.json` probed other split files") for line in bad)
