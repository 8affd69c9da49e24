"""The provenance footer every results chapter ends with.

It is produced when the chapter *executes*: the time, the commit, the hashes of the chapter's
declared inputs and, for each run used, its manifest's hashes, device and package versions. A
page served from Quarto's freeze shows the footer of the execution that made it, so the text
says so; ``finetune-lab check-freeze`` (run before publishing) fails if any input listed here
has changed since, which is what makes "from freeze" checkable rather than a promise.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from finetune_lab.book.records import digest_of
from finetune_lab._files import sha256_file, utc_now
from finetune_lab.book.chapter_inputs import MISSING, chapter_inputs, hash_inputs
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.runs.manifest import MANIFEST_NAME, git_commit, package_versions
from finetune_lab.runs.registry import RunRecord
from finetune_lab.runs.runspeed import device_name

_VERSION_KEYS = ("torch", "fairseq-fixed", "transformers", "peft")


def current_chapter(project: Path = PROJECT_ROOT) -> str | None:
    """The chapter being executed, from Quarto's ``QUARTO_DOCUMENT_PATH``/``_FILE`` variables."""
    folder, name = os.environ.get("QUARTO_DOCUMENT_PATH"), os.environ.get("QUARTO_DOCUMENT_FILE")
    if not name:
        return None
    path = (Path(folder) / name) if folder else Path(name)
    if path.suffix != ".qmd":
        path = path.with_suffix(".qmd")
    try:
        return path.resolve().relative_to(project.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _short(sha: str | None, n: int = 12) -> str:
    return f"`{sha[:n]}`" if sha and sha != MISSING else (sha or "–")


def _versions(man: dict[str, Any]) -> str:
    pk = (man.get("environment") or {}).get("packages") or {}
    return ", ".join(f"{k} {pk[k]}" for k in _VERSION_KEYS if k in pk) or "?"


def run_rows(runs: Iterable[RunRecord]) -> list[dict[str, str]]:
    """One row per run: identity, device, versions, code commit, manifest and events hashes."""
    rows = []
    for r in runs:
        man = r.manifest or {}
        git = (man.get("environment") or {}).get("git") or {}
        mpath = r.path / MANIFEST_NAME
        rows.append({
            "run": f"{r.experiment}/{r.name}",
            "init / seed": f"{r.init} / {r.seed}",
            "status": "valid" if r.valid else f"excluded: {r.reason}",
            "device": device_name(man),
            "versions": _versions(man),
            "commit": _short(git.get("commit"), 8) + (" (dirty)" if git.get("dirty") else ""),
            "manifest sha256": _short(sha256_file(mpath)) if mpath.is_file() else "–",
            "events sha256": _short(digest_of(man["outputs"])) if man.get("outputs") else "–",
            "wall time": f"{man['wall_time_s']:.0f} s" if man.get("wall_time_s") else "–",
        })
    return rows


def _md_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    esc = [{c: str(row[c]).replace("|", "\\|") for c in cols} for row in rows]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(r[c] for c in cols) + " |" for r in esc]
    return "\n".join(lines)


def compact_run_rows(runs: Iterable[RunRecord]) -> list[dict[str, str]]:
    """The PDF's form of :func:`run_rows` for the runs it lists (the excluded ones): columns short
    enough for a page (the HTML has all)."""
    return [{"run": f"{r.experiment}/{r.name}",
             "status": "valid" if r.valid else "excluded",
             "manifest": _short(sha256_file(r.path / MANIFEST_NAME), 8)
             if (r.path / MANIFEST_NAME).is_file() else "–"} for r in runs]


def _when(fmt: str, body: list[str], unless: bool = False) -> list[str]:
    """Quarto conditional content: ``body`` only in (or, ``unless``, all but) format ``fmt``."""
    cls = "content-hidden" if unless else "content-visible"
    return ["", f"::: {{.{cls} when-format=\"{fmt}\"}}", *body, ":::"]


def provenance_markdown(
    runs: Iterable[RunRecord] = (),
    chapter: str | None = None,
    project: Path = PROJECT_ROOT,
    max_files: int = 15,
) -> str:
    """The footer as Markdown text (see :func:`provenance_footer` for the displayable object).

    The HTML gets the full form (input files and runs with their hashes, devices, versions);
    other formats (the PDF) a compact one that fits its pages: the digest, and runs by name,
    status and short manifest hash. Both are in the text, as Quarto conditional content, so
    that one execution serves every format.
    """
    runs = list(runs)
    chapter = chapter or current_chapter(project)
    git = git_commit(project)
    commit = (git["commit"][:10] if git["commit"] else "no commit") + (
        " and changes committed after it (the digest below names the inputs exactly)"
        if git["dirty"] else "")
    versions = package_versions(("finetune-lab",) + _VERSION_KEYS)
    parts = [
        "## Provenance {.unnumbered .unlisted}",
        "",
        f"Executed {utc_now()} (UTC) from commit {commit}; "
        + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
    ]  # what the footer means is said once, in the front page's "Reading the book"
    full: list[str] = []
    compact: list[str] = []
    patterns = chapter_inputs(project, chapter) if chapter and (project / chapter).is_file() else None
    if patterns is not None:
        files = hash_inputs(project, patterns)
        summary = (f"Inputs of `{chapter}` (its declared data, and the package modules its "
                   f"code imports, directly or not): {len(files)} files, digest "
                   f"{_short(digest_of(files), 16)}")
        parts += ["", summary + "."]
        shown = list(files.items())[:max_files]
        full += ["", _md_table([{"input": f"`{k}`", "sha256": _short(v)} for k, v in shown])]
        if len(files) > max_files:
            full.append(f"\n(and {len(files) - max_files} more files in the digest)")
        compact += ["", "The files and their hashes are listed in the HTML book, with each "
                        "run's device, package versions, commit and hashes."]
    elif chapter:
        parts += ["", f"`{chapter}` declares no `inputs:` and imports no package module; its "
                      "freeze follows its text only."]
    if runs:
        used = [r for r in runs if r.valid]
        excluded = [r for r in runs if not r.valid]
        parts += ["", f"Runs: {len(used)} used, {len(excluded)} excluded."]
        full += ["", _md_table(run_rows(runs))]
        if excluded:  # the PDF names only the runs it did not use, in a sentence that flows
            # with the text (a table's last row alone on a page is what a table risks)
            compact += ["", "Excluded: " + "; ".join(
                f"`{row['run']}` (manifest {row['manifest']})"
                for row in compact_run_rows(excluded)) + "."]
    if full:
        parts += _when("html", full) + _when("html", compact, unless=True)
    return "\n".join(parts) + "\n"


def provenance_footer(runs: Iterable[RunRecord] = (), chapter: str | None = None,
                      project: Path = PROJECT_ROOT):
    """Displayable Markdown footer for a chapter's last cell (Quarto reads ``text/markdown``)."""
    from IPython.display import Markdown

    return Markdown(provenance_markdown(runs, chapter=chapter, project=project))
