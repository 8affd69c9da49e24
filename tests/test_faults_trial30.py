"""Fault trial 30, and what check 29b left: a task-adaptive share against a run of one phase
(F9), a temporary folder's name cut by characters (F13), a second element in a review (F14)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from finetune_lab.runs.registry import discover_runs


def _edit(manifest: Path, **hyperparameters: object) -> None:
    man = json.loads(manifest.read_text())
    man["hyperparameters"].update(hyperparameters)
    manifest.write_text(json.dumps(man, indent=2))


@pytest.mark.parametrize("key, share", [
    ("pretrain/cpu-clean-general1", 0.3),  # one general phase, said to be 30 % task-adaptive
    ("pretrain/cpu-long4", 1.0),
    ("pretrain/cpu-tapt2", 0.0),  # one task-adaptive phase, said to be none
    ("pretrain/cpu-tapt3", 0.5),
])
def test_a_task_adaptive_share_that_one_phase_does_not_give_is_rejected(cache, key, share):
    """Check 29b's F9: `tapt_fraction` 0.3 on a run of one general phase stayed valid (only a
    share of 1 was held to the phase's name), and the pretraining tables showed 0.3."""
    _edit(cache / key / "manifest.json", tapt_fraction=share)
    rec = {r.key: r for r in discover_runs(cache)}[key]
    assert not rec.valid
    assert any(f"tapt_fraction {share} does not give its phases" in p for p in rec.problems)


def test_every_committed_share_agrees_with_its_phases():
    """The rule holds for every committed pretraining run (the one-phase runs share 0 or 1)."""
    from finetune_lab.config import PROJECT_ROOT

    judged = [r for r in discover_runs(PROJECT_ROOT / "data" / "runs")
              if r.key.startswith("pretrain/cpu-")]
    assert len(judged) >= 10
    assert not [p for r in judged for p in r.problems if "tapt_fraction" in p]


def test_a_long_multibyte_name_gets_a_temporary_folder_that_fits(tmp_path):
    """Check 29b's F13: `--out` named with 80 three-byte characters (240 bytes, a valid name)
    was refused as "cannot write into ...: File name too long", advice to choose another
    location: its temporary folder took 100 characters of the name, 300 bytes."""
    from finetune_lab._files import atomic_dir

    dest = tmp_path / ("€" * 80)
    with atomic_dir(dest, "prepare-cls") as tmp:
        assert len(tmp.name.encode()) <= 255
        (tmp / "train.review").write_text("new\n")
    assert (dest / "train.review").read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == [dest.name]


@pytest.mark.parametrize("tag, second", [
    ("text", "<text>Une seconde critique, perdue.</text>"),
    ("rating", "<rating>1.0</rating>"),
])
def test_a_second_text_or_rating_in_an_item_is_refused(tmp_path, tag, second):
    """Check 29b's F14: an item with two `<text>` elements was prepared from the first alone,
    the second dropped without a word; a second `<rating>` would have been ignored alike."""
    from test_cls_books import BOOKS, _fake_root, _replace_in_item

    from finetune_lab.data.cls_books import ClsDataError, prepare_cls

    root = _fake_root(tmp_path, _replace_in_item(4, "</item>", f"{second}</item>"))
    with pytest.raises(ClsDataError, match=rf"train\.review: item 4.*2 <{tag}> elements"):
        prepare_cls(root, tmp_path / "out")
    assert not (tmp_path / "out").exists() and (root / BOOKS / "train.review").is_file()


# --- trial 30's R: a run's labels against what its processes recorded ----------------------------

def _change(manifest: Path, change) -> None:
    man = json.loads(manifest.read_text())
    change(man)
    manifest.write_text(json.dumps(man, indent=2))


def _quantized(man: dict) -> None:
    man["hyperparameters"]["quantization"] = {"bnb_4bit_compute_dtype": "bfloat16",
                                              "bnb_4bit_quant_type": "nf4", "load_in_4bit": True}


def _renamed_gpu(man: dict) -> None:
    text = json.dumps(man).replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
    man.clear()
    man.update(json.loads(text))


def _random_as_pretrained(man: dict) -> None:
    man["init"] = "pretrained"
    man["command"][man["command"].index("random")] = "pretrained"


RELABELLED_30 = {
    # a sinusoid run said to be none, and the other way
    "pretrain/cpu-sinpos1": (lambda m: m["hyperparameters"].pop("position_init"),
                             "position_init None, but the run recorded writing 'sinusoidal'"),
    "pretrain/cpu-docbow1": (lambda m: m["hyperparameters"].update(position_init="sinusoidal"),
                             "position_init 'sinusoidal', but"),
    # the long run's phase names swapped
    "pretrain/cpu-long": (lambda m: [p.update(name=n) for p, n in
                                     zip(m["hyperparameters"]["phases"], ("tapt", "general"))],
                          "names 'tapt' the phase that trained on …/pretrain-bin/bin"),
    # LoRA said to be 4-bit, QLoRA said to be not
    "lora/lora-qv-seed0": (_quantized, "but the model its event file logs was loaded with no"),
    "lora-gpu/qlora-qv-seed1": (lambda m: m["hyperparameters"].pop("quantization"),
                                "hyperparameters.quantization None, but"),
    # an ablation's 8 minutes said to be 12
    "pretrain-ablation/fp32-dropout": (lambda m: m["hyperparameters"].update(budget_minutes=12.0),
                                       "budget_minutes 12, but"),
    # an H100 run said to have run on an A100
    "fairseq-gpu/pretrained-seed9": (_renamed_gpu, "its train.log says it trained on "
                                                   "['NVIDIA H100 80GB HBM3']"),
    # a random init said to be pretrained
    "transformers-gpu/random-seed9": (_random_as_pretrained,
                                      "init 'pretrained', but the model its event file logs "
                                      "was initialised at random"),
}


def test_a_run_relabelled_against_what_its_processes_recorded_is_rejected(cache):
    """Trial 30's R-1, R-2, R-3, R-10, R-11, R-12: each relabelling, made across the manifest,
    stayed valid and changed a table; what the processes recorded contradicts each."""
    for key, (change, _why) in RELABELLED_30.items():
        _change(cache / key / "manifest.json", change)
    judged = {r.key: r for r in discover_runs(cache)}
    for key, (_change_it, why) in RELABELLED_30.items():
        assert not judged[key].valid, key
        assert any(why in p for p in judged[key].problems), (key, judged[key].problems)
    assert judged["lora/qlora-qv-seed0"].valid and judged["pretrain/cpu-long2"].valid


def test_the_pretraining_chapter_depends_on_the_prepared_corpus_record():
    """R-15: the chapter described the prepared corpus from its record, which its freeze did
    not count: a changed record left a stale freeze called current."""
    from finetune_lab.book.chapter_inputs import chapter_inputs
    from finetune_lab.config import PROJECT_ROOT

    assert "data/work/pretrain-bin/manifest.json" in chapter_inputs(
        PROJECT_ROOT, "chapters/pretraining.qmd")


def test_a_corpus_prepared_again_is_not_described_as_the_stand_ins(tmp_path, monkeypatch):
    """R-7: `prepare-pretrain --max-novels 2` had the chapter describe two novels as the
    stand-in's corpus. A prepared corpus counts only where the runs trained on it."""
    from finetune_lab.book import pretrain_budget
    from finetune_lab.data.cls_splits import read_summary

    record = read_summary()["pretrain"]
    record["counts"]["train"]["novels"] = 2
    (tmp_path / "bin").mkdir()
    monkeypatch.setattr(pretrain_budget, "default_corpus", lambda: tmp_path)
    from finetune_lab.config import PROJECT_ROOT

    run = PROJECT_ROOT / "data" / "runs" / "pretrain" / "cpu-sinpos1" / "manifest.json"
    ran = next(d["sha256"]["train.bin"] for d in json.loads(run.read_text())["inputs"]["data"])
    for sha, novels in (("0" * 64, "429 ELTeC-fra novels"), (ran, "2 ELTeC-fra novels")):
        (tmp_path / "manifest.json").write_text(json.dumps(
            {**record, "outputs": {"bin/train.bin": sha}}))
        assert pretrain_budget.corpus_description().startswith(novels)


def test_a_fill_mask_answer_that_is_no_piece_of_the_runs_dictionary_is_set_aside(tmp_path):
    """R-9: a candidate's record (its weights not on this machine) answered a word that is in
    no dictionary, and the table showed it; its run trained with the committed dict.txt."""
    import shutil

    from finetune_lab.book.fill_mask import fill_mask_dir, recorded_fill_masks

    shutil.copytree(fill_mask_dir(), tmp_path / "fm")
    record = tmp_path / "fm" / "cpu-sinpos1.json"
    text = record.read_text()
    assert '"predicted piece": "vraiment"' in text
    record.write_text(text.replace('"predicted piece": "vraiment"',
                                   '"predicted piece": "ordinateurquantique"', 1))
    bad: list[str] = []
    assert list(recorded_fill_masks(tmp_path / "fm", set_aside=bad)) == ["cpu-sinpos1-bow"]
    assert len(bad) == 1 and "'ordinateurquantique'" in bad[0] and "dict.txt" in bad[0]


@pytest.mark.parametrize("edit, said", [
    # the novels, and the documents with them
    (lambda d: d["pretrain"]["counts"]["train"].update(novels=329, documents=409),
     "pretrain.counts.train.novels is 329 but ELTeC-fra's 438 novels less the 9"),
    # R-20: the reviews' repetition
    (lambda d: d["pretrain"]["parameters"].update(review_repeat=10),
     "pretrain.counts.train.documents is 509 but pretrain.counts.train.novels 429 + 4 review "
     "files written pretrain.parameters.review_repeat 10 times each gives 469"),
    # an example's piece
    (lambda d: d["examples"][0]["pieces"].__setitem__(4, "\u2581catastrophe"),
     "examples.0 has pieces that do not spell its text"),
    (lambda d: d["examples"][1]["ids"].__setitem__(0, d["examples"][0]["ids"][0]),
     "examples.1 has id 414 for '\u2581In', which names '\u2581Ce' elsewhere"),
])
def test_a_data_summary_edited_against_its_other_facts_is_refused(tmp_path, edit, said):
    """R-8, R-20, R-21: the pretraining corpus's row and the tokenizer's examples showed edited
    counts and pieces that the summary's other facts contradict."""
    from finetune_lab.data.cls_splits import read_summary, summary_path
    from finetune_lab.errors import UserError

    data = json.loads(summary_path().read_text())
    edit(data)
    (tmp_path / "data.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match=re.escape(said)):
        read_summary(tmp_path / "data.json")


# --- trial 30's L: a folder replaced that the command did not make, or lost at the swap ----------

def _legacy(folder: Path, step: str = "prepare-cls") -> Path:
    """A data step's folder as made before output markers: its files, and a manifest listing
    each with its sha256."""
    import hashlib

    folder.mkdir()
    for name in ("train.review", "valid.review"):
        (folder / name).write_text(f"{name}\n")
    (folder / "manifest.json").write_text(json.dumps({"step": step, "outputs": {
        n: hashlib.sha256(f"{n}\n".encode()).hexdigest() for n in ("train.review", "valid.review")}}))
    return folder


@pytest.mark.parametrize("fault", ["edited", "log in a folder of the user's", "none"])
def test_an_old_output_is_replaced_only_as_it_was_made(tmp_path, fault):
    """Trial 30's L-1, L-3: a folder made before markers was recognised by its files' names
    alone, so an edited file, or a user's folder holding a `preprocess.log`, was replaced
    without --force."""
    from finetune_lab._files import check_replaceable
    from finetune_lab.errors import UserError

    dest = _legacy(tmp_path / "cls")
    if fault == "edited":
        (dest / "valid.review").write_text("MY EDIT valid.review\n")
    elif fault != "none":
        (dest / "notes").mkdir()
        (dest / "notes" / "preprocess.log").write_text("my notes\n")
    if fault == "none":
        check_replaceable(dest, "prepare-cls")
    else:
        with pytest.raises(UserError, match="--force"):
            check_replaceable(dest, "prepare-cls")


def test_an_old_conversion_is_replaced_only_as_it_was_made(tmp_path):
    """Trial 30's L-2: a conversion made before markers, its `config.json` edited, was
    replaced: each file must be of the sha256 its `conversion.json` lists."""
    import hashlib

    from finetune_lab.models.conversion_check import converted_output

    conv = tmp_path / "conv"
    conv.mkdir()
    (conv / "config.json").write_text("{}\n")
    (conv / "conversion.json").write_text(json.dumps({"files": {"config.json": {
        "sha256": hashlib.sha256(b"{}\n").hexdigest()}}}))
    assert converted_output(conv)
    (conv / "config.json").write_text('{"mine": 1}\n')
    assert not converted_output(conv)


def test_an_interrupt_at_the_swap_keeps_the_old_folder(tmp_path, monkeypatch):
    """Trial 30's L-4: Ctrl-C delivered during the exchange of `--force` (or just after it)
    found the swap unrecorded, and the old folder, now at the temporary name, was deleted as
    the new. The signal now waits until the swap is recorded; the old folder is kept."""
    import os
    import signal

    from finetune_lab import _files

    real = _files._swap

    def swap_then_interrupted(a, b):
        done = real(a, b)
        os.kill(os.getpid(), signal.SIGINT)  # as if it came at the end of the system call
        return done

    monkeypatch.setattr(_files, "_swap", swap_then_interrupted)
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("my thesis notes")
    with pytest.raises(KeyboardInterrupt):
        with _files.atomic_dir(dest, "prepare-cls", force=True) as tmp:
            (tmp / "train.review").write_text("new\n")
    kept = [p for p in tmp_path.rglob("notes.txt")]
    assert [p.read_text() for p in kept] == ["my thesis notes"]


def test_an_old_folder_a_killed_command_left_is_never_cleared_as_half_written(tmp_path):
    """Trial 30's L-5: SIGKILL between the swap and keeping the old folder left it under the
    temporary name, and the next write removed it as an interrupted command's half-written
    output. The old folder never has that name now."""
    import subprocess
    import sys
    import textwrap

    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("my thesis notes")
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from finetune_lab import _files
        _files._drop_old = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        with _files.atomic_dir(Path({str(dest)!r}), "prepare-cls", force=True) as tmp:
            (tmp / "train.review").write_text("new\\n")
    """)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, check=False)
    assert ran.returncode == -9, ran.stderr
    from finetune_lab._files import atomic_dir

    with atomic_dir(dest, "prepare-cls", force=True) as tmp:
        (tmp / "train.review").write_text("newer\n")
    assert [p.read_text() for p in tmp_path.rglob("notes.txt")] == ["my thesis notes"]


def test_a_record_folder_that_is_a_link_is_refused(tmp_path, monkeypatch):
    """Trial 30's L-9: `data/summaries/fill-mask` made a link to a folder elsewhere, and the
    record was written there, through it."""
    from finetune_lab import config
    from finetune_lab.errors import UserError

    project = tmp_path / "project"
    monkeypatch.setattr(config, "PROJECT_ROOT", project)
    (tmp_path / "elsewhere").mkdir()
    (project / "data" / "summaries").mkdir(parents=True)
    (project / "data" / "summaries" / "fill-mask").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match=r"fill-mask is a link .*put the folder back"):
        config.check_new_record(project / "data" / "summaries" / "fill-mask" / "x.json",
                                "a record")
    config.check_new_record(project / "data" / "summaries" / "x.json", "a record")


def test_a_superseded_folder_that_is_a_link_is_refused_and_the_run_stays(tmp_path):
    """Trial 30's L-8: `data/runs/.superseded` as a link moved a replaced run out of the
    project."""
    from finetune_lab.errors import UserError
    from finetune_lab.runs.recording import SUPERSEDED, set_aside

    run = tmp_path / "runs" / "fairseq" / "random-seed0"
    run.mkdir(parents=True)
    (run / "train.log").write_text("a run\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "runs" / SUPERSEDED).symlink_to(tmp_path / "out")
    with pytest.raises(UserError, match=r"\.superseded is a link"):
        set_aside(run)
    assert (run / "train.log").read_text() == "a run\n" and not any((tmp_path / "out").iterdir())


# --- trial 30's E: tracebacks ---------------------------------------------------------------------

HOOK = """
import os, signal, sys
class _Hook:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["AT"] and signal.getsignal(SIG) not in (signal.SIG_DFL, None):
            sys.meta_path.remove(self)
            os.kill(os.getpid(), SIG)
        return None
SIG = getattr(signal, os.environ["SIG"])
sys.meta_path.insert(0, _Hook())
"""


@pytest.mark.parametrize("at, sig, code", [
    ("datetime", "SIGTERM", 143),  # E-10: inside numpy's C import, once the handlers are set
    ("finetune_lab.config", "SIGINT", 130),  # E-11: Ctrl-C before the command's main runs
])
def test_a_signal_while_the_modules_load_is_one_line(tmp_path, at, sig, code):
    """Trial 30's E-10, E-11: SIGTERM while numpy imported gave its "bad install" traceback
    and exit 1, and Ctrl-C before `main` set its handlers a KeyboardInterrupt traceback. A
    signal now waits until the modules have loaded, then stops the command as ever."""
    import os
    import subprocess
    import sys

    from finetune_lab.config import PROJECT_ROOT

    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    env = {**os.environ, "AT": at, "SIG": sig,
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "hook"), str(PROJECT_ROOT / "src")])}
    ran = subprocess.run(
        [sys.executable, "-c", "import sys, finetune_lab; sys.argv = ['finetune-lab', 'params']; "
                               "sys.exit(finetune_lab.main())"],
        env=env, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert (ran.returncode, ran.stderr) == (code, "finetune-lab params: interrupted\n")


def test_bad_arguments_and_inputs_of_trial_30_are_one_line(tmp_path, capsys):
    """E-18, E-19, E-21, E-12, E-14: a port, a rank, a seed, a worker count and a Python
    version no command can use were taken, and failed later with another program's traceback
    (or hung); E-16, E-17: a damaged model folder for lora-qa; E-20: an empty split."""
    from finetune_lab.cli import main

    model = tmp_path / "model"
    model.mkdir()
    for argv, said in [
        (["pretrain", "--master-port", "99999", "--run", "x"], "--master-port: must be at most 65535"),
        (["pretrain", "--nnodes", "2", "--node-rank", "5", "--run", "x"], "--node-rank 5 is not below --nnodes 2"),
        (["train-tokenizer", "--seed", "4294967296"], "--seed: must be at most 4294967295"),
        (["binarize-cls", "--workers", "100000"], "--workers: must be at most 256"),
        (["gpu-bundle", "--python", "3"], "--python: must be a Python version such as 3.12"),
    ]:
        with pytest.raises(SystemExit) if "--node-rank" not in argv else _no_exit():
            assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, (argv, err)
    for text, said in [('{"model_type": "bloom", ', "config.json is damaged"),
                       ("[1]", "is not a model configuration")]:
        (model / "config.json").write_text(text)
        assert main(["lora-qa", "--model", str(model), "--max-steps", "1",
                     "--runs-root", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    (model / "config.json").write_text('{"model_type": "bloom"}')
    assert main(["lora-qa", "--model", str(model), "--max-steps", "1",
                 "--runs-root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "cannot load the tokenizer" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def _no_exit():
    import contextlib

    return contextlib.nullcontext()


def test_an_empty_split_is_refused_before_binarizing(tmp_path):
    """E-20: an empty `valid.review` and `valid.label` were binarized into an empty
    `valid.bin`, which fairseq then could not read (its traceback, relayed)."""
    from finetune_lab.data.cls_books import ClsDataError, check_same_length

    (tmp_path / "valid.review").write_text("")
    (tmp_path / "valid.label").write_text("")
    with pytest.raises(ClsDataError, match=r"valid\.review is empty"):
        check_same_length(tmp_path / "valid.review", 0, tmp_path / "valid.label", 0)


# --- check 30b: what the checks of trial 30 still let through ------------------------------------

@pytest.mark.parametrize("edit, said", [
    (lambda d: d["pretrain"]["valid_documents"].__setitem__(0, "eltec-fra/level1/FRA99999_X.txt.xz"),
     "names a novel twice or not ELTeC-fra's"),
    (lambda d: d["pretrain"]["valid_documents"].__setitem__(1, d["pretrain"]["valid_documents"][0]),
     "names a novel twice or not ELTeC-fra's"),
    (lambda d: (d["pretrain"]["parameters"].update(with_reviews=False),
                d["pretrain"]["counts"]["train"].update(documents=429)),
     "pretrain.counts.valid1 holds reviews, but with_reviews is off"),
])
def test_a_corpus_record_edited_against_its_own_lists_is_refused(tmp_path, edit, said):
    """Check 30b's 30b-9, 30b-10: a held-out novel ELTeC-fra does not hold (or one named twice),
    and reviews said to be left out of a corpus that holds them, were shown."""
    from finetune_lab.data.cls_splits import read_summary, summary_path
    from finetune_lab.errors import UserError

    data = json.loads(summary_path().read_text())
    edit(data)
    (tmp_path / "data.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match=re.escape(said)):
        read_summary(tmp_path / "data.json")


def test_a_sinusoid_run_relabelled_as_keep_in_both_places_is_rejected(cache):
    """Check 30b's 30b-4: `keep` in `hyperparameters` and in `extra.position_init` alike, the
    written table's sha256 and cosines left: no run records `keep` with a table."""
    def keep(man: dict) -> None:
        man["hyperparameters"]["position_init"] = "keep"
        man["extra"]["position_init"]["position_init"] = "keep"

    _change(cache / "pretrain/cpu-sinpos1/manifest.json", keep)
    rec = {r.key: r for r in discover_runs(cache)}["pretrain/cpu-sinpos1"]
    assert not rec.valid and any("with the table's sha256" in p for p in rec.problems)


def test_a_model_file_cut_short_is_one_line(monkeypatch):
    """Check 30b's 30b-12: lora-qa with a `model.safetensors` cut short printed safetensors'
    traceback."""
    import transformers
    from safetensors import SafetensorError

    from finetune_lab.errors import UserError
    from finetune_lab.train import lora_qa

    def cut(*_args, **_kwargs):
        raise SafetensorError("Error while deserializing header: incomplete metadata")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", cut)
    plan = lora_qa.Plan(use_4bit=False, optim="adamw_torch", mixed_precision="no", device="cpu")
    with pytest.raises(UserError, match="cannot load model 'm' \\(Error while deserializing"):
        lora_qa.load_model("m", plan)


@pytest.mark.parametrize("key", ["pretrain/cpu-sinpos1", "pretrain/cpu-tapt1"])
def test_a_token_budget_the_updates_do_not_give_is_rejected(cache, key):
    """Check 30b's 30b-5: `budget_tokens` doubled alone stayed valid, and the chapter printed a
    budget of 24.0 M tokens for 2,930 updates of 4,096 tokens."""
    _change(cache / key / "manifest.json",
            lambda m: m["hyperparameters"].update(budget_tokens=2 * m["hyperparameters"]["budget_tokens"]))
    rec = {r.key: r for r in discover_runs(cache)}[key]
    assert not rec.valid and any("updates of 4,096 tokens" in p for p in rec.problems)


def test_an_answer_given_twice_where_one_piece_shows_so_is_set_aside(tmp_path):
    """Check 30b's 30b-11: rank 2's answer made rank 1's ("vraiment" twice in one top 5) was
    shown; only two pieces that show alike (`▁,` and `,`) can both be answered."""
    import shutil

    from finetune_lab.book.fill_mask import fill_mask_dir, recorded_fill_masks

    shutil.copytree(fill_mask_dir(), tmp_path / "fm")
    record = tmp_path / "fm" / "cpu-sinpos1-bow.json"
    data = json.loads(record.read_text())
    data["predictions"][1]["predicted piece"] = data["predictions"][0]["predicted piece"]
    record.write_text(json.dumps(data))
    bad: list[str] = []
    assert list(recorded_fill_masks(tmp_path / "fm", set_aside=bad)) == ["cpu-sinpos1"]
    assert len(bad) == 1 and "2 times, more than the pieces that show so" in bad[0]


def test_a_model_folder_without_readable_weights_makes_no_run(tmp_path):
    """Check 30b's 30b-13: a `--model` folder without weights (or with a file cut short) was
    refused by the loader inside the run, which left a failed run that blocked the retry."""
    from safetensors.numpy import save_file

    from finetune_lab.errors import UserError
    from finetune_lab.train.lora_qa import check_weights

    with pytest.raises(UserError, match="holds no weights"):
        check_weights(tmp_path)
    import numpy as np

    save_file({"w": np.zeros((64, 64), dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    check_weights(tmp_path)
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="model.safetensors cannot be read"):
        check_weights(tmp_path)
