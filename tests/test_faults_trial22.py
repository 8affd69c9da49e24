"""Fault trial 22's findings, one test each."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import needs_data_root

from finetune_lab.config import PROJECT_ROOT, default_data_root
from finetune_lab.data import eltec, pretrain_corpus, tokenizer
from finetune_lab.errors import UserError

WEBIS = "webis-cls-10/fr"


def _root_with(dest: Path, replaced: dict[str, Path]) -> Path:
    """A data root of links to the real one's files, but for the ``replaced`` ones (relative
    path to the file put there), and without the real SHA256SUMS (it would name them)."""
    real = default_data_root()
    for path in sorted(real.rglob("*")):
        rel = path.relative_to(real).as_posix()
        if path.is_dir() or rel == "SHA256SUMS" or "/" not in rel:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel in replaced:
            shutil.copyfile(replaced[rel], dest / rel)
        else:
            os.symlink(path, dest / rel)
    return dest


def _tokenizer(dest: Path) -> Path:
    """The packaged checkpoint's tokenizer, as `adopt-tokenizer` lays it out."""
    dest.mkdir()
    ckpt = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr"
    shutil.copyfile(ckpt / "sentencepiece.bpe.model", dest / tokenizer.MODEL_FILE)
    shutil.copyfile(ckpt / "dict.txt", dest / tokenizer.DICT_FILE)
    return dest


def _test_file() -> Path:
    return default_data_root() / WEBIS / "books" / "test.review"


@needs_data_root
@pytest.mark.parametrize("where", ["books/train.review", "dvd/train.review",
                                   "music/test.review"])
@pytest.mark.parametrize("other_corpus", [False, True])
def test_the_books_test_reviews_are_never_pretrained_on(tmp_path, where, other_corpus):
    """Trial 22's D-e1, D-e2: prepare-pretrain read Webis-CLS-10 without prepare-cls's check,
    and the books test reviews, put in as the books or dvd training file, were pretrained on."""
    root = _root_with(tmp_path / "root", {f"{WEBIS}/{where}": _test_file()})
    with pytest.raises(UserError, match=rf"{where} is Webis-CLS-10's books test file"):
        pretrain_corpus.prepare_pretrain(root, _tokenizer(tmp_path / "tok"), tmp_path / "out",
                                         max_novels=2, task_repeat=3, workers=1,
                                         other_corpus=other_corpus)
    assert not (tmp_path / "out").exists()


@needs_data_root
def test_a_review_file_not_webis_is_read_only_when_asked_and_then_recorded(tmp_path):
    """Trial 22's D-e5: a disguised books training file passed prepare-pretrain; any review
    file that is not Webis-CLS-10's now needs --other-corpus, and the corpus says so."""
    dvd = default_data_root() / WEBIS / "dvd" / "train.review"
    cut = tmp_path / "dvd-train.review"
    text = dvd.read_text(encoding="utf-8")
    cut.write_text(text[:text.index("</item>", len(text) // 2) + 7] + "\n</items>\n",
                   encoding="utf-8")
    root = _root_with(tmp_path / "root", {f"{WEBIS}/dvd/train.review": cut})
    tok = _tokenizer(tmp_path / "tok")
    with pytest.raises(UserError, match=r"dvd/train\.review is not Webis-CLS-10's "
                                        r"webis-cls-10/fr/dvd/train\.review.*--other-corpus"):
        pretrain_corpus.prepare_pretrain(root, tok, tmp_path / "out", max_novels=2, workers=1)
    with pytest.raises(UserError, match=r"--other-corpus"):
        tokenizer.train_tokenizer(root, tmp_path / "tok2", max_novels=2)
    out, ran = pretrain_corpus.prepare_pretrain(root, tok, tmp_path / "out", max_novels=2,
                                                workers=1, review_repeat=1, train_novels=False,
                                                other_corpus=True)
    assert ran and json.loads((out / "manifest.json").read_text())["parameters"]["corpus"] == \
        "other"
    assert pretrain_corpus.corpus_record(out / "bin")["corpus"] == "other"


@needs_data_root
def test_webis_files_pass_and_a_books_training_file_of_test_reviews_fails_the_text_check(
        tmp_path):
    """The real files are the pinned ones; with --other-corpus, a training file that is mostly
    the test reviews is still refused by the text comparison."""
    real = default_data_root()
    docs = eltec.in_domain_reviews(real)[0] + [eltec.task_reviews(real, 1)]
    assert eltec.check_review_documents(real, docs) is False
    test = _test_file().read_text(encoding="utf-8")
    near = tmp_path / "train.review"
    near.write_text(test.replace("</text>", " !</text>"), encoding="utf-8")
    root = _root_with(tmp_path / "root", {f"{WEBIS}/books/train.review": near})
    with pytest.raises(UserError, match=r"shares \d+ of its 2000 reviews with"):
        eltec.check_review_documents(root, [eltec.task_reviews(root, 1)], other_corpus=True)


def _edit(run: Path, change) -> None:
    man = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    change(man["extra"])
    (run / "manifest.json").write_text(json.dumps(man, indent=1), encoding="utf-8")


@pytest.mark.parametrize("run, change, reason", [
    ("transformers-gpu/pretrained-seed9",
     lambda e: e["peak_memory"].update(bytes=e["peak_memory"]["bytes"] * 3),
     r"extra\.peak_memory\.bytes 1660133376 differ from those of the other runs"),
    ("lora-gpu/lora-attn-seed0",
     lambda e: e["peak_memory"].update(bytes=int(e["peak_memory"]["bytes"] * 1.5)),
     r"extra\.peak_memory\.bytes 615032832 differ"),
    ("lora-gpu/lora-attn-seed0", lambda e: e.update(time_s=e["time_s"] * 0.85),
     r"extra\.time_s 114\.8\d* s is shorter than the 135\.\d s between its event files' first"),
])
def test_a_measurement_edited_in_one_manifest_rejects_that_run_alone(cache, run, change,
                                                                       reason):
    """Trial 22's M-d1, M-d2: a peak memory and a time in one manifest, only bounded, moved the
    Transformers and LoRA chapters' tables; the other seeds of the recipe on the same GPU and the
    run's own event files now say what they were."""
    from finetune_lab.runs.registry import discover_runs

    _edit(cache / run, change)
    records = {r.key: r for r in discover_runs(cache)}
    assert not records[run].valid
    assert re.search(reason, records[run].reason), records[run].reason
    experiment = run.split("/")[0]
    assert all(r.valid for k, r in records.items() if k != run and r.experiment == experiment)


def test_a_state_logged_in_another_run_folder_is_not_resumed_whatever_its_score(tmp_path):
    """Trial 22's W2-e2: a run killed after a save it had not recorded resumed another run's
    state (same save folder, same corpus path, another training set there): at a tiny lr both
    printed the same score. The state names the run folder it logged in, which the run's own
    log prints as each launch starts."""
    import torch

    from finetune_lab.train.pretrain_resume import check_own_state, resume_point

    save = tmp_path / "work" / "zR"
    save.mkdir(parents=True)
    last = save / "checkpoint_last.pt"
    run = tmp_path / "runs" / "pretrain" / "zR"

    def state(logdir: Path) -> dict:
        torch.save({"optimizer_history": [{"num_updates": 2}], "extra_state": {"val_loss": 15.111},
                    "cfg": {"common": {"seed": 1, "tensorboard_logdir": str(logdir)},
                            "optimization": {"lr": [1e-7]}, "dataset": {"batch_size": 2},
                            "task": {"tokens_per_sample": 64},
                            "checkpoint": {"save_dir": str(save)}}}, last)
        return resume_point(save)
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({
        "status": "running", "seed": 1, "updates_done": 0,
        "hyperparameters": {"lr": 1e-7, "tokens_per_sample": 64, "tokens_per_update": 128}}))
    (run / "train.log").write_text(
        "2026-11-27 12:00:00 | INFO | fairseq_cli.train | {'common': {'seed': 1, "
        f"'tensorboard_logdir': '{run}'}}}}\n"
        "2026-11-27 12:00:05 | INFO | fairseq.checkpoint_utils | Saved checkpoint "
        f"{save}/checkpoint_1_2.pt (epoch 1 @ 2 updates, score 15.111) (writing took 0.1 s)\n")
    other = tmp_path / "other-runs" / "pretrain" / "zR"
    with pytest.raises(UserError, match="is not the state .* last recorded"):
        check_own_state(run, last, 2, made=state(other))
    check_own_state(run, last, 2, made=state(run))  # its own


@pytest.mark.parametrize("experiment, run", [("pretrain", "CPU-CLEAN-BOW1"),
                                             ("Pretrain", "zz-new")])
def test_a_run_or_experiment_name_in_another_case_is_refused(tmp_path, experiment, run):
    """Trial 22's N-e1: `pretrain --run CPU-CLEAN-BOW1` was recorded beside the committed
    cpu-clean-bow1 (on a case-insensitive disk, its folder)."""
    from finetune_lab.runs.recording import run_dir_for

    (tmp_path / "pretrain" / "cpu-clean-bow1").mkdir(parents=True)
    with pytest.raises(UserError, match=r"differs only in case from '(cpu-clean-bow1|pretrain)'"):
        run_dir_for(experiment, run, tmp_path)
    assert run_dir_for("pretrain", "cpu-clean-bow1", tmp_path) == \
        tmp_path / "pretrain" / "cpu-clean-bow1"
    (tmp_path / "pretrain" / "CPU-CLEAN-BOW1").mkdir()  # a twin made before: still readable
    assert run_dir_for("pretrain", "CPU-CLEAN-BOW1", tmp_path).is_dir()


def test_a_command_line_that_contradicts_the_recorded_epochs_rejects_the_run(cache):
    """Trial 22's M-d5: `--epochs 7` in a Transformers run's command, beside 5 recorded epochs,
    passed (the epochs were compared with fairseq's `--max-epoch` only)."""
    from finetune_lab.runs.registry import discover_runs

    manifest = cache / "transformers-gpu" / "pretrained-seed9" / "manifest.json"
    man = json.loads(manifest.read_text(encoding="utf-8"))
    man["command"][man["command"].index("--epochs") + 1] = "7"
    manifest.write_text(json.dumps(man), encoding="utf-8")
    (rec,) = [r for r in discover_runs(cache) if r.key == "transformers-gpu/pretrained-seed9"]
    assert not rec.valid and "hyperparameters.epochs 5 contradicts its command line (--epochs 7)" \
        in rec.reason, rec.reason


def test_an_input_folder_made_a_link_is_named_not_gits_rules(tmp_path):
    """Trial 22's F-e1: `data/runs/fairseq-gpu` replaced by a link stopped check-freeze with
    git's "beyond a symbolic link", blaming the ignore rules."""
    import subprocess

    from finetune_lab.book.freeze import git_ignored

    project = tmp_path / "project"
    (project / "data" / "runs").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    (tmp_path / "copy").mkdir()
    (project / "data" / "runs" / "fairseq-gpu").symlink_to(tmp_path / "copy")
    with pytest.raises(UserError, match=r"data/runs/fairseq-gpu is a link: no chapter reads"):
        git_ignored(project, ["data/runs/fairseq-gpu/random-seed9/manifest.json"])
    assert git_ignored(project, ["data/runs/other/manifest.json"]) == set()
