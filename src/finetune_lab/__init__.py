"""finetune-lab: the NLP-frameworks lab as a reproducible report."""

import logging as _logging

__version__ = "0.1.0"


class _OptionalKernelNotice(_logging.Filter):
    """bitsandbytes warns at import, on CPUs with AVX512-BF16, that an optional accelerated
    kernel package is not installed; it falls back to its own code. Drop only that record, so
    that it does not appear on every chapter page that imports transformers."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "kernels-community" not in record.getMessage()


_logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_OptionalKernelNotice())
