"""What a GPU device call sends back: one archive in pieces under 16 MiB, and its unpacking here.

A device call returns at most 8 files of 16 MiB each from ``$OUT``. :func:`pack` (there) tars the
new run folders and weights, cuts the archive into pieces and writes ``gpu-lab.json`` with each
piece's and the whole's sha256; :func:`unpack` (here, ``finetune-lab gpu-unpack DIR``) checks and
reassembles them and moves each run into the run cache, under experiments of its own
(``fairseq-gpu``, ...), where the registry checks it like any other run. Nothing already there
is replaced.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from finetune_lab._files import not_there, parse_json
from finetune_lab.config import PROJECT_ROOT
from finetune_lab.errors import UserError
from finetune_lab.models.checkpoints import package_manifest
from finetune_lab.runs.experiments import EXPERIMENT_CONFIG
from finetune_lab.runs.gpu_place import (STAGING_PREFIX, files_under, place, place_config,
                                         staged_configs, unpack_lock, whole_problem)
from finetune_lab.runs.gpu_plan import LAB_PARTS

RESULT_FILE = "gpu-lab.json"
ARCHIVE = "gpu-lab.tar"
PIECE_BYTES = 15 * 2**20
"""Under the 16 MiB a file from ``$OUT`` may have."""
MAX_FILES_BACK = 8
UNPACKED_BYTES = 2 * 2**30
"""What a call's archive may unpack to (its pieces are 120 MiB at most, compressed)."""


def pack(paths_in: Sequence[Path], out: Path, *, root: Path = PROJECT_ROOT,
         piece_bytes: int = PIECE_BYTES, extra: dict[str, Any] | None = None,
         generation: int = 0) -> dict[str, Any]:
    """Tar ``paths_in`` (relative to ``root``), split it into pieces of at most
    ``piece_bytes`` and write ``gpu-lab.json`` with each piece's and the whole's sha256.

    Called again with a higher ``generation`` (a snapshot after each finished run), it replaces
    the earlier snapshot so that a kill at any moment leaves one whole snapshot in ``out``: the
    new pieces are written under new names, ``gpu-lab.json`` is replaced in one rename, and only
    then are the older pieces removed."""
    out.mkdir(parents=True, exist_ok=True)
    digest, pieces = hashlib.sha256(), []
    with tempfile.TemporaryDirectory() as tmp:  # the whole archive never lands in out
        whole = Path(tmp) / ARCHIVE
        # gzip at its fastest: weights hardly compress (34 MiB of 44 against xz -1's 32), and
        # each snapshot packs everything again (xz -1 took 10 s for the weights alone)
        with tarfile.open(whole, "w:gz", compresslevel=1) as tar:
            for p in paths_in:
                tar.add(p, arcname=Path(p).resolve().relative_to(root.resolve()).as_posix())
        size = whole.stat().st_size
        count = -(-size // piece_bytes) or 1
        if count + 1 > MAX_FILES_BACK - 1:  # one more: the earlier snapshot's piece, briefly
            raise UserError(f"{count} pieces of {piece_bytes / 2**20:.0f} MiB and {RESULT_FILE} "
                            f"exceed the {MAX_FILES_BACK} files a call returns")
        stem = f"{ARCHIVE}.g{generation}" if generation else ARCHIVE
        with open(whole, "rb") as fh:
            while chunk := fh.read(piece_bytes):
                digest.update(chunk)
                name = f"{stem}.{len(pieces):03d}"
                (out / name).write_bytes(chunk)
                pieces.append({"file": name, "bytes": len(chunk),
                               "sha256": hashlib.sha256(chunk).hexdigest()})
    result = {**(extra or {}), "archive_sha256": digest.hexdigest(), "pieces": pieces}
    staged = out / f"{RESULT_FILE}.tmp"
    staged.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    os.replace(staged, out / RESULT_FILE)
    keep = {piece["file"] for piece in pieces}
    for old in out.glob(f"{ARCHIVE}.*"):  # the earlier snapshot's pieces, now unlisted
        if old.name not in keep:
            old.unlink()
    return result


PRODUCT_ROOTS = ("data/runs", "data/checkpoints", "data/work/candidates", "data/work/gpu-lab-logs")
"""Where a device call's products may go: one folder directly under one of these (an
experiment, a packaged checkpoint, a candidate, a call's logs), as :func:`pack` makes them."""


def read_result(meta_path: Path) -> dict[str, Any]:
    """``gpu-lab.json``, checked for the fields :func:`unpack` reads: a damaged or foreign file
    is one line naming it, never a traceback."""
    fetch = "fetch the call's files again"
    try:
        meta = parse_json(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{meta_path} is not valid JSON ({exc.msg}, line {exc.lineno}): it was "
                        f"cut short or damaged; {fetch}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{meta_path} cannot be read ({exc}); {fetch}") from None
    shapes = {"pieces": list, "archive_sha256": str, "products": list}
    wrong = [key for key, kind in shapes.items()
             if not isinstance(meta, dict) or not isinstance(meta.get(key), kind)]
    if wrong:
        raise UserError(f"{meta_path} lacks {', '.join(repr(k) for k in wrong)} (or has the wrong "
                        f"kind of value there): it is not what gpu-lab writes; {fetch}")
    for piece in meta["pieces"]:
        name = piece.get("file") if isinstance(piece, dict) else None
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..") \
                or not isinstance(piece.get("sha256"), str):
            raise UserError(f"{meta_path} lists a piece {piece!r} that is not a file name with "
                            f"its sha256; {fetch}")
    for product in meta["products"]:
        check_product_path(product, meta_path)
    return meta


def check_product_path(product: Any, meta_path: Path) -> str:
    """A product path must name one folder directly under :data:`PRODUCT_ROOTS`, relative, with
    no ``..``: so nothing a bundle lists lands outside the run cache and the candidates."""
    parts = PurePosixPath(product).parts if isinstance(product, str) else ()
    ok = (isinstance(product, str) and "\\" not in product and len(parts) >= 2
          and PurePosixPath(product).as_posix() == product.rstrip("/")
          and not PurePosixPath(product).is_absolute()
          and not any(p in ("", ".", "..") or p.startswith(".") for p in parts)  # G-h4
          and "/".join(parts[:-1]) in PRODUCT_ROOTS)
    if not ok:
        raise UserError(f"{meta_path} lists the product {product!r}, which is not one folder "
                        f"directly under {', '.join(r + '/' for r in PRODUCT_ROOTS)}: refused, "
                        "nothing was unpacked")
    return "/".join(parts)


def _staged(stage: Path, product: str, meta_path: Path) -> Path:
    """The product's folder in the extracted archive: there, a real folder (no link on the way),
    and with no link inside (a link would point the move, or a later reader, elsewhere)."""
    top = stage / product
    if not top.is_dir() or top.resolve() != stage.resolve() / product:
        raise UserError(f"{meta_path} lists {product}, which the archive does not hold as a "
                        "folder: the files do not belong together; fetch the call's files again")
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            if any(ord(c) < 32 or ord(c) == 127 for c in name):  # trial 17's G-h5: a newline
                rel = Path(folder, name).relative_to(stage)
                raise UserError(f"the archive's {str(rel)!r} has a control character in its "
                                "name, which no command writes; refused, nothing was unpacked")
            if os.path.islink(os.path.join(folder, name)):
                rel = Path(folder, name).relative_to(stage)
                raise UserError(f"the archive's {rel} is a link: a device call's products hold "
                                "none; refused, nothing was unpacked")
    return top


def unpack(src: Path, *, root: Path = PROJECT_ROOT) -> list[Path]:
    """Check each piece's sha256 and the whole's, then move every run folder and candidate it
    holds into place. A destination that already exists is left alone and reported. Every
    product is checked (:func:`check_product_path`, :func:`_staged`, each folder whole against
    the archive and its run's manifest) before anything moves, and one unpack runs at a time
    (:func:`~finetune_lab.runs.gpu_place.unpack_lock`)."""
    with unpack_lock(root, PRODUCT_ROOTS):
        return _unpack(Path(src), root)


def _unpack(src: Path, root: Path) -> list[Path]:
    meta_path = src / RESULT_FILE
    if not meta_path.is_file():
        raise UserError(f"{meta_path} {not_there(meta_path)}: pass the folder the device "
                        "call's files came back in")
    meta = read_result(meta_path)
    digest = hashlib.sha256()
    # same disk, so moves are renames; hidden, so no reader takes it for data
    with tempfile.TemporaryDirectory(dir=root / "data", prefix=STAGING_PREFIX) as tmp:
        whole = Path(tmp) / ARCHIVE
        with open(whole, "wb") as fh:
            for piece in meta["pieces"]:
                if not (src / piece["file"]).is_file():  # gone, or a pipe, device, folder
                    raise UserError(f"{src / piece['file']} {not_there(src / piece['file'])}: "
                                    f"every piece that {meta_path.name} lists must come back "
                                    "with it, as a file")
                data = (src / piece["file"]).read_bytes()
                if hashlib.sha256(data).hexdigest() != piece["sha256"]:
                    raise UserError(f"{src / piece['file']} does not match its sha256 in "
                                    f"{meta_path}: fetch the call's files again")
                digest.update(data)
                fh.write(data)
        if digest.hexdigest() != meta["archive_sha256"]:
            raise UserError(f"the pieces listed in {meta_path} do not reassemble to the archive "
                            "it names: fetch the call's files again")
        stage = Path(tmp) / "stage"
        try:
            with tarfile.open(whole) as tar:
                # pack() writes files and folders only: a link (a hard one to a name the archive
                # lacks was a KeyError traceback, trial 24's G-i1) is refused before extracting
                linked = [m.name for m in tar.getmembers() if m.islnk() or m.issym()]
                if linked:
                    raise tarfile.TarError(f"{linked[0]!r} is a link, which pack never writes")
                if (size := sum(m.size for m in tar.getmembers())) > UNPACKED_BYTES:  # G-k1
                    raise tarfile.TarError(f"its files would take {size / 2**20:,.0f} MiB, far "
                                           "more than a call's runs and weights")
                files = {PurePosixPath(m.name).as_posix(): m.size for m in tar.getmembers()
                         if m.isfile()}  # what each placed folder must hold, whole
                tar.extractall(stage, filter="data")
        except (tarfile.TarError, KeyError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            # (a stream cut short or damaged inside pieces whose sha256s match: trial 29's E-18)
            raise UserError(f"the archive of {meta_path} cannot be unpacked safely ({exc}): "
                            "refused, nothing was unpacked") from None
        named = [check_product_path(p, meta_path) for p in meta["products"]]
        products = {p: _staged(stage, p, meta_path) for p in named}
        for product, top in products.items():  # weights: their manifest must be whole, first
            if product.startswith(("data/checkpoints/", "data/work/candidates/")):
                try:
                    if package_manifest(top) is None:
                        raise UserError(f"{product} holds no manifest.json")
                except UserError as exc:
                    raise UserError(f"{meta_path}: the weights {product}: {exc}; refused, "
                                    "nothing was unpacked") from None
        staged_configs(products, meta_path)
        for product in products:  # a file or a link where a product goes: said before any move
            blocked = next((d for d in [root / product, *(root / product).parents]
                            if d.is_relative_to(root) and (d.is_file() or d.is_symlink()
                            and len(d.relative_to(root).parts) > 2)), None)  # below data/runs
            if blocked is not None:  # a link: what moved through it would leave the project
                raise UserError(f"{blocked} is a {'link' if blocked.is_symlink() else 'file'} "
                                f"where the call's {product} goes: move it away; nothing was "
                                "unpacked")
        moves = []
        for product, top in products.items():
            # an experiment's experiment.json first: the runs beside it are judged by it
            children = sorted((p for p in top.iterdir() if not p.name.startswith(".")),
                              key=lambda p: (p.name != EXPERIMENT_CONFIG, p.name)) \
                if product.startswith("data/runs/") else [top]
            for item in children:
                rel = item.relative_to(stage).as_posix()
                mine, run = files_under(files, rel), product.startswith("data/runs/")
                problem = whole_problem(item, mine, run)  # trial 27's L-m10: never half a run
                if problem is not None:
                    raise UserError(f"{meta_path}: the call's {rel} is not whole ({problem}): "
                                    "refused, nothing was unpacked; fetch the call's files again")
                moves.append((product, item, mine, run))
        placed = keep_call_record(meta, stage, root)  # before its logs move away
        for product, item, mine, run in moves:
            dest = root / item.relative_to(stage)
            if item.name == EXPERIMENT_CONFIG and run:
                if not place_config(dest, item, root):
                    continue
            elif dest.exists() or dest.is_symlink():
                print(f"gpu-unpack: {dest.relative_to(root)} exists; left as it is")
                continue
            if place(item, dest, mine, root):
                placed.append(dest)
            else:
                print(f"gpu-unpack: {dest.relative_to(root)} appeared meanwhile; left as it is")
    return placed


CALL_RECORDS = "data/summaries/gpu-lab"
"""Where each call's record is kept (committed): ``gpu-lab.json`` as the call wrote it (device,
jobs, timings, wall time) and the GPU's use sampled by ``nvidia-smi``, named by the call's date."""
LOGS_ROOT = "data/work/gpu-lab-logs"


PREP_JOBS = ("binarize-cls", "convert-hf")
"""The jobs of a call's data phase, one after another; every other job runs in its ``runs``
(trial 25's M-k6: 25 s moved from data to runs halved the setup the fairseq chapter names)."""
SEQUENTIAL = ("install", "data", "runs")
"""A call's phases one after another (``timings_s``): together no longer than the call. The
pretraining of a call that fine-tunes its weights is part of ``runs``."""


def call_record_problem(meta: Any, stamp: str | None = None) -> str | None:
    """What a call's record lacks for the book (its plan, jobs, wall time, timings, device),
    or None: a record that says less is kept out of the book, by name. ``stamp``: the name it
    is kept under, which must be its own log folder's (a copy under a later name would pass
    for a later call)."""
    if not isinstance(meta, dict):
        return "is not a JSON object"
    for key, kind in (("plan", dict), ("jobs", list), ("timings_s", dict), ("device", dict)):
        if not isinstance(meta.get(key), kind):
            return f"lacks {key} (or it is not a {kind.__name__})"
    wall = meta.get("wall_s")
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) \
            or wall < 0:
        return f"has wall_s = {wall!r}, not a finite number of seconds"
    for job in meta["jobs"]:
        if not isinstance(job, dict) or not isinstance(job.get("job"), str) \
                or isinstance(job.get("exit_code"), bool) \
                or not isinstance(job.get("exit_code"), int):
            return f"lists a job {job!r} without its name and exit code"
    names = [j["job"] for j in meta["jobs"]]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return f"lists job {', '.join(twice)} more than once: each job runs once in a call"
    lab_parts = meta["plan"].get("lab_parts")
    unplanned = sorted({n.split("-", 1)[0] for n in names} & set(LAB_PARTS)
                       - set(lab_parts if isinstance(lab_parts, list) else []))
    if unplanned:
        return (f"ran {', '.join(unplanned)} jobs but its plan's lab_parts are {lab_parts!r}: the "
                "plan or the jobs were edited")
    parts = {f"timings_s.{k}": v for k, v in meta["timings_s"].items()}
    parts.update({f"job {j['job']}": j.get("seconds") for j in meta["jobs"] if "seconds" in j})
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in parts.values()):
        return "has timings or job seconds that are not numbers"
    ran = {int(m[1]) for j in meta["jobs"] if (m := re.search(r"-seed(\d+)$", j["job"]))}
    planned = meta["plan"].get("seeds")
    if ran and isinstance(planned, list) and ("runs" in meta["timings_s"] and set(planned) != ran
                                              or not ran <= set(planned)):
        return (f"plans seeds {planned} but its jobs ran seeds {sorted(ran)}: the plan or the "
                "jobs were edited")
    negative = next((k for k, v in parts.items() if not math.isfinite(v) or v < 0), None)
    if negative is not None:
        return f"says its {negative} took {parts[negative]:g} s"
    longest = max(parts, key=parts.get, default=None)
    if longest is not None and parts[longest] > wall + 1.0:  # timed to 0.1 s
        return (f"has wall_s = {wall:g} but its {longest} took {parts[longest]:g} s: no part of "
                "a call is longer than the call")
    seconds = {j["job"]: j.get("seconds") or 0.0 for j in meta["jobs"]}
    prep = sum(v for k, v in seconds.items() if k in PREP_JOBS)
    slowest = max((v for k, v in seconds.items() if k not in PREP_JOBS), default=0.0)
    data, runs = meta["timings_s"].get("data"), meta["timings_s"].get("runs")
    if data is not None and data + 1.0 < prep or runs is not None and runs + 1.0 < slowest:
        return (f"says its data phase took {data} s and its runs {runs} s, which its jobs' own "
                f"seconds contradict (the data jobs {prep:g} s one after another, the longest "
                f"other job {slowest:g} s)")
    phases = sum(meta["timings_s"].get(k, 0.0) for k in SEQUENTIAL)
    if phases > wall + 1.0:
        return (f"has wall_s = {wall:g} but its phases one after another ({', '.join(SEQUENTIAL)}) "
                f"took {phases:g} s")
    products = meta.get("products") if isinstance(meta.get("products"), list) else []
    logs = [str(p) for p in products if str(p).startswith(LOGS_ROOT + "/")]
    if stamp is not None and logs and PurePosixPath(logs[0]).name != stamp:
        return (f"is kept as {stamp} but is the record of call {PurePosixPath(logs[0]).name} "
                "(its logs' folder): a copy")
    return None


def keep_call_record(meta: dict[str, Any], stage: Path, root: Path) -> list[Path]:
    """Copy the call's ``gpu-lab.json`` and its ``nvidia-smi.csv`` under :data:`CALL_RECORDS`,
    named by the call's log folder (its UTC start); an existing record is left as it is, and
    one that lacks what the book reads (:func:`call_record_problem`) is not kept."""
    logs = [p for p in meta["products"] if p.startswith(LOGS_ROOT + "/")]
    if not logs:
        return []
    problem = call_record_problem(meta)
    if problem is not None:
        print(f"gpu-unpack: the call's record {problem}; it is not kept under {CALL_RECORDS}")
        return []
    stamp = PurePosixPath(logs[0]).name
    dest = root / CALL_RECORDS
    dest.mkdir(parents=True, exist_ok=True)
    made = []
    record = dest / f"{stamp}.json"
    # lexists: a link there, dangling or not, is left as it is, never written through (trial
    # 13's GL5 wrote a file into the package through one)
    if not os.path.lexists(record):
        record.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        made.append(record)
    smi = stage / logs[0] / "nvidia-smi.csv"
    if smi.is_file() and not os.path.lexists(dest / f"{stamp}-nvidia-smi.csv"):
        shutil.copyfile(smi, dest / f"{stamp}-nvidia-smi.csv")
        made.append(dest / f"{stamp}-nvidia-smi.csv")
    return made
