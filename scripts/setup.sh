#!/usr/bin/env bash
# Create (or update) the project's virtual environment without ever pulling CUDA packages.
# Usage: scripts/setup.sh [VENV_DIR]   (default .venv; PYTHON selects the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
python=${PYTHON:-python3}
stamp="$venv/.finetune-lab-installed"
want=$(cat pyproject.toml requirements/*.txt scripts/setup.sh | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $venv is up to date"; exit 0
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

echo "setup: torch (CPU build) ..."
# torch first and pinned, so that no later requirement can resolve a CUDA build.
pip install -q "torch==${TORCH_VERSION:-2.13.0}"
echo "setup: fairseq build requirements ..."
pip install -q setuptools wheel cython numpy
pip install -q -r requirements/fairseq-deps.txt
if ! "$venv/bin/python" -c "import fairseq" 2>/dev/null; then
  echo "setup: compiling fairseq-fixed (3-4 minutes the first time) ..."
  pip install -q --no-build-isolation --no-deps "fairseq-fixed==0.12.3.1"
fi
echo "setup: finetune-lab and its requirements ..."
pip install -q -e ".[dev]"
if "$venv/bin/python" -m pip list 2>/dev/null | grep -qiE '^(nvidia-|torchaudio )'; then
  echo "setup: a CUDA package or torchaudio was installed; this must not happen" >&2; exit 1
fi
echo "$want" > "$stamp"
echo "setup: done ($venv)"
