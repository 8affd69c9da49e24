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

from finetune_lab._files import sha256_file, write_json_atomic
from finetune_lab.argtypes import positive_int
from finetune_lab.cli import main
from finetune_lab.data import tokenizer
from finetune_lab.errors import UserError
from finetune_lab.models import checkpoints
from finetune_lab.train.lora_cls import DEFAULT_METHODS as LORA_METHODS


def adopt_checkpoint_tokenizer(checkpoint_dir: Path, tokenizer_dir: Path) -> bool:
    """Make the work tokenizer the checkpoint's own (sentencepiece model + dict); True if copied."""
    src_model = checkpoint_dir / checkpoints.SPM_FILE
    src_dict = checkpoint_dir / checkpoints.DICT_FILE
    if not (src_model.is_file() and src_dict.is_file()):
        raise UserError(f"{checkpoint_dir} lacks {checkpoints.SPM_FILE} or {checkpoints.DICT_FILE}")
    dst_model, dst_dict = tokenizer_dir / tokenizer.MODEL_FILE, tokenizer_dir / tokenizer.DICT_FILE
    same = all(d.is_file() and sha256_file(d) == sha256_file(s)
               for s, d in ((src_model, dst_model), (src_dict, dst_dict)))
    if same:
        return False
    if tokenizer_dir.exists():
        shutil.rmtree(tokenizer_dir)
    tokenizer_dir.mkdir(parents=True)
    shutil.copyfile(src_model, dst_model)
    shutil.copyfile(src_dict, dst_dict)
    write_json_atomic(tokenizer_dir / "manifest.json", {
        "step": "adopted from the packaged checkpoint",
        "source": str(checkpoint_dir),
        "outputs": {p.name: sha256_file(p) for p in (dst_model, dst_dict)},
    })
    return True


def plan(*, from_scratch: bool, gpu: bool, have_checkpoint: bool,
         pretrain_minutes: float | None, jobs: int = 1) -> list[list[str]]:
    """The commands, in order (``[["adopt-tokenizer"], ...]`` marks the in-process step)."""
    steps: list[list[str]] = [["prepare-cls"]]
    pretrain = from_scratch or not have_checkpoint
    steps.append(["train-tokenizer"] if pretrain else ["adopt-tokenizer"])
    steps.append(["binarize-cls"])
    if pretrain:
        budget = ["--minutes", str(pretrain_minutes)] if pretrain_minutes else []
        steps += [["prepare-pretrain"], ["pretrain", "--overwrite", *budget]]
    steps.append(["finetune", "fairseq", "--init", "pretrained", "random", "--seeds", "0", "1", "2",
                  *(["--jobs", str(jobs)] if jobs > 1 else [])])
    hf_inits = ["pretrained", "random"] if gpu else ["pretrained"]
    steps.append(["finetune", "transformers", "--init", *hf_inits, "--seeds", "0", "1", "2"])
    # the LoRA table's full fine-tuning row is the Transformers pretrained runs above
    steps.append(["finetune", "lora", "--methods", *LORA_METHODS, "--seeds", "0", "1", "2"])
    steps.append(["data-summary"])
    return steps


def reproduce(*, from_scratch: bool = False, pretrain_minutes: float | None = None,
              dry_run: bool = False, jobs: int = 1) -> int:
    import torch

    ckpt = checkpoints.packaged_dir()
    steps = plan(from_scratch=from_scratch, gpu=torch.cuda.is_available(),
                 have_checkpoint=(ckpt / checkpoints.MODEL_FILE).is_file(),
                 pretrain_minutes=pretrain_minutes, jobs=jobs)
    for step in steps:
        print(f"reproduce: finetune-lab {' '.join(step)}", flush=True)
        if dry_run:
            continue
        if step == ["adopt-tokenizer"]:
            copied = adopt_checkpoint_tokenizer(ckpt, tokenizer.default_output())
            print(f"reproduce: tokenizer {'copied from' if copied else 'already that of'} {ckpt}")
            continue
        code = main(step)
        if code:
            print(f"reproduce: `finetune-lab {' '.join(step)}` failed (exit {code}); fix it and "
                  "run `finetune-lab reproduce` again: completed steps are skipped")
            return code
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="run every experiment of the book in order (resumable)")
    p.add_argument("--from-scratch", action="store_true",
                   help="retrain the tokenizer and pretrain again instead of using the checkpoint")
    p.add_argument("--pretrain-minutes", type=float,
                   help="pretraining budget (default: 8 on a GPU, 120 on a CPU)")
    p.add_argument("--dry-run", action="store_true", help="print the steps only")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="fairseq grid runs side by side (`finetune fairseq --jobs`)")
    p.set_defaults(func=lambda a: reproduce(from_scratch=a.from_scratch,
                                            pretrain_minutes=a.pretrain_minutes,
                                            dry_run=a.dry_run, jobs=a.jobs))
