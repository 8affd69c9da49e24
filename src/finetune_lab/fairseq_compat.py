"""Living with fairseq 0.12 inside a notebook or a library.

Importing fairseq reconfigures the *root* logger (two speech tasks call ``logging.basicConfig``
at import time and the level ends at DEBUG), which floods a Jupyter page with every library's
debug messages. :func:`quiet_import` imports it and puts the root logger back as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


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
