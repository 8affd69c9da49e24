"""The worker that fills a render's cache ahead of Quarto, and the lock that makes a fact
computed once when two processes ask for it at the same time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import quarto_hash

from finetune_lab import render_cache
from finetune_lab.book import freeze, prewarm

HELPER = '''
import os, time
from finetune_lab.render_cache import per_render

@per_render
def fact(label: str, wait: float = 0.0) -> str:
    with open(os.environ["CALLS_FILE"], "a") as f:
        f.write(label + "\\n")
    time.sleep(wait)
    return label.upper()
'''

QUARTO_YML = "project:\n  type: book\nbook:\n  chapters:\n    - index.qmd\n    - a.qmd\n"
INDEX = '---\ntitle: Home\n---\n\n```{python}\nimport helper\nx = helper.fact("index")\n```\n'
CHAPTER = """---
title: A
---

```{python}
import helper
print("shown by the kernel, not by the worker")
y = helper.fact("a")
```

```{python}
#| eval: false
helper.fact("never")
```

```{python}
1 / 0
```

```{python}
helper.fact("after")
```
"""


@pytest.fixture()
def project(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "_quarto.yml").write_text(QUARTO_YML)
    (tmp_path / "index.qmd").write_text(INDEX)
    (tmp_path / "a.qmd").write_text(CHAPTER)
    (tmp_path / "helper.py").write_text(HELPER)
    monkeypatch.setenv("CALLS_FILE", str(tmp_path / "calls.txt"))
    monkeypatch.delenv("FINETUNE_LAB_PREWARM", raising=False)
    monkeypatch.setattr(render_cache, "PROJECT_ROOT", tmp_path)
    return tmp_path


def _calls(project: Path) -> list[str]:
    path = project / "calls.txt"
    return path.read_text().split() if path.exists() else []


def test_worker_runs_the_chapters_in_book_order_and_the_kernel_reads_its_facts(
        project: Path, monkeypatch) -> None:
    render_cache.open_cache(project)
    chapters = prewarm.book_order(project, ["a.qmd", "index.qmd"])
    assert chapters == ["index.qmd", "a.qmd"]
    proc = prewarm.start(project, chapters)
    assert proc is not None and proc.wait(timeout=60) == 0
    # book order; an `eval: false` cell is skipped; a failing cell ends the chapter's pass
    assert _calls(project) == ["index", "a"]
    report = prewarm.stop(project)  # what post-render logs: a line per chapter
    assert [line.rsplit(",", 1)[0] for line in report] == [
        "prewarm: index.qmd: done",
        "prewarm: a.qmd: stopped at cell 3 (ZeroDivisionError: division by zero)"]
    log = (render_cache.cache_dir(project) / prewarm.LOG_FILE).read_text()
    assert "shown by the kernel" not in log  # the worker's output is thrown away

    # the chapter's kernel, in the same render: the fact comes from the cache
    monkeypatch.setenv("QUARTO_DOCUMENT_FILE", str(project / "a.qmd"))
    monkeypatch.syspath_prepend(str(project))
    import helper  # noqa: PLC0415 - the chapter's own module, on its folder's path

    assert helper.fact("a") == "A"
    assert _calls(project) == ["index", "a"]
    assert helper.fact("b") == "B" and _calls(project)[-1] == "b"  # not warmed: computed
    sys.modules.pop("helper", None)


def test_pre_render_warms_only_what_quarto_will_execute_and_post_render_stops_it(
        project: Path) -> None:
    inputs = "---\ntitle: {}\ninputs: [helper.py]\n---\n"
    (project / "index.qmd").write_text(INDEX.replace("---\ntitle: Home\n---\n",
                                                     inputs.format("Home")))
    (project / "a.qmd").write_text(inputs.format("A") + '\n```{python}\nimport helper\n'
                                   'helper.fact("a", wait=30)\n```\n')
    env = {"QUARTO_PROJECT_RENDER_ALL": "1"}
    # an earlier render executed index.qmd alone: it is frozen, with a record of its inputs
    freeze.pre_render(project, env, log=lambda *_: None)
    results = freeze.freeze_entry(project, "index.qmd") / "execute-results"
    results.mkdir(parents=True)
    (results / "html.json").write_text(json.dumps(
        {"hash": quarto_hash(project / "index.qmd"), "result": {"markdown": ""}}))
    freeze.post_render(project, log=lambda *_: None)
    assert freeze.check_freeze(project) == []

    freeze.pre_render(project, env, log=lambda *_: None, warm=True)
    pid = int((render_cache.cache_dir(project) / prewarm.PID_FILE).read_text())
    deadline = time.monotonic() + 30
    while not _calls(project) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert _calls(project) == ["a"]  # the frozen chapter is not executed, so not warmed
    logged: list[str] = []
    freeze.post_render(project, log=logged.append)  # the worker is 30 s from done: stopped
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
    assert not render_cache.cache_dir(project).exists()
    assert not any("prewarm" in line for line in logged)  # it never finished a chapter


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def test_no_worker_when_nothing_executes_or_when_turned_off(project: Path, monkeypatch) -> None:
    render_cache.open_cache(project)
    assert prewarm.start(project, []) is None
    monkeypatch.setenv("FINETUNE_LAB_PREWARM", "0")
    assert prewarm.start(project, ["a.qmd"]) is None
    assert not (render_cache.cache_dir(project) / prewarm.PID_FILE).exists()


def test_two_processes_asking_for_one_fact_compute_it_once(project: Path) -> None:
    folder = render_cache.open_cache(project)
    env = {**os.environ, "QUARTO_DOCUMENT_FILE": "a.qmd", render_cache.CACHE_ENV: str(folder),
           "PYTHONPATH": str(project)}
    code = "import helper; print(helper.fact('shared', wait=1.0))"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["SHARED", "SHARED"]
    assert _calls(project) == ["shared"]  # the second waited for the first one's value
