"""fairseq ``--user-dir`` plugin: registers the course's ``roberta_small`` architecture.

Upstream fairseq has no ``roberta_small``; the course's fork did. Use it with
``fairseq-train --user-dir $(finetune-lab user-dir) --arch roberta_small ...`` or, from Python,
``import finetune_lab.models.fairseq_user_dir``. Importing it twice (once by fairseq under the bare
module name, once as part of the package) is harmless: registration happens once.
"""

from __future__ import annotations

from finetune_lab.models.fairseq_compat import (
    install_bf16_without_tpu,
    install_launch_mark,
    install_numpy_long_alias,
    install_torchrun_on_cpu,
    quiet_import,
)
from finetune_lab.models.trust import install_fairseq_loader

quiet_import()  # fairseq's first import reconfigures the root logger; this one puts it back
from fairseq.models import ARCH_MODEL_REGISTRY, register_model_architecture  # noqa: E402
from fairseq.models.roberta.model import base_architecture  # noqa: E402

ARCH = "roberta_small"

# The course model: 4 layers, width 512, FFN 512, 8 heads, 256 usable positions (258 learned
# rows once fairseq adds padding_idx + 1); everything else as roberta_base.
ROBERTA_SMALL = {
    "encoder_layers": 4,
    "encoder_embed_dim": 512,
    "encoder_ffn_embed_dim": 512,
    "encoder_attention_heads": 8,
    "max_positions": 256,
}


def roberta_small_architecture(args) -> None:
    """Fill unset arguments with the roberta_small sizes, then the roberta_base defaults."""
    for name, value in ROBERTA_SMALL.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    base_architecture(args)


if ARCH not in ARCH_MODEL_REGISTRY:
    register_model_architecture("roberta", ARCH)(roberta_small_architecture)

# whole-line samples and the <s> bag-of-words objective (pretrain --sample-break-mode/--bow-weight)
from finetune_lab.models.fairseq_user_dir import doc_objective  # noqa: E402

doc_objective.register()

# fairseq-train --restore-file and from_pretrained load checkpoints with torch's safe loader,
# with one exception (argparse.Namespace) granted to checkpoints listed in a project manifest.
install_fairseq_loader()
# fairseq 0.12's --bf16 means "TPU"; on a GPU or a CPU it means bf16 here (fairseq_compat)
install_bf16_without_tpu()
install_torchrun_on_cpu()
install_numpy_long_alias()  # fairseq's eos break mode (doc_objective's whole-line samples)
install_launch_mark()  # a pretraining launch's id in every state it saves (pretrain_resume)
