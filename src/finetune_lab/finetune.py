"""The ``finetune`` command group: one sub-command per framework, same recipe for all."""

from __future__ import annotations


def add_parser(sub) -> None:
    from finetune_lab import finetune_fairseq, hf_finetune

    p = sub.add_parser("finetune", help="fine-tune on CLS-Books (Tasks 3-5): fairseq | transformers")
    frameworks = p.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    finetune_fairseq.add_finetune_parser(frameworks)
    hf_finetune.add_finetune_parser(frameworks)
