"""The versions of the tools a data step's output depends on, which its manifest records, so
that a rebuilt dataset says what made it."""

from __future__ import annotations

import platform
from importlib import metadata


def tool_versions() -> dict[str, str]:
    """Versions of the tools whose output the manifests describe (read from metadata, no import)."""
    versions = {"python": platform.python_version()}
    for label, dist in (("sentencepiece", "sentencepiece"), ("fairseq", "fairseq-fixed"),
                        ("torch", "torch")):
        try:
            versions[label] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions
