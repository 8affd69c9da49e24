"""A run's labels against what the processes that trained recorded themselves (fault trial 30).

The registry already holds a fairseq run's recipe to the configuration its ``train.log`` prints
(:mod:`log_config`). The same kind of relabelling, made consistently across a manifest, changed
tables elsewhere: a GPU renamed (fairseq prints the GPU it found), a Transformers run's init or
a LoRA run's 4-bit quantization swapped (the Trainer logs the model's configuration into the
hashed event file), the sinusoidal position table claimed or denied (the run records the
table it wrote).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finetune_lab.runs.eventfiles import log_text, model_configs

GPU_LINE = re.compile(r"rank\s+\d+: capabilities = [^;]*; total memory = [^;]*; name = (.+?)\s*$",
                      re.MULTILINE)
"""fairseq's line for each GPU it trains on (``fairseq.utils``'s CUDA environment)."""


def fact_problems(path: Path, man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """Every check below, on a manifest whose shape passed the schema."""
    return position_problems(man) + gpu_problems(path, man) + model_problems(man, events)


def position_problems(man: dict[str, Any]) -> list[str]:
    """``hyperparameters.position_init`` against the run's record of the table it wrote
    (``extra.position_init``, its sha256 and neighbour cosines): trial 30's R-1, a sinusoid
    run relabelled as none moved it out of the chapter's row of sinusoid runs."""
    hp = man.get("hyperparameters") if isinstance(man.get("hyperparameters"), dict) else {}
    extra = man.get("extra") if isinstance(man.get("extra"), dict) else {}
    said, wrote = hp.get("position_init"), extra.get("position_init")
    table = isinstance(wrote, dict) and "sha256" in wrote  # a table was written: a sinusoid's
    wrote = wrote.get("position_init") if isinstance(wrote, dict) else wrote
    if said != wrote or table != (said == "sinusoidal"):  # check 30b's 30b-4: "keep" twice
        return [f"hyperparameters.position_init {said!r}, but the run recorded writing "
                f"{wrote!r} (extra.position_init" + (", with the table's sha256)" if table else ")")]
    return []


def gpu_problems(path: Path, man: dict[str, Any]) -> list[str]:
    """The GPUs a fairseq run names (``device``, and each launch's) against those its
    ``train.log`` says it trained on: trial 30's R-11, an H100 call relabelled as an A100."""
    if man.get("framework") != "fairseq" or "train.log" not in (man.get("logs") or {}):
        return []
    try:
        logged = set(GPU_LINE.findall(log_text(path / "train.log")))
    except OSError:
        return []  # the log's own check names it
    devices = [man.get("device") or {}] + [s.get("device") or {} for s in man.get("segments")
                                           or [] if isinstance(s, dict)]
    named = {n for d in devices if isinstance(d, dict) and d.get("type") == "cuda"
             for n in (d.get("names") or [d.get("name")]) if isinstance(n, str)}
    if logged != named and (not man.get("segments") or not logged <= named):
        return [f"its device names {sorted(named) or 'no GPU'}, but its train.log says it "
                f"trained on {sorted(logged) or 'no GPU'}"]
    return []


def model_problems(man: dict[str, Any], events: Sequence[Path]) -> list[str]:
    """A Transformers run's init and quantization against the model configuration the Trainer
    logged: converted weights carry their ``architectures``, a random init none (trial 30's
    R-12), and a 4-bit model its ``quantization_config`` (R-3: LoRA and QLoRA swapped)."""
    if man.get("framework") != "transformers":
        return []
    hp = man.get("hyperparameters") if isinstance(man.get("hyperparameters"), dict) else {}
    quant = hp.get("quantization") if isinstance(hp.get("quantization"), dict) else {}
    for config in model_configs(events):
        converted = bool(config.get("architectures"))  # the stand-in's RoBERTa: BLOOM's has them
        if man.get("init") in ("pretrained", "random") and config.get("model_type") == "roberta" \
                and (man["init"] == "pretrained") != converted:
            return [f"init {man['init']!r}, but the model its event file logs was "
                    + ("converted from pretrained weights" if converted else "initialised at "
                       "random")]
        logged = config.get("quantization_config")
        logged = logged if isinstance(logged, dict) else {}
        if bool(quant.get("load_in_4bit")) != bool(logged.get("load_in_4bit")) or any(
                key in logged and logged[key] != value for key, value in quant.items()):
            return [f"hyperparameters.quantization {quant or None}, but the model its event file "
                    f"logs was loaded with {logged or 'no quantization'}"]
    return []
