"""A random initialisation written to a file, so that a run from scratch can start from it.

``--position-init sinusoidal`` rewrites the position table of the weights a run starts from.
A run from scratch has no such file: fairseq draws its weights inside ``fairseq-train``. This
module draws them the same way (fairseq's own argument parsing, task and model building, after
the same seeding as ``fairseq_cli.train``), so the file holds exactly the weights a random-init
run of that command line would have begun with, and the run then starts from it with
``--finetune-from-model``. Its manifest still says ``init: random``.
"""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path
from typing import Any

from finetune_lab._files import sha256_file, write_bytes_atomic
from finetune_lab.models.checkpoints import weights_only_state


def write_random_init(train_args: list[str], dest: Path) -> dict[str, Any]:
    """Build the model of ``fairseq-train train_args`` as fairseq would, seeded by its
    ``--seed``, and save it to ``dest`` as a fairseq checkpoint (fp32, no optimizer state).

    Returns what a manifest records: the seed, the parameter count and the file's sha256.
    """
    import numpy as np  # heavy: numpy
    import torch  # heavy: torch
    from fairseq import options, tasks, utils  # heavy: fairseq
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # heavy: fairseq
    from omegaconf import OmegaConf  # heavy: omegaconf

    parser = options.get_training_parser()
    hydra_log = logging.getLogger("hydra")
    level = hydra_log.level
    hydra_log.setLevel(logging.WARNING)  # hydra's debug lines and deprecation notices: noise here
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = convert_namespace_to_omegaconf(
                options.parse_args_and_arch(parser, input_args=train_args))
    finally:
        hydra_log.setLevel(level)
    # as fairseq_cli.train.main, before it builds the task and the model
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    state = weights_only_state({
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "MaskedLmLoss", "num_updates": 0}],
    }, dtype="float32")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_bytes_atomic(Path(dest), buffer.getvalue())
    return {"init": "random", "seed": int(cfg.common.seed),
            "parameters": sum(p.numel() for p in model.parameters()),
            "sha256": sha256_file(dest)}
