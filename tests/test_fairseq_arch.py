"""The roberta_small architecture is registered for fairseq-train and for Python."""

from __future__ import annotations

import subprocess
import sys

from finetune_lab.config import paths


def test_arch_from_fairseq_option_parser():
    from fairseq import options

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "unused-data-dir", "--task", "masked_lm", "--user-dir", str(paths().user_dir),
        "--arch", "roberta_small",
    ])
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim) == (4, 512, 512)
    assert (args.encoder_attention_heads, args.max_positions) == (8, 256)
    # Everything else comes from roberta_base.
    assert args.activation_fn == "gelu" and args.dropout == 0.1


def test_arch_overridable_from_command_line():
    from fairseq import options

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "d", "--task", "masked_lm", "--user-dir", str(paths().user_dir),
        "--arch", "roberta_small", "--encoder-layers", "2",
    ])
    assert args.encoder_layers == 2 and args.encoder_embed_dim == 512


def _train_help(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fairseq_cli.train", "--arch", "roberta_small",
         "--task", "masked_lm", *extra, "--help"],
        capture_output=True, text=True, timeout=300,
    )


def test_fairseq_train_cli_needs_and_accepts_the_plugin():
    without = _train_help()
    assert without.returncode != 0 and "invalid choice: 'roberta_small'" in without.stderr
    with_plugin = _train_help("--user-dir", str(paths().user_dir))
    assert with_plugin.returncode == 0, with_plugin.stderr[-2000:]


def test_user_dir_cli_prints_plugin(capsys):
    from finetune_lab.cli import main

    assert main(["user-dir"]) == 0
    assert capsys.readouterr().out.strip().endswith("fairseq_user_dir")
