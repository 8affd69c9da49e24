"""The registry is the one gate between the run cache and the book (issue 35, items 2, 6-10).

A run the registry rejects (a copy in another experiment, deleted event folders, a manifest of
the wrong shape, a damaged ``experiment.json``) must change no table, figure or sentence, and a
damaged file makes its own run (or experiment) invalid with a reason, never an exception
elsewhere. The book functions the chapters call are run on a temporary copy of the committed
run cache, before and after the damage.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from conftest import link_events
from finetune_lab.book import fairseq_report as fr
from finetune_lab.book import hf_compare
from finetune_lab.book import lora_cls_report, lora_cls_runs
from finetune_lab.book import pretrain_plateau as pp
from finetune_lab.book import pretrain_candidates as pc
from finetune_lab.book.pretrain_budget import pretrain_budget
from finetune_lab.config import PROJECT_ROOT, RUNS_DIR_ENV
from finetune_lab.models import trust
from finetune_lab.runs.reading import one_reading, reads_once
from finetune_lab.runs.registry import discover_runs

COMMITTED = PROJECT_ROOT / "data" / "runs"


def _frames(root: Path, values: dict[str, Any]) -> dict[str, str]:
    """Every output as text (the runs root's own path left out), so that two runs of the book
    compare exactly."""
    out = {}
    for key, value in values.items():
        if isinstance(value, pd.DataFrame):
            with pd.option_context("display.max_rows", None, "display.max_columns", None,
                                   "display.width", 10_000, "display.max_colwidth", None):
                value = value.to_string()
        out[key] = str(value).replace(str(root), "<runs>")
    return out


@reads_once  # the store judged once per call, as one render's cache does
def fairseq_chapter(root: Path) -> dict[str, str]:
    """What the fairseq chapter shows from the runs (the exclusion list aside)."""
    res = fr.load_results(root)
    return _frames(root, {
        "best": fr.best_epoch_table(res), "seeds": fr.seed_table(res),
        "comparison": fr.comparison_table(res), "by epoch": fr.test_by_epoch_table(res),
        "speed": fr.speed_table(res), "layout": fr.layout_speeds(res, root),
        "gap": fr.gap_markdown(res), "results": fr.results_markdown(res),
        "speed text": fr.speed_markdown(res), "budget": pretrain_budget(root)})


@reads_once
def transformers_chapter(root: Path) -> dict[str, str]:
    comp = hf_compare.load_comparison(root)
    return _frames(root, {"per seed": hf_compare.per_seed_table(comp),
                    "seeds": hf_compare.seed_table(comp), "time": hf_compare.time_table(comp),
                    "gaps": hf_compare.framework_gaps(comp),
                    "present": comp.present})


@reads_once
def pretraining_chapter(root: Path) -> dict[str, str]:
    """The pretraining chapter's inputs from the runs: the budget and lineage read from the
    packaged checkpoint's run, the runs whose fields its tables may read (valid or unfinished:
    the plateau and long-run tables), the candidates' fine-tuned sources."""
    records = pp.all_pretraining_runs(root)
    return _frames(root, {"budget": pretrain_budget(root),
                          "readable": sorted(r.key for r in records if r.manifest is not None),
                          "used": sorted(r.key for r in records if r.valid),
                          "tuned": sorted(pc.fine_tuned_sources(root))})


@reads_once
def lora_chapter(root: Path) -> dict[str, str]:
    loaded = lora_cls_runs.cached_runs(root)
    return _frames(root, {"results": lora_cls_report.results_table(loaded),
                    "used": sorted(r.key for r in loaded.used)})


CHAPTERS: dict[str, Callable[[Path], dict[str, str]]] = {
    "fairseq": fairseq_chapter, "transformers": transformers_chapter,
    "pretraining": pretraining_chapter, "lora": lora_chapter}


def plant_copies(root: Path) -> list[str]:
    """Copy a run of another experiment into every experiment (fairseq/random-seed0, or into
    fairseq itself a candidate's run): each copy is rejected (its manifest names another
    folder), so nothing may change."""
    planted = []
    for exp in sorted(p for p in root.iterdir() if p.is_dir()):
        source = root / ("fairseq-candidate/pretrained-seed0" if exp.name == "fairseq"
                         else "fairseq/random-seed0")
        dest = exp / (f"copy-{source.name}" if (exp / source.name).exists() else source.name)
        shutil.copytree(source, dest)
        planted.append(f"{exp.name}/{dest.name}")
    return planted


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_a_rejected_copy_changes_nothing(cache: Path, chapter: str) -> None:
    """Issue 35 item 2: `cp -r fairseq/random-seed0 transformers/random-seed0` moved the
    fairseq chapter's machine-layout table (Intel 2x1 went from 2 runs to 4)."""
    before = CHAPTERS[chapter](cache)
    planted = plant_copies(cache)
    bad = {r.key: r for r in discover_runs(cache) if not r.valid}
    assert set(planted) <= set(bad), "every planted copy must be rejected by the registry"
    assert CHAPTERS[chapter](cache) == before


def test_a_damaged_run_counts_as_absent(cache: Path, tmp_path: Path) -> None:
    """Issue 35 item 2: random-seed1 with its event folders deleted and wall_time_s = 60000
    moved the 1x1 median from 31.9 to 38.2 min. A rejected run must weigh exactly as much as
    a run that is not there."""
    run = cache / "fairseq" / "random-seed1"
    gone = tmp_path / "gone"
    shutil.copytree(cache, gone, copy_function=link_events)
    shutil.rmtree(gone / "fairseq" / "random-seed1")
    for sub in [p for p in run.iterdir() if p.is_dir()]:
        shutil.rmtree(sub)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "wall_time_s": 60000.0}))
    assert fairseq_chapter(cache) == fairseq_chapter(gone)


# --- one bad file: its own run (or experiment) invalid, with a reason; nothing raises -------


def _edit(field: str, value: Any) -> Callable[[dict], Any]:
    return lambda m: {**m, field: value}


def _device(m: dict) -> dict:
    return {**m, "device": "H100"}


DAMAGES: dict[str, tuple[Callable[[dict], Any] | str, str]] = {
    # name: (how the manifest changes, or its raw text; what the reason names)
    "outputs a list": (_edit("outputs", ["train/events"]), "outputs"),
    "outputs empty list": (_edit("outputs", []), "outputs"),
    "manifest a list": (lambda m: [], "JSON object"),
    "time in words": (_edit("start_time", "sometime last tuesday"), "start_time"),
    "end time in words": (_edit("end_time", "2026-13-45T99:00:00+00:00"), "end_time"),
    "huge seed": (_edit("seed", 10 ** 40), "out of range"),
    "negative seed": (_edit("seed", -1), "seed"),
    "device a name": (_device, "device"),
    "unknown device type": (_edit("device", {"type": "tpu", "name": "x"}), "device.type"),
    "threads zero": (_edit("device", {"type": "cpu", "name": "x", "threads": 0}),
                     "device.threads"),
    "wall time negative": (_edit("wall_time_s", -5.0), "wall_time_s"),
    "wall time NaN": ('"wall_time_s": NaN', "NaN"),
    "wall time overflow": ('"wall_time_s": 1e400', "out of range"),
    "unknown framework": (_edit("framework", "jax"), "framework"),
    "updates a text": (lambda m: {**m, "hyperparameters": {**m["hyperparameters"],
                                                           "total_updates": "many"}},
                       "total_updates"),
    "throughput a text": (_edit("throughput", {"updates_per_s": "fast"}), "throughput"),
    # the second fault trial: each was listed ok, and moved a table
    "init against the folder": (_edit("init", "pretrained"), "contradict its folder name"),
    "seed against the folder": (_edit("seed", 1), "contradict its folder name"),
    "seed a float": (_edit("seed", 0.0), "is not an integer"),
    "complete with exit 1": (_edit("exit_code", 1), "exited with code 1"),
    "complete in no time": (_edit("wall_time_s", 0), "no run takes no time"),
}


def damage(run: Path, how: Callable[[dict], Any] | str) -> None:
    path = run / "manifest.json"
    text = path.read_text()
    if isinstance(how, str):  # raw JSON that Python's parser accepts but no number is
        key = how.split(":")[0]
        start = text.index(key)
        end = text.index("\n", start)
        text = text[:start] + how + ("," if text[end - 1] == "," else "") + text[end:]
    else:
        text = json.dumps(how(json.loads(text)))
    path.write_text(text)


FOLDER_BOUND = ("init against the folder", "seed against the folder", "seed a float")
"""Damages that contradict (or not) a folder's name: given to random-seed0 and the seed-0 runs."""


def _damaged_runs(root: Path) -> dict[str, str]:
    """Each damage of :data:`DAMAGES` to a run of its own among the fairseq recipe's runs (the
    grid's and the candidates'), by run key: one store judged once for all of them."""
    runs = [p for p in sorted(root.glob("fairseq*/*-seed*/")) if p.parent.name != "fairseq-gpu"]
    runs.sort(key=lambda p: (p.name != "random-seed0", not p.name.endswith("-seed0")))
    order = [*FOLDER_BOUND, *sorted(set(DAMAGES) - set(FOLDER_BOUND))]
    assert len(runs) >= len(order)
    return {f"{run.parent.name}/{run.name}": name for run, name in zip(runs, order)}


def test_a_damaged_manifest_rejects_its_run_only(cache: Path) -> None:
    """Issue 35 items 6, 8, 9, 10: outputs as a list crashed trust.manifest_hashes; a start
    time in words (DateParseError) and a seed of 10**40 (OverflowError) passed the schema and
    crashed the fairseq chapter; device "H100" was BAD yet read by runspeed.device_threads.
    Each damage to a run of its own, in one store (issue 36: one judgement, not 22)."""
    damaged = _damaged_runs(cache)
    for key, name in damaged.items():
        damage(cache / key, DAMAGES[name][0])
    with one_reading():  # the store judged once for the records, the results and the chapter
        records = {r.key: r for r in discover_runs(cache)}
        for key, name in damaged.items():
            rec = records[key]
            assert not rec.valid and DAMAGES[name][1] in rec.reason, (name, rec.reason)
            assert rec.manifest is None, f"{name}: a rejected run's fields must not be readable"
        assert all(r.valid or r.unfinished for k, r in records.items() if k not in damaged), [
            (k, r.reason) for k, r in records.items() if k not in damaged and not r.valid]
        res = fr.load_results(cache)
        assert not set(damaged) & {r.key for r in res.loaded.used}
        fairseq_chapter(cache)  # nothing raises
    trust.manifest_hashes([cache / key / "manifest.json" for key in damaged])  # nor the trust list


def test_a_damaged_experiment_config_rejects_its_experiment_only(
        cache: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 35 item 7: a truncated lora/experiment.json made `runs` exit 2 listing nothing and
    broke the unrelated fairseq chapter."""
    from finetune_lab.cli import main

    before = fairseq_chapter(cache)
    (cache / "lora" / "experiment.json").write_text('{"hyperparameters": {')
    records = discover_runs(cache)
    lora = [r for r in records if r.experiment == "lora"]
    assert lora and all(not r.valid and "experiment.json" in r.reason for r in lora)
    assert all(r.valid or r.unfinished for r in records if r.experiment == "fairseq")
    assert fairseq_chapter(cache) == before
    loaded = lora_cls_runs.cached_runs(cache)
    assert loaded is not None and not [r for r in loaded.used if r.experiment == "lora"]
    assert "experiment.json" in lora_cls_report.state_markdown(loaded)
    lora_cls_report.gaps_table(loaded)
    assert main(["runs", "--root", str(cache), "--no-inputs"]) == 0
    out = capsys.readouterr().out
    assert "BAD lora/lora-qv-seed0" in out and "ok  fairseq/random-seed0" in out


# --- issue 35 item 5: no machine's paths in what is committed --------------------------------

MACHINE_PATH = re.compile(r"(?<![\w.~-])/(work|home|tmp|root|opt|Users|var|mnt|srv|scratch)/")
"""An absolute path of some machine (``/work/main/.venv/bin/python``, ``/tmp/x``)."""


def _committed(*patterns: str) -> list[Path]:
    """Files git tracks under the patterns (those on disk when this is no git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(PROJECT_ROOT), "ls-files", "-z", "--", *patterns],
                             capture_output=True, check=True).stdout.decode()
        files = [PROJECT_ROOT / f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = [p for pat in patterns for p in PROJECT_ROOT.glob(pat)]
    return [f for f in files if f.is_file()]


def _machine_paths(files: list[Path]) -> list[str]:
    found = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a figure as PNG: no text to show a path
        found += [f"{f.relative_to(PROJECT_ROOT)}: ...{text[max(0, m.start() - 30):m.end() + 30]!r}"
                  for m in list(MACHINE_PATH.finditer(text))[:1]]
    return found


def test_committed_manifests_record_no_machine_path() -> None:
    """All 60 committed manifests recorded /work/main/.venv/bin/python and
    /work/main/data/work/... in `command` and `environment.executable`."""
    files = _committed("data/runs/**/manifest.json", "data/runs/*/experiment.json",
                       "data/checkpoints/**/manifest.json", "data/summaries/**/*.json")
    assert len(files) >= 60
    assert _machine_paths(files) == []


def test_the_frozen_book_shows_no_machine_path() -> None:
    """The published data chapter printed the checkout's absolute path. (Fails until _freeze/
    is rendered again from manifests and chapters that record none.)"""
    assert _machine_paths(_committed("_freeze/**")) == []


def test_a_recorded_run_stores_its_command_relative_to_the_project(tmp_path: Path) -> None:
    """New manifests name the interpreter `python` (its version beside it) and every path in
    the checkout relative to its root; the process still runs with the real paths."""
    from finetune_lab.runs.portable import portable_command
    from finetune_lab.runs.recording import record_run

    data = PROJECT_ROOT / "data" / "work" / "cls-books-bin"
    script = Path(sys.executable).parent / "finetune-lab"
    assert portable_command([sys.executable, "-m", "x", data, f"--dir={data}", script, "rel"]) \
        == ["python", "-m", "x", "data/work/cls-books-bin", "--dir=data/work/cls-books-bin",
            "finetune-lab", "rel"]
    with record_run("exp", "r", framework="fairseq", init="random", seed=0,
                    hyperparameters={}, runs_root=tmp_path,
                    command=[sys.executable, "-m", "x", str(data)]) as handle:
        handle.run([sys.executable, "-c", "pass", str(PROJECT_ROOT / "data")])
    manifest = json.loads((tmp_path / "exp" / "r" / "manifest.json").read_text())
    assert manifest["command"] == ["python", "-c", "pass", "data"]
    assert manifest["environment"]["executable"] == "python"
    assert manifest["environment"]["python"] == platform.python_version()


def test_migrating_an_old_manifest_keeps_it_valid(tmp_path: Path, monkeypatch) -> None:
    """The committed manifests were rewritten by `python -m finetune_lab.runs.portable`: another
    machine's checkout root (read off the paths themselves) is dropped, nothing the registry
    checks changes."""
    from finetune_lab.runs.portable import migrate

    root = tmp_path / "runs"
    shutil.copytree(COMMITTED / "fairseq" / "random-seed0", root / "fairseq" / "random-seed0",
                    copy_function=link_events)
    path = root / "fairseq" / "random-seed0" / "manifest.json"
    old = json.loads(path.read_text())
    old["command"] = ["/srv/ck/.venv/bin/python", "-m", "fairseq_cli.train",
                      "/srv/ck/data/work/cls-books-bin", "--tensorboard-logdir",
                      "/srv/ck/data/runs/fairseq/random-seed0"]
    old["environment"]["executable"] = "/srv/ck/.venv/bin/python3.11"
    path.write_text(json.dumps(old))
    assert migrate([path]) == [path]
    new = json.loads(path.read_text())
    assert new["command"] == ["python", "-m", "fairseq_cli.train", "data/work/cls-books-bin",
                              "--tensorboard-logdir", "data/runs/fairseq/random-seed0"]
    assert new["environment"]["executable"] == "python"
    assert {k: v for k, v in new.items() if k not in ("command", "environment")} == \
        {k: v for k, v in old.items() if k not in ("command", "environment")}
    (rec,) = discover_runs(root, check_inputs=False)
    assert rec.valid, rec.reason


# --- issue 35 items 12-13: a damaged or hostile checkpoint, in one line ----------------------


def test_a_truncated_checkpoint_listed_by_its_manifest_is_one_line(tmp_path: Path, capsys
                                                                   ) -> None:
    """A model.pt cut short, whose manifest hash was updated to match: fill-mask raised
    torch's RuntimeError (PytorchStreamReader failed ...) as a traceback."""
    from finetune_lab._files import sha256_file
    from finetune_lab.book import fill_mask
    from finetune_lab.cli import main
    from finetune_lab.errors import UserError

    committed = PROJECT_ROOT / "data" / "checkpoints" / "roberta-small-fr"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in ("dict.txt", "sentencepiece.bpe.model"):
        shutil.copyfile(committed / name, folder / name)
    with open(committed / "model.pt", "rb") as src:
        (folder / "model.pt").write_bytes(src.read(1 << 20))
    files = {n: {"sha256": sha256_file(folder / n)} for n in ("model.pt", "dict.txt")}
    (folder / "manifest.json").write_text(json.dumps({"files": files}))
    # the book's own records name weights inside the project (trial 16's CF-v2): weights in
    # a temporary folder are recorded beside them
    with pytest.raises(UserError, match="model.pt cannot be read: the file is damaged or cut "
                                        "short"):
        fill_mask.record_fill_mask(folder, "cut", out_dir=tmp_path / "records")
    assert main(["fill-mask", "--checkpoint", str(folder), "--name", "cut"]) == 2
    assert "lies outside the project" in capsys.readouterr().err


class _RunsCode:
    """What a hostile pickle holds: a call made while it is loaded."""

    def __reduce__(self):
        return (os.getpid, ())


def test_a_checkpoint_holding_code_is_refused_without_torch_advice(tmp_path: Path) -> None:
    """torch's refusal advised "Re-running torch.load with weights_only set to False will
    likely succeed": the one thing a user must not do with a file that runs code."""
    import torch

    from finetune_lab.errors import UserError
    from finetune_lab.models.trust import load_trusted

    path = tmp_path / "model.pt"
    torch.save({"model": {}, "hook": _RunsCode()}, path)
    with pytest.raises(UserError) as info:
        load_trusted(path, trust=True)
    text = str(info.value)
    assert "holding code" in text and "getpid" in text
    assert "weights_only" not in text and "False" not in text


def test_an_infinite_token_budget_is_one_line(capsys) -> None:
    """`pretrain --tokens 1e400 --run x` reached the trainer as an OverflowError."""
    from finetune_lab.cli import main

    with pytest.raises(SystemExit) as info:
        main(["pretrain", "--tokens", "1e400", "--run", "x"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--tokens: must be a finite number, not 1e400" in err


# --- issue 35 item 14: messages and exit codes that mislead ----------------------------------


@pytest.mark.parametrize("strict", [[], ["--strict"]])
@pytest.mark.parametrize("what", ["missing", "a file"])
def test_runs_under_a_root_that_is_not_there_fails(tmp_path: Path, capsys, strict, what) -> None:
    """`runs --root <missing folder>` (even --strict) said "no runs" and exited 0."""
    from finetune_lab.cli import main

    root = tmp_path / "nope"
    if what == "a file":
        root.write_text("")
    assert main(["runs", "--root", str(root), *strict]) == 2
    err = capsys.readouterr().err
    assert f"runs root {root}" in err and ("does not exist" in err or "is a file" in err)


def test_an_empty_root_or_a_missing_runs_dir_in_the_environment_fails(tmp_path: Path, capsys,
                                                                     monkeypatch) -> None:
    """`runs --root ""` listed the project's root; FINETUNE_LAB_RUNS_DIR naming a missing
    folder said "no runs" and exited 0, where --root naming it exits 2."""
    from finetune_lab.cli import main

    assert main(["runs", "--root", ""]) == 2
    assert "--root is empty" in capsys.readouterr().err
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "nope"))
    assert main(["runs"]) == 2
    assert f"runs root {tmp_path / 'nope'} does not exist" in capsys.readouterr().err


def test_a_full_disk_names_the_file(tmp_path: Path, monkeypatch, capsys) -> None:
    """A full disk said "cannot write a file: No space left on device", with no path."""
    import errno

    from finetune_lab.cli import main
    from finetune_lab.runs import manifest as mf

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mf, "write_json_atomic", full)
    with pytest.raises(OSError) as info:
        mf.write_manifest(tmp_path / "run", {"status": "running"})
    assert info.value.filename == str(tmp_path / "run" / "manifest.json")

    def fails(_args):
        raise info.value

    monkeypatch.setattr("finetune_lab.runs.runs_cli._cmd_runs", fails)
    monkeypatch.setattr("finetune_lab.runs.runs_cli.add_parser", _runs_parser(fails))
    assert main(["runs"]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {tmp_path / 'run' / 'manifest.json'}: No space left" in err


def _runs_parser(func):
    def add_parser(sub):
        sub.add_parser("runs").set_defaults(func=func)
    return add_parser


def test_a_read_only_checkout_is_not_told_to_move_the_work_dir(tmp_path: Path, monkeypatch,
                                                              capsys) -> None:
    """`freeze pre-render` in a read-only checkout failed on .quarto/ and advised setting
    FINETUNE_LAB_WORK_DIR, which would not help."""
    import errno

    from finetune_lab import render_cache
    from finetune_lab.cli import fault_advice, main

    (tmp_path / "index.qmd").write_text("---\ntitle: Home\n---\n")
    (tmp_path / "_quarto.yml").write_text("project:\n  type: book\n")
    cache = render_cache.cache_dir(tmp_path)

    def read_only(project=None):
        raise PermissionError(errno.EROFS, "Read-only file system", str(cache))

    monkeypatch.setattr(render_cache, "open_cache", read_only)
    assert main(["freeze", "pre-render", "--project", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(cache) in err and "FINETUNE_LAB_WORK_DIR" not in err and "writable copy" in err
    work = PROJECT_ROOT / "data" / "work" / "x"
    assert "FINETUNE_LAB_WORK_DIR" in fault_advice(errno.EROFS, str(work))


def test_a_run_folder_that_cannot_be_read_is_rejected_alone(cache: Path, capsys,
                                                            monkeypatch) -> None:
    """A folder name that is not UTF-8 crashed `runs` and the chapters (tensorboard encodes
    the path strictly); an input path of /proc/1 ended the whole listing with "cannot write";
    an unreadable event file gave two chained tracebacks. Each is now its own run's problem."""
    from finetune_lab.cli import main
    from finetune_lab.runs import registry

    before = fairseq_chapter(cache)
    odd = cache / "fairseq" / os.fsdecode(b"copy\xffseed0")
    shutil.copytree(cache / "fairseq" / "random-seed0", odd, copy_function=link_events)
    run = cache / "fairseq" / "random-seed1"
    man = json.loads((run / "manifest.json").read_text())
    man["inputs"]["data"] = [{"path": "/proc/1", "sha256": {"x": "0" * 64}}]
    (run / "manifest.json").write_text(json.dumps(man))
    whole = cache / "fairseq" / "pretrained-seed1"  # an input "folder" that is the whole disk
    man = json.loads((whole / "manifest.json").read_text())
    man["inputs"]["data"] = [{"path": "/", "sha256": {"x": "0" * 64}}]
    (whole / "manifest.json").write_text(json.dumps(man))
    unreadable = next((cache / "fairseq" / "random-seed2").rglob("events.out.tfevents.*"))
    checked = registry.checked_events

    def refuse(path: Path):
        if path == unreadable:
            raise PermissionError(13, "Permission denied", os.fsencode(path))
        return checked(path)

    monkeypatch.setattr(registry, "checked_events", refuse)
    records = {r.key: r for r in discover_runs(cache)}
    assert "not UTF-8" in records["fairseq/copy\\xffseed0"].reason
    assert "/proc/1/cwd cannot be read" in records["fairseq/random-seed1"].reason
    assert "no data folder" in records["fairseq/pretrained-seed1"].reason
    assert "cannot be read: Permission denied" in records["fairseq/random-seed2"].reason
    assert records["fairseq/random-seed0"].valid
    assert main(["runs", "--root", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "BAD fairseq/copy\\xffseed0" in out and "ok  fairseq/pretrained-seed0" in out
    fairseq_chapter(cache)  # nothing raises
    monkeypatch.setattr(registry, "checked_events", checked)
    shutil.rmtree(odd)
    assert fairseq_chapter(cache) != before  # three runs are still rejected


def test_a_refused_read_is_one_line_that_does_not_say_write(monkeypatch, capsys) -> None:
    """A PermissionError whose file name is bytes (tensorboard's) made the CLI's own message
    raise a TypeError; and a refused read was told as "cannot write"."""
    from finetune_lab import cli

    def refused(_args):
        raise PermissionError(13, "Permission denied", b"/somewhere/events.out")

    parser = cli.build_parser()
    args = parser.parse_args(["user-dir"])
    monkeypatch.setattr(cli, "build_parser", lambda *_: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv=None: (setattr(args, "func", refused),
                                                                 args)[1])
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read or write /somewhere/events.out" in err


@pytest.mark.parametrize("text, says", [
    (None, "not JSON"),  # cut to its first 300 bytes
    ("[]", "not a JSON object"),
    ('{"files": {}, "lineage": "abc"}', "lineage is not a list"),
    ('{"files": {}, "lineage": ["abc"]}', "not an object"),
    ('{"files": {"model.pt": {"sha256": NaN}}}', "NaN"),
    ('{"name": "x"}', "files and their sha256 are missing"),
])
def test_a_damaged_checkpoint_manifest_is_one_error_naming_it(tmp_path: Path, text, says
                                                              ) -> None:
    """The committed checkpoint's manifest cut short crashed two chapters (JSONDecodeError);
    `[]` made the budget table switch silently to another run; a lineage in words raised an
    AttributeError. Every pretrained number rests on that file: a damaged one is an error that
    names it and the fix, and it is never read as if it said less."""
    from finetune_lab.errors import UserError
    from finetune_lab.models import checkpoints

    folder = tmp_path / "roberta-small-fr"
    folder.mkdir()
    original = (checkpoints.packaged_dir() / "manifest.json").read_text()
    (folder / "manifest.json").write_text(original[:300] if text is None else text)
    with pytest.raises(UserError, match=f"manifest.json is damaged .*{says}") as raised:
        checkpoints.package_manifest(folder)
    assert "\n" not in str(raised.value) and "package the checkpoint again" in str(raised.value)
    with pytest.raises(UserError, match="is damaged"):
        pretrain_budget(tmp_path, folder)


def test_a_checkpoint_whose_manifest_is_damaged_is_not_called_foreign(tmp_path: Path) -> None:
    """The refusal said the model "is in no manifest" and advised --trust, though its own
    manifest was only cut short."""
    from finetune_lab.models import checkpoints

    folder = tmp_path / "roberta-small-fr"
    shutil.copytree(checkpoints.packaged_dir(), folder)
    (folder / "manifest.json").write_text((folder / "manifest.json").read_text()[:200])
    with pytest.raises(trust.UntrustedCheckpointError, match="its own manifest .* is damaged"):
        trust.check_trusted(folder / "model.pt", [folder / "manifest.json"])


def test_packaging_a_checkpoint_onto_its_own_folder_is_refused(tmp_path: Path, capsys) -> None:
    """`package-checkpoint data/checkpoints/roberta-small-fr/model.pt --dest
    data/checkpoints/roberta-small-fr` replaced the committed manifest, losing its lineage;
    a missing source or a folder gave a traceback."""
    from finetune_lab.cli import main
    from finetune_lab.models import checkpoints

    folder = tmp_path / "roberta-small-fr"
    shutil.copytree(checkpoints.packaged_dir(), folder)
    before = (folder / "manifest.json").read_bytes()
    for source, says in ((folder / "model.pt", "lies in"), (tmp_path / "none.pt", "does not exist"),
                         (folder, "is a folder")):
        assert main(["package-checkpoint", str(source), "--dest", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    assert (folder / "manifest.json").read_bytes() == before


def test_a_damaged_call_record_is_set_aside_by_name(tmp_path: Path) -> None:
    """A call record cut short, without its jobs or with a NaN wall time crashed the fairseq
    chapter (or printed "nan"), even when it was not the call the chapter describes."""
    from finetune_lab.book import devices
    from finetune_lab.runs.gpu_archive import CALL_RECORDS, keep_call_record

    folder = PROJECT_ROOT / CALL_RECORDS
    shutil.copytree(folder, tmp_path / CALL_RECORDS)
    good = devices.latest_call(tmp_path)
    assert good is not None and devices.call_records_set_aside(tmp_path) == ""
    records = sorted((tmp_path / CALL_RECORDS).glob("*Z.json"))
    meta = json.loads(records[0].read_text())
    (tmp_path / CALL_RECORDS / "20990101T000000Z.json").write_text(records[0].read_text()[:100])
    (tmp_path / CALL_RECORDS / "20990102T000000Z.json").write_text(
        json.dumps({k: v for k, v in meta.items() if k != "jobs"}))
    (tmp_path / CALL_RECORDS / "20990103T000000Z.json").write_text(
        json.dumps(meta).replace(f'"wall_s": {json.dumps(meta["wall_s"])}', '"wall_s": NaN'))
    assert devices.latest_call(tmp_path) == good
    shown = devices.call_records_set_aside(tmp_path)
    assert "3 device-call record files were set aside" in shown
    for stamp, why in (("20990101", "cannot be read as JSON"), ("20990102", "lacks jobs"),
                       ("20990103", "cannot be read as JSON")):
        assert f"`{stamp}T000000Z.json` {why}" in shown, shown
    root = tmp_path / "unpacked"
    assert keep_call_record({k: v for k, v in meta.items() if k != "jobs"} | {
        "products": ["data/work/gpu-lab-logs/20990104T000000Z"]}, tmp_path, root) == []
    assert not (root / CALL_RECORDS).exists() or not list((root / CALL_RECORDS).iterdir())


def _with_seed(command: list[str], seed: int) -> list[str]:
    """A recorded command line with its ``--seed`` value replaced."""
    return [str(seed) if i and command[i - 1] == "--seed" else t for i, t in enumerate(command)]


def _relabelled(copy: Path, seed: int, **fields: Any) -> None:
    """A copied run edited everywhere it names its seed and folder, as a forger would: its
    manifest, command, and the configuration its train.log printed (the log's hash rewritten:
    trial 27's M-m6 holds a run to its log)."""
    import hashlib

    man = json.loads((copy / "manifest.json").read_text())
    log = copy / "train.log"
    text = re.sub(rf"('seed': |\bseed=){man['seed']}\b", rf"\g<1>{seed}",
                  log.read_text(encoding="utf-8"))
    log.write_text(text.replace(f"/{man['run']}',", f"/{copy.name}',"), encoding="utf-8")
    man["logs"]["train.log"] = hashlib.sha256(log.read_bytes()).hexdigest()
    man.update(run=copy.name, seed=seed, command=_with_seed(man["command"], seed), **fields)
    (copy / "manifest.json").write_text(json.dumps(man))


def test_a_copy_marked_failed_is_no_neighbour(cache: Path) -> None:
    """random-seed0 copied as random-seed7 with status `failed`: `runs` listed it BAD, yet the
    machine-layout table counted it as a run beside random-seed0 (Intel 1x1: 3 runs -> 2)."""
    before = fairseq_chapter(cache)
    copy = cache / "fairseq" / "random-seed7"
    shutil.copytree(cache / "fairseq" / "random-seed0", copy, copy_function=link_events)
    _relabelled(copy, 7, status="failed", exit_code=1)  # only its events' bytes give it away
    rec = {r.key: r for r in discover_runs(cache)}["fairseq/random-seed7"]
    assert not rec.valid and not rec.unfinished and "byte-identical" in rec.reason, rec.reason
    assert fairseq_chapter(cache) == before


def test_a_folder_that_is_no_book_or_no_checkpoint_file_is_named(tmp_path: Path, capsys) -> None:
    """`check-freeze --project /tmp` said "nothing stale" (a .qmd file lay there); `convert-hf
    --checkpoint <folder>` said the folder "does not exist"."""
    from finetune_lab.cli import main
    from finetune_lab.models import checkpoints

    (tmp_path / "notes.qmd").write_text("# notes\n")
    assert main(["check-freeze", "--project", str(tmp_path)]) == 2
    assert "not the book's folder" in capsys.readouterr().err
    folder = checkpoints.packaged_dir()
    assert main(["convert-hf", "--checkpoint", str(folder), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder} is a folder" in err


@pytest.mark.parametrize("text", ['{"cls": {"splits": [', '{"cls": {"splits": NaN}}', '[]'])
def test_a_damaged_data_summary_is_one_line_naming_it(tmp_path: Path, text: str) -> None:
    """data.json cut short gave a traceback that did not name the file; a NaN was shown."""
    from finetune_lab.data.cls_splits import train_size
    from finetune_lab.errors import UserError

    path = tmp_path / "data.json"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(str(path))) as raised:
        train_size(path)
    assert "\n" not in str(raised.value)


def test_an_edited_log_rejects_its_run_and_leaves_the_budget(cache: Path) -> None:
    """Issue 35: the budget's passes over the task's texts (and the corpus blocks, the plateau
    table's rates) are read from a pretraining run's train.log, which no hash covered, so an
    edited log changed the book while the registry still called the run valid."""
    run = cache / "pretrain" / "cpu-sinpos1-bow"
    before = pretrain_budget(cache)
    assert before is not None and before.tapt_passes is not None
    log = run / "train.log"
    log.write_text(log.read_text(encoding="utf-8") + "an edited line\n", encoding="utf-8")
    rec = {r.key: r for r in discover_runs(cache)}["pretrain/cpu-sinpos1-bow"]
    assert not rec.valid and "train.log changed after the run ended" in rec.reason, rec.reason
    assert pretrain_budget(cache) != before  # the run is absent now, never a new number
    log.unlink()
    rec = {r.key: r for r in discover_runs(cache)}["pretrain/cpu-sinpos1-bow"]
    assert not rec.valid and "train.log listed in the manifest is missing" in rec.reason


def test_every_committed_run_that_ended_hashes_its_log() -> None:
    """The migration added `logs` to the manifests made before it; a run recorded from now on
    gets it when it ends (recording._finish)."""
    missing = []
    for man_path in sorted(COMMITTED.glob("*/*/manifest.json")):
        man = json.loads(man_path.read_text(encoding="utf-8"))
        if man.get("status") != "running" and (man_path.parent / "train.log").is_file():
            if set((man.get("logs") or {})) != {"train.log"}:
                missing.append(man_path.parent.relative_to(COMMITTED).as_posix())
    assert missing == []


# --- fault trial 3: fields that contradict what else records the same fact --------------------


def _throughput(m: dict) -> dict:
    return {**m, "throughput": {**m["throughput"], "updates_per_s": 50.0}}


def _timed(m: dict) -> dict:
    return {**m, "extra": {**m["extra"], "time_s": 1.0}}


def _trainable(m: dict) -> dict:
    return {**m, "extra": {**m["extra"], "parameters": {**m["extra"]["parameters"],
                                                        "trainable": 1}}}


def _peak(m: dict) -> dict:
    peak = m["extra"]["peak_memory"]
    return {**m, "extra": {**m["extra"], "peak_memory": {**peak, "bytes": peak["bytes"] // 4}}}


def _a_day_later(m: dict) -> dict:
    later = {k: (pd.Timestamp(m[k]) + pd.Timedelta(days=1)).isoformat()
             for k in ("start_time", "end_time")}
    return {**m, **later}


def _cpu_name(m: dict) -> dict:
    return {**m, "device": {**m["device"], "name": "AMD EPYC"}}


def _weight_decay(m: dict) -> dict:
    return {**m, "hyperparameters": {**m["hyperparameters"], "weight_decay": 0.1}}


CONTRADICTIONS: dict[str, tuple[str, Callable[[dict], dict], str]] = {
    # trial 4, f01, f02, f03, f05
    "a quarter of the peak memory": ("lora/lora-qv-seed0", _peak, "extra.peak_memory.bytes"),
    "another CPU's name": ("fairseq/random-seed0", _cpu_name, "is not its device.cpu"),
    "a run moved a day": ("fairseq-candidate/pretrained-seed1", _a_day_later,
                          "outside the run's start_time to end_time"),
    "one seed's own weight decay": ("lora/lora-qv-seed0", _weight_decay,
                                    "hyperparameter 'weight_decay'"),
    # name: (run, how its manifest changes, what the reason names)
    "a wall time past its own end": ("fairseq/random-seed1", _edit("wall_time_s", 60000.0),
                                     "longer than"),
    "a rate its log does not give": ("fairseq/random-seed1", _throughput,
                                     "disagrees with its train.log"),
    "a timed part of one second": ("lora/lora-qv-seed0", _timed, "extra.time_s"),
    "one trainable parameter": ("lora/lora-qv-seed0", _trainable, "extra.parameters"),
}


@pytest.mark.parametrize("name", sorted(CONTRADICTIONS))
def test_a_field_that_contradicts_its_run_rejects_it(cache: Path, tmp_path: Path,
                                                     name: str) -> None:
    """Fault trial 3, S2, S4, S6, S7: each edit stayed in the schema's ranges, `runs` said ok,
    and a table showed 1000.0 min, 50.00 updates/s, "1–394,754" trainable, 18.8 min."""
    key, how, says = CONTRADICTIONS[name]
    chapter = fairseq_chapter if key.startswith("fairseq") else lora_chapter
    gone = tmp_path / "gone"
    shutil.copytree(cache, gone, copy_function=link_events)
    shutil.rmtree(gone / key)
    path = cache / key / "manifest.json"
    path.write_text(json.dumps(how(json.loads(path.read_text()))))
    rec = {r.key: r for r in discover_runs(cache)}[key]
    assert not rec.valid and says in rec.reason, rec.reason
    assert chapter(cache) == chapter(gone)


def test_a_copied_run_renamed_to_a_new_seed_is_rejected(cache: Path) -> None:
    """Fault trial 3, S9: pretrained-seed0 copied to pretrained-seed3 with its run and seed
    edited made n = 4 and moved every fairseq table (78.13 to 78.20)."""
    before = fairseq_chapter(cache)
    copy = cache / "fairseq" / "pretrained-seed3"
    shutil.copytree(cache / "fairseq" / "pretrained-seed0", copy)
    man = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**man, "run": copy.name, "seed": 3}))
    rec = {r.key: r for r in discover_runs(cache)}["fairseq/pretrained-seed3"]
    assert not rec.valid and "contradicts its command line (--seed 0)" in rec.reason
    assert fairseq_chapter(cache) == before


def test_two_self_consistent_runs_with_the_same_events_are_both_rejected(cache: Path) -> None:
    """A copy edited everywhere (command too) cannot be told from its original: both are set
    aside, named, rather than one of them counted twice."""
    copy = cache / "fairseq" / "pretrained-seed3"
    shutil.copytree(cache / "fairseq" / "pretrained-seed0", copy)
    _relabelled(copy, 3)
    records = {r.key: r for r in discover_runs(cache)}
    for key in ("fairseq/pretrained-seed3", "fairseq/pretrained-seed0"):
        assert not records[key].valid and "byte-identical" in records[key].reason
