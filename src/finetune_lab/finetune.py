"""The ``finetune`` command group: one sub-command per framework, same recipe for all."""

from __future__ import annotations


def add_parser(sub) -> None:
    from finetune_lab import finetune_fairseq, hf_finetune, lora_cls

    p = sub.add_parser("finetune", help="fine-tune on CLS-Books: fairseq | transformers | lora")
    frameworks = p.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    finetune_fairseq.add_finetune_parser(frameworks)
    hf_finetune.add_finetune_parser(frameworks)
    lora_cls.add_finetune_parser(frameworks)
