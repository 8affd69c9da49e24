"""The ``finetune`` command group: one sub-command per framework, same recipe for all."""

from __future__ import annotations

import argparse

from finetune_lab.train import finetune_fairseq, hf_finetune, lora_cls


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune on CLS-Books: fairseq | transformers | lora")
    frameworks = p.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    finetune_fairseq.add_finetune_parser(frameworks)
    hf_finetune.add_finetune_parser(frameworks)
    lora_cls.add_finetune_parser(frameworks)
