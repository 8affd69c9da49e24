"""What Quarto froze for a chapter: where its results live in ``_freeze/``, whether they are
readable and whole, which text they were made from, and the sha256 of each of its files.

``check-freeze`` compares those hashes with the ones recorded when the chapter was executed, so
a number edited in ``execute-results/html.json``, or a figure copied over another, makes the
chapter stale (trial 14's CF4, CF5): the freeze publishes only what a render wrote.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from finetune_lab._files import parse_json, sha256_file

FREEZE_DIR = "_freeze"
RECORDS_DIR = "finetune-lab"


# --- where things live in _freeze ---------------------------------------------------------


def freeze_entry(project: Path, chapter: str) -> Path:
    """``_freeze/<chapter without .qmd>/`` (Quarto's layout)."""
    return project / FREEZE_DIR / Path(chapter).with_suffix("")


def is_frozen(project: Path, chapter: str) -> bool:
    results = freeze_entry(project, chapter) / "execute-results"
    return results.is_dir() and any(results.glob("*.json"))


def damaged_results(project: Path, chapter: str) -> str | None:
    """What is wrong with a chapter's frozen results (None: each parses and is whole).

    Quarto re-executes a chapter whose results it cannot read, which a publish job without
    torch cannot do; so a truncated or hand-edited ``execute-results/*.json``, or a figure its
    Markdown shows that is gone, makes the chapter stale here, before the render."""
    entry = freeze_entry(project, chapter)
    for path in sorted((entry / "execute-results").glob("*.json")):
        shown = path.relative_to(project).as_posix()
        if not path.is_file():  # a pipe would block the read for ever: never opened
            return f"{shown} is not a regular file"
        try:
            data = parse_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return f"{shown} cannot be read ({exc})"
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(data.get("hash"), str) \
                or not isinstance(result, dict) or not isinstance(result.get("markdown"), str):
            return f"{shown} is not a Quarto freeze record (hash, result.markdown)"
        files = f"{Path(chapter).stem}_files/"
        for ref in sorted(set(re.findall(re.escape(files) + r"[\w./-]+", result["markdown"]))):
            if not (entry / ref[len(files):]).is_file():
                return f"{shown} shows {ref}, which is not in {entry.relative_to(project)}/"
            if not _whole_image(entry / ref[len(files):]):  # trial 13's CF5: emptied, cut
                return f"{shown} shows {ref}, which is cut short or empty"
    return None


def _whole_image(path: Path) -> bool:
    """An SVG that ends its ``<svg>``, a PNG that ends with its IEND chunk, anything else not
    empty: what a figure cut short or emptied is not."""
    data = path.read_bytes()
    if path.suffix == ".svg":
        return data.rstrip().endswith(b"</svg>")
    if path.suffix == ".png":
        return data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(b"IEND\xaeB`\x82")
    return bool(data)


def text_changed(project: Path, chapter: str) -> str | None:
    """Which frozen result was made from another text of the chapter (None: none). Quarto keys
    each result on the md5 of the ``.qmd`` file, and executes a chapter again when it differs,
    which a publish job without torch cannot do."""
    now = hashlib.md5((project / chapter).read_bytes()).hexdigest()
    for path in sorted((freeze_entry(project, chapter) / "execute-results").glob("*.json")):
        if parse_json(path.read_text(encoding="utf-8")).get("hash") != now:
            return f"{path.relative_to(project).as_posix()} holds the md5 of another text"
    return None


def output_hashes(project: Path, chapter: str) -> dict[str, str]:
    """``{path under _freeze/<chapter>/: sha256}`` of every file Quarto froze for the chapter
    (its results for each format and its figures); a folder there that is not a regular file's
    parent, or a link, is recorded by kind and never opened."""
    entry = freeze_entry(project, chapter)
    if not entry.is_dir():
        return {}
    out = {}
    for path in sorted(entry.rglob("*")):
        rel = path.relative_to(entry).as_posix()
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            out[rel] = "not a regular file"
        elif path.is_file():
            out[rel] = sha256_file(path)
    return out
