"""Loading and packaging fairseq checkpoints under torch's safe loading.

Which files may be unpickled is :mod:`trust`'s business; this module packages a run's
checkpoint in the course's layout and loads packaged ones.

The packaged checkpoint (``data/checkpoints/roberta-small-fr/``) is laid out as the course
shipped its model: ``model.pt`` (weights only, fp16, no optimizer state), ``dict.txt`` and
``sentencepiece.bpe.model``, plus a ``manifest.json`` listing every file's sha256.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from finetune_lab._files import (
    atomic_dir,
    check_replaceable,
    not_there,
    parse_json,
    read_json,
    read_utf8,
    regular_text,
    sha256_file,
    tree_entries,
    utc_now,
    write_json_atomic,
)
from finetune_lab.config import PROJECT_ROOT, paths, run_key
from finetune_lab.errors import DamagedFileError, UserError, library_write
from finetune_lab.models.fairseq_compat import preserved_root_logger
from finetune_lab.models.trust import MANIFEST_FILE, load_trusted, trusting

CHECKPOINT_NAME = "roberta-small-fr"
COMMAND = "package-checkpoint"
MODEL_FILE = "model.pt"
DICT_FILE = "dict.txt"
SPM_FILE = "sentencepiece.bpe.model"


def packaged_dir() -> Path:
    return paths().checkpoints / CHECKPOINT_NAME


def packaged_output(folder: Path) -> bool:
    """Whether ``folder`` is a packaged checkpoint, the only folder :func:`package_checkpoint`
    replaces: its manifest lists its files, and it holds nothing else. Told by its exact files,
    not a marker, so that the committed checkpoint stays these four files byte for byte."""
    try:
        listed = parse_json(regular_text(folder / MANIFEST_FILE)).get("files")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(listed, dict) and tree_entries(folder) <= {*listed, MANIFEST_FILE}


def package_manifest(folder: Path | None = None) -> dict[str, Any] | None:
    """The manifest of a packaged checkpoint folder (default: the committed one), or None when
    there is none. A damaged one is an error naming it: every pretrained number rests on it, so
    it is never read as if it said less."""
    manifest = Path(folder or packaged_dir()) / MANIFEST_FILE
    if os.path.lexists(manifest) and not manifest.is_file():
        raise _damaged(manifest, f"it {not_there(manifest)}")
    if not manifest.is_file():  # weights without their manifest are no package either
        if (manifest.parent / MODEL_FILE).exists():
            raise _damaged(manifest, f"it is missing beside {MODEL_FILE}")
        return None
    try:
        data = read_json(manifest)  # strict: not UTF-8, not JSON, NaN or Infinity all fail
    except DamagedFileError as exc:
        raise _damaged(manifest, f"not JSON: {exc.why}") from None
    if not isinstance(data, dict):
        raise _damaged(manifest, "not a JSON object")
    files = data.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in files.values()):
        raise _damaged(manifest, "its files and their sha256 are missing")
    for key, kind in (("lineage", list), ("run", str), ("source", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise _damaged(manifest, f"its {key} is not a {kind.__name__}")
    if any(not isinstance(step, dict) for step in data.get("lineage") or []):
        raise _damaged(manifest, "its lineage holds an entry that is not an object")
    if data.get("lineage") and not isinstance(data.get("run"), str):  # check 29b's F6
        raise _damaged(manifest, "its lineage names runs, but it names no run of its own")
    if data.get("lineage"):
        run = _run_manifest(data["run"])
        if (why := lineage_chain_problem(data["lineage"], data["run"], run)) is not None:
            raise _damaged(manifest, f"its {why}")
    return data


def _run_manifest(stored: str) -> dict[str, Any] | None:
    """The manifest of a run a package names (``data/runs/EXPERIMENT/RUN``, in the run store
    wherever it is), or None when it is not there to be read (the registry judges it)."""
    where = Path(stored)
    try:
        data = read_json(paths().runs / where.parent.name / where.name / MANIFEST_FILE)
    except (OSError, DamagedFileError):
        return None
    return data if isinstance(data, dict) else None


def lineage_chain_problem(lineage: list[Any], run: str, run_manifest: dict[str, Any] | None
                          ) -> str | None:
    """A copied lineage (a package's, a continued run's ``extra.continued_from``, a fine-tuning
    run's ``extra.checkpoint_source``) names every run behind the weights, oldest first: it
    ends at the weights' own ``run``, and the steps before are that run's own copy of its
    lineage, as it recorded it (none where it started from random weights). Trial 29's R-15 to
    R-17: a step deleted or inserted changed the tokens and hours the book adds up, though each
    step that was left agreed with its run."""
    if not lineage:
        return None
    if _run_of(lineage[-1]) != _run_of({"run": run}):
        return f"lineage ends at {_run_of(lineage[-1])}, not at {run}, the run of its weights"
    if run_manifest is None:
        return None
    source = (run_manifest.get("extra") or {}).get("continued_from")
    before = source.get("lineage") if isinstance(source, dict) else None
    named = [_run_of(step) for step in lineage[:-1]]
    own = [_run_of(step) for step in (before if isinstance(before, list) else [])]
    if named != own:  # (each step's updates and tokens are held to its run where it is read)
        return (f"lineage names {named or 'no run'} before {run}, but that run's manifest "
                f"records {own or 'none'} (extra.continued_from.lineage)")
    return None


def _run_of(step: Any) -> str:
    """A lineage step's run, as ``experiment/name`` wherever the run store was."""
    return run_key(str(step.get("run") if isinstance(step, dict) else None))


def _damaged(manifest: Path, why: str) -> UserError:
    return UserError(f"{manifest} is damaged ({why}): {_restore(manifest)}")


def _restore(manifest: Path) -> str:
    """How to get a packaged checkpoint's manifest back: git for the committed one, else the
    packaging command."""
    committed = manifest.parent.resolve() == packaged_dir().resolve() \
        and manifest.resolve().is_relative_to(PROJECT_ROOT.resolve())
    return (f"restore it with `git checkout -- "
            f"{manifest.resolve().relative_to(PROJECT_ROOT.resolve())}`" if committed
            else "package the checkpoint again (finetune-lab package-checkpoint)")


def require_whole_package(folder: Path | None = None) -> dict[str, Any] | None:
    """A packaged folder's manifest (None: no package there), once every file it lists is
    there, of its size and sha256. Trial 27's P-m4: ``model.pt`` moved out (as the GPU recipe
    does) and forgotten made ``reproduce`` plan a pretraining that ``pretrain`` refused after
    2.5 minutes of work; weights gone or changed are a damaged package, said before any."""
    folder = Path(folder or packaged_dir())
    manifest = package_manifest(folder)
    if manifest is None:
        return None
    committed = folder.resolve() == packaged_dir().resolve() \
        and folder.resolve().is_relative_to(PROJECT_ROOT.resolve())
    restore = (f"`git checkout -- {folder.resolve().relative_to(PROJECT_ROOT.resolve())}`"
               if committed else "`finetune-lab package-checkpoint`")
    for name, want in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise UserError(f"{path} is missing: restore it ({restore}, or move it back)")
        size = want.get("bytes")
        if (isinstance(size, int) and path.stat().st_size != size) \
                or sha256_file(path) != want["sha256"]:
            raise UserError(f"{path} is not the file its manifest lists (sha256 "
                            f"{want['sha256'][:12]}…): restore it ({restore}, or move the "
                            "listed file back)")
    return manifest


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def lineage_step_updates(step: dict[str, Any], run_manifest: dict[str, Any],
                         package: dict[str, Any] | None = None,
                         folder: Path | None = None, restore: str | None = None) -> int:
    """The updates the packaged weights went through in one lineage step, from the step's run's
    own manifest (``updates_done``, else ``max_update``), checked against the copy the lineage
    keeps (``updates``, ``tokens``; :func:`~finetune_lab.train.pretrain_lineage.lineage_of`
    writes them as the run's updates and updates × ``tokens_per_update``).

    A copy that disagrees with the run it names is refused in one line naming the package's
    manifest, the step and both values, never silently preferred or overruled. The one update
    count that may differ from the run's is the last step's when the weights were packaged on
    the way (a checkpoint saved before the run ended): fewer updates than the run's, the
    package's own ``num_updates``. ``folder``: the package (default: the committed one);
    ``restore``: the fix a refusal names when the copy is not a package's (a run's manifest)."""
    manifest = Path(folder or packaged_dir()) / MANIFEST_FILE
    run = step.get("run")
    hp = run_manifest["hyperparameters"]
    per_update = int(hp["tokens_per_update"])
    done = int(run_manifest.get("updates_done") or hp["max_update"])

    def problem(field: str, value: Any, want: int, how: str) -> UserError:
        # trial 16's O-1: the run is the side that changed when `--overwrite` replaced it
        return UserError(f"{manifest}: its lineage step {run} records {field} {value!r} but the "
                         f"run's own manifest gives {want} ({how}): either the run there is "
                         "another one under its name (an earlier run replaced with --overwrite "
                         "is kept in data/runs/.superseded/; move it back), or this file was "
                         f"edited ({restore or _restore(manifest)})")

    updates = done
    recorded = step.get("updates")
    if recorded is not None:
        package = package or {}
        on_the_way = (_whole(recorded) and recorded < done and run == package.get("run")
                      and recorded == package.get("num_updates"))
        if not _whole(recorded) or (recorded != done and not on_the_way):
            raise problem("updates", recorded, done, "updates_done")
        updates = recorded
    tokens = step.get("tokens")
    if tokens is not None and (not _whole(tokens) or tokens != updates * per_update):
        raise problem("tokens", tokens, updates * per_update,
                      f"{updates} updates × {per_update} tokens_per_update")
    return updates




TIED_WEIGHTS = ("encoder.lm_head.weight", "encoder.sentence_encoder.embed_tokens.weight")
"""RoBERTa's masked-LM head decodes with the token embedding (fairseq ties them)."""


def weights_only_state(state: dict[str, Any], dtype: str = "float16") -> dict[str, Any]:
    """A fairseq checkpoint reduced to what inference and fine-tuning need.

    Keeps the configuration and the model weights (floating tensors cast to ``dtype``); drops
    the optimizer state, criterion, task state and meters. The minimal ``optimizer_history`` and
    ``extra_state`` entries are what fairseq's loader expects to find.
    """
    import torch

    cast = getattr(torch, dtype)
    last = (state.get("optimizer_history") or [{}])[-1]
    # Tied tensors (the LM head's decoder is the token embedding) must stay one tensor after the
    # cast, or torch.save would store the 32000 x 512 matrix twice.
    cast_once: dict[tuple, Any] = {}
    model = {}
    for k, v in state["model"].items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.dtype)
        if key not in cast_once:
            cast_once[key] = v.to(cast) if v.is_floating_point() else v
        model[k] = cast_once[key]
    # A checkpoint saved from bf16 training stores the tied pair as two equal tensors; keep one.
    head, embed = TIED_WEIGHTS
    if head in model and embed in model and model[head] is not model[embed] \
            and torch.equal(model[head], model[embed]):
        model[head] = model[embed]
    return {
        "args": state.get("args"),
        "cfg": state.get("cfg"),
        "model": model,
        "optimizer_history": [{
            "criterion_name": last.get("criterion_name", "MaskedLmLoss"),
            "optimizer_name": last.get("optimizer_name", "FairseqAdam"),
            "lr_scheduler_state": {"best": None},
            "num_updates": int(last.get("num_updates", 0)),
        }],
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }


def check_package_source(source: Path, dest: Path | None = None) -> None:
    """A checkpoint file to package, and not one inside the folder it would replace."""
    dest = Path(dest) if dest is not None else packaged_dir()
    if not Path(source).is_file():
        raise UserError(f"{source} {not_there(source)}: pass a fairseq checkpoint file (checkpoint_best.pt, model.pt)")
    if Path(source).resolve().is_relative_to(dest.resolve()):
        raise UserError(f"{source} lies in {dest}, the folder package-checkpoint would replace "
                        "(its manifest's lineage and run would be lost): pass another --dest")


def check_package_dest(dest: Path | None) -> None:
    """Refuse, before a training that would package its weights there, a ``dest`` that is not
    a packaged checkpoint (``pretrain --package-to``, which has no ``--force``)."""
    check_replaceable(Path(dest) if dest is not None else packaged_dir(), COMMAND,
                      earlier=packaged_output, can_force=False)


def package_checkpoint(
    source: Path,
    tokenizer_model: Path,
    dictionary: Path,
    dest: Path | None = None,
    *,
    metadata: dict[str, Any] | None = None,
    manifests: Iterable[Path] | None = None,
    trust: bool = False,
    force: bool = False,
    flag: str = "--dest",
) -> Path:
    """Write ``dest/{model.pt,dict.txt,sentencepiece.bpe.model,manifest.json}`` atomically: the
    new folder is swapped in whole, so a crash leaves the old checkpoint or the new one. An
    existing ``dest`` is replaced only if it is a packaged checkpoint (:func:`packaged_output`)
    unless ``force``. ``trust``: the user vouches for a ``source`` that no manifest lists
    (recorded as such). ``flag``: the caller's option for ``dest`` (``pretrain``'s
    ``--package-to``), named in the advice on an unwritable one."""
    import torch

    dest = Path(dest) if dest is not None else packaged_dir()
    check_package_source(source, dest)
    check_replaceable(dest, COMMAND, force=force, earlier=packaged_output)  # before loading
    for f in (tokenizer_model, dictionary):
        if not Path(f).is_file():
            raise UserError(f"{f} is missing: run `finetune-lab adopt-tokenizer` first (or "
                            "`train-tokenizer`, for weights trained with a new one)")
    state = load_trusted(source, manifests, trust=trust)
    if trust:
        metadata = {**(metadata or {}), "trusted_by": "the user (package-checkpoint --trust)"}
    # what it replaces is kept, the same weights too: its manifest records their lineage
    # (trial 23's A-f1: the committed checkpoint's, replaced by a copy of its own weights)
    with atomic_dir(dest, COMMAND, force=force, earlier=packaged_output, marker=False,
                    keep_old=True, flag=flag) as tmp:
        with library_write(dest):
            torch.save(weights_only_state(state), tmp / MODEL_FILE)
        shutil.copyfile(dictionary, tmp / DICT_FILE)
        shutil.copyfile(tokenizer_model, tmp / SPM_FILE)
        files = {name: {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size}
                 for name in (MODEL_FILE, DICT_FILE, SPM_FILE)}
        write_json_atomic(tmp / MANIFEST_FILE, {
            "name": dest.name,
            "created": utc_now(),
            "source": {"path": str(source), "sha256": sha256_file(source)},
            "dtype": "float16",
            "num_updates": state["optimizer_history"][-1].get("num_updates"),
            "files": files,
            **(metadata or {}),
        })
    return dest


def check_listed_files(folder: Path) -> None:
    """The dictionary and the sentencepiece model beside the weights, as the folder's own
    manifest lists them (fairseq would read a damaged ``dict.txt`` into a traceback, or into
    other tokens): one line naming the file that differs."""
    restore = f"restore {folder} (`finetune-lab package-checkpoint`, or git for the committed one)"
    for name in (MODEL_FILE, DICT_FILE, SPM_FILE):  # trial 10's FF11: a pipe hung fill-mask
        if os.path.lexists(folder / name) and not (folder / name).is_file():
            raise UserError(f"{folder / name} is not a regular file (a pipe, socket, device or "
                            f"folder): {restore}")
    if (folder / DICT_FILE).is_file():
        read_utf8(folder / DICT_FILE, restore)
    listed = (package_manifest(folder) or {}).get("files") or {}
    for name in (DICT_FILE, SPM_FILE):
        want = (listed.get(name) or {}).get("sha256") if isinstance(listed, dict) else None
        if isinstance(want, str) and (folder / name).is_file() \
                and sha256_file(folder / name) != want:
            raise UserError(f"{folder / name} is not the file its manifest lists (sha256 "
                            f"{want[:12]}…): {restore}")


def load_hub_model(folder: Path | None = None):
    """A packaged model as a fairseq ``RobertaHubInterface`` (fill-mask, encode, ...), on CPU.

    Its file must be listed by a manifest of the project or by the folder's own manifest."""
    folder = Path(folder) if folder is not None else packaged_dir()
    if folder.is_file():
        raise UserError(f"{folder} is a file, not a folder: pass the folder that holds "
                        f"{MODEL_FILE} ({folder.parent})")
    if not (folder / MODEL_FILE).is_file():
        raise UserError(f"{folder / MODEL_FILE} {not_there(folder / MODEL_FILE)}: run "
                        "`finetune-lab pretrain` (see README)")
    check_listed_files(folder)
    with preserved_root_logger():  # fairseq logs its missing optional packages on import
        # registers roberta_small and the checkpoint loader
        from fairseq.models.roberta import RobertaModel

        import finetune_lab.models.fairseq_user_dir  # noqa: F401  # heavy: fairseq

    with preserved_root_logger(), trusting(folder / MANIFEST_FILE):
        hub = RobertaModel.from_pretrained(
            str(folder), checkpoint_file=MODEL_FILE, data_name_or_path=str(folder),
            bpe="sentencepiece", sentencepiece_model=str(folder / SPM_FILE),
        )
    hub.eval()
    return hub
