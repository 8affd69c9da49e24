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


def _first_half(src: Path, dest: Path) -> Path:
    """A reviews file of the first half of ``src``'s items: another corpus, but French."""
    text = src.read_text(encoding="utf-8")
    dest.write_text(text[:text.index("</item>", len(text) // 2) + 7] + "\n</items>\n",
                    encoding="utf-8")
    return dest


@needs_data_root
def test_a_review_file_not_webis_is_read_only_when_asked_and_then_recorded(tmp_path):
    """Trial 22's D-e5: a disguised books training file passed prepare-pretrain; any review
    file that is not Webis-CLS-10's now needs --other-corpus, and the corpus says so."""
    real = default_data_root() / WEBIS
    root = _root_with(tmp_path / "root", {
        f"{WEBIS}/dvd/train.review": _first_half(real / "dvd" / "train.review", tmp_path / "d"),
        f"{WEBIS}/books/train.review": _first_half(real / "books" / "train.review",
                                                   tmp_path / "b")})
    tok = _tokenizer(tmp_path / "tok")
    with pytest.raises(UserError, match=r"dvd/train\.review is not Webis-CLS-10's "
                                        r"webis-cls-10/fr/dvd/train\.review.*--other-corpus"):
        tokenizer.train_tokenizer(root, tmp_path / "tok2", max_novels=2)
    task = {"max_novels": 2, "workers": 1, "with_reviews": False, "train_novels": False,
            "task_repeat": 1}  # the books training texts alone, a task-adaptive corpus
    with pytest.raises(UserError, match=r"books/train\.review is not Webis-CLS-10's"):
        pretrain_corpus.prepare_pretrain(root, tok, tmp_path / "out", **task)
    out, ran = pretrain_corpus.prepare_pretrain(root, tok, tmp_path / "out", other_corpus=True,
                                                **task)
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
    digests, other = eltec.check_documents(real, docs)
    assert other is False and digests == {d.name: eltec.WEBIS_SHA256[d.name] for d in docs}
    test = _test_file().read_text(encoding="utf-8")
    near = tmp_path / "train.review"
    near.write_text(test.replace("</text>", " !</text>"), encoding="utf-8")
    root = _root_with(tmp_path / "root", {f"{WEBIS}/books/train.review": near})
    with pytest.raises(UserError, match=r"shares \d+ of its 2000 reviews with"):
        eltec.check_documents(root, [eltec.task_reviews(root, 1)], other_corpus=True)


def _edit(run: Path, change) -> None:
    man = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    change(man["extra"])
    (run / "manifest.json").write_text(json.dumps(man, indent=1), encoding="utf-8")


def _peak(factor: float):
    return lambda e: e["peak_memory"].update(bytes=int(e["peak_memory"]["bytes"] * factor))


@pytest.mark.parametrize("edits, reason, rejected", [
    ({"transformers-gpu/pretrained-seed9": _peak(3)},
     r"extra\.peak_memory\.bytes \d+: the 12 runs of its recipe on GPUs in "
     r"transformers-gpu disagree", 12),
    ({"lora-gpu/lora-attn-seed0": _peak(1.5)}, r"disagree on their peak memory", 3),
    # 22b's M-e1: two of three edited alike outvote no one
    ({"transformers-gpu/pretrained-seed10": _peak(3), "transformers-gpu/pretrained-seed11":
      _peak(3)}, r"disagree on their peak memory \(553377792 to 1660133376 bytes\)", 12),
    # 22b's M-e3: the GPU the peak names, moved out of its group
    ({"transformers-gpu/pretrained-seed9": lambda e: (_peak(3)(e), e["peak_memory"].update(
        gpu="NVIDIA A100"))}, r"extra\.peak_memory\.gpu 'NVIDIA A100' is not its device", 1),
    # 22b's M-e5: a CPU run's resident peak, 30 % more
    ({"transformers/pretrained-seed0": lambda e: (_peak(1.3)(e), e["cpu_peak_rss"].update(
        bytes=e["peak_memory"]["bytes"]))}, r"on AMD EPYC in transformers disagree", 3),
    ({"lora-gpu/lora-attn-seed0": lambda e: e.update(time_s=e["time_s"] * 0.85)},
     r"extra\.time_s 114\.8\d* s is not the 135\.\d s between its event files' first", 1),
    # 22b's M-e8: longer, its wall time along (the 80-100 % rule then holds)
    ({"lora-gpu/lora-attn-seed0": lambda e: e.update(time_s=e["time_s"] + 15)},
     r"extra\.time_s 150\.0\d* s is not the 135\.\d s", 1),
])
def test_a_measurement_edited_in_a_manifest_rejects_its_recipes_runs(cache, edits, reason,
                                                                       rejected):
    """Trial 22's M-d1, M-d2 and 22b's M-e: a peak memory or a time, only bounded, moved the
    Transformers and LoRA chapters' tables; the runs of the same recipe on the same device
    model, and each run's own event files, now say what they were."""
    from finetune_lab.runs.registry import discover_runs

    for run, change in edits.items():
        _edit(cache / run, change)
    if "time_s" in reason and "150" in reason:
        man = json.loads((cache / next(iter(edits)) / "manifest.json").read_text())
        man["wall_time_s"] += 15
        (cache / next(iter(edits)) / "manifest.json").write_text(json.dumps(man))
    records = discover_runs(cache)
    bad = [r for r in records if not r.valid and not r.unfinished]
    assert len(bad) == rejected, [(r.key, r.reason) for r in bad]
    assert set(edits) <= {r.key for r in bad}
    assert all(re.search(reason, r.reason) for r in bad if r.key in edits), \
        [r.reason for r in bad]


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


@needs_data_root
@pytest.mark.parametrize("novel", ["FRA00000_Aaa.txt.xz", "FRA00102_Adam.txt.xz"])
def test_the_test_reviews_put_in_as_a_novel_are_refused(tmp_path, novel):
    """22b's D-f: only review files were checked; the books test reviews written as a new novel,
    or in place of a listed one, went into the tokenizer and a pretraining corpus."""
    import lzma

    fake = tmp_path / novel
    from finetune_lab.data.cls_books import read_reviews
    with lzma.open(fake, "wt", encoding="utf-8") as out:
        out.writelines(r.text + "\n" for r in read_reviews(_test_file()))
    root = _root_with(tmp_path / "root", {f"eltec-fra/level1/{novel}": fake})
    shutil.copyfile(fake, root / "eltec-fra" / "level1" / novel)  # a new name too
    tok = _tokenizer(tmp_path / "tok")
    corpus = {"max_novels": 4, "with_reviews": False, "workers": 1}
    with pytest.raises(UserError, match=rf"{novel} is not ELTeC-fra's .*--other-corpus"):
        pretrain_corpus.prepare_pretrain(root, tok, tmp_path / "out", **corpus)
    with pytest.raises(UserError, match=r"shares \d+ of its \d+ reviews with"):
        pretrain_corpus.prepare_pretrain(root, tok, tmp_path / "out", other_corpus=True,
                                         **corpus)
    assert not (tmp_path / "out").exists()
