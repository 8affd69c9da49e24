"""Numbers a manifest records that follow from others it records, counted again: a LoRA run's
trainable parameters from its recipe (trial 7's S15), a Transformers run's total from its model's
shape (trial 8's S23), the peak memory its own weights bound from below (S20), a pretraining
run's tokens per update from its batch (S21). The same edit on every seed passes the seeds' vote,
and the chapters print these numbers.

The LoRA count is the one ``tests/test_lora_counts.py`` checks against peft for BLOOM, here for
the RoBERTa the lab's runs adapt: r × (inputs + outputs) per adapted linear layer. The total is
``models.params``' analytic count of RoBERTa with a classification head, as Transformers builds
it (a token-type row, no LM head); ``tests/test_derived_counts.py`` holds both to real models.
"""

from __future__ import annotations

from typing import Any

from finetune_lab.models.sizing import RobertaSize, hf_classifier_total


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


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def roberta_classifier_total(size: dict[str, Any]) -> int | None:
    """Parameters of Transformers' ``RobertaForSequenceClassification`` of a run's
    ``model_size`` (:func:`~finetune_lab.models.sizing.hf_classifier_total`; None for another
    shape)."""
    try:
        shape = RobertaSize(**{k: int(size[k]) for k in ("vocab", "positions", "dim", "ffn",
                                                          "layers", "classes")})
    except (KeyError, TypeError, ValueError):
        return None
    return hf_classifier_total(shape)


def parameter_total_problems(man: dict[str, Any]) -> list[str]:
    """A Transformers run's ``extra.parameters.total`` against its model's shape: the model,
    plus for LoRA what peft adds (its adapters and the classifier copy it trains, all of the
    trainable count). The LoRA chapter divides by this total."""
    hp = man.get("hyperparameters") or {}
    counted = (man.get("extra") or {}).get("parameters") or {}
    total, trainable = _int(counted.get("total")), _int(counted.get("trainable"))
    base = roberta_classifier_total(hp.get("model_size")) \
        if isinstance(hp.get("model_size"), dict) else None
    if man.get("framework") != "transformers" or base is None or total is None \
            or trainable is None:
        return []
    lora = isinstance(hp.get("lora"), dict)
    expected = base + trainable if lora else base
    if total != expected:
        how = (f"{base:,} of the model and the {trainable:,} trainable that peft adds"
               if lora else f"{base:,} of the model")
        return [f"extra.parameters.total {total:,} but its model_size gives {expected:,} ({how})"]
    if not lora and trainable != total:
        return [f"extra.parameters.trainable {trainable:,} but a full fine-tuning trains all "
                f"{total:,}"]
    return []


FLOOR_BYTES = {"trainable": 4, "frozen": 0.5}
"""The fewest bytes a parameter can hold in a run's memory: a trained one its 16-bit weight and
gradient at least, a frozen one 4 bits (QLoRA's)."""


def peak_memory_problems(man: dict[str, Any]) -> list[str]:
    """A run's recorded peak memory holds at least its own parameters (trial 8's S20: 1 MiB on
    the GPU for 23 M parameters)."""
    extra = man.get("extra") or {}
    counted, peak = extra.get("parameters") or {}, extra.get("peak_memory") or {}
    total, trainable = _int(counted.get("total")), _int(counted.get("trainable"))
    got = _int(peak.get("bytes")) if isinstance(peak, dict) else None
    if total is None or trainable is None or got is None:
        return []
    floor = int(trainable * FLOOR_BYTES["trainable"] + (total - trainable) * FLOOR_BYTES["frozen"])
    if got < floor:
        return [f"extra.peak_memory.bytes {got:,} is less than its own parameters take "
                f"({total:,}, {trainable:,} trained: at least {floor:,} bytes)"]
    return []


def tokens_per_update_problems(man: dict[str, Any]) -> list[str]:
    """A pretraining run's ``tokens_per_update`` is its batch × sample length × update frequency
    × processes (the plateau table's tokens behind each run are updates × this)."""
    hp = man.get("hyperparameters") or {}
    recorded = _int(hp.get("tokens_per_update"))
    factors = [_int(hp.get(k)) for k in ("batch_size", "tokens_per_sample", "update_freq")]
    world = _int(hp.get("world_size", 1))
    if recorded is None or world is None or any(f is None for f in factors):
        return []
    batch, sample, freq = factors
    expected = batch * sample * freq * world
    if recorded != expected:
        processes = f" × {world} processes" if world != 1 else ""
        return [f"hyperparameters.tokens_per_update {recorded:,} but its batch_size {batch} × "
                f"tokens_per_sample {sample} × update_freq {freq}{processes} is {expected:,}"]
    return []


def total_updates_problems(man: dict[str, Any]) -> list[str]:
    """A fine-tuning run's ``total_updates`` is its epochs × the batches of ``n_train`` reviews
    (the schedule and the book's cost figures rest on it; trial 9's S3: a doubled batch size
    on every seed was held against nothing)."""
    hp = man.get("hyperparameters") or {}
    n_train, batch, epochs, total = (_int(hp.get(k)) for k in ("n_train", "batch_size",
                                                                "epochs", "total_updates"))
    if None in (n_train, batch, epochs, total) or not batch:
        return []
    expected = -(-n_train // batch) * epochs
    if total != expected:
        return [f"hyperparameters.total_updates {total:,} but {epochs} epochs of {n_train:,} "
                f"reviews in batches of {batch} are {expected:,} updates"]
    return []


def derived_count_problems(man: dict[str, Any]) -> list[str]:
    """Every check of this module on one manifest."""
    return (lora_parameter_problems(man) + parameter_total_problems(man)
            + peak_memory_problems(man) + tokens_per_update_problems(man)
            + total_updates_problems(man))
