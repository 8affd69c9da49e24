"""``finetune-lab reproduce``: every experiment of the book, in order, with one command.

Each step is one of the documented commands, called as a user would call it; the steps that
can be skipped are (binarized data with unchanged inputs, complete and valid runs), so an
interrupted reproduction resumes where it stopped. With a committed checkpoint, the tokenizer it
ships with is adopted instead of training a new one, because a retrained tokenizer would give
the checkpoint's embedding rows other meanings. ``--from-scratch`` retrains tokenizer and model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from finetune_lab._files import atomic_dir, data_step_output, sha256_file, write_json_atomic
from finetune_lab.argtypes import folder, positive_float, positive_int
from finetune_lab.cli import build_parser, main
from finetune_lab.data import tokenizer
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints
from finetune_lab.runs.recording import run_dir_for
from finetune_lab.runs.registry import validate_run
from finetune_lab.train.lora_cls import DEFAULT_METHODS as LORA_METHODS


def adopt_checkpoint_tokenizer(checkpoint_dir: Path, tokenizer_dir: Path, *,
                               force: bool = False) -> bool:
    """Make the work tokenizer the checkpoint's own (sentencepiece model + dict); True if copied.
    ``force``: replace ``tokenizer_dir`` even if no tokenizer step of this project made it."""
    src_model = checkpoint_dir / checkpoints.SPM_FILE
    src_dict = checkpoint_dir / checkpoints.DICT_FILE
    if not (src_model.is_file() and src_dict.is_file()):
        raise UserError(f"{checkpoint_dir} lacks {checkpoints.SPM_FILE} or {checkpoints.DICT_FILE}: "
                        "it is no packaged checkpoint (restore data/checkpoints/ from git, or "
                        "pretrain one: `finetune-lab reproduce --from-scratch`)")
    dst_model, dst_dict = tokenizer_dir / tokenizer.MODEL_FILE, tokenizer_dir / tokenizer.DICT_FILE
    same = all(d.is_file() and sha256_file(d) == sha256_file(s)
               for s, d in ((src_model, dst_model), (src_dict, dst_dict)))
    if same:
        return False
    # swapped in whole, and only over a tokenizer folder of this project (trained or adopted)
    mine = data_step_output(tokenizer.COMMAND, tokenizer.ADOPTED_STEP)
    with atomic_dir(tokenizer_dir, tokenizer.COMMAND, earlier=mine, force=force) as tmp:
        for src, dst in ((src_model, dst_model), (src_dict, dst_dict)):
            shutil.copyfile(src, tmp / dst.name)
        write_json_atomic(tmp / "manifest.json", {
            "step": tokenizer.ADOPTED_STEP,
            "source": str(checkpoint_dir),
            "outputs": {p.name: sha256_file(tmp / p.name) for p in (dst_model, dst_dict)},
        })
    return True


def plan(*, from_scratch: bool, gpu: bool, have_checkpoint: bool,
         pretrain_minutes: float | None, jobs: int = 1,
         other_corpus: bool = False) -> list[list[str]]:
    """The commands, in order, each one a user can type (``finetune-lab STEP...``).

    The pretraining corpus is prepared in every case: the data chapter's summary (the last
    step) describes it, whether or not this reproduction pretrains."""
    other = ["--other-corpus"] if other_corpus else []
    steps: list[list[str]] = [["prepare-cls", *other]]
    pretrain = from_scratch or not have_checkpoint
    steps.append([tokenizer.COMMAND, *other] if pretrain else [tokenizer.ADOPT_COMMAND])
    steps += [["binarize-cls"], ["prepare-pretrain", *other]]
    if pretrain:
        budget = ["--minutes", str(pretrain_minutes)] if pretrain_minutes else []
        steps.append(["pretrain", "--overwrite", *budget])
    steps.append(["finetune", "fairseq", "--init", "pretrained", "random", "--seeds", "0", "1", "2",
                  *(["--jobs", str(jobs)] if jobs > 1 else [])])
    hf_inits = ["pretrained", "random"] if gpu else ["pretrained"]
    steps.append(["finetune", "transformers", "--init", *hf_inits, "--seeds", "0", "1", "2"])
    # the LoRA table's full fine-tuning row is the Transformers pretrained runs above
    steps.append(["finetune", "lora", "--methods", *LORA_METHODS, "--seeds", "0", "1", "2"])
    steps.append(["data-summary"])
    return steps


SCRATCH_FIX = ("`reproduce --from-scratch` cannot pretrain in its place, and ran nothing; "
               "pretrain weights of your own beside it (`finetune-lab pretrain --run NAME "
               "--package-to data/work/candidates/NAME`) and fine-tune them (`finetune-lab "
               "finetune fairseq --init pretrained --checkpoint data/work/candidates/NAME "
               "--experiment fairseq-candidate-N`)")
"""Advice whose commands do what it says (trial 27's P-m2: without ``--init pretrained`` the
fine-tune also ran the three random seeds, 1.5 hours that say nothing about the weights)."""
RESTORE_FIX = ("restore the packaged checkpoint (`git checkout -- data/checkpoints/"
               "roberta-small-fr`), which `reproduce` then fine-tunes; it ran nothing")


def refuse_before_steps(steps: list[list[str]], *, from_scratch: bool) -> None:
    """Each planned step's own refusals (a step's parser names them as ``before_work``), asked
    before the first step runs, whatever the flags: trial 26's P-m1 and trial 27's P-m4 were
    refused at ``pretrain``, after minutes of rebuilding data, with advice ``reproduce`` takes
    no flag for."""
    parser = build_parser()
    for step in steps:
        args = parser.parse_args(step)
        before = getattr(args, "before_work", None)
        if before is not None:
            before(args, SCRATCH_FIX if from_scratch else RESTORE_FIX)


def pending_runs(step: list[str]) -> list[str]:
    """What a fine-tuning step would run (trial 28's P-m1: a dry run printed the same lines
    whether every run was done or a committed run, rejected, would be run again, 35 minutes,
    and moved aside): each run that is not complete and valid, as the step itself decides."""
    from finetune_lab.train import lora_cls  # heavy: pandas (through finetune_lab.models.four_bit)

    if step[0] != "finetune":
        return []
    args = build_parser().parse_args(step)
    names = {"fairseq": lambda a: [f"{i}-seed{s}" for i in a.init for s in a.seeds],
             "transformers": lambda a: [f"{i}-seed{s}" for i in a.init for s in a.seeds],
             "lora": lambda a: [lora_cls.run_name(m, s) for m in a.methods for s in a.seeds]}
    lines = []
    for name in names[step[1]](args):
        target = run_dir_for(step[1], name)
        if not (target / "manifest.json").is_file():
            lines.append(f"would run {step[1]}/{name} (not there yet)")
        elif not (rec := validate_run(target)).valid:
            lines.append(f"would run {step[1]}/{name} again, moving the one there aside "
                         f"(rejected: {rec.reason})")
    return lines or ["every run complete and valid: nothing to run"]


def reproduce(*, from_scratch: bool = False, pretrain_minutes: float | None = None,
              dry_run: bool = False, jobs: int = 1, other_corpus: bool = False) -> int:
    """Plan from the packaged folder as a whole (weights listed by its manifest but gone are a
    damaged package, said at once, not "no checkpoint"), refuse what a step would, then run."""
    import torch

    have = checkpoints.require_whole_package(checkpoints.packaged_dir()) is not None
    steps = plan(from_scratch=from_scratch, gpu=torch.cuda.is_available(), have_checkpoint=have,
                 pretrain_minutes=pretrain_minutes, jobs=jobs, other_corpus=other_corpus)
    if pretrain_minutes and not any(step[0] == "pretrain" for step in steps):  # trial 28's P-m2
        raise UserError("--pretrain-minutes sets the budget of a pretraining this plan does not "
                        "run: it fine-tunes the packaged checkpoint; drop the flag, or pretrain "
                        "with --from-scratch (in a project without that checkpoint)")
    refuse_before_steps(steps, from_scratch=from_scratch)
    for step in steps:
        print(f"reproduce: finetune-lab {' '.join(step)}", flush=True)
        if dry_run:
            for line in pending_runs(step):
                print(f"reproduce:   {line}")
            continue
        code = main(step)
        if code:
            print(f"reproduce: `finetune-lab {' '.join(step)}` failed (exit {code}); fix it and "
                  "run `finetune-lab reproduce` again: completed steps are skipped")
            return code
    return 0


def _cmd_adopt(args) -> int:
    ckpt = args.checkpoint or checkpoints.packaged_dir()
    out = args.out or tokenizer.default_output()
    copied = adopt_checkpoint_tokenizer(ckpt, out, force=args.force)
    print(f"{tokenizer.ADOPT_COMMAND}: {out} {'now holds' if copied else 'already holds'} the "
          f"tokenizer of {ckpt}")
    return 0


def add_parser(sub) -> None:
    a = sub.add_parser(tokenizer.ADOPT_COMMAND,
                       help="make the work tokenizer the committed checkpoint's own (what every "
                            "committed run read; train-tokenizer makes a new one)")
    a.add_argument("--checkpoint", type=folder, default=None,
                   help="packaged checkpoint folder (default: data/checkpoints/roberta-small-fr)")
    a.add_argument("--out", type=folder, default=None,
                   help="tokenizer folder (default: data/work/tokenizer)")
    a.add_argument("--force", action="store_true",
                   help="replace --out even if no tokenizer step of this project made it")
    a.set_defaults(func=_cmd_adopt)
    p = sub.add_parser("reproduce", help="run every experiment of the book in order (resumable)")
    p.add_argument("--from-scratch", action="store_true",
                   help="retrain the tokenizer and pretrain again, in a project without the "
                        "packaged checkpoint (never over it)")
    p.add_argument("--pretrain-minutes", type=positive_float,
                   help="pretraining budget (default: 8 on a GPU, 120 on a CPU)")
    p.add_argument("--dry-run", action="store_true", help="print the steps only")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="fairseq grid runs side by side (`finetune fairseq --jobs`)")
    p.add_argument("--other-corpus", action="store_true",
                   help="books files that are not Webis-CLS-10's (`prepare-cls --other-corpus`)")
    p.set_defaults(func=lambda a: reproduce(from_scratch=a.from_scratch,
                                            pretrain_minutes=a.pretrain_minutes,
                                            dry_run=a.dry_run, jobs=a.jobs,
                                            other_corpus=a.other_corpus))
