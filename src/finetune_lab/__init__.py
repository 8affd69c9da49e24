"""finetune-lab: the NLP-frameworks lab as a reproducible report."""

import logging as _logging
import os as _os
import signal as _signal

__version__ = "0.1.0"


class _OptionalKernelNotice(_logging.Filter):
    """bitsandbytes warns at import, on CPUs with AVX512-BF16, that an optional accelerated
    kernel package is not installed; it falls back to its own code. Drop only that record, so
    that it does not appear on every chapter page that imports transformers."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "kernels-community" not in record.getMessage()


_logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_OptionalKernelNotice())


HELD: list[int] = []
"""The signals that asked the command to stop (trial 30's E-10, E-11): one that came while its
modules loaded waits here until they have, since an exception raised inside numpy's import left
it half-imported, and a "bad install" traceback, not the one line an interrupt gives."""


def hold(signum: int, _frame: object) -> None:
    """Keep a stop signal for later; a second one ends the process at once."""
    if HELD:
        _os._exit(128 + signum)
    HELD.append(signum)


def main() -> int:
    """The ``finetune-lab`` console script: Ctrl-C and SIGTERM wait from its first line until
    the command's modules have loaded (:func:`finetune_lab.cli.main` then stops as ever)."""
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(sig) is not _signal.SIG_IGN:
            _signal.signal(sig, hold)
    from finetune_lab.cli import main as run

    return run()
