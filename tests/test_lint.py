"""Static checks that catch real bugs (undefined names, unused imports, syntax errors)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from finetune_lab.config import PROJECT_ROOT


def test_ruff_finds_no_errors():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is a dev dependency: run scripts/setup.sh"
    out = subprocess.run([ruff, "check", "--select", "F,E9", "--no-cache", "src", "tests"],
                         cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]
