"""finetune-lab: the NLP-frameworks lab as a reproducible report."""

import logging as _logging
import signal as _signal

from finetune_lab.errors import hold

__version__ = "0.1.0"


class _OptionalKernelNotice(_logging.Filter):
    """bitsandbytes warns at import, on CPUs with AVX512-BF16, that an optional accelerated
    kernel package is not installed; it falls back to its own code. Drop only that record, so
    that it does not appear on every chapter page that imports transformers."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "kernels-community" not in record.getMessage()


_logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_OptionalKernelNotice())


def main() -> int:
    """The ``finetune-lab`` console script: Ctrl-C and SIGTERM wait from its first line until
    the command's modules have loaded (:func:`finetune_lab.errors.hold`; the CLI then stops as
    ever)."""
    for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(sig) is not _signal.SIG_IGN:
            _signal.signal(sig, hold)
    from finetune_lab.cli import main as run  # ordered: after the handlers, not at the top

    return run()
