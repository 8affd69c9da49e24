"""Fault trial 21's findings and the older minors mended beside them, one test each."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import needs_data_root

from finetune_lab import _files, cli
from finetune_lab.errors import UserError


def _run_as_command(monkeypatch, func) -> int:
    """``cli.main`` with ``func`` as the command (the CLI's own error handling around it)."""
    parser = cli.build_parser()
    args = parser.parse_args(["user-dir"])
    monkeypatch.setattr(cli, "build_parser", lambda *_: parser)
    monkeypatch.setattr(parser, "parse_args",
                        lambda argv=None: (setattr(args, "func", func), args)[1])
    return cli.main([])


def test_a_copy_onto_a_full_disk_names_the_copy_not_its_source(tmp_path, monkeypatch, capsys):
    """Trial 20's X-z3: shutil names a failed copy's source first; the full disk is the
    destination's, so the line names the destination."""
    source, dest = tmp_path / "dict.txt", tmp_path / "small" / "dict.txt"
    source.write_text("a 1\n")
    dest.parent.mkdir()

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "sendfile", full)
    monkeypatch.setattr(shutil, "_USE_CP_SENDFILE", True)
    assert _run_as_command(monkeypatch, lambda _args: shutil.copyfile(source, dest)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot write {dest}:" in err, err
    assert str(source) not in err


@pytest.mark.parametrize(("field", "saved", "message"), [
    (("criterion",), {"_name": "masked_lm"}, r"bow_weight 0.0 \(the run's 8.0\)"),
    (("criterion",), {"_name": "masked_lm_bow", "bow_weight": 2.0}, r"bow_weight 2.0 \(the run's 8.0\)"),
    (("task", "sample_break_mode"), "none", r"sample_break_mode none \(the run's eos\)"),
    (("optimizer", "adam_betas"), "(0.9,0.999)", r"adam_betas \[0.9, 0.999\] \(the run's \[0.9, 0.98\]\)"),
])
def test_a_state_trained_on_another_objective_is_not_resumed(tmp_path, field, saved, message):
    """The review of trial 20's W2 mend: the comparison left out the objective (the bag of words
    and its weight, whole lines or stretches) and Adam's betas, which a manifest records too."""
    import torch

    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zB"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"
    cfg = {"common": {"seed": 1}, "optimization": {"lr": [1e-3], "update_freq": [1]},
           "dataset": {"batch_size": 2, "max_tokens": None},
           "task": {"tokens_per_sample": 64, "sample_break_mode": "eos"},
           "optimizer": {"adam_betas": "(0.9,0.98)"},
           "criterion": {"_name": "masked_lm_bow", "bow_weight": 8.0},
           "checkpoint": {"save_dir": str(save)}}
    run = tmp_path / "runs" / "zB"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({
        "status": "paused", "seed": 1, "updates_done": 2,
        "hyperparameters": {"lr": 1e-3, "tokens_per_sample": 64, "tokens_per_update": 128,
                            "sample_break_mode": "eos", "bow_weight": 8.0,
                            "adam_betas": [0.9, 0.98]}}))

    def save_state(cfg: dict) -> dict:
        torch.save({"optimizer_history": [{"num_updates": 2}], "extra_state": {}, "cfg": cfg},
                   last)
        return resume_point(save)

    made = save_state(cfg)
    assert all(k not in made or made[k] is not None for k in ("adam_betas", "bow_weight"))
    check_own_state(run, last, 2, made=made)  # paused at its save, with its recipe: its own
    section = cfg[field[0]]
    changed = {**cfg, field[0]: saved if len(field) == 1 else {**section, field[1]: saved}}
    with pytest.raises(UserError, match=message):
        check_own_state(run, last, 2, made=save_state(changed))


def test_the_stand_in_footer_names_a_rejected_gpu_pretraining(cache):
    """Trial 20's G-z2: with `pretrain-gpu/gpu4` rejected its sentence and table rows went, and
    the chapter named it nowhere: its footer counted only the CPU's pretraining runs."""
    from finetune_lab.book import pretrain_plateau as pp
    from finetune_lab.book.provenance import provenance_markdown
    from finetune_lab.config import PROJECT_ROOT

    with open(cache / "pretrain-gpu" / "gpu4" / "train.log", "a", encoding="utf-8") as log:
        log.write(" ")
    records = pp.all_pretraining_runs()
    (gpu4,) = [r for r in records if r.key == "pretrain-gpu/gpu4"]
    assert not gpu4.valid
    text = (PROJECT_ROOT / "chapters" / "standin-build.qmd").read_text(encoding="utf-8")
    assert "provenance_footer([*records," in text and "records = pp.all_pretraining_runs()" in text
    footer = provenance_markdown(records)
    assert "pretrain-gpu/gpu4" in footer and "excluded" in footer


@needs_data_root
def test_a_training_file_changed_in_any_way_is_another_corpus(tmp_path, capsys):
    """Trials 13 to 21, D (21's D-c: an `x` inside every word of the test reviews, two letters
    swapped, the last one replaced by a middle dot): each disguise a comparison of texts did not
    know passed. The books files are Webis-CLS-10's, by sha256, or the user says they are not."""
    from finetune_lab.config import default_data_root
    from finetune_lab.data.cls_books import BOOKS_DIR, BOOKS_SHA256

    real = default_data_root()
    root = tmp_path / "root"
    (root / BOOKS_DIR).mkdir(parents=True)
    os.symlink(real / BOOKS_DIR / "test.review", root / BOOKS_DIR / "test.review")
    text = (real / BOOKS_DIR / "train.review").read_text(encoding="utf-8")
    (root / BOOKS_DIR / "train.review").write_text(text.replace(" livre ", " lixvre ", 1),
                                                    encoding="utf-8")
    out = tmp_path / "cls"
    assert cli.main(["prepare-cls", "--data-root", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.review is not Webis-CLS-10's train.review" in err
    assert "--other-corpus" in err and not out.exists()
    assert cli.main(["prepare-cls", "--data-root", str(root), "--out", str(out),
                     "--other-corpus"]) == 0
    assert json.loads((out / "manifest.json").read_text())["corpus"] == "other"
    ours = {n: _files.sha256_file(real / BOOKS_DIR / f"{n}.review") for n in ("train", "test")}
    assert ours == BOOKS_SHA256  # the data root's files are the ones pinned


def test_a_killed_run_resumes_no_state_saved_in_a_folder_since_gone(tmp_path):
    """W2-c1: killed after its first save and before recording it, the run found another run's
    state (same name, seed and recipe) saved in a folder that no longer exists here: its log
    said it saved at that update, and a gone folder said nothing."""
    import torch

    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zR"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"

    def state(saved_in: Path) -> dict:
        torch.save({"optimizer_history": [{"num_updates": 2}],
                    "extra_state": {"launch": "a1b2c3d4e5f60718"},  # the plugin's mark
                    "cfg": {"common": {"seed": 1}, "optimization": {"lr": [1e-3]},
                            "dataset": {"batch_size": 2}, "task": {"tokens_per_sample": 64},
                            "checkpoint": {"save_dir": str(saved_in)}}}, last)
        return resume_point(save)
    run = tmp_path / "runs" / "zR"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({
        "status": "running", "seed": 1, "updates_done": 0,
        "segments": [{"launch": "a1b2c3d4e5f60718"}],
        "hyperparameters": {"lr": 1e-3, "tokens_per_sample": 64, "tokens_per_update": 128}}))
    (run / "train.log").write_text(
        "2026-11-27 12:00:00 | INFO | fairseq.checkpoint_utils | Saved checkpoint "
        f"{save}/checkpoint_1_2.pt (epoch 1 @ 2 updates, score 9.1) (writing took 0.1 s)\n")
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 2, made=state(tmp_path / "gone" / "zR"))
    check_own_state(run, last, 2, made=state(save))  # the state its own log saved


def test_a_committed_input_turned_ignored_and_gone_is_a_change(tmp_path):
    """F-c1, F-c2: a commit that ignores a run's train.log, a probe record or the packaged
    weights (and untracks them) gives clones without them, which check-freeze called up to
    date: only the work folder's files are machine-local."""
    import subprocess

    from finetune_lab.book.freeze import diff_files

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/data/work\ndata/runs/fairseq/random-seed0/train.log\n"
                                         "data/checkpoints/roberta-small-fr/model.pt\n")
    recorded = {"data/runs/fairseq/random-seed0/train.log": "a" * 64,
                "data/checkpoints/roberta-small-fr/model.pt": "b" * 64,
                "data/work/cls.books/train.review": "c" * 64}
    assert diff_files(recorded, {}, tmp_path) == [
        "data/checkpoints/roberta-small-fr/model.pt (removed)",
        "data/runs/fairseq/random-seed0/train.log (removed)"]


def test_a_method_whose_runs_were_all_rejected_is_not_called_never_run(cache):
    """G-c3: with the three CPU `qlora-qv` runs rejected, the LoRA chapter said "Not run yet:
    `qlora-qv`" and gave the command that would run it again, over the rejected runs."""
    from finetune_lab.book import lora_cls_report, lora_cls_runs

    for events in sorted((cache / "lora").glob("qlora-qv-seed*/events.out.tfevents.*")):
        data = events.read_bytes()  # a hard link of the committed file: replaced, not appended
        events.unlink()
        events.write_bytes(data + b"x")
    text = lora_cls_report.state_markdown(lora_cls_runs.cached_runs())
    assert "**Rejected:** `qlora-qv` (every run of it was excluded" in text, text
    assert "Not run yet" not in text and "--methods qlora-qv" not in text


def test_a_second_launch_beside_a_live_one_is_told_so(tmp_path):
    """W2-c2: two launches of one new run at once; the second read the first's folder (status
    running, nothing saved yet) as a run whose state was lost, and advised deleting it."""
    from finetune_lab.train.pretrain_long import start_over_unsaved

    run = tmp_path / "runs" / "zT"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"status": "running", "seed": 1}))
    with pytest.raises(UserError, match="is running and has saved no state yet .* another launch "
                                        "may be writing it now") as err:
        start_over_unsaved(run, tmp_path / "work" / "zT", 10)
    assert "delete" not in str(err.value)
    assert (run / "manifest.json").is_file()


@pytest.mark.parametrize("name", ["CPU-SINPOS1", "ROBERTA-SMALL-FR", "Cpu-Long3", "CPU-LONG3-u10",
                                  "CPU-TAPT1-U2"])
def test_a_known_name_in_other_case_is_refused(name):
    """W3-c2: `fill-mask --name CPU-SINPOS1` (and the packaged checkpoint's name in capitals)
    was written and shown beside `cpu-sinpos1`'s row: only `random` was compared casefolded."""
    from finetune_lab.config import paths
    from finetune_lab.runs.crosscheck import packaged_origin
    from finetune_lab.runs.record_names import name_problem

    record = {"name": name, "checkpoint": {"path": "data/work/mine", "sha256": "0" * 64}}
    problem = name_problem(record, paths().runs, packaged_origin(), "fill-mask")
    assert problem is not None and problem.startswith("differs only in case from "), problem
    mine = name_problem({**record, "name": "my-own-weights"}, paths().runs, packaged_origin(),
                        "fill-mask")
    assert mine is None


def test_a_state_of_the_same_folder_is_the_runs_only_with_its_score_and_corpus(tmp_path):
    """21b's W2-d1: another run of the same name, saved in the same folder (a checkout at the
    same path) on a corpus since gone, was resumed: its folder agreed with the run's log, and a
    gone corpus said nothing. The state's score must be the one the run's log printed for that
    save, and its corpus one of the run's, as text."""
    import torch

    from finetune_lab.runs.manifest import input_record
    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zR"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"
    corpus = tmp_path / "pp" / "bin"

    def state(score: float, data: Path) -> dict:
        torch.save({"optimizer_history": [{"num_updates": 2}],
                    "extra_state": {"val_loss": score, "launch": "a1b2c3d4e5f60718"},
                    "cfg": {"common": {"seed": 1}, "optimization": {"lr": [1e-3]},
                            "dataset": {"batch_size": 2}, "task": {"tokens_per_sample": 64,
                                                                   "data": str(data)},
                            "checkpoint": {"save_dir": str(save)}}}, last)
        return resume_point(save)
    run = tmp_path / "runs" / "zR"
    run.mkdir(parents=True)
    corpus.mkdir(parents=True)
    (corpus / "train.bin").write_bytes(b"0")
    (run / "manifest.json").write_text(json.dumps({
        "status": "running", "seed": 1, "updates_done": 0,
        "segments": [{"launch": "a1b2c3d4e5f60718"}],
        "inputs": {"data": [input_record(corpus.parent)]},
        "hyperparameters": {"lr": 1e-3, "tokens_per_sample": 64, "tokens_per_update": 128}}))
    (run / "train.log").write_text(
        "2026-11-27 12:00:00 | INFO | fairseq.checkpoint_utils | Saved checkpoint "
        f"{save}/checkpoint_1_2.pt (epoch 1 @ 2 updates, score 14.756) (writing took 0.1 s)\n")
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 2, made=state(14.767, corpus))  # another save's score
    with pytest.raises(UserError, match=r", data .*pp3/bin \(not the run's\)"):
        check_own_state(run, last, 2, [corpus.parent], made=state(14.756, tmp_path / "pp3" / "bin"))
    check_own_state(run, last, 2, [corpus.parent], made=state(14.756, corpus))  # its own


def test_a_kernel_that_dies_as_it_starts_is_started_again(tmp_path, monkeypatch):
    """A newcomer's suite failed once: two chapter kernels started at once were given the same
    port, and one died before replying ("Address already in use"). Only that is retried."""
    from nbclient import NotebookClient

    from finetune_lab.book.qmd import KERNEL_STARTS, execute_chapter

    qmd = tmp_path / "k.qmd"
    qmd.write_text("# K\n\n```{python}\nprint(6 * 7)\n```\n")
    real, starts = NotebookClient.execute, []

    def flaky(self, **kwargs):
        starts.append(1)
        if len(starts) == 1:
            raise RuntimeError("Kernel died before replying to kernel_info")
        return real(self, **kwargs)
    monkeypatch.setattr(NotebookClient, "execute", flaky)
    nb = execute_chapter(qmd)
    assert len(starts) == 2 and "42" in nb.cells[-1].outputs[0]["text"]
    starts.clear()
    monkeypatch.setattr(NotebookClient, "execute", lambda self, **kw: (starts.append(1), (
        _ for _ in ()).throw(RuntimeError("Kernel died before replying to kernel_info"))))
    with pytest.raises(RuntimeError, match="Kernel died"):
        execute_chapter(qmd)
    assert len(starts) == KERNEL_STARTS
