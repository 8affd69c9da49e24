"""The ``finetune-lab`` command: one subcommand per lab step.

Each subcommand lives in the module that does the work; that module exposes
``add_parser(subparsers)`` which registers the subcommand and sets ``func`` (a callable taking
the parsed namespace and returning an exit code). Add a module to ``COMMAND_MODULES`` to add a
subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from finetune_lab.errors import UserError

COMMAND_MODULES: list[str] = [
    "finetune_lab.params",
    "finetune_lab.pretrain",
    "finetune_lab.pretrain_ablations",
    "finetune_lab.finetune",
    "finetune_lab.reproduce",
    "finetune_lab.cls_books",
    "finetune_lab.tokenizer",
    "finetune_lab.binarize",
    "finetune_lab.pretrain_corpus",
    "finetune_lab.data_summary",
    "finetune_lab.registry",
    "finetune_lab.freeze",
    "finetune_lab.lora_qa",
    "finetune_lab.hf_convert",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="finetune-lab",
        description="Re-run and report the NLP-frameworks lab (see README).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    user_dir = sub.add_parser("user-dir", help="print the fairseq --user-dir path of roberta_small")
    user_dir.set_defaults(func=_print_user_dir)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def _print_user_dir(_args: argparse.Namespace) -> int:
    from finetune_lab.config import paths

    print(paths().user_dir)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"finetune-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
