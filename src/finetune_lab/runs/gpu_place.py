"""Where ``gpu-unpack`` puts a device call's products: one unpack at a time, each folder whole.

:func:`~finetune_lab.runs.gpu_archive.unpack` extracts the call's archive into a staging folder
under ``data/`` and moves each product from there. Two unpacks at once (trial 27's L-m10): the
second cleared every staging folder, the first's too, and the first then placed a run with
files missing, silently, which a rerun left as it was ("exists"). So an unpack holds
``data/.gpu-unpack.lock`` for its whole length, clears leftovers only while it holds it, and
places a folder only once it holds every file the archive lists for it and its run's manifest
hashes match (:func:`whole_problem`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from finetune_lab._files import parse_json, sha256_file
from finetune_lab.errors import UserError, rename_noreplace
from finetune_lab.runs.experiments import (
    EXPERIMENT_CONFIG,
    RecipeConflict,
    differing_hyperparameters,
    parse_config,
    pin_config,
)
from finetune_lab.runs.runlock import exclusive_lock

STAGING_PREFIX = ".gpu-unpack-"
"""``gpu-unpack``'s staging folder under ``data/``, and a folder on its way into place beside
its destination (git-ignored, hidden from every reader): one a killed unpack left is removed by
the next, while it holds :data:`UNPACK_LOCK`."""
UNPACK_LOCK = ".gpu-unpack.lock"
"""Under ``data/``: held by the one unpack running (not a :data:`STAGING_PREFIX` name)."""


@contextmanager
def unpack_lock(root: Path, product_roots: Sequence[str]) -> Iterator[None]:
    """Hold ``data/.gpu-unpack.lock`` (refused in one line, naming its holder, while another
    unpack holds it), and clear what killed unpacks left, only while holding it."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    lock = root / "data" / UNPACK_LOCK
    with exclusive_lock(lock, root / "data", lambda holder: (
            f"{lock} is held by {holder}: another `finetune-lab gpu-unpack` is unpacking into "
            "this project right now; wait for it to end, then run this one again")):
        for parent in [root / "data", *leftover_parents(root, product_roots)]:
            for left in parent.glob(f"{STAGING_PREFIX}*"):  # a killed unpack's (trial 17's GL2)
                if left.is_dir() and not left.is_symlink():
                    shutil.rmtree(left, ignore_errors=True)
        yield


def leftover_parents(root: Path, product_roots: Sequence[str]) -> list[Path]:
    """The folders a product passes through on its way into place: each product root and each
    experiment under ``data/runs`` (not through a link)."""
    tops = [root / r for r in product_roots if (root / r).is_dir() and not (root / r).is_symlink()]
    return tops + [e for t in tops if t.name == "runs" for e in t.iterdir()
                   if e.is_dir() and not e.is_symlink()]


def whole_problem(folder: Path, files: dict[str, int], run: bool) -> str | None:
    """What keeps ``folder`` (a staged or moved product) from being whole, or None: a file the
    archive lists for it (``files``: its relative path to its size) that is missing or of
    another size, and, for a run (``run``), an event file or log whose sha256 is not the one its
    manifest recorded (the registry's hashes)."""
    for rel, size in sorted(files.items()):
        path = folder / rel if rel else folder
        if not path.is_file() or path.is_symlink():
            return f"{rel or folder.name} is missing"
        if path.stat().st_size != size:
            return f"{rel or folder.name} has {path.stat().st_size} bytes, not the archive's {size}"
    try:
        manifest = parse_json((folder / "manifest.json").read_text(encoding="utf-8")) \
            if run else None
    except (OSError, UnicodeDecodeError, ValueError):
        manifest = None  # a damaged run's manifest: the registry names it
    if not isinstance(manifest, dict):
        return None
    for key in ("outputs", "logs"):
        listed = manifest.get(key)
        for rel, want in sorted(listed.items() if isinstance(listed, dict) else ()):
            path = folder / str(rel)
            if not path.is_file():
                return f"{rel}, which its manifest's {key} lists, is missing"
            if sha256_file(path) != want:
                return f"{rel} does not match the sha256 its manifest's {key} recorded"
    return None


def files_under(files: dict[str, int], rel: str) -> dict[str, int]:
    """The archive's files of the product item ``rel``, relative to it ("" for the item itself)."""
    return {k[len(rel) + 1:]: n for k, n in files.items() if k.startswith(rel + "/")} \
        if rel not in files else {"": files[rel]}


def place(item: Path, dest: Path, files: dict[str, int], root: Path) -> bool:
    """Move ``item`` to ``dest`` only whole: first beside it under a hidden name, checked there
    (:func:`whole_problem`: its files and sizes), then renamed in without replacing anything. A folder that is not
    whole after the move is removed (the call's copy: its pieces still hold it) and refused in
    one line; whatever took ``dest`` meanwhile is left as it is (False)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    moving = dest.parent / f"{STAGING_PREFIX}{os.getpid()}-{dest.name}"
    try:
        shutil.move(str(item), moving)
        # the hashes were checked in staging; a move keeps contents, so what it can lose is a
        # file (another process at work there): presence and sizes
        problem = whole_problem(moving, files, run=False)
        if problem is not None:
            raise UserError(f"{dest.relative_to(root)} was not placed: after the move {problem}; "
                            "nothing of it was left there; run gpu-unpack again")
        return rename_noreplace(moving, dest)
    finally:
        if moving.is_dir() and not moving.is_symlink():
            shutil.rmtree(moving)
        elif os.path.lexists(moving):
            moving.unlink()


def place_config(dest: Path, incoming: Path, root: Path) -> bool:
    """The call's ``experiment.json`` (parsed already, :func:`staged_configs`) beside the run
    cache's. Where there is one, the names the call let its runs vary in are added to it
    (:func:`~finetune_lab.runs.experiments.pin_config`), and nothing else: a value it pins
    stays. Where there is none, the call's is moved in only if every run there agrees with it.
    Returns whether the call's file was moved in."""
    config = parse_config(incoming)
    shown = dest.relative_to(root)
    if dest.exists() or dest.is_symlink():
        try:
            pin_config(dest.parent, config)
        except RecipeConflict as exc:
            print(f"gpu-unpack: {shown} kept as it is: the call's differs from it in "
                  f"{', '.join(exc.keys)}, so the call's runs are judged by this one")
        except UserError as exc:
            print(f"gpu-unpack: {shown} kept as it is ({exc})")
        return False
    here = dest.parent.iterdir() if dest.parent.is_dir() else iter(())
    for run in sorted(p for p in here if (p / "manifest.json").is_file()):
        try:
            hp = parse_json((run / "manifest.json").read_text(encoding="utf-8"))["hyperparameters"]
            differ = differing_hyperparameters(config, hp)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            continue  # a damaged run: the registry names it
        if differ:
            print(f"gpu-unpack: the call's {shown} left out: {run.relative_to(root)} differs "
                  f"from it in {', '.join(differ)}, and it would be rejected")
            return False
    return True


def staged_configs(products: dict[str, Path], meta_path: Path) -> None:
    """Every ``experiment.json`` the call sends back parses, or nothing is unpacked."""
    for product, top in products.items():
        staged = top / EXPERIMENT_CONFIG
        if product.startswith("data/runs/") and (staged.exists() or staged.is_symlink()):
            try:
                parse_config(staged)
            except UserError as exc:
                said = str(exc).replace(str(staged), f"the call's {product}/{EXPERIMENT_CONFIG}")
                raise UserError(f"{meta_path}: {said.removesuffix('; restore or delete it')}; "
                                "refused, nothing was unpacked") from None

