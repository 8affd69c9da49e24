"""Fault trial 25: each defect's class, on real small inputs."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta

import pytest

from test_faults_trial23 import _moved, \
    test_a_measurement_moved_through_an_unchecked_field_or_the_clock_slack_is_rejected as rejected

GENERAL = "pretrain/cpu-clean-general1"


def _relogged(cache, run: str, edit) -> str:
    """``run``'s train.log rewritten line by line by ``edit`` (the manifest's hash of it made
    to match, as a forger would); returns the new hash."""
    log = cache / run / "train.log"
    lines = log.read_text(encoding="utf-8").splitlines(True)
    log.write_text("".join(edit(lines)), encoding="utf-8")
    digest = hashlib.sha256(log.read_bytes()).hexdigest()
    path = cache / run / "manifest.json"
    man = json.loads(path.read_text(encoding="utf-8"))
    man["logs"]["train.log"] = digest
    path.write_text(json.dumps(man, indent=1), encoding="utf-8")
    return digest


def _stamp(line: str) -> datetime:
    return datetime.fromisoformat(line[:19])


def _end_moved(m: dict) -> None:
    """M-k1: the middle launch's end 170 s past its last line (a launch the run went on after
    packages nothing; 180 s were allowed as for the last)."""
    seg = m["segments"][1]
    seg["end_time"] = _moved(seg["end_time"], 170)
    seg["wall_time_s"] += 170
    m["wall_time_s"] += 170


def _empty_launch(m: dict) -> None:
    """R-k4: a launch of 29 s forged in the gap between two, with no line of that time."""
    before, after = m["segments"][1], m["segments"][2]
    start = _moved(before["end_time"], 600)
    assert start < after["start_time"]
    m["segments"].insert(2, {**before, "start_time": start, "end_time": _moved(start, 29),
                             "wall_time_s": 29.0, "updates_from": before["updates_to"],
                             "updates_to": before["updates_to"], "ended": "failed"})
    m["wall_time_s"] += 29


@pytest.mark.parametrize("edit, reason", [
    (_end_moved, r"segments\[1\] ran from .* do not begin and end with it"),
    (_empty_launch, r"segments\[2\] ran from .* lines of that time do not exist"),
])
def test_a_launch_is_held_to_its_lines(cache, edit, reason):
    """Trial 25's M-k1 (94.1 to 96.9 min) and R-k4 (3 to 4 launches in the long-run table)."""
    rejected(cache, GENERAL, edit, reason)


def test_a_log_line_restamped_is_caught_by_its_event_files_clock(cache):
    """Trial 25's M-k3: the middle launch's last training line stamped 20 min later, its end
    moved to match and the log's hash rewritten: 94.1 to 114.1 min in the book."""
    man = json.loads((cache / GENERAL / "manifest.json").read_text(encoding="utf-8"))
    end = datetime.fromisoformat(man["segments"][1]["end_time"]).replace(tzinfo=None)

    def restamp(lines: list[str]) -> list[str]:
        i = max(k for k, line in enumerate(lines) if "| train_inner |" in line
                and _stamp(line) <= end)  # the log is in UTC here, as the machine was
        later = (_stamp(lines[i]) + timedelta(minutes=20)).isoformat(" ")
        return [*lines[:i], later + lines[i][19:], *lines[i + 1:]]
    _relogged(cache, GENERAL, restamp)
    rejected(cache, GENERAL, lambda m: (
        m["segments"][1].update(end_time=_moved(m["segments"][1]["end_time"], 1201),
                                wall_time_s=m["segments"][1]["wall_time_s"] + 1201),
        m.update(wall_time_s=m["wall_time_s"] + 1201)),
        r"its train.log stamps its train_inner line of update \d+ .* but train_inner/.* wrote "
        r"that update's loss at")


def test_rates_scaled_in_the_log_disagree_with_the_event_files(cache):
    """Trial 25's M-k5, M-k7: every wps of a run's log times 1.2 (its hash and the manifest's
    throughput made to match): 4,905 to 5,886 tokens/s in the budget and throughput tables."""
    def scaled(lines: list[str]) -> list[str]:
        return [re.sub(r"(\bwps[= ])([0-9.]+)",
                       lambda m: f"{m[1]}{float(m[2]) * 1.2:.1f}", line) for line in lines]
    _relogged(cache, "pretrain/cpu-sinpos1-bow", scaled)
    rejected(cache, "pretrain/cpu-sinpos1-bow",
             lambda m: m["throughput"].update(tokens_per_s=m["throughput"]["tokens_per_s"] * 1.2),
             r"its \w+ wps at update \d+ is [0-9.]+ in .*, but its train.log prints [0-9.]+ there")


def test_a_first_line_forged_earlier_is_bounded_by_fairseqs_wall_meter(cache):
    """M-i3 (trials 24, 25): the log's first line stamped 10 min earlier, the run's start
    moved back to match and the hash rewritten: 27.5 to 37.5 min in the book, bounded only by
    the 600 s allowed before the first event."""
    run = "fairseq/pretrained-seed0"

    def earlier(lines: list[str]) -> list[str]:
        return [(_stamp(lines[0]) - timedelta(seconds=590)).isoformat(" ") + lines[0][19:],
                *lines[1:]]
    _relogged(cache, run, earlier)
    rejected(cache, run, lambda m: m.update(start_time=_moved(m["start_time"], -590),
                                            wall_time_s=m["wall_time_s"] + 590),
             r"its train.log's first line is stamped .*, but fairseq's wall meter started "
             r"\+59\d s from it")


def test_fairseq_reads_the_binarized_files_not_a_text_file_beside_them(tiny_pipeline, tmp_path):
    """Trial 25's D-k1: a text file `input0/train` holding test reviews beside the checked
    train.bin: fairseq, left to infer the format, read the text and trained on it. The runs
    name the format, so fairseq reads the binarized files whatever lies beside them."""
    import shutil

    from fairseq.data import Dictionary, data_utils

    from finetune_lab.train.finetune_fairseq import fairseq_args, train_size
    from finetune_lab.train.recipe import FinetuneRecipe
    from finetune_lab.train.pretrain_fairseq import fairseq_args as pretrain_args
    from finetune_lab.train.pretrain_recipe import PretrainRecipe

    data = tmp_path / "bin"
    shutil.copytree(tiny_pipeline["cls_bin"], data)
    (data / "input0" / "train").write_text("a text file\n" * 5, encoding="utf-8")
    args = fairseq_args(data, FinetuneRecipe(), 64, seed=0, checkpoint=None, cpu=True)
    words = Dictionary.load(str(data / "input0" / "dict.txt"))

    def loaded(impl: str | None) -> int:
        return len(data_utils.load_indexed_dataset(str(data / "input0" / "train"), words, impl))
    assert loaded(None) == 5  # inferred: the text file
    assert loaded(args[args.index("--dataset-impl") + 1]) == train_size(data) == 64
    pre = pretrain_args(data, tmp_path, PretrainRecipe(), seed=1, device="cpu", precision="fp32")
    assert pre[pre.index("--dataset-impl") + 1] == "mmap"


def test_a_deleted_launch_leaves_its_lines_outside_every_launch(cache):
    """Trial 25's R-k1: the middle launch (updates 1000 to 1250, 680 s) deleted, the next
    starting where the first stopped: 94.1 to 82.7 min and 3 to 2 launches in the book."""
    def edit(m: dict) -> None:
        gone = m["segments"].pop(1)
        m["segments"][1]["updates_from"] = m["segments"][0]["updates_to"] = gone["updates_to"]
        m["wall_time_s"] = round(m["wall_time_s"] - gone["wall_time_s"], 3)
    rejected(cache, GENERAL, edit, r"train.log has \d+ lines, stamped .* outside every launch")


@pytest.mark.parametrize("data, runs", [(6.3, 234.7), (56.3, 184.7)])
def test_a_call_records_phases_hold_its_jobs(data, runs):
    """Trial 25's M-k6: 25 s moved from the data phase to the runs (the call's wall time kept):
    the fairseq chapter's setup went from 39.9 to 14.9 s."""
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.runs.gpu_archive import call_record_problem

    record = PROJECT_ROOT / "data" / "summaries" / "gpu-lab" / "20261126T041935Z.json"
    meta = json.loads(record.read_text(encoding="utf-8"))
    assert call_record_problem(meta) is None
    meta["timings_s"].update(data=data, runs=runs)
    assert "its jobs' own seconds contradict (the data jobs 28.2 s one after another, the " \
           "longest other job 209.6 s)" in call_record_problem(meta)


def test_a_cpu_pretraining_run_is_allowed_seconds_not_minutes_past_its_log(cache):
    """Trial 25's M-k2: a one-launch CPU pretraining run 140 s longer (its end moved, the log
    untouched) passed within the 150 s allowed for packaging on a GPU; on a CPU it takes 3 to 8
    s. The budget table's 20.1 min became 22.5."""
    def later(m: dict) -> None:
        m["end_time"] = m["segments"][0]["end_time"] = _moved(m["end_time"], 140)
        m["segments"][0]["wall_time_s"] += 140
        m["wall_time_s"] = round(m["wall_time_s"] + 140, 3)
    rejected(cache, "pretrain/cpu-sinpos1-bow", later,
             r"wall_time_s [0-9.]+ s is not the \d+ s between its train.log's first and last")


@pytest.mark.parametrize("resave", ["crlf", "one review edited"])
def test_a_re_saved_training_file_does_not_make_the_root_another_data_set(tmp_path, monkeypatch,
                                                                         resave):
    """Trial 25's D-k: the books training file re-saved with one line end changed made the root
    "another data set", whose test file (here dvd's) the splits were compared with: a split
    whose training file is the 2000 books test reviews was binarized and fine-tuned on."""
    from data_fixtures import tiny_tokenizer
    from test_faults_trial24 import _swapped

    from finetune_lab.config import DATA_ROOT_ENV, default_data_root
    from finetune_lab.data.binarize import binarize_cls
    from finetune_lab.data.cls_books import BOOKS_DIR
    from finetune_lab.errors import UserError

    split, tokenizer = _swapped(tmp_path / "cls.books"), tiny_tokenizer()  # from the real root
    books = default_data_root() / BOOKS_DIR
    root = tmp_path / "root"
    (root / BOOKS_DIR).mkdir(parents=True)
    dvd = default_data_root() / "webis-cls-10" / "fr" / "dvd" / "test.review"
    (root / BOOKS_DIR / "test.review").write_bytes(dvd.read_bytes())
    train = (books / "train.review").read_bytes()
    train = train.replace(b"\n", b"\r\n", 1) if resave == "crlf" else \
        train.replace(b"<text>", b"<text>Bof. ", 1)
    (root / BOOKS_DIR / "train.review").write_bytes(train)
    monkeypatch.setenv(DATA_ROOT_ENV, str(root))
    with pytest.raises(UserError, match=r"does not hold Webis-CLS-10's books test reviews, though "
                                        r"the training file beside it is Webis-CLS-10's"):
        binarize_cls(split, tokenizer, tmp_path / "bin")


def test_a_matplotlibrc_a_chapter_draws_with_makes_it_stale(tmp_path, capsys, monkeypatch):
    """Trial 25's F-k: `chapters/matplotlibrc` (red axes, 30-point text) changed every figure,
    and check-freeze said up to date; so would one in $MATPLOTLIBRC or the user's folder."""
    from test_freeze_env import _project, _render_all

    from finetune_lab.cli import main

    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mplconfig"))
    monkeypatch.delenv("MATPLOTLIBRC", raising=False)
    root = _project(tmp_path / "project")
    _render_all(root)
    assert main(["check-freeze", "--project", str(root)]) == 0
    capsys.readouterr()
    (root / "chapters" / "matplotlibrc").write_text("axes.edgecolor: red\nfont.size: 30\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert capsys.readouterr().err.count("matplotlibrc chapters/matplotlibrc (new)") == 2
    _render_all(root)
    (root / "chapters" / "matplotlibrc").write_text("axes.edgecolor: blue\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert "matplotlibrc chapters/matplotlibrc (changed)" in capsys.readouterr().err
    (root / "chapters" / "matplotlibrc").unlink()
    (tmp_path / "mplconfig").mkdir()
    (tmp_path / "mplconfig" / "matplotlibrc").write_text("axes.edgecolor: blue\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert "matplotlibrc (outside the project) (new)" in capsys.readouterr().err


def test_a_missing_continue_from_folder_is_named_before_the_corpus(tmp_path, monkeypatch,
                                                                   capsys):
    """Trial 25's E-k14: `pretrain --continue-from <missing>` named the corpus it lacked, so a
    user prepared a corpus only to be refused for the folder."""
    from finetune_lab.cli import main

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    assert main(["pretrain", "--tokens", "1e5", "--run", "cf", "--continue-from",
                 str(tmp_path / "nonexist"), "--package-to", str(tmp_path / "pk")]) == 2
    err = capsys.readouterr().err
    assert "--continue-from" in err and "nonexist does not exist" in err \
        and "pretrain-bin" not in err


def test_only_a_first_launch_starts_fairseqs_wall_meter(tmp_path):
    """A later launch goes on with the meters its state saved (fairseq restores them), so its
    first training line less its `wall` is no start: only the first launch is held to it."""
    from finetune_lab.runs.measurements import log_clock_problems

    (tmp_path / "train.log").write_text(
        "2026-11-26 01:00:05 | INFO | fairseq_cli.train | loading\n"  # killed before training
        "2026-11-26 02:00:04 | INFO | fairseq_cli.train | loading\n"
        "2026-11-26 02:01:00 | INFO | train_inner | epoch 001:     10 / 99 loss=9.1, "
        "num_updates=260, train_wall=50, wall=5000\n", encoding="utf-8")
    man = {"framework": "fairseq", "segments": [
        {"start_time": "2026-11-26T01:00:00+00:00", "end_time": "2026-11-26T01:00:05+00:00"},
        {"start_time": "2026-11-26T02:00:00+00:00", "end_time": "2026-11-26T02:01:03+00:00"}]}
    assert log_clock_problems(tmp_path, man, []) == []
    (one,) = log_clock_problems(tmp_path, {**man, "segments": man["segments"][:1]}, [])
    assert "first line is stamped 2026-11-26 01:00:05, but fairseq's wall meter started " \
        "-1345 s from it" in one


def test_rates_on_lines_fairseq_did_not_log_at_info_are_not_read(cache):
    """Check 25b's M-l6: a WARNING copy of each training line with its wps tripled (the log's
    hash rewritten, the throughput set to the median then read): cpu-long's 3,572 tokens/s
    became 5,185 in the throughput table. Rates are read from fairseq's INFO lines, as the
    values held against the event files are."""
    import statistics

    def copied(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            out.append(line)
            if "| INFO | train_inner |" in line:
                out.append(re.sub(r"(\bwps=)([0-9.]+)", lambda m: f"{m[1]}{float(m[2]) * 3:.1f}",
                                  line.replace("| INFO |", "| WARNING |")))
        return out
    _relogged(cache, "pretrain/cpu-long", copied)
    text = (cache / "pretrain" / "cpu-long" / "train.log").read_text(encoding="utf-8")
    forged = statistics.median([float(v) for line in text.splitlines()
                                if "| train_inner |" in line
                                for v in re.findall(r"\bwps=([0-9.]+)", line)][1:])
    rejected(cache, "pretrain/cpu-long",
             lambda m: m["throughput"].update(tokens_per_s=forged),
             r"throughput.tokens_per_s [0-9.]+ disagrees with its train.log")
