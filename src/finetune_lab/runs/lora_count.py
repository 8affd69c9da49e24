"""A LoRA run's trainable parameters, counted again from its recipe (trial 7's S15: the same
edit on every seed of a method passed the seeds' vote, and the LoRA chapter printed it).

The count is the one ``tests/test_lora_counts.py`` checks against peft for BLOOM, here for the
RoBERTa the lab's LoRA runs adapt: r × (inputs + outputs) per adapted linear layer.
"""

from __future__ import annotations

from typing import Any


def lora_parameter_problems(man: dict[str, Any]) -> list[str]:
    """A LoRA run's trainable count against the one its recipe gives: r × (inputs + outputs)
    per adapted linear layer, over every layer, plus the classifier peft trains whole
    (``modules_to_save``). The same edit on every seed of a method passed the seeds' vote."""
    hp = man.get("hyperparameters") or {}
    lora, size = hp.get("lora"), hp.get("model_size")
    trainable = ((man.get("extra") or {}).get("parameters") or {}).get("trainable")
    if not isinstance(lora, dict) or not isinstance(size, dict) or not isinstance(trainable, int) \
            or lora.get("bias", "none") != "none":
        return []
    try:
        d, f, layers, classes, r = (int(size["dim"]), int(size["ffn"]), int(size["layers"]),
                                    int(size["classes"]), int(lora["r"]))
        shapes = {"query": (d, d), "key": (d, d), "value": (d, d),
                  "attention.output.dense": (d, d), "intermediate.dense": (d, f),
                  "output.dense": (f, d)}
        adapted = sum(r * sum(shapes[t]) for t in lora["target_modules"])
    except (KeyError, TypeError, ValueError):
        return []  # another model or target: not counted here
    head = d * d + d + d * classes + classes if "classifier" in (lora.get("modules_to_save")
                                                                  or []) else 0
    expected = layers * adapted + head
    if trainable != expected:
        return [f"extra.parameters.trainable {trainable:,} but its recipe (r = {r} on "
                f"{', '.join(lora['target_modules'])}, {layers} layers of {d}) trains "
                f"{expected:,}"]
    return []
