"""Where a pretraining run's weights come from: the packaged checkpoint a run continues, the
runs behind the weights (their lineage, so that the tokens seen add up across continued runs),
whether any of them read the task's own texts, and what the packaged checkpoint's manifest
records of its origin."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finetune_lab._files import parse_json, sha256_file
from finetune_lab.config import paths
from finetune_lab.data.pretrain_corpus import TAPT_OUTPUT_NAME
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints
from finetune_lab.models.trust import check_trusted, load_trusted, unreadable
from finetune_lab.runs.manifest import (
    MANIFEST_NAME,
    portable_path,
    readable_manifests,
    resolve_stored_path,
    run_key,
)
from finetune_lab.train.pretrain_recipe import state_dir


def continuation_source(folder: Path, bin_dir: Path) -> dict[str, Any]:
    """The packaged checkpoint to continue pretraining from, checked, with its lineage.

    It must be trusted (its sha256 in its manifest) and share the corpus's dictionary, or the
    embedding rows would mean other pieces. The lineage lists every run the weights went through
    (updates and tokens each), so the tokens seen add up across continued runs.
    """
    folder = Path(folder)
    model, manifest = folder / checkpoints.MODEL_FILE, folder / checkpoints.MANIFEST_FILE
    for f in (model, manifest, folder / checkpoints.DICT_FILE):
        if not f.is_file():
            raise UserError(f"{f} is missing: --continue-from needs a packaged checkpoint folder "
                            "(model.pt, dict.txt, manifest.json), as `finetune-lab pretrain` "
                            "writes to data/checkpoints/roberta-small-fr")
    check_trusted(model, [manifest])
    try:  # whole (trial 25's E-k15: one cut short, its manifest vouching, reached fairseq)
        with zipfile.ZipFile(model) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError) as exc:
        raise unreadable(model, exc) from None
    if damaged is not None:
        raise unreadable(model, ValueError(f"{damaged} in it fails its checksum"))
    if sha256_file(folder / checkpoints.DICT_FILE) != sha256_file(bin_dir / "dict.txt"):
        raise UserError(f"{bin_dir / 'dict.txt'} is not the dictionary of {folder}: binarize the "
                        "corpus with the checkpoint's tokenizer (`finetune-lab reproduce` adopts "
                        "it; or copy its dict.txt and sentencepiece model to data/work/tokenizer "
                        "and run `finetune-lab prepare-pretrain`)")
    man = checkpoints.package_manifest(folder)
    lineage = man.get("lineage")
    if lineage is None:  # packaged before lineages were kept: one run, read from its manifest
        tokens = None
        run_manifest = paths().project / str(man.get("run") or "") / "manifest.json"
        if man.get("run") and run_manifest.is_file():
            hp = parse_json(run_manifest.read_text(encoding="utf-8"))["hyperparameters"]
            tokens = int(hp["tokens_per_update"]) * int(man.get("num_updates") or 0)
        lineage = [{"run": man.get("run"), "updates": man.get("num_updates"), "tokens": tokens}]
    return {"path": str(model), "sha256": sha256_file(model), "run": man.get("run"),
            "lineage": lineage}


def runs_built_on(run_dir: Path, runs_root: Path) -> list[str]:
    """What is built on the pretraining run in ``run_dir``: the packaged checkpoint whose lineage
    holds it, and every recorded run whose copied lineage names it (a continued run's
    ``continued_from``, a fine-tuning run's ``checkpoint_source``). Replacing the run would
    leave them citing another run under its name (trial 16's O-1)."""
    key = run_key(run_dir)
    found = []
    try:
        package = checkpoints.package_manifest() or {}
    except UserError:  # a damaged package manifest: the chapters that read it say so
        package = {}
    if key in lineage_keys([s for s in package.get("lineage") or [] if isinstance(s, dict)]):
        found.append(f"the packaged checkpoint {portable_path(checkpoints.packaged_dir())}")
    for manifest, record in readable_manifests(Path(runs_root), f"*/*/{MANIFEST_NAME}"):
        extra = record.get("extra") if isinstance(record.get("extra"), dict) else {}
        for field in ("continued_from", "checkpoint_source"):
            source = extra.get(field)
            lineage = source.get("lineage") if isinstance(source, dict) else None
            steps = [s for s in lineage if isinstance(s, dict)] if isinstance(lineage, list) else []
            if manifest.parent != Path(run_dir) and key in lineage_keys(steps):
                found.append(f"run {run_key(manifest.parent)}")
                break
    return found


def continued_run_name(parent_run: str, runs_behind: int) -> str:
    """``cpu-seed1`` continued once is ``cpu-seed1-c1``, then ``cpu-seed1-c2`` (not ``-c1-c2``)."""
    first = re.sub(r"-c\d+$", "", Path(parent_run).name)
    return f"{first}-c{runs_behind}"


def lineage_of(manifest: dict[str, Any], run: str | None) -> list[dict[str, Any]]:
    """The runs behind a pretraining run's final weights, itself (``run``) last, each with its
    updates and tokens: what a package records, and what the report reads for a candidate."""
    hp = manifest["hyperparameters"]
    done = manifest.get("updates_done")
    earlier = ((manifest.get("extra") or {}).get("continued_from") or {}).get("lineage") or []
    return [*earlier, {"run": run, "updates": done,
                       "tokens": done * int(hp["tokens_per_update"]) if done is not None else None}]


def lineage_keys(lineage: list[dict[str, Any]]) -> list[str]:
    """The runs behind some weights, as ``experiment/name`` (:func:`run_key`), the nearest last:
    what the book matches against the registry's runs."""
    return [run_key(str(step["run"])) for step in lineage if step.get("run")]


def sinusoids_in(lineage: list[dict[str, Any]],
                 position_init: Callable[[str], str | None]) -> str | None:
    """The nearest run behind the weights (as its manifest stores it) whose
    ``position_init`` was ``sinusoidal``: where the position table was last restarted.
    ``position_init`` reads it for a stored run path (from disk, or from loaded records)."""
    return next((str(step["run"]) for step in reversed(lineage)
                 if step.get("run") and position_init(str(step["run"])) == "sinusoidal"), None)


def step_reads_task_texts(manifest: dict[str, Any]) -> tuple[bool, str]:
    """Whether one pretraining run read CLS-Books texts (task-adaptive), and the evidence.

    A run records the corpora it read (``extra.corpora``, each with its kind, from the corpus's
    own manifest); runs from before that record are judged by their phases and corpus paths:
    the task's texts only ever entered through ``prepare-pretrain --tapt``'s corpus.
    """
    corpora = (manifest.get("extra") or {}).get("corpora") or []
    # every record of it is evidence, and any one that says "task texts" wins: a corpus kind
    # edited to "dapt" must not hide the task-adaptive corpus the run's inputs name
    tapt = [str(c.get("path")) for c in corpora
            if c.get("kind") == "tapt" or (c.get("task_repeat") or 0) > 0]
    if tapt:
        return True, f"read {', '.join(tapt)} (task-adaptive)"
    phases = (manifest.get("hyperparameters") or {}).get("phases") or []
    if any(p.get("name") == "tapt" for p in phases):
        return True, "a tapt phase"
    data = [str(d.get("path")) for d in (manifest.get("inputs") or {}).get("data") or []]
    tapt = [d for d in data if TAPT_OUTPUT_NAME in Path(d).parts]
    if tapt:
        return True, f"read {', '.join(tapt)}"
    if corpora and all(c.get("kind") for c in corpora):
        return False, "its corpora: " + ", ".join(f"{c.get('path')} ({c['kind']})"
                                                  for c in corpora)
    return False, "read " + (", ".join(data) or "no recorded corpus")


def _stored_manifest(run: str) -> dict[str, Any] | None:
    path = resolve_stored_path(run) / "manifest.json"
    return parse_json(path.read_text(encoding="utf-8")) if path.is_file() else None


def task_text_steps(lineage: list[dict[str, Any]],
                    manifest_of: Callable[[str], dict[str, Any] | None] = _stored_manifest,
                    ) -> list[dict[str, Any]]:
    """Every run behind some weights with ``task_texts`` (True, False, or None when its
    manifest is not at hand) and the evidence: the check that a lineage is clean."""
    out = []
    for step in lineage:
        run = str(step.get("run") or "")
        manifest = manifest_of(run) if run else None
        if manifest is None:
            out.append({"run": run or None, "task_texts": None, "evidence": "no manifest"})
            continue
        read, evidence = step_reads_task_texts(manifest)
        out.append({"run": run, "task_texts": read, "evidence": evidence})
    return out


def reads_task_texts(lineage: list[dict[str, Any]],
                     manifest_of: Callable[[str], dict[str, Any] | None] = _stored_manifest,
                     ) -> bool | None:
    """True if any run behind the weights read CLS-Books texts; None if that cannot be told
    (a step's manifest is missing and none of the others did); False: a clean lineage."""
    steps = task_text_steps(lineage, manifest_of)
    if any(s["task_texts"] for s in steps):
        return True
    return None if any(s["task_texts"] is None for s in steps) or not steps else False


def checkpoint_metadata(source: Path, manifests: list[Path], *,
                        trust: bool = False) -> dict[str, Any]:
    """What the packaged checkpoint's manifest says of its origin: run, the lineage of its
    weights (:func:`lineage_of`, whether packaged by ``pretrain`` or ``package-checkpoint``) and
    validation loss."""
    sha = sha256_file(source)
    run, lineage = None, None
    for m in manifests:
        manifest = parse_json(Path(m).read_text(encoding="utf-8"))
        saved = manifest.get("saved_checkpoints") or {}
        if any(v.get("sha256") == sha for v in saved.values()):
            run = portable_path(Path(m).parent)
            lineage = lineage_of(manifest, run)
    state = load_trusted(source, manifests, trust=trust)
    if run is None:  # a checkpoint a run saved on its way (a long run, paused or going on)
        run, lineage = _saved_on_the_way(Path(source), manifests, state)
    loss = (state.get("extra_state") or {}).get("best")
    return {"run": run, "lineage": lineage,
            "reads_task_texts": reads_task_texts(lineage) if lineage else None,
            "valid_loss_bits": loss,
            "valid_perplexity": 2 ** loss if loss is not None else None}


def _saved_on_the_way(source: Path, manifests: list[Path],
                      state: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]] | None]:
    """The run whose save folder holds ``source`` and the lineage of those weights: the run's
    own, with its entry cut at the checkpoint's update (not the run's latest)."""
    updates = ((state.get("optimizer_history") or [{}])[-1]).get("num_updates")
    for m in manifests:
        folder = Path(m).parent
        if state_dir(folder.name).resolve() != source.parent.resolve() or updates is None:
            continue
        manifest = parse_json(Path(m).read_text(encoding="utf-8"))
        run = portable_path(folder)
        *earlier, _ = lineage_of(manifest, run)
        tokens = int(updates) * int(manifest["hyperparameters"]["tokens_per_update"])
        return run, [*earlier, {"run": run, "updates": int(updates), "tokens": tokens}]
    return None, None

