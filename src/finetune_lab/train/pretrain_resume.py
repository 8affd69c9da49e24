"""Which saved state a long pretraining run may resume: its own, as it recorded it at each save
and as it stopped, made with its recipe (trials 14 to 19, W2: another run's state was resumed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from finetune_lab._files import sha256_file
from finetune_lab.errors import UserError
from finetune_lab.models import trust
from finetune_lab.runs.manifest import input_record, portable_path, read_manifest, write_manifest

LAST = "checkpoint_last.pt"
"""fairseq's state of the last save, in the run's save folder: what a launch resumes from."""


def resume_point(save_dir: Path) -> dict[str, Any] | None:
    """Updates done and fairseq's cumulative training time in ``checkpoint_last.pt`` (None: none).

    The file is this run's own (in its save folder), read memory-mapped without the optimizer
    state being copied.
    """
    import torch

    last = save_dir / LAST
    if not last.is_file():
        return None
    with trust.fairseq_safe_globals(last):
        state = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
    history = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}
    cfg = state.get("cfg") if isinstance(state.get("cfg"), dict) else {}

    def field(section: str, key: str) -> Any:  # a section is a dict, or (model) a Namespace
        part = cfg.get(section)
        return part.get(key) if isinstance(part, dict) else getattr(part, key, None)
    per = field("dataset", "max_tokens") or (
        (field("dataset", "batch_size") or 0) * (field("task", "tokens_per_sample") or 0))
    return {"updates": int(history[-1].get("num_updates") or 0),
            "training_time_s": float(extra.get("previous_training_time") or 0.0),
            "val_loss": extra.get("val_loss"),  # the score fairseq's log line of the save shows
            # who made it: fairseq keeps the seed and the save folder of the run it trained
            "seed": field("common", "seed"),
            "save_dir": field("checkpoint", "save_dir"), "data": field("task", "data"),
            "launch": extra.get("launch"),  # the launch that saved it (fairseq_compat)
            # and the recipe, as the run's manifest records it (RECIPE)
            **{key: field(*where) for key, where in RECIPE.items()},
            "lr": (field("optimization", "lr") or [None])[0],
            "adam_betas": _betas(field("optimizer", "adam_betas")),
            # the objective: the bag-of-words criterion has a weight, the plain one none (0)
            "bow_weight": {"masked_lm_bow": field("criterion", "bow_weight"),
                           "masked_lm": 0.0}.get(field("criterion", "_name")),
            "tokens_per_update": per * (field("optimization", "update_freq") or [1])[0] * (
                field("distributed_training", "distributed_world_size") or 1) or None}


RECIPE = {"dropout": ("model", "dropout"), "attention_dropout": ("model", "attention_dropout"),
          "tokens_per_sample": ("task", "tokens_per_sample"), "mask_prob": ("task", "mask_prob"),
          "leave_unmasked_prob": ("task", "leave_unmasked_prob"),
          "random_token_prob": ("task", "random_token_prob"),
          "weight_decay": ("optimizer", "weight_decay"), "adam_eps": ("optimizer", "adam_eps"),
          "clip_norm": ("optimization", "clip_norm"),
          "warmup_updates": ("lr_scheduler", "warmup_updates"),
          "sample_break_mode": ("task", "sample_break_mode"),
          "max_update": ("lr_scheduler", "total_num_update")}
"""Where fairseq's saved configuration holds each recipe field of a run's manifest: a state
must agree on all of them, with the lr and the tokens per update (trial 20's W2-z1: another
run's state of the same seed, lr and dropout, but twice the batch, was resumed)."""
COMPARED = ("lr", "tokens_per_update", "adam_betas", "bow_weight", *RECIPE)


def _betas(saved: Any) -> list[float] | None:
    """Adam's betas as a manifest records them (fairseq saves the flag's text, "(0.9,0.98)")."""
    try:
        return [float(b) for b in ast.literal_eval(saved)] if isinstance(saved, str) else None
    except (ValueError, SyntaxError, TypeError):
        return None


SAVED = re.compile(r"\| Saved checkpoint (.+?) \(epoch \d+ @ (\d+) updates(?:, score ([^)]*))?")
"""fairseq's line for a save it finished, with the file and the update it was made at."""


def _elsewhere(saved: Any, own: list[Path]) -> bool:
    """Whether a folder fairseq saved in a state's configuration is on this machine and none of
    the run's ``own`` (one that is not here says nothing: a checkout moved, another machine)."""
    if not isinstance(saved, str) or not saved or not Path(saved).exists():
        return False
    return all(Path(saved).resolve() != Path(o).resolve() for o in own)


def _other_corpus(saved: Any, own: list[Path]) -> bool:
    """Whether the corpus a state's configuration names (fairseq's ``task.data``: a corpus
    folder or its ``bin/``) is none of the run's, compared as text: a folder that is gone says
    as much as one that is here (21b's W2-d1); a checkout that moved keeps the path below it."""
    if not isinstance(saved, str) or not saved:
        return False
    text = Path(saved).as_posix()
    mine = {portable_path(p) for o in own for p in (Path(o), Path(o) / "bin")}
    return not any(text == m or portable_path(saved) == m
                   or (not Path(m).is_absolute() and text.endswith("/" + m)) for m in mine)


def _differ_score(logged: str, saved: Any) -> bool:
    """Whether the score fairseq logged for a save and the one its state holds disagree (the
    log prints the validation loss as it was saved; a missing one agrees)."""
    try:
        return abs(float(logged) - float(saved)) > 5e-4
    except (TypeError, ValueError):
        return False


def _differ(saved: Any, recorded: Any) -> bool:
    """Whether a value of fairseq's saved configuration and the run's record disagree (a
    missing one agrees: states and manifests from before a field was kept)."""
    if saved is None or recorded is None:
        return False
    try:
        return abs(float(saved) - float(recorded)) > 1e-9 * max(1.0, abs(float(recorded)))
    except (TypeError, ValueError):
        return str(saved) != str(recorded)


def check_own_state(run_dir: Path, last: Path, updates: int,
                    data: list[Path] | None = None, made: dict[str, Any] | None = None) -> None:
    """Refuse to resume ``run_dir`` from state that is not its own (trials 14 to 17, W2): a
    launch that ended paused, failed or interrupted recorded the sha256 of the state it left,
    and nothing has launched the run since; a launch killed after that can only have gone
    further. A run paused before that record was kept must find the state at the very update
    it paused at, made with its seed in its own save folder (``made``: :func:`resume_point`;
    trial 17's R-W2-v1: another run's state at the same update passed). And a launch must read
    the corpora the run was recorded on (``data``)."""
    man = read_manifest(run_dir)
    hyper = man.get("hyperparameters") or {}
    lr = hyper.get("lr")
    # the recipe fairseq saved with the state is the run's (trial 18's W2-w: the lr; 19b's W3:
    # the dropout), wherever both say
    other = [k for k in COMPARED if made is not None and _differ(made.get(k), hyper.get(k))]
    # the folders fairseq saved it in and read: where they are on this machine, the run's own
    # (20b's W2-b1: a state of a run of the same name in another work folder, on another corpus)
    other += ["save_dir"] if made is not None and _elsewhere(made.get("save_dir"), [last.parent]) \
        else []
    other += ["data"] if made is not None and data is not None \
        and _other_corpus(made.get("data"), data) else []
    if made is not None and (made.get("seed") != man.get("seed") or Path(
            str(made.get("save_dir"))).name != last.parent.name or other):
        differs = "".join(f", {k} {made.get(k)} " + (f"(the run's {hyper[k]})" if k in hyper
                                                    else "(not the run's)") for k in other)
        raise UserError(f"{last} was saved by another run (seed {made.get('seed')}, lr "
                        f"{made.get('lr')}, dropout {made.get('dropout')}, in "
                        f"{made.get('save_dir')}{differs}), not by {run_dir} (seed "
                        f"{man.get('seed')}, lr {lr}, dropout {hyper.get('dropout')}): "
                        "move that folder away, or put the run's own state back")
    launches = [s.get("launch") for s in man.get("segments") or [] if isinstance(s, dict)]
    if made is not None and isinstance(made.get("launch"), str) and made["launch"] not in launches:
        # a state that names its launch names one of this run's (trial 24's W-i2: the sha256 a
        # run recorded was of a state another store's launch of its name saved there)
        raise UserError(f"{last} is not the state {run_dir} last recorded of its own: launch "
                        f"{made['launch']}, none of the run's, saved it; move that folder away, or "
                        "put the run's own state back")
    recorded = man.get("resume_state")
    # every launch records its state's sha256 as it saves and as it stops (paused, failed,
    # interrupted); a launch killed before its first record (status "running") may have saved
    paused = man.get("status") != "running"
    if isinstance(recorded, dict):
        at, same = int(recorded.get("updates") or 0), sha256_file(last) == recorded.get("sha256")
    else:  # paused before records were kept: the very update it paused at
        at = int(man.get("updates_done") or 0)
        same = paused and updates == at
    if not same and not paused and updates > at and made is not None:
        # killed within a second of a save, before it was recorded (19b's W2: the run could
        # never resume), or before its first record: the state fairseq's own log says the run
        # saved there, with the run's recipe (trial 20's W2-z1: any state was taken then), in
        # the folder the state itself names (21's W2-c1: a state saved in a folder since gone,
        # another machine's, and put in the run's own after its save)
        log = run_dir / "train.log"
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        # and the score it logged is the state's (21b's W2-d1: another run's, saved at the same
        # update in the same folder of a checkout at the same path)
        same = updates in {int(n) for folder, n, score in SAVED.findall(text)
                           if Path(folder).parent.name == last.parent.name
                           and Path(folder).parent == Path(str(made.get("save_dir")))
                           and not _differ_score(score, made.get("val_loss"))}
        # and one of the run's launches saved it: each writes its random id in the manifest
        # before fairseq starts, and into every state (trial 22's W2-e2, 22b's W2-f1: another
        # run's, at a score two runs that barely moved both printed, in a run store at the
        # same path; a state saved before launches were named is not resumed this way)
        same = same and isinstance(made.get("launch"), str) and made["launch"] in launches
    if not same or updates < at:
        raise UserError(f"{last} is not the state {run_dir} last recorded (update {at}; its "
                        "sha256 or update count differs: another run's, or saved as a launch was "
                        "killed): move that folder away, or put the run's own state back")
    recorded = [d for d in (man.get("inputs") or {}).get("data") or [] if isinstance(d, dict)]
    was, now = [d.get("path") for d in recorded], [portable_path(d) for d in data or []]
    if data is not None and (was != now or any(  # the same paths, prepared again (trial 16)
            input_record(d)["sha256"] != r.get("sha256") for d, r in zip(data, recorded))):
        raise UserError(f"{run_dir} was recorded on {', '.join(map(str, was))}; this launch reads "
                        f"{', '.join(now)}, or that data changed since: a run goes on with its "
                        "own corpora (give them, or choose another --run)")


def note_save(line: str, manifest: dict[str, Any], run_dir: Path, last: Path) -> None:
    """On fairseq's "Saved checkpoint" line (logged once ``checkpoint_last.pt`` is written too),
    record that state in the manifest on disk: a launch killed later (SIGKILL) leaves the sha256
    of the only state the run may resume (trial 18's W2-w1: another run's state of the same seed
    and learning rate, put in its folder after a kill, was resumed)."""
    if "| INFO | fairseq.checkpoint_utils | Saved checkpoint " in line:
        try:
            keep_resume_state(manifest, last)
            write_manifest(run_dir, manifest)
        except Exception as exc:  # noqa: BLE001 (the watcher goes on; the stop records it)
            print(f"pretrain: the state saved at this point was not recorded ({exc})",
                  flush=True)


def keep_resume_state(manifest: dict[str, Any], last: Path) -> None:
    """Record the state a launch leaves (its update and sha256) in the run's manifest: the only
    state the next launch resumes (:func:`check_own_state`)."""
    try:
        point = resume_point(last.parent) if last.is_file() else None
    except UserError:  # a state cut short: none to resume (the next launch says so)
        point = None
    manifest.pop("resume_state", None)
    if point is not None:
        manifest["resume_state"] = {"path": portable_path(last), "updates": point["updates"],
                                    "sha256": sha256_file(last)}
