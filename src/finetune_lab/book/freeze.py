"""Data-aware freeze: re-execute a chapter when its *inputs* change, not only its text.

Quarto's ``freeze`` keys on each ``.qmd`` file's text. A chapter that reads runs, data or
``src/`` modules would keep showing old numbers after those change. Each chapter therefore
declares the data it reads in its front matter (paths or globs relative to the project root)
and its code is the import closure of its cells (:mod:`finetune_lab.book.chapter_inputs`)::

    ---
    title: "Fine-tuning with fairseq"
    inputs:
      - data/runs/fairseq/**
    ---

and two project scripts keep ``_freeze/`` honest:

* ``finetune-lab freeze pre-render`` hashes each rendered chapter's inputs. A chapter whose
  frozen results were made with other inputs (or with no record of them) has its
  ``_freeze/<chapter>/`` folder removed, which makes Quarto execute it again. Every chapter that
  will be executed gets a *pending* record of the hashes it is executed with.
* ``finetune-lab freeze post-render`` turns a pending record into the chapter's record once
  Quarto has written fresh frozen results for it, with the sha256 of each file of those results
  (:mod:`~finetune_lab.book.freeze_results`): results edited after the render are stale too.

Records live in ``_freeze/finetune-lab/<chapter>.qmd.json`` (not inside ``_freeze/<chapter>/``,
which Quarto copies next to the chapter's output). ``finetune-lab check-freeze`` compares every
frozen chapter with its record and fails, naming the changed files, when one is stale.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finetune_lab import render_cache
from finetune_lab.book.records import digest_of
from finetune_lab._files import parse_json, utc_now, write_json_atomic
from finetune_lab.book import prewarm
from finetune_lab.book.chapter_inputs import (EMPTY_FOLDER, MISSING, absent_inputs, chapter_inputs,
                                              chapters, check_book_stores)
from finetune_lab.book.freeze_env import record_inputs
from finetune_lab.book.freeze_results import (FREEZE_DIR, RECORDS_DIR, damaged_results,
                                              freeze_entry, is_frozen, output_hashes,
                                              text_changed)
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError

def record_path(project: Path, chapter: str, pending: bool = False) -> Path:
    suffix = ".pending.json" if pending else ".json"
    return project / FREEZE_DIR / RECORDS_DIR / f"{chapter}{suffix}"


def read_record(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def make_record(project: Path, chapter: str, patterns: list[str]) -> dict[str, Any]:
    files = record_inputs(project, chapter, patterns)  # and its packages' locked versions
    return {"chapter": chapter, "inputs": patterns, "files": files, "digest": digest_of(files),
            "hashed_at": utc_now()}


PREPARED_BY = {"data/work/cls.books": "prepare-cls", "data/work/tokenizer": "adopt-tokenizer",
               "data/work/cls-books-bin": "binarize-cls",
               "data/work/pretrain-bin/manifest.json": "prepare-pretrain",
               "data/work/hf": "convert-hf"}
"""The machine-local data a chapter reads and the command that makes each, in order (git
ignores them: a fresh clone has none until they are made). Of the pretraining corpus a chapter
needs only the record; the corpus itself is read by the registry only to check runs."""


# --- comparing ------------------------------------------------------------------------------


@dataclass
class StaleChapter:
    chapter: str
    reason: str
    changed: list[str] = field(default_factory=list)

    def describe(self, most: int = 8) -> str:
        shown = self.changed[:most] + ([f"and {len(self.changed) - most} more"]
                                       if len(self.changed) > most else [])
        files = f": {', '.join(shown)}" if shown else ""
        return f"{self.chapter} is stale ({self.reason}){files}"


def git_ignored(project: Path, paths: Iterable[str]) -> set[str]:
    """Which of ``paths`` git ignores in ``project`` (none where it is no git checkout)."""
    paths = list(paths)
    if not paths:
        return set()
    checkout = (Path(project) / ".git").exists()
    try:  # safe.directory: reading the ignore rules of another user's checkout is harmless
        proc = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(project),
                               "check-ignore", "-z", "--stdin"],
                              input="\0".join(paths).encode(), capture_output=True, check=False)
    except OSError as exc:
        if checkout:
            raise UserError(f"git cannot be run ({exc.strerror}): check-freeze needs it to tell "
                            f"the machine-local files of {project} (data/work/) from the "
                            "project's; install git") from None
        return set()
    if proc.returncode == 0:
        return {p for p in proc.stdout.decode().split("\0") if p}
    if proc.returncode != 1 and checkout:  # 1: none is ignored; anything else is git failing
        why = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
        links = sorted({str(parent) for p in paths for parent in Path(p).parents
                        if str(parent) != "." and (Path(project) / parent).is_symlink()})
        if links:  # trial 22's F-e1: git's "beyond a symbolic link" sent the user to its rules
            raise UserError(f"{Path(project) / links[0]} is a link: no chapter reads an input "
                            "through a link (nor does the registry a run); put the folder "
                            "itself there, then run check-freeze again")
        raise UserError(f"git could not read the ignore rules of {project} ({why}): "
                        "check-freeze needs them; fix what git says, then run it again")
    return set()


MACHINE_LOCAL = "data/work/"
"""The one git-ignored folder whose files chapters read where they exist (prepared data, the
candidates' weights): a clean clone lacks them, and its frozen pages are the ones to publish."""


def diff_files(recorded: dict[str, str], current: dict[str, str],
               project: Path | None = None) -> list[str]:
    """Human-readable list of what changed between two ``{path: sha256}`` maps.

    With ``project``, a recorded file of the machine-local :data:`MACHINE_LOCAL` that is gone
    and that git ignores there is no change: a clean clone never has it, and its frozen page is
    the one to publish. Its edits, where it exists, still count. An empty folder that appeared
    there holds nothing a chapter reads (``mkdir -p data/work``)."""
    gone = [p for p in recorded if recorded[p] != MISSING and current.get(p) in (None, MISSING)]
    emptied = [p for p in current if current[p] == EMPTY_FOLDER and p not in recorded]
    # only the work folder is machine-local: a committed input that a commit turned ignored
    # (trial 21's F-c1, a run's train.log) is gone from a clone, and that is a change
    local = {p for p in git_ignored(project, gone + emptied) if p.startswith(MACHINE_LOCAL)} \
        if project is not None else set()
    out = []
    for path in sorted(set(recorded) | set(current)):
        old, new = recorded.get(path), current.get(path)
        if old == new or path in local:
            continue
        if old is None or old == MISSING:
            out.append(f"{path} (new)")
        elif new is None or new == MISSING:
            out.append(f"{path} (removed)")
        else:
            out.append(f"{path} (changed)")
    return out


def stale_chapter(project: Path, chapter: str,
                  patterns: list[str] | None = None) -> StaleChapter | None:
    """Why the frozen results of ``chapter`` no longer match its inputs (``None``: they do).

    Chapters without frozen results or without declared ``inputs:`` are never stale here.
    """
    if not (project / chapter).is_file():
        return None
    if not is_frozen(project, chapter):  # a record of results that are gone (trial 15's R-CF6)
        return StaleChapter(chapter, "its frozen results are gone, so Quarto would execute it "
                                     "again") if record_path(project, chapter).is_file() else None
    patterns = patterns if patterns is not None else chapter_inputs(project, chapter)
    if patterns is None:
        return None
    if (damage := damaged_results(project, chapter)) is not None:
        return StaleChapter(chapter, f"its frozen results are damaged: {damage}")
    if (edited := text_changed(project, chapter)) is not None:
        return StaleChapter(chapter, f"its text changed since it was executed ({edited}), so "
                                     "Quarto would execute it again")
    path = record_path(project, chapter)
    record = read_record(path)
    if record is None:
        return StaleChapter(chapter, "frozen without a record of its inputs' hashes"
                            if not path.exists() else
                            f"its record of its inputs' hashes ({path.relative_to(project)}) is "
                            "damaged")
    current = record_inputs(project, chapter, patterns)
    if record.get("inputs") != patterns:
        changed = diff_files(record["files"], current, project)
        return StaleChapter(chapter, "its inputs (declared, or imported) changed", changed)
    changed = diff_files(record["files"], current, project)
    if changed:
        return StaleChapter(chapter, "inputs changed since it was executed", changed)
    outputs = record.get("outputs")
    if not isinstance(outputs, dict):
        return StaleChapter(chapter, "its record does not hold its frozen results' hashes (it "
                                     "was executed before they were recorded)")
    changed = diff_files(outputs, output_hashes(project, chapter))
    return StaleChapter(chapter, "its frozen results changed after it was executed (Quarto "
                                 "writes them; an edit there is not a render)",
                        [f"{freeze_entry(project, chapter).relative_to(project)}/{c}"
                         for c in changed]) if changed else None


def check_freeze(project: Path = PROJECT_ROOT) -> list[StaleChapter]:
    """Every frozen chapter whose inputs changed since execution (empty list: all fresh)."""
    if not (project / FREEZE_DIR).is_dir():
        return []
    return [s for c in chapters(project) if (s := stale_chapter(project, c)) is not None] + \
        gone_chapters(project)


def gone_chapters(project: Path) -> list[StaleChapter]:
    """Chapters the book lists in ``_quarto.yml``, or that have a freeze record, whose ``.qmd``
    is gone (trial 20's F-z7: a deleted chapter, or ``chapters/`` replaced by a file, was "up
    to date"): a render would stop in Quarto."""
    listed = re.findall(r"[\w./-]+\.qmd\b", (project / "_quarto.yml").read_text(
        encoding="utf-8", errors="replace")) if (project / "_quarto.yml").is_file() else []
    base = project / FREEZE_DIR / RECORDS_DIR
    recorded = [r.relative_to(base).as_posix()[:-len(".json")]
                for r in base.rglob("*.qmd.json")] if base.is_dir() else []
    return [StaleChapter(c, "the book lists it or froze it, but it is gone: restore it, or "
                            "drop it from _quarto.yml and its _freeze/ entries")
            for c in sorted(set(listed + recorded)) if not (project / c).is_file()]


# --- Quarto project scripts -----------------------------------------------------------------


def rendered_chapters(project: Path, environ: dict[str, str] | None = None) -> list[str]:
    """Chapters Quarto is rendering, from its pre-render environment (all if not told).

    ``QUARTO_PROJECT_INPUT_FILES`` is a newline-separated list relative to the project (or, when
    ``QUARTO_USE_FILE_FOR_PROJECT_INPUT_FILES`` is set, the file holding that list).
    """
    env = os.environ if environ is None else environ
    listing = env.get("QUARTO_PROJECT_INPUT_FILES")
    list_file = env.get("QUARTO_USE_FILE_FOR_PROJECT_INPUT_FILES")
    if list_file and Path(list_file).is_file():
        listing = Path(list_file).read_text(encoding="utf-8")
    if env.get("QUARTO_PROJECT_RENDER_ALL") or not listing:
        return chapters(project)
    out = []
    for line in listing.splitlines():
        line = line.strip()
        if not line.endswith(".qmd"):
            continue
        p = Path(line)
        p = p.resolve().relative_to(project.resolve()) if p.is_absolute() else p
        out.append(p.as_posix())
    return sorted(set(out))


def pre_render(project: Path = PROJECT_ROOT, environ: dict[str, str] | None = None,
               log=print, warm: bool = False) -> list[StaleChapter]:
    """Invalidate stale frozen chapters and write pending records; returns what it invalidated.

    Also opens the render's cache (:mod:`finetune_lab.render_cache`), so that a chapter
    executed for several formats computes its facts once, and with ``warm`` starts the worker
    that fills it ahead of Quarto (:mod:`finetune_lab.book.prewarm`) for the chapters Quarto
    will execute.
    """
    check_book_stores(project)
    prewarm.stop(project)
    render_cache.open_cache(project)
    invalidated, executed = [], []
    env = os.environ if environ is None else environ
    # Quarto executes a document rendered on its own (`quarto render chapters/x.qmd`) whether
    # frozen or not: its new results need a record of the inputs they were made with too
    incremental = not env.get("QUARTO_PROJECT_RENDER_ALL") and bool(
        env.get("QUARTO_PROJECT_INPUT_FILES") or env.get("QUARTO_USE_FILE_FOR_PROJECT_INPUT_FILES"))
    for chapter in rendered_chapters(project, environ):
        if not (project / chapter).is_file():
            continue
        patterns = chapter_inputs(project, chapter)
        if patterns is None:
            continue
        stale = stale_chapter(project, chapter, patterns)
        if stale is not None:
            shutil.rmtree(freeze_entry(project, chapter), ignore_errors=True)
            # a half-finished earlier render can leave thawable results beside the chapter
            shutil.rmtree(project / Path(chapter).parent / f"{Path(chapter).stem}_files"
                          / "execute-results", ignore_errors=True)
            record_path(project, chapter).unlink(missing_ok=True)
            invalidated.append(stale)
            log(f"finetune-lab freeze: {stale.describe()}; removed its frozen results so "
                "Quarto executes it again")
        if incremental or not is_frozen(project, chapter):
            write_json_atomic(record_path(project, chapter, pending=True),
                              make_record(project, chapter, patterns))
            executed.append(chapter)
            if absent := absent_inputs(project, patterns, PREPARED_BY):
                steps = [c for d, c in PREPARED_BY.items() if any(a.startswith(d) for a in absent)]
                log(f"finetune-lab freeze: WARNING: {chapter} executes without its prepared data "
                    f"({', '.join(absent)}): its pages will say what they could not compute; "
                    f"`finetune-lab {'`, `finetune-lab '.join(steps)}` prepare it, in that order")
    if warm:
        prewarm.start(project, prewarm.book_order(project, executed))
    return invalidated


def post_render(project: Path = PROJECT_ROOT, log=print) -> list[str]:
    """Promote pending records of chapters that now have fresh frozen results, and close the
    render's cache."""
    for line in prewarm.stop(project):
        log(f"finetune-lab freeze: {line}")
    render_cache.close_cache(project)
    promoted = []
    base = project / FREEZE_DIR / RECORDS_DIR
    if not base.is_dir():
        return promoted
    for pending in sorted(base.rglob("*.qmd.pending.json")):
        record = read_record(pending)
        chapter = record.get("chapter") if record else None
        if chapter and is_frozen(project, chapter):
            write_json_atomic(record_path(project, chapter),
                              {**record, "outputs": output_hashes(project, chapter)})
            promoted.append(chapter)
            log(f"finetune-lab freeze: recorded the input hashes {chapter} was executed with")
        pending.unlink(missing_ok=True)
    for chapter in chapters(project):  # a format rendered later (Typst after an HTML render)
        record = read_record(record_path(project, chapter))
        old, now = (record or {}).get("outputs"), output_hashes(project, chapter)
        if chapter not in promoted and isinstance(old, dict) and old != now \
                and all(now.get(k) == v for k, v in old.items()):  # added, none changed
            write_json_atomic(record_path(project, chapter), {**record, "outputs": now})
    return promoted


# --- CLI ------------------------------------------------------------------------------------


def _project(args: argparse.Namespace) -> Path:
    """The project named on the command line, which must be a folder holding a book: a typo
    must not read as "nothing frozen" and pass."""
    if not args.project:
        return PROJECT_ROOT
    project = Path(args.project).resolve()
    if not project.is_dir():
        what = "is a file, not a folder" if project.exists() else "does not exist"
        raise UserError(f"project {args.project} {what}; name the folder that holds the book "
                        "(_quarto.yml, the chapters' .qmd files)")
    if not (project / "_quarto.yml").is_file() or not chapters(project):
        raise UserError(f"project {args.project} holds no _quarto.yml and .qmd chapters: it is "
                        "not the book's folder")
    return project


def _cmd_check(args: argparse.Namespace) -> int:
    project = _project(args)
    if not (project / FREEZE_DIR).is_dir():
        print(f"no {FREEZE_DIR}/ in {project}: nothing frozen, nothing stale")
        return 0
    stale = check_freeze(project)
    for s in stale:
        print(f"stale: {s.describe()}", file=sys.stderr)
    if stale:
        print("re-render to refresh them (the pre-render script removes their frozen results), "
              f"or delete {FREEZE_DIR}/<chapter>/", file=sys.stderr)
        return 1
    print("freeze is up to date with every chapter's declared inputs")
    return 0


def _cmd_pre(args: argparse.Namespace) -> int:
    pre_render(_project(args), warm=True)
    return 0


def _cmd_post(args: argparse.Namespace) -> int:
    post_render(_project(args))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "check-freeze", help="fail if a frozen chapter's declared inputs changed since execution")
    check.add_argument("--project", default=None, help="project root (default: this checkout)")
    check.set_defaults(func=_cmd_check)

    freeze = subparsers.add_parser("freeze", help="Quarto pre-/post-render scripts for freeze")
    sub = freeze.add_subparsers(dest="freeze_command", metavar="STEP", required=True)
    pre = sub.add_parser("pre-render", help="invalidate chapters whose inputs changed")
    pre.add_argument("--project", default=None)
    pre.set_defaults(func=_cmd_pre)
    post = sub.add_parser("post-render", help="record the inputs executed chapters used")
    post.add_argument("--project", default=None)
    post.set_defaults(func=_cmd_post)
