"""The registry's work kept, and only as long as what it judged is unchanged (issue 36).

Within one reading the store is judged once; after it, a change is seen. A run's log checked
against its event files is kept by the log's text and the files' identities: a copied store
(hard-linked event files, the same logs) is not checked again, an edited one is.
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune_lab.runs import copies, evaluations, registry
from finetune_lab.runs.reading import one_reading


def _counted(monkeypatch, module, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


def test_one_reading_judges_the_store_once_and_a_later_one_sees_a_change(cache: Path,
                                                                         monkeypatch) -> None:
    judged = _counted(monkeypatch, registry, "_judge_store")
    run = cache / "fairseq" / "random-seed0" / "manifest.json"
    with one_reading():
        first = {r.key: r.valid for r in registry.discover_runs(cache)}
        run.write_text(json.dumps({**json.loads(run.read_text()), "seed": -1}))
        again = {r.key: r.valid for r in registry.discover_runs(cache)}
        registry.discover_runs(cache, ["fairseq"])  # another question: judged apart
    assert len(judged) == 2 and first == again and first["fairseq/random-seed0"]
    later = {r.key: r.valid for r in registry.discover_runs(cache)}
    assert len(judged) == 3 and not later["fairseq/random-seed0"]


def test_a_logs_check_is_kept_for_a_copied_store_and_redone_for_a_changed_file(
        cache: Path, tmp_path: Path, monkeypatch) -> None:
    import os
    import shutil

    from conftest import link_events

    from finetune_lab.runs import eventfiles
    from finetune_lab.runs.manifest import event_files

    monkeypatch.setattr(eventfiles, "_AGAINST_LOG", {})  # nothing kept from other tests
    monkeypatch.setattr(copies, "_MEASURED", {})
    parsed = _counted(monkeypatch, evaluations, "printed_metrics")
    measured = _counted(monkeypatch, copies, "_points")
    other = tmp_path / "other"
    shutil.copytree(cache, other, copy_function=link_events)
    assert all(r.valid for r in registry.discover_runs(cache, ["fairseq"]))
    assert (len(parsed), len(measured)) == (6, 6)  # each run's log, each run's values
    assert all(r.valid for r in registry.discover_runs(other, ["fairseq"]))
    assert (len(parsed), len(measured)) == (6, 6)  # the copy: the same logs and files
    linked = event_files(other / "fairseq" / "random-seed2")[0]
    shutil.copy2(linked, tmp_path / "copy")  # the same bytes and times, another file (inode)
    os.replace(tmp_path / "copy", linked)
    assert all(r.valid for r in registry.discover_runs(other, ["fairseq"]))
    assert (len(parsed), len(measured)) == (7, 7)  # not known to be the same: checked again
