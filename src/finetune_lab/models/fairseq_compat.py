"""Living with fairseq 0.12 inside a notebook or a library.

Importing fairseq reconfigures the *root* logger (two speech tasks call ``logging.basicConfig``
at import time and the level ends at DEBUG), which floods a Jupyter page with every library's
debug messages. :func:`quiet_import` imports it and puts the root logger back as it was.
:func:`install_bf16_without_tpu` makes ``--bf16`` usable where there is no TPU.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from argparse import Namespace
from types import SimpleNamespace
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def preserved_root_logger() -> Iterator[None]:
    """Silence INFO records during the block; then restore the root logger's level and handlers."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        root.setLevel(level)
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)


def quiet_import() -> None:
    """Import fairseq's model and task registries without touching logging."""
    with preserved_root_logger():
        import fairseq.models  # noqa: F401
        import fairseq.tasks  # noqa: F401


def _xla_available() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def clear_tpu(cfg: Any) -> list[str]:
    """Set every ``tpu`` of a fairseq config to False; return the sections that had it set."""
    from omegaconf import DictConfig, open_dict

    cleared = []
    for key in list(cfg.keys()):
        node = cfg.get(key)
        if isinstance(node, DictConfig) and node.get("tpu"):
            with open_dict(node):
                node.tpu = False
            cleared.append(str(key))
        elif isinstance(node, Namespace) and getattr(node, "tpu", False):
            node.tpu = False
            cleared.append(str(key))
    return cleared


def install_bf16_without_tpu() -> None:
    """Let ``--bf16`` mean bf16 on a GPU or a CPU, not a TPU.

    fairseq 0.12 treats ``--bf16`` as a TPU flag (``options.py`` sets ``tpu = True`` with it,
    facebookresearch/fairseq#4696), so on a GPU or a CPU the trainer asks torch_xla for a
    device and fails, and the masked-LM criterion would project every token, not only the masked
    ones. Where torch_xla is absent there is no TPU to mean: the flag is cleared from every
    section of the config before the task, model and trainer are built (``call_main`` is the
    first thing ``fairseq-train`` runs with the config). The model then runs in bf16 with fp32
    master weights (fairseq's ``FP16Optimizer``, without loss scaling for bf16).
    """
    from fairseq.distributed import utils as dist_utils

    if getattr(dist_utils.call_main, "_bf16_without_tpu", False):
        return
    original = dist_utils.call_main

    def call_main(cfg, main, **kwargs):
        if cfg.common.bf16 and cfg.common.tpu and not _xla_available():
            clear_tpu(cfg)
            logging.getLogger(__name__).info("--bf16 without torch_xla: bf16 on %s, not a TPU",
                                             "the CPU" if cfg.common.cpu else "the GPU")
        return original(cfg, main, **kwargs)

    call_main._bf16_without_tpu = True  # type: ignore[attr-defined]
    dist_utils.call_main = call_main


TORCHRUN_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")


def install_torchrun_on_cpu() -> None:
    """Let ``torchrun ... -m fairseq_cli.train --cpu`` train data-parallel over gloo.

    fairseq 0.12 reads torchrun's environment in ``_infer_torch_distributed_launch_init``, which
    sets ``device_id = rank % torch.cuda.device_count()``: a division by zero without a GPU.
    Without CUDA the same settings are made here, with device 0, before fairseq infers them;
    on a GPU fairseq's own inference runs unchanged.
    """
    import torch
    from fairseq.distributed import utils as dist_utils
    from omegaconf import open_dict

    if getattr(dist_utils.call_main, "_torchrun_on_cpu", False):
        return
    original = dist_utils.call_main

    def call_main(cfg, main, **kwargs):
        dt = cfg.distributed_training
        if (dt.distributed_init_method is None and not torch.cuda.is_available()
                and all(k in os.environ for k in TORCHRUN_ENV)):
            with open_dict(dt):
                dt.distributed_init_method = "env://"
                dt.distributed_world_size = int(os.environ["WORLD_SIZE"])
                dt.distributed_rank = int(os.environ["RANK"])
                dt.device_id = 0
                dt.distributed_no_spawn = True
        return original(cfg, main, **kwargs)

    call_main._torchrun_on_cpu = True  # type: ignore[attr-defined]
    dist_utils.call_main = call_main


def install_numpy_long_alias() -> None:
    """Give numpy 2 the ``np.compat.long`` alias that fairseq 0.12's ``eos`` break mode uses.

    ``TokenBlockDataset`` builds its one-line-per-sample index with ``np.compat.long``, which
    numpy 2 removed; without it ``--sample-break-mode eos`` fails before training. The alias is
    numpy 1's own meaning (a 64-bit integer) and is added only where it is missing.
    """
    import numpy as np  # heavy: numpy (fairseq's own; this module is imported without it)

    if not hasattr(np, "compat"):
        np.compat = SimpleNamespace(long=np.int64)  # type: ignore[attr-defined]


LAUNCH_ENV = "FINETUNE_LAB_LAUNCH"
"""The environment variable that names a pretraining launch: a random id its manifest records."""


def install_launch_mark() -> None:
    """Write the launch's id (:data:`LAUNCH_ENV`) into every state fairseq saves, as
    ``extra_state["launch"]``: a run killed after a save, before it recorded the state, resumes
    only a state that one of its own launches saved (22b's W2-f1: another run of the same name,
    in a checkout at the same path, matched its folders, seed, recipe and score).

    fairseq keeps unknown ``extra_state`` keys and ignores them as it loads a state. Without the
    variable (every other use of fairseq) nothing is changed.
    """
    launch = os.environ.get(LAUNCH_ENV)
    if not launch:
        return
    from fairseq.trainer import Trainer

    original = Trainer.state_dict
    if getattr(original, "_launch_mark", False):
        return

    def state_dict(self):
        state = original(self)
        state["extra_state"]["launch"] = launch
        return state

    state_dict._launch_mark = True  # type: ignore[attr-defined]
    Trainer.state_dict = state_dict
