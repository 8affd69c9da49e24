"""Fault trial 27's defects in what the registry accepts as a run of its own, one test per class."""

from __future__ import annotations

import json
import re
import shutil
from types import SimpleNamespace

import pytest

from finetune_lab.config import PROJECT_ROOT
from finetune_lab.runs import copies
from finetune_lab.runs.registry import validate_run


def _record(key: str, seed: int) -> SimpleNamespace:
    return SimpleNamespace(path=PROJECT_ROOT / "data" / "runs" / key, key=key, seed=seed,
                           manifest={}, problems=[], unfinished=False)


@pytest.mark.parametrize("changed, copy", [
    (1, True),      # R-m1: one loss moved across a rounding boundary (0.997 -> 0.9979)
    (0.4, True),    # two points in five moved past the log's precision: still most of them
    (0.6, False),   # most points moved: runs that differ, as two seeds' do
])
def test_a_copy_with_some_values_moved_is_still_a_copy(monkeypatch, changed, copy):
    """Trial 27's R-m1: a candidate's run filed as seed 3 of the grid, with one loss changed
    below the log's precision, made the chapter "78.2 ± 0.3 (n=4)": runs were keyed by their
    values rounded, so one value across a rounding boundary made another run."""
    real = copies.logged_values

    def moved(path):
        values = real(path)
        if "fairseq/pretrained-seed0" not in path.as_posix():
            return values
        out, k = [], 0
        for t, s, v in values:
            if t in copies.SERIES_TAGS:
                if changed == 1 and k == 0:  # the first loss only, by 9e-4
                    v += 9e-4
                elif changed < 1 and k % 10 < changed * 10:
                    v += 0.01
                k += 1
            out.append((t, s, v))
        return tuple(out)
    monkeypatch.setattr(copies, "logged_values", moved)
    monkeypatch.setattr(copies, "_MEASURED", {})  # kept by file, and these files are unchanged
    claimed, candidate = _record("fairseq/pretrained-seed0", 3), \
        _record("fairseq-candidate-10/pretrained-seed0", 0)
    copies.copy_problems([claimed, candidate], [claimed], {id(claimed), id(candidate)})
    assert bool(claimed.problems) == copy, claimed.problems
    if copy:
        assert re.fullmatch(r"logs the same loss and accuracy as run fairseq-candidate-10/"
                            r"pretrained-seed0 at \d+% of the points both logged, though that "
                            r"run's seed is 0, not 3: a copy, not a run of its own",
                            claimed.problems[0])


def test_the_committed_seeds_are_runs_of_their_own():
    """Different seeds agree at few points (under 14 % in the committed store), far from
    :data:`copies.REPLICA_SHARE`; so no committed run is called a copy."""
    runs = [_record(f"fairseq/{init}-seed{s}", s) for init in ("pretrained", "random")
            for s in (0, 1, 2)]
    measured = [copies._measured(r) for r in runs]
    shares = [copies._agreement(a, b) for i, a in enumerate(measured) for b in measured[i + 1:]]
    assert len(shares) == 15 and max(shares) < 0.2


def _relabelled(tmp_path, seed: int):
    """M-m6: random-seed2 filed as another seed in its manifest, command and folder; its
    hashed train.log untouched (it still says seed 2 and logged to .../random-seed2)."""
    root = tmp_path / "runs"
    src = PROJECT_ROOT / "data" / "runs" / "fairseq" / "random-seed2"
    dest = root / "fairseq" / f"random-seed{seed}"
    shutil.copytree(src, dest)
    man = json.loads((dest / "manifest.json").read_text(encoding="utf-8"))
    text = json.dumps(man).replace("random-seed2", f"random-seed{seed}")
    man = json.loads(text)
    man["seed"] = seed
    cmd = man["command"]
    cmd[cmd.index("--seed") + 1] = str(seed)
    (dest / "manifest.json").write_text(json.dumps(man, indent=1), encoding="utf-8")
    return dest


def test_a_run_relabelled_as_another_seed_is_held_to_its_log(tmp_path):
    """Trial 27's M-m6: the best-epoch table listed seeds 0, 1, 5."""
    rec = validate_run(_relabelled(tmp_path, 5))
    assert not rec.valid
    assert "is seed 5, but its train.log's fairseq process of 2026-" in rec.reason
    assert "was configured with seed 2" in rec.reason


def test_a_run_filed_under_another_name_is_held_to_the_folder_it_logged_to(tmp_path):
    """The same log moved to another run's folder with its seed kept (random-seed2 as
    pretrained-seed2 would also contradict its init; here as a seed-2 run of another
    experiment)."""
    root = tmp_path / "runs"
    src = PROJECT_ROOT / "data" / "runs" / "fairseq" / "random-seed2"
    dest = root / "fairseq-other" / "random-seed2"
    shutil.copytree(src, dest)
    man = json.loads((dest / "manifest.json").read_text(encoding="utf-8"))
    man = json.loads(json.dumps(man).replace("runs/fairseq/random-seed2",
                                             "runs/fairseq-other/random-seed2"))
    man["experiment"] = "fairseq-other"
    (dest / "manifest.json").write_text(json.dumps(man, indent=1), encoding="utf-8")
    rec = validate_run(dest)
    assert not rec.valid
    assert "is fairseq-other/random-seed2, but its train.log's fairseq process of" in rec.reason
    assert "logged to fairseq/random-seed2: the log of another run" in rec.reason
