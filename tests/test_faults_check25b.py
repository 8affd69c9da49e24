"""Check 25b's and fault trial 26's defects (and trial 25's minor ones), one test per class."""

from __future__ import annotations

import json
import re

import pytest
from conftest import needs_data_root
from test_faults_trial25 import _relogged, rejected
from test_freeze_env import _project, _render_all

from finetune_lab.cli import main
from finetune_lab.errors import UserError


def test_what_the_kernel_runs_before_a_chapter_is_a_freeze_input(tmp_path, capsys, monkeypatch):
    """F-l1, F-l2: an IPython startup file (red axes, one-decimal tables) or a kernel
    configuration changed every chapter's output, and check-freeze said up to date; so would a
    kernelspec of the user's shadowing the environment's."""
    ipython, data = tmp_path / "ipython", tmp_path / "jupyter-data"
    for name, value in (("IPYTHONDIR", ipython), ("JUPYTER_DATA_DIR", data)):
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    monkeypatch.delenv("JUPYTER_PREFER_ENV_PATH", raising=False)
    root = _project(tmp_path / "project")
    _render_all(root)
    assert main(["check-freeze", "--project", str(root)]) == 0
    capsys.readouterr()
    startup = ipython / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "README").write_text("not run: only .py and .ipy files are\n")
    assert main(["check-freeze", "--project", str(root)]) == 0
    (startup / "00-house.py").write_text("import matplotlib\n"
                                         "matplotlib.rcParams['axes.edgecolor'] = 'red'\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert capsys.readouterr().err.count("kernel IPython profile: startup/00-house.py (new)") == 2
    _render_all(root)
    (startup / "00-house.py").write_text("import pandas\npandas.set_option('display.precision', 1)\n")
    config = ipython / "profile_default" / "ipython_kernel_config.py"
    config.write_text("c.InteractiveShellApp.exec_lines = ['x = 1']\n")
    assert main(["check-freeze", "--project", str(root)]) == 1
    err = capsys.readouterr().err
    assert "kernel IPython profile: startup/00-house.py (changed)" in err
    assert "kernel IPython profile: ipython_kernel_config.py (new)" in err
    _render_all(root)
    spec = data / "kernels" / "python3" / "kernel.json"
    spec.parent.mkdir(parents=True)
    spec.write_text(json.dumps({"argv": ["python", "-m", "ipykernel_launcher", "-f",
                                         "{connection_file}"], "env": {"MPLBACKEND": "svg"},
                                "language": "python"}))
    assert main(["check-freeze", "--project", str(root)]) == 1
    assert "kernel kernelspec python3 (changed)" in capsys.readouterr().err
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "1")  # the environment's is found first
    assert main(["check-freeze", "--project", str(root)]) == 0


def _variants(test: list[str]) -> dict[str, list[str]]:
    """Check 25b's corpora: the test reviews whole, split at their middle, joined in pairs,
    prefixed, and one sentence an item."""
    import re

    return {"whole": test,
            "halves": [half for t in test for half in (t[:len(t) // 2], t[len(t) // 2:])],
            "pairs": [a + " " + b for a, b in zip(test[::2], test[1::2])],
            "prefixed": ["Extrait : " + t for t in test],
            "sentences": [s for t in test for s in re.split(r"(?<=[.!?])\s+", t) if s]}


@needs_data_root
def test_a_corpus_holding_the_test_reviews_in_pieces_is_refused(tiny_pipeline, tmp_path):
    """D-l1 to D-l4: fairseq pretrains on the stream of a corpus's items (sample-break-mode
    none), so test reviews split into halves or sentences, joined in pairs or prefixed are
    trained on as much as whole ones; each was searched for as a whole item, and passed."""
    import re
    import shutil

    from test_faults_trial24 import _binarized

    from finetune_lab.config import default_data_root
    from finetune_lab.data.binarized import check_corpus
    from finetune_lab.data.cls_books import BOOKS_DIR, read_reviews

    test = [r.text for r in read_reviews(default_data_root() / BOOKS_DIR / "test.review")
            if len(r.text) > 200][:300]
    counts = {}
    for name, texts in _variants(test).items():
        corpus = tmp_path / name
        shutil.copytree(tiny_pipeline["corpus"] / "bin", corpus)
        _binarized(corpus / "train", texts, tiny_pipeline["tok"])
        with pytest.raises(UserError, match="train.bin holds") as refused:
            check_corpus(corpus)
        counts[name] = int(re.search(r"holds (\d+) of", str(refused.value))[1])
    assert counts["whole"] >= 150  # the tiny tokenizer cannot spell some reviews' characters
    assert counts == dict.fromkeys(counts, counts["whole"])


def test_a_key_is_found_across_the_parts_of_a_stream_by_most_of_its_windows():
    """Check 26b's D-n1 to D-n5: accents dropped, halves swapped, a letter changed."""
    from finetune_lab.data.binarized import find_in_stream

    key = "cestunlivrequejaiadoreetreluavecplaisirdutoutdebutjusqualafin"
    assert find_in_stream(["zz", key[:1], key[1:5], key[5:] + "x"], [key]) == {key}
    assert find_in_stream([key[30:], "unautretexte", key[:30]], [key]) == {key}
    assert find_in_stream([key.replace("e", "a", 1)], [key]) == {key}
    assert find_in_stream(["cestunlivrequejaiadoréetrelu"], ["cestunlivrequejaiadoreetrelu"])
    assert find_in_stream(["".join(c if i % 4 else "z" for i, c in enumerate(key))], [key]) \
        == set()  # a letter in four changed: no window whole
    assert find_in_stream(["x" * 19, "x"], ["x" * 20, key]) == {"x" * 20}


LAB_CALL = "20261126T041935Z"


@pytest.mark.parametrize("change, says", [
    ({"wall_s": 600}, "has wall_s = 849.6 but its phases one after another"),
    ({"wall_s": 600, "install": 600}, "its nvidia-smi samples (20261126T041935Z-nvidia-smi.csv) "
                                      "end 249 s after its start"),
    ({"wall_s": 600, "data": 600}, "says its data phase took 631.3 s, though its data jobs took "
                                   "28.2 s"),
    ({"wall_s": -200, "runs": -200, "jobs": 9.0}, "end 249 s after its start"),
    ({"install": -8, "runs": 8}, "says its install phase took 0.6 s, but its nvidia-smi "
                                 "samples (20261126T041935Z-nvidia-smi.csv) begin 9 s"),
], ids=["wall", "wall-and-install", "wall-and-data", "shorter", "install"])
def test_a_call_record_is_held_to_its_own_clock(tmp_path, change, says):
    """G-l1, G-l2, G-l4: the lab call's wall time grown by ten minutes (with its install or data
    phase), or shrunk with its runs, was read as the call's ("The whole command took 14.2
    min"); its nvidia-smi samples span 240 s of it, and its phases make it up."""
    import shutil

    from finetune_lab.book import devices
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.runs.gpu_archive import CALL_RECORDS

    folder = tmp_path / CALL_RECORDS
    folder.mkdir(parents=True)
    for name in (f"{LAB_CALL}.json", f"{LAB_CALL}-nvidia-smi.csv"):
        shutil.copyfile(PROJECT_ROOT / CALL_RECORDS / name, folder / name)
    assert devices.latest_call(tmp_path).wall_s == pytest.approx(249.6)
    record = folder / f"{LAB_CALL}.json"
    meta = json.loads(record.read_text())
    for key, seconds in change.items():
        if key == "jobs":  # every job's seconds (G-l4)
            meta["jobs"] = [{**job, "seconds": seconds} for job in meta["jobs"]]
            continue
        where = meta if key == "wall_s" else meta["timings_s"]
        where[key] = round(where[key] + seconds, 1)
    record.write_text(json.dumps(meta))
    assert devices.latest_call(tmp_path) is None
    assert says in devices.call_records_set_aside(tmp_path)
    if set(change) == {"wall_s"} or "data" in change:  # these hold without samples too
        record.write_text(json.dumps({**meta, "device": {**meta["device"], "type": "cpu"}}))
        assert devices.latest_call(tmp_path) is None


def test_a_gpu_call_without_its_samples_is_set_aside(tmp_path):
    import shutil

    from finetune_lab.book import devices
    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.runs.gpu_archive import CALL_RECORDS

    folder = tmp_path / CALL_RECORDS
    folder.mkdir(parents=True)
    shutil.copyfile(PROJECT_ROOT / CALL_RECORDS / f"{LAB_CALL}.json", folder / f"{LAB_CALL}.json")
    assert devices.latest_call(tmp_path) is None
    assert (f"has no nvidia-smi samples that can be read beside it ({LAB_CALL}-nvidia-smi.csv)"
            in devices.call_records_set_aside(tmp_path))


# --- M-l1 to M-l5, M-l7, M-l12: a long run's launches held to the fairseq processes -----------

LONG, LONG3, GENERAL = "pretrain/cpu-long", "pretrain/cpu-long3", "pretrain/cpu-clean-general1"


def _stamp(line: str):
    from datetime import datetime

    return datetime.fromisoformat(line[:19])


def _restamped(line: str, seconds: float) -> str:
    from datetime import timedelta

    return (_stamp(line) + timedelta(seconds=seconds)).isoformat(" ") + line[19:]


def _starts(lines: list[str]) -> list[int]:
    """Where each fairseq process's lines begin (its import-time tensorboardX line)."""
    return [k for k, line in enumerate(lines) if "| fairseq.tasks.text_to_speech |" in line]


def _last_stamped(lines: list[str], before: int) -> int:
    return max(k for k in range(before) if lines[k][:4].isdigit())


def _later(m: dict, i: int, seconds: float) -> None:
    """Launch ``i`` ending ``seconds`` later, the run's wall time with it."""
    from test_faults_trial23 import _moved

    seg = m["segments"][i]
    seg["end_time"] = _moved(seg["end_time"], seconds)
    seg["wall_time_s"] = round(seg["wall_time_s"] + seconds, 3)
    m["wall_time_s"] = round(m["wall_time_s"] + seconds, 3)
    if i == len(m["segments"]) - 1:
        m["end_time"] = seg["end_time"]


def test_two_launches_merged_into_one_are_two_processes(cache):
    """M-l1: cpu-long's two killed launches merged across the 149 s between them (launches 3
    to 2, 76.0 to 78.5 min): the second fairseq process started after one that was killed."""
    def merged(m: dict) -> None:
        first, second = m["segments"][0], m["segments"].pop(1)
        first.update(end_time=second["end_time"], updates_to=second["updates_to"],
                     wall_time_s=first["wall_time_s"] + second["wall_time_s"] + 149)
        m["wall_time_s"] = round(m["wall_time_s"] + 149, 3)
    rejected(cache, LONG, merged, r"segments\[0\] holds a fairseq process that started at "
                                  r"2026-11-22 17:44:0\d after one that did not finish")


def test_a_launch_split_where_no_process_started_is_refused(cache):
    """M-l2: cpu-long3's second launch split at its longest pause between two training lines
    into a failed launch and a new one (5 to 6 launches in the long-run table)."""
    from test_faults_trial23 import _moved

    lines = (cache / LONG3 / "train.log").read_text(encoding="utf-8").splitlines(True)
    inner = [k for k, line in enumerate(lines) if "| INFO | train_inner |" in line
             and "2026-11-23 02:03" <= line[:19] <= "2026-11-23 04:03"]
    a, b = max(((a, b) for a, b in zip(inner, inner[1:]) if b == a + 1),
               key=lambda p: _stamp(lines[p[1]]) - _stamp(lines[p[0]]))
    update = int(re.search(r"num_updates=(\d+)", lines[a])[1])

    def split(m: dict) -> None:
        from datetime import datetime

        seg = m["segments"][1]
        cut = _stamp(lines[a]).isoformat() + "+00:00"
        resumed = _moved(_stamp(lines[b]).isoformat() + "+00:00", -20)
        span = (lambda x, y: (datetime.fromisoformat(y) - datetime.fromisoformat(x))
                .total_seconds())
        m["segments"].insert(2, {**seg, "start_time": resumed, "updates_from": update,
                                 "wall_time_s": span(resumed, seg["end_time"])})
        seg.update(end_time=cut, updates_to=update, ended="failed",
                   wall_time_s=span(seg["start_time"], cut))
        m["wall_time_s"] = round(m["wall_time_s"] - span(cut, resumed), 3)
    rejected(cache, LONG3, split, r"segments\[2\] holds lines of .* on that no fairseq process it "
                                  r"started wrote")


def test_a_line_inserted_after_a_killed_launch_does_not_lengthen_it(cache):
    """M-l3: a WARNING line 130 s after killed launch 0's last line, its end moved to it
    (76.0 to 78.2 min)."""
    def inserted(lines: list[str]) -> list[str]:
        k = _last_stamped(lines, _starts(lines)[1])
        line = _restamped(lines[k][:19] + " | WARNING | fairseq.trainer | NaN loss, skipped\n",
                          130)
        return [*lines[:k + 1], line, *lines[k + 1:]]
    _relogged(cache, LONG, inserted)
    rejected(cache, LONG, lambda m: _later(m, 0, 130),
             r"its train.log's line \"NaN loss, skipped\" is stamped .*, 130 s after the line "
             r"before it: no event file holds it")


def test_a_line_stamped_in_the_gap_between_launches_does_not_lengthen_one(cache):
    """M-l4: a `Start iterating over samples` line 85 min after failed launch 1's last line,
    its end moved to it (94.1 to 179.1 min)."""
    def inserted(lines: list[str]) -> list[str]:
        k = _last_stamped(lines, _starts(lines)[2])
        line = _restamped(lines[k][:19] + " | INFO | fairseq_cli.train | Start iterating over "
                                          "samples\n", 5100)
        return [*lines[:k + 1], line, *lines[k + 1:]]
    _relogged(cache, GENERAL, inserted)
    rejected(cache, GENERAL, lambda m: _later(m, 1, 5100), r"5100 s after the line before it")


def test_a_deleted_launch_leaves_the_next_loading_another_update(cache):
    """M-l5: cpu-long3's failed launch 3 deleted with its lines and event files, the next
    going on from where launch 2 stopped (5 to 4 launches in the long-run table); its log
    says it loaded the checkpoint of update 4000."""
    import os

    run = cache / LONG3
    lines = (run / "train.log").read_text(encoding="utf-8").splitlines(True)
    starts = _starts(lines)
    _relogged(cache, LONG3, lambda ls: [*ls[:starts[3]], *ls[starts[4]:]])
    pid = re.search(r"\.(\d+)\.\d+$", sorted((run / "train_inner").iterdir())[3].name)[1]
    gone = [p for p in run.rglob(f"events.out.tfevents.*.{pid}.*")]
    assert gone
    for path in gone:
        os.unlink(path)

    def deleted(m: dict) -> None:
        seg = m["segments"].pop(3)
        m["segments"][3]["updates_from"] = seg["updates_from"]
        m["wall_time_s"] = round(m["wall_time_s"] - seg["wall_time_s"], 3)
        m["outputs"] = {k: v for k, v in m["outputs"].items() if f".{pid}." not in k}
    rejected(cache, LONG3, deleted, r"segments\[3\] goes on from update 3930, but its fairseq "
                                    r"process loaded the checkpoint of update 4000")


def _start_up_earlier(cache, seconds: float, reason: str) -> None:
    """cpu-long's last launch: its start and every line before its first training line
    ``seconds`` earlier (the log's hash rewritten), judged against ``reason``."""
    from test_faults_trial23 import _moved

    def earlier(lines: list[str]) -> list[str]:
        first = _starts(lines)[2]
        until = next(k for k in range(first, len(lines)) if "| train_inner |" in lines[k])
        return [*lines[:first], *(_restamped(line, -seconds) if line[:4].isdigit() else line
                                  for line in lines[first:until]), *lines[until:]]
    _relogged(cache, LONG, earlier)

    def moved(m: dict) -> None:
        seg = m["segments"][2]
        seg["start_time"] = _moved(seg["start_time"], -seconds)
        seg["wall_time_s"] = round(seg["wall_time_s"] + seconds, 3)
        m["wall_time_s"] = round(m["wall_time_s"] + seconds, 3)
    rejected(cache, LONG, moved, reason)


def test_a_launchs_start_up_restamped_earlier_is_held_to_its_first_training_line(cache):
    """M-l7: the last launch's start and every line before its `Start iterating` 300 s earlier
    (76.0 to 81.0 min): its first training line says when training began (100 s earlier here:
    300 s is past the 180 s a process takes to its first training line, check 26b's M-n5)."""
    _start_up_earlier(cache, 100, r"its train.log says training began at .*, but its first "
                                  r"training line .* says \+10\d s from that")


def test_checkpoint_lines_restamped_do_not_lengthen_a_killed_launch(cache):
    """M-l12: the four checkpoint lines after killed launch 0's valid1 line 100 s later
    (76.0 to 77.7 min)."""
    def later(lines: list[str]) -> list[str]:
        end = _starts(lines)[1]
        k = max(i for i in range(end) if "| INFO | valid1 |" in lines[i])
        return [*lines[:k + 1], *(_restamped(line, 100) if line[:4].isdigit() else line
                                  for line in lines[k + 1:end]), *lines[end:]]
    _relogged(cache, LONG, later)
    rejected(cache, LONG, lambda m: _later(m, 0, 100), r"10\d s after the line before it")


@pytest.mark.parametrize("run, edit, reason", [
    (LONG, lambda m: m["segments"][0].update(ended="paused"),
     r"segments\[0\] says it ended paused, but its fairseq process did not finish"),
    (GENERAL, lambda m: m["segments"][0].update(ended="paused"),
     r"segments\[0\] says it ended paused, but its fairseq process did not finish"),
    (LONG, lambda m: m["segments"][1].update(device={**m["segments"][1]["device"],
                                                     "type": "cuda", "name": "NVIDIA H200"}),
     r"segments\[1\] says it ran on the cuda, but its fairseq process of .* cpu=True"),
], ids=["killed-paused", "failed-paused", "device"])
def test_a_launchs_label_and_device_are_its_processs(cache, run, edit, reason):
    """R-k7, R-k8 (trial 25): a launch's `ended` and device were tied to nothing; its log says
    whether its process finished, and fairseq's configuration where it ran."""
    rejected(cache, run, edit, reason)


def test_an_archive_that_unpacks_to_far_more_than_a_call_returns_is_refused(tmp_path,
                                                                            monkeypatch):
    """Trial 25's G-k1: a 1 MiB piece that expanded to 1 GiB was moved into the run store (the
    limit made small here: 2 MiB of zeros compress to a few KiB)."""
    from finetune_lab.runs import gpu_archive

    there = tmp_path / "device"
    run = there / "data" / "runs" / "zzb-gpu" / "r-seed0"
    run.mkdir(parents=True)
    (run / "blob").write_bytes(bytes(2 * 2**20))
    gpu_archive.pack([there / "data" / "runs" / "zzb-gpu"], tmp_path / "files", root=there,
                     extra={"products": ["data/runs/zzb-gpu"]})
    assert sum(p.stat().st_size for p in (tmp_path / "files").iterdir()) < 2**20 // 8
    monkeypatch.setattr(gpu_archive, "UNPACKED_BYTES", 2**20)
    home = tmp_path / "home"
    with pytest.raises(UserError, match=r"cannot be unpacked safely \(its files would take "
                                        r"2 MiB, far more than a call's runs and weights\)"):
        gpu_archive.unpack(tmp_path / "files", root=home)
    assert not (home / "data" / "runs").exists()


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_weights_cut_short_are_refused_before_pretraining_from_them(tmp_path, damage):
    """Trial 25's E-k15: a `--continue-from` model.pt cut to 10 MB, its manifest's sha256
    rewritten to match, was copied and handed to fairseq, which printed its traceback."""
    import hashlib
    import shutil

    from finetune_lab.models import checkpoints
    from finetune_lab.train.pretrain_lineage import continuation_source

    folder = tmp_path / "weights"
    shutil.copytree(checkpoints.packaged_dir(), folder)
    model = folder / checkpoints.MODEL_FILE
    data = model.read_bytes()
    if damage == "cut":
        data = data[:10_000_000]
    else:  # one byte of the stored tensors changed: the zip reads, its checksum does not
        at = len(data) // 2
        data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    model.write_bytes(data)
    path = folder / checkpoints.MANIFEST_FILE
    man = json.loads(path.read_text(encoding="utf-8"))
    man["files"]["model.pt"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    path.write_text(json.dumps(man, indent=1), encoding="utf-8")
    with pytest.raises(UserError, match=r"model.pt cannot be read: the file is damaged or cut "
                                        r"short"):
        continuation_source(folder, folder)


def test_a_full_disk_inside_fairseq_is_the_disk_and_leaves_no_partial_file(tmp_path):
    """Trial 25's E-k10: fairseq's 20-line traceback ending in "No space left on device", no
    fix, and its `checkpoint_best.pt.tmp` left filling the disk."""
    import errno
    import sys

    from finetune_lab.runs.recording import record_run

    save = tmp_path / "state"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"a state of the run's")
    crash = ("import pathlib, sys; pathlib.Path(sys.argv[2], 'checkpoint_best.pt.tmp')"
             ".write_bytes(bytes(1000)); print('Traceback (most recent call last):'); "
             "print('OSError: [Errno 28] No space left on device'); sys.exit(1)")
    with pytest.raises(OSError) as full:
        with record_run("exp", "r", framework="fairseq", init="random", seed=0,
                        hyperparameters={}, runs_root=tmp_path / "runs") as handle:
            handle.run([sys.executable, "-c", crash, "--save-dir", str(save)])
    assert full.value.errno == errno.ENOSPC and full.value.filename == str(save)
    assert sorted(p.name for p in save.iterdir()) == ["checkpoint_last.pt"]
    manifest = json.loads((tmp_path / "runs" / "exp" / "r" / "manifest.json").read_text())
    assert manifest["status"] == "failed"


# --- trial 26 ----------------------------------------------------------------------------------


def test_a_run_of_other_weights_filed_in_a_grid_is_rejected(cache):
    """Trial 26's R-m2: a candidate's run (other weights, its own checkpoint path and sha256
    kept) filed as seed 5 of the lab's grid made the headline 76.5 %, not 78.1 %."""
    candidate = json.loads((cache / "fairseq-candidate-11" / "pretrained-seed0" /
                            "manifest.json").read_text(encoding="utf-8"))
    rejected(cache, "fairseq/pretrained-seed2",
             lambda m: m["inputs"].update(checkpoint=candidate["inputs"]["checkpoint"]),
             r"fine-tunes other weights than the other pretrained runs of experiment 'fairseq' "
             r"\(2 sets of weights among its runs\)")


def test_runs_that_measured_the_same_under_other_seeds_are_one_run():
    """Trial 26's R-m1: a candidate's run re-saved with its event times moved by under a
    millisecond (bytes differ) and filed as seed 3 of the grid made it "4 seeds, 78.2 %". The
    lab's grid and candidate 10's fine-tune the same weights with the same seeds on a CPU, so
    they measured the same: that is allowed; under another seed it cannot be."""
    from types import SimpleNamespace

    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.runs.copies import copy_problems

    def rec(key: str, seed: int):
        return SimpleNamespace(path=PROJECT_ROOT / "data" / "runs" / key, key=key, seed=seed,
                               manifest={}, problems=[], unfinished=False)
    lab, candidate = rec("fairseq/pretrained-seed0", 0), rec("fairseq-candidate-10/"
                                                              "pretrained-seed0", 0)
    copy_problems([lab, candidate], [lab, candidate], {id(lab), id(candidate)})
    assert lab.problems == candidate.problems == []
    claimed = rec("fairseq/pretrained-seed0", 3)
    copy_problems([claimed, candidate], [claimed], {id(claimed), id(candidate)})
    assert claimed.problems == ["logs the same loss and accuracy as run fairseq-candidate-10/"
                                "pretrained-seed0 at 100% of the points both logged, though that "
                                "run's seed is 0, not 3: a copy, not a run of its own"]


@needs_data_root
def test_fine_tuning_other_weights_into_a_grid_is_refused_before_any_work(tiny_pipeline,
                                                                         tmp_path):
    """Trial 26's R-m2, by an ordinary command: `finetune fairseq --seeds 5 --checkpoint DIR`
    without --experiment wrote another checkpoint's run into the lab's grid (only the same
    seed's complete run was compared)."""
    import shutil

    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.train import finetune_fairseq as ff

    runs = tmp_path / "runs"
    shutil.copytree(PROJECT_ROOT / "data" / "runs" / "fairseq" / "pretrained-seed0",
                    runs / "fairseq" / "pretrained-seed0")
    with pytest.raises(UserError, match=r"pretrained-seed0 holds a complete run from another "
                                        r"checkpoint than .*: an experiment's pretrained runs "
                                        r"fine-tune one checkpoint; pass another --experiment "
                                        r"\(e.g. fairseq-candidate\)"):
        ff.finetune_grid(("pretrained",), (5,), bin_dir=tiny_pipeline["cls_bin"],
                         checkpoint_dir=tiny_pipeline["packaged"], runs_root=runs, log=False)
    assert sorted(p.name for p in (runs / "fairseq").iterdir()) == ["pretrained-seed0"]


def test_a_gpu_run_among_cpu_runs_does_not_average_into_their_memory(cache):
    """Trial 26's R-m3: a GPU run filed under `transformers` (where a plain `finetune
    transformers` on a GPU machine writes) made the LoRA table's full row "1,971 (cpu/cuda)",
    the mean of three CPU resident peaks and one CUDA peak: LoRA seemed to use more memory."""
    import shutil

    from finetune_lab.book import lora_cls_runs as lr

    def full_row():
        return lr.summary(lr.cached_runs(cache)).set_index("method").loc["full"]

    before = full_row()
    assert before["peak_device"] == "cpu" and before["n"] == 3
    run = cache / "transformers" / "pretrained-seed9"
    shutil.move(cache / "transformers-gpu" / "pretrained-seed9", run)
    man = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    man["experiment"] = "transformers"
    man["command"][man["command"].index("--experiment") + 1] = "transformers"
    (run / "manifest.json").write_text(json.dumps(man, indent=1), encoding="utf-8")
    # trial 27's R-m2: an experiment's runs share one device type, so the GPU run is rejected
    # and the CPU row stays as it was (its accuracy, memory and time)
    assert full_row().equals(before)
    from finetune_lab.runs.registry import discover_runs

    (rec,) = [r for r in discover_runs(cache) if r.key == "transformers/pretrained-seed9"]
    assert not rec.valid and "device.type 'cuda', but experiment 'transformers'" in rec.reason


@pytest.mark.parametrize("fraction, part", [(0.9999, "training"), (0.0002, "validation")])
def test_a_split_that_leaves_a_class_no_review_is_refused(fraction, part):
    """Trial 26's E-m1: `prepare-cls --valid-fraction 0.9999` wrote "train 0", binarize-cls an
    empty train.bin, and both fine-tunes ended in a traceback."""
    from finetune_lab.data.cls_books import Review, stratified_split

    reviews = [Review(text=f"avis {i}", label=i % 2, rating=5.0 if i % 2 else 1.0,
                      position=i + 1) for i in range(2000)]
    with pytest.raises(UserError, match=rf"--valid-fraction {fraction} leaves the 1000 reviews "
                                        rf"of class 0 no {part} review"):
        stratified_split(reviews, valid_fraction=fraction)
    train, valid = stratified_split(reviews, valid_fraction=0.001)
    assert (len(train), len(valid)) == (1998, 2)


@needs_data_root
@pytest.mark.parametrize("cut", ["bytes", "lines"])
def test_a_tokenizer_dictionary_cut_short_is_refused(tiny_pipeline, tmp_path, cut):
    """Trial 26's E-m13: `dict.txt` cut at a line end binarized the split with 56 % of its
    tokens `<unk>`; the next fine-tune was refused for a leak that was not one."""
    import shutil

    from finetune_lab.data.tokenizer import DICT_FILE, MODEL_FILE, check_dictionary

    tok = tmp_path / "tok"
    shutil.copytree(tiny_pipeline["tok"], tok)
    check_dictionary(tok / MODEL_FILE, tok / DICT_FILE)
    lines = (tok / DICT_FILE).read_text(encoding="utf-8").splitlines(True)
    kept = lines[:len(lines) // 2] if cut == "lines" else \
        lines[:len("".join(lines).encode()[:1000].decode(errors="ignore").splitlines())]
    (tok / DICT_FILE).write_text("".join(kept), encoding="utf-8")
    with pytest.raises(UserError, match=rf"dict.txt does not list the {len(lines)} pieces of "
                                        rf".*spm.model in its order \({len(kept)} lines\)"):
        check_dictionary(tok / MODEL_FILE, tok / DICT_FILE)


def test_reproduce_from_scratch_over_the_packaged_checkpoint_runs_nothing(tmp_path,
                                                                          monkeypatch, capsys):
    """Trial 26's P-m1: `reproduce --from-scratch` retrained the tokenizer and re-binarized the
    data every committed run recorded, then was refused at its `pretrain --overwrite` step with
    advice it could not follow."""
    from finetune_lab.cli import main

    monkeypatch.setenv("FINETUNE_LAB_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    assert main(["reproduce", "--from-scratch"]) == 2
    err = capsys.readouterr().err
    assert "holds the packaged checkpoint the book reads" in err
    assert "`reproduce --from-scratch` cannot pretrain in its place, and ran nothing" in err
    assert not (tmp_path / "work").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, says", [
    (["finetune", "fairseq", "--seeds", "0", "0"], "--seeds lists 0 twice"),
    (["finetune", "fairseq", "--init", "random", "random"], "--init lists random twice"),
    (["finetune", "lora", "--methods", "lora-qv", "lora-qv"], "--methods lists lora-qv twice"),
])
def test_a_seed_or_part_listed_twice_is_refused(argv, says, capsys, tmp_path, monkeypatch):
    """Trial 26's E-m3: `--seeds 0 0` and `--init random random` were taken without a word."""
    from finetune_lab.cli import main

    monkeypatch.setenv("FINETUNE_LAB_RUNS_DIR", str(tmp_path / "runs"))
    assert main(argv) == 2
    assert f"error: {says}: give each once" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_data_summary_force_keeps_the_file_it_replaces(tmp_path, capsys):
    """Trial 26's L-m2: `data-summary --out FILE --force` replaced a user's file and kept no
    copy, where every folder output keeps what it replaced beside it."""
    from finetune_lab.book import data_summary as ds

    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}')
    with pytest.raises(UserError, match="exists and is not a data summary"):
        ds.write_summary({"cls": {}, "tokenizer": {}}, mine)
    ds.write_summary({"cls": {}, "tokenizer": {}}, mine, force=True)
    (kept,) = tmp_path.glob("notes.json.replaced-*")
    assert kept.read_text() == '{"my": "notes"}'
    assert f"what it held is kept in {kept}" in capsys.readouterr().err
    ds.write_summary({"cls": {"n": 1}, "tokenizer": {}}, mine)  # a summary: replaced, not kept
    assert len(list(tmp_path.glob("notes.json.replaced-*"))) == 1


def test_convert_hf_of_a_folder_names_its_file_only_where_it_is(tmp_path, capsys):
    """Trial 26's E-m11: a folder without model.pt was answered "pass the checkpoint file in
    it (DIR/model.pt)", a file that does not exist."""
    from finetune_lab.cli import main

    (tmp_path / "dir1").mkdir()
    (tmp_path / "dir1" / "a").write_text("x")
    assert main(["convert-hf", "--checkpoint", str(tmp_path / "dir1")]) == 2
    assert "dir1 is a folder that holds no model.pt: pass a checkpoint file" in \
        capsys.readouterr().err


def test_a_missing_split_is_said_before_the_checkpoint_is_converted(tmp_path, monkeypatch):
    """Trial 26's E-m10: `finetune transformers` converted the checkpoint (40 s, progress
    bars) before saying that the prepared split was missing."""
    from finetune_lab.train import hf_finetune

    def converted():
        raise AssertionError("converted before the split was read")
    monkeypatch.setattr(hf_finetune, "ensure_converted", converted)
    with pytest.raises(UserError, match=r"train.review"):
        hf_finetune.finetune_transformers("pretrained", 0, cls_dir=tmp_path / "no-split")


def test_a_file_edited_in_a_commands_folder_is_kept_when_it_is_replaced(tmp_path, capsys):
    """Trial 25's L-k3: a file the user edited inside a folder a command made was replaced
    without a copy (the marker named the folder's files, not what they held)."""
    from finetune_lab.cli import main

    out = tmp_path / "tok"
    assert main(["adopt-tokenizer", "--out", str(out)]) == 0
    with open(out / "dict.txt", "a", encoding="utf-8") as fh:
        fh.write("monmot 1\n")  # the user's own piece
    capsys.readouterr()
    assert main(["adopt-tokenizer", "--out", str(out)]) == 2
    assert "holds dict.txt, which `finetune-lab train-tokenizer` did not write (or changed since " \
           "it wrote it)" in capsys.readouterr().err
    assert main(["adopt-tokenizer", "--out", str(out), "--force"]) == 0
    (kept,) = tmp_path.glob("tok.replaced-*")
    assert (kept / "dict.txt").read_text(encoding="utf-8").endswith("monmot 1\n")
    assert not (out / "dict.txt").read_text(encoding="utf-8").endswith("monmot 1\n")


# --- check 26b ---------------------------------------------------------------------------------


def _call_root(tmp_path):
    """The lab call's record and samples, and the runs it made, under a root of their own."""
    import shutil

    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.runs.gpu_archive import CALL_RECORDS

    folder = tmp_path / CALL_RECORDS
    folder.mkdir(parents=True)
    for name in (f"{LAB_CALL}.json", f"{LAB_CALL}-nvidia-smi.csv"):
        shutil.copyfile(PROJECT_ROOT / CALL_RECORDS / name, folder / name)
    for experiment in ("fairseq-gpu", "transformers-gpu", "lora-gpu"):
        shutil.copytree(PROJECT_ROOT / "data" / "runs" / experiment,
                        tmp_path / "data" / "runs" / experiment)
    return folder


@pytest.mark.parametrize("seconds, phase, says", [
    (600, "runs", "says the call took 849.6 s, but the last run it made ended 24\\d s after"),
    (300, "install", "says its setup took 339.9 s, but the first run it made started 4\\d s "
                     "after its start"),
], ids=["runs-and-samples-extended", "install-and-samples-shifted"])
def test_a_call_record_is_held_to_the_runs_it_made(tmp_path, seconds, phase, says):
    """Check 26b's G-n1 to G-n3: ten minutes added to the lab call's runs phase (its samples
    extended to match: "the whole command took 14.2 min"), or five to its install phase (its
    samples shifted): the runs it made record their own start and end."""
    from datetime import datetime, timedelta

    from finetune_lab.book import devices

    folder = _call_root(tmp_path)
    assert devices.latest_call(tmp_path).wall_s == pytest.approx(249.6)
    record, samples = folder / f"{LAB_CALL}.json", folder / f"{LAB_CALL}-nvidia-smi.csv"
    meta = json.loads(record.read_text())
    meta["wall_s"] = round(meta["wall_s"] + seconds, 1)
    meta["timings_s"][phase] = round(meta["timings_s"][phase] + seconds, 1)
    record.write_text(json.dumps(meta))
    head, *rows = samples.read_text().splitlines()

    def moved(row: str, by: float) -> str:
        at = datetime.strptime(row.split(",")[0], "%Y/%m/%d %H:%M:%S.%f") + timedelta(seconds=by)
        return at.strftime("%Y/%m/%d %H:%M:%S.%f")[:-3] + row[row.index(","):]
    if phase == "runs":  # idle samples after the last one, to the new end
        rows += [moved(rows[-1], k).replace(rows[-1].split(", ", 1)[1], "0 %, 4 MiB, 80.00 W")
                 for k in range(1, seconds + 1)]
    else:
        rows = [moved(row, seconds) for row in rows]
    samples.write_text("\n".join([head, *rows]) + "\n")
    assert devices.latest_call(tmp_path) is None
    assert re.search(says, devices.call_records_set_aside(tmp_path))


def test_a_cpu_run_whose_configuration_lost_its_device_is_no_gpu_run(cache):
    """Check 26b's M-n4: `'cpu': True` deleted from cpu-long's configuration lines and its
    launches relabelled as an H100's: the throughput table printed "1× NVIDIA H100"."""
    _relogged(cache, LONG, lambda lines: [line.replace("'cpu': True, ", "") for line in lines])
    gpu = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1}

    def relabelled(m: dict) -> None:
        m["device"] = gpu
        for seg in m["segments"]:
            seg["device"] = gpu
        m["command"] = [c for c in m["command"] if c != "--cpu"]
    rejected(cache, LONG, relabelled, r"says it ran on the cuda, but its fairseq process of .* "
                                      r"was configured with cpu=(None|True)")


def test_a_launchs_start_up_moved_far_from_its_first_training_line_is_refused(cache):
    """Check 26b's M-n5: a launch's start-up restamped 400 s earlier, with its first training
    line's train_wall raised alike in the log and its event file (76.0 to 82.7 min): from a
    process's first line to its first training line takes at most 86 s in the committed
    runs."""
    _start_up_earlier(cache, 200, r"its fairseq process that started at .* logged its first "
                                  r"training line at .*: start-up and one logging interval "
                                  r"take under 180 s")


def test_a_copy_whose_values_moved_below_the_logs_precision_is_still_a_copy(monkeypatch):
    """Check 26b's R-n1: every value of a re-saved copy scaled by 1 + 1e-6 (the log's three
    decimals still agree) made it another seed's run."""
    from types import SimpleNamespace

    from finetune_lab.config import PROJECT_ROOT
    from finetune_lab.runs import copies

    real = copies.logged_values

    def scaled(path):
        values = real(path)
        return tuple((t, s, v * (1 + 1e-6)) for t, s, v in values) \
            if "fairseq/pretrained-seed0" in path.as_posix() else values
    monkeypatch.setattr(copies, "logged_values", scaled)
    monkeypatch.setattr(copies, "_MEASURED", {})  # kept by file, and these files are unchanged

    def rec(key: str, seed: int):
        return SimpleNamespace(path=PROJECT_ROOT / "data" / "runs" / key, key=key, seed=seed,
                               manifest={}, problems=[], unfinished=False)
    claimed, candidate = rec("fairseq/pretrained-seed0", 3), rec("fairseq-candidate-10/"
                                                                  "pretrained-seed0", 0)
    copies.copy_problems([claimed, candidate], [claimed], {id(claimed), id(candidate)})
    assert claimed.problems and "seed is 0, not 3: a copy" in claimed.problems[0]
