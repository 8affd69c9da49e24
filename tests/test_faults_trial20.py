"""Fault trial 20's serious classes (report: fault-trial-20.md), each with a new member of its
class beside the trial's own reproduction."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from finetune_lab.errors import UserError


def _review(text: str):
    from finetune_lab.data.cls_books import Review

    return Review(text=text, label=1, rating=5.0, position=1)


TEST = ["Un roman magnifique que je relirai volontiers cet été avec mes enfants",
        "Une intrigue confuse et des personnages sans relief du début à la fin"]


@pytest.mark.parametrize("inside", ["\u0085", "\u0081", "\u2028", "-", "\u00b7", "\u02bc",
                                    "\u2063", ".", "_", "1", "\u00b9"])
def test_test_reviews_with_anything_inside_their_words_are_found(inside):
    """D-z2, D-z3: a next-line or C1 control, a line separator, or a visible hyphen, middle dot
    or modifier apostrophe inside every word split each word in two, and the copy passed (20b's
    D-b7: a digit, a superscript one); the letters alone compare (an invisible separator and
    '.', '_' are new members)."""
    from finetune_lab.data.overlap import near_test_reviews, skeleton

    test = [_review(t) for t in TEST]
    hidden = [_review(" ".join(w[:2] + inside + w[2:] if len(w) > 3 else w for w in t.split()))
              for t in TEST]
    assert skeleton(hidden[0].text) == skeleton(TEST[0])
    assert near_test_reviews(hidden, test) == 2
    other = [_review("Un tout autre avis sur un tout autre livre de poche, lu cet hiver")]
    assert near_test_reviews(other, test) == 0


@pytest.mark.parametrize("letters", [("ou", "\u0585\u057d"), ("oia", "\u0585\u0131\u0251"),
                                     ("e", "\u0435"), ("a", "\u1d00"), ("oei", "031"),
                                     ("eo", "\u212e\u25cb"), ("o", "\u00b7")])
def test_a_file_in_other_letters_is_refused_naming_the_first(tmp_path, letters):
    """D-z1: Armenian look-alikes (and the dotless i and Latin alpha with them) passed, being
    in no list of look-alikes; 20b's D-b8, D-b9: digits or symbols for letters. Anything French
    text rarely holds, throughout, is refused (Cyrillic e, a small capital A, a dot for every o
    are new members)."""
    from finetune_lab.data.overlap import check_overlap

    swap = str.maketrans(*letters)
    train = [_review(t.translate(swap)) for t in TEST * 20]
    sources = {"train": tmp_path / "train.review", "test": tmp_path / "test.review"}
    with pytest.raises(UserError, match=r"train\.review: \d+ of its characters \(for \d+ "
                                        r"letters\) are not French text's \(the first, in review "
                                        r"1: "):
        check_overlap(sources, train, [_review(t) for t in TEST])
    # the real files' own letters pass: accents, œ, and a rare foreign name
    check_overlap(sources, [_review("Un cœur d'Œdipe à Kraków, lu à Noël ")] * 40 + [
        _review("Tout autre chose, vraiment rien de commun avec le reste du lot")],
                  [_review(t) for t in TEST])


def test_a_killed_run_with_no_record_resumes_only_a_state_its_log_saved(tmp_path):
    """W2-z1: killed before its first save (status running, no recorded state), the run took
    another run's state of the same name, seed, lr and dropout but twice the batch."""
    import torch

    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zR"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"

    def state(batch: int) -> None:
        torch.save({"optimizer_history": [{"num_updates": 2}],
                    "extra_state": {"launch": "a1b2c3d4e5f60718"},  # the plugin's mark
                    "cfg": {"common": {"seed": 1}, "optimization": {"lr": [1e-3],
                                                                   "update_freq": [1]},
                            "model": {"dropout": 0.0, "attention_dropout": 0.0},
                            "dataset": {"batch_size": batch, "max_tokens": None},
                            "task": {"tokens_per_sample": 64},
                            "checkpoint": {"save_dir": str(save)}}}, last)
    run = tmp_path / "runs" / "zR"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({
        "status": "running", "seed": 1, "updates_done": 0,
        "segments": [{"launch": "a1b2c3d4e5f60718"}],
        "hyperparameters": {"lr": 1e-3, "dropout": 0.0, "attention_dropout": 0.0,
                            "tokens_per_sample": 64, "tokens_per_update": 128}}))
    state(4)  # another run's: 256 tokens per update
    with pytest.raises(UserError, match=r"tokens_per_update 256 \(the run's 128\)"):
        check_own_state(run, last, 2, made=resume_point(save))
    state(2)  # the run's recipe, but the run never saved it
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 2, made=resume_point(save))
    line = ("2026-11-27 12:00:00 | INFO | fairseq.checkpoint_utils | Saved checkpoint "
            "{}/checkpoint_1_2.pt (epoch 1 @ 2 updates, score 9.1) (writing took 0.1 s)\n")
    (run / "train.log").write_text(line.format(tmp_path / "elsewhere" / "zQ"))
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 2, made=resume_point(save))  # another folder's save
    (run / "train.log").write_text(line.format(save))
    check_own_state(run, last, 2, made=resume_point(save))  # its own log says it saved it
    # 20b's W2-b1: a run of the same name in another work folder, on another corpus
    elsewhere = tmp_path / "other-work" / "zR"
    elsewhere.mkdir(parents=True)
    state = torch.load(last, weights_only=False)
    state["cfg"]["checkpoint"]["save_dir"] = str(elsewhere)
    torch.save(state, last)
    with pytest.raises(UserError, match=r"save_dir .*other-work/zR \(not the run's\)"):
        check_own_state(run, last, 2, made=resume_point(save))
    state["cfg"]["checkpoint"]["save_dir"] = str(save)
    state["cfg"]["task"]["data"] = str(tmp_path)  # a corpus here that the run does not read
    torch.save(state, last)
    with pytest.raises(UserError, match=r", data .* \(not the run's\)"):
        check_own_state(run, last, 2, data=[tmp_path / "corpus"], made=resume_point(save))


def test_trained_weights_under_the_random_initialisations_name_are_refused(tmp_path,
                                                                           monkeypatch):
    """W3-z1: `fill-mask --name random` of trained weights was shown in the book as the random
    initialisation's answers; and one name holds one set of weights across record kinds."""
    from finetune_lab import config
    from finetune_lab.runs import record_names

    problem = record_names.name_problem(
        {"name": "random", "checkpoint": {"path": "data/work/mine/model.pt", "sha256": "ab"}},
        tmp_path / "runs", None)
    assert problem is not None and "random initialisation" in problem
    summaries = tmp_path / "summaries"
    (summaries / "probes").mkdir(parents=True)
    monkeypatch.setattr(record_names, "paths", lambda: replace(config.paths(),
                                                              summaries=summaries))
    (summaries / "probes" / "mine.json").write_text(json.dumps(
        {"name": "mine", "init": "pretrained", "checkpoint": {"sha256": "ab" * 32}}))
    answers = summaries / "fill-mask" / "mine.json"
    assert record_names.other_record_problem("mine", "ab" * 32, answers) is None
    assert "probes/mine.json" in record_names.other_record_problem("mine", "cd" * 32, answers)
    assert "probes/mine.json" in record_names.other_record_problem("mine", None, answers)
    # and when the book reads them (20b's W3-b5: two records merged in, one name, two weights)
    answers_record = {"name": "mine", "checkpoint": {"path": "data/work/x/model.pt",
                                                     "sha256": "cd" * 32}}
    assert "probes/mine.json" in record_names.name_problem(answers_record, tmp_path / "runs", None)
    probe_record = {**answers_record, "init": "pretrained"}
    assert record_names.name_problem(probe_record, tmp_path / "runs", None) is None  # itself


def test_force_keeps_weights_the_command_made(tmp_path):
    """A-z1: `package-checkpoint --dest data/work/candidates/NAME --force` deleted the weights
    that committed runs fine-tuned, since the command had made them."""
    from finetune_lab import _files

    dest = tmp_path / "candidates" / "cpu-x"
    for weights in (b"old weights", b"new weights"):
        with _files.atomic_dir(dest, "package-checkpoint", force=True) as tmp:
            (tmp / "model.pt").write_bytes(weights)
            (tmp / "manifest.json").write_text("{}")
    kept = list(dest.parent.glob("cpu-x.replaced-*"))
    assert [(k / "model.pt").read_bytes() for k in kept] == [b"old weights"]
    assert (dest / "model.pt").read_bytes() == b"new weights"
    with _files.atomic_dir(tmp_path / "data", "prepare-cls") as tmp:  # no weights: replaced
        (tmp / "train.review").write_text("a\n")
    with _files.atomic_dir(tmp_path / "data", "prepare-cls") as tmp:
        (tmp / "train.review").write_text("b\n")
    assert not list(tmp_path.glob("data.replaced-*"))


def test_a_guard_names_rejected_runs_of_experiments_it_does_not_list(cache):
    """G-z5: with one pretraining run rejected, a guard listing fairseq* said "no run there is
    excluded, so the results themselves changed", naming no run."""
    from finetune_lab.book.claims import ClaimError, holds

    log = cache / "pretrain" / "cpu-clean-bow1" / "train.log"
    log.write_text(log.read_text() + " ")
    with pytest.raises(ClaimError, match=r"no run there is excluded, but these runs of other "
                                         r"experiments are.*pretrain/cpu-clean-bow1"):
        holds(False, "a sentence", "fairseq*")


def test_a_chapter_the_book_lists_or_froze_but_that_is_gone_is_stale(tmp_path):
    """F-z7: with a chapter deleted (still listed in _quarto.yml), or chapters/ replaced by a
    file, check-freeze said "up to date"."""
    from finetune_lab.book.freeze import check_freeze

    (tmp_path / "_quarto.yml").write_text("book:\n  chapters:\n    - index.qmd\n"
                                          "    - chapters/gone.qmd\n")
    (tmp_path / "index.qmd").write_text("# Index\n")
    record = tmp_path / "_freeze" / "finetune-lab" / "chapters" / "frozen.qmd.json"
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    assert [(s.chapter, "it is gone" in s.reason) for s in check_freeze(tmp_path)] == [
        ("chapters/frozen.qmd", True), ("chapters/gone.qmd", True)]
