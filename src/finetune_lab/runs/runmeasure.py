"""Parameter counts, peak memory and time of a fine-tuning run, written into its manifest.

Every Transformers-side run (plain, LoRA, QLoRA) is measured the same way, so the LoRA chapter
can put full fine-tuning next to the adapters without a second copy of the same runs.
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

TIME_COVERS = ("building the Trainer, training, and valid + test evaluation after every epoch "
               "(not loading data or the model)")


def count_parameters(model) -> tuple[int, int]:
    """``(trainable, all)``: peft's own count for a peft model, else ``numel()`` sums."""
    if hasattr(model, "get_nb_trainable_parameters"):
        return tuple(int(x) for x in model.get_nb_trainable_parameters())  # type: ignore
    params = list(model.parameters())
    return (sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))


def parameter_record(model) -> dict[str, Any]:
    """The manifest's ``extra.parameters``: both counts and who counted them."""
    trainable, total = count_parameters(model)
    return {"trainable": trainable, "total": total,
            "counted_by": "peft get_nb_trainable_parameters()"
            if hasattr(model, "get_nb_trainable_parameters")
            else "numel() of every parameter (trainable: requires_grad)"}


def _reset_peak_rss() -> bool:
    """Reset the process's peak RSS (Linux ``clear_refs`` 5); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


@contextlib.contextmanager
def measure_run(handle, model=None) -> Iterator[None]:
    """Record parameter counts (of ``model``), peak memory and time into ``handle.manifest``.

    Peak memory is ``torch.cuda.max_memory_allocated`` on a GPU; on a CPU the process's peak
    resident set size, reset at the start where Linux allows it (the manifest says which).
    """
    import torch

    extra = handle.manifest.setdefault("extra", {})
    if model is not None:
        extra["parameters"] = parameter_record(model)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    reset = _reset_peak_rss()
    start = time.monotonic()
    yield
    if cuda:
        torch.cuda.synchronize()
    seconds = time.monotonic() - start
    rss = {"bytes": _peak_rss_bytes(),
           "measure": "peak resident set size of the process (resource.getrusage ru_maxrss), "
                      + ("reset at the start of the run via /proc/self/clear_refs" if reset
                         else "since the process started (no reset possible here)")}
    if cuda:
        peak = {"device": "cuda", "bytes": int(torch.cuda.max_memory_allocated()),
                "measure": "torch.cuda.max_memory_allocated, reset at the start of the run",
                "gpu": torch.cuda.get_device_name(0)}
    else:
        peak = {"device": "cpu", "bytes": rss["bytes"], "measure": rss["measure"]}
    extra.update(peak_memory=peak, cpu_peak_rss=rss, time_s=round(seconds, 3),
                 time_covers=TIME_COVERS)
