#!/usr/bin/env bash
# Create (or update) the project's virtual environment. On a CPU machine no CUDA package is ever
# pulled; on a GPU machine (nvidia-smi lists a device, or FINETUNE_LAB_GPU=1) torch is PyPI's
# CUDA build. Usage: scripts/setup.sh [VENV_DIR]   (default .venv; PYTHON selects the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
python=${PYTHON:-python3}
gpu=${FINETUNE_LAB_GPU:-}
if [ -z "$gpu" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; else gpu=0; fi
fi
stamp="$venv/.finetune-lab-installed"
want=$( (cat pyproject.toml requirements/*.txt scripts/setup.sh; echo "gpu=$gpu") | sha256sum | cut -c1-16)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: $venv is up to date"; exit 0
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }

# torch first and pinned, so that no later requirement can resolve another build.
if [ "$gpu" = 1 ]; then echo "setup: torch (CUDA build: a GPU is visible) ..."; else echo "setup: torch (CPU build) ..."; fi
pip install -q "torch==${TORCH_VERSION:-2.13.0}"
echo "setup: fairseq build requirements ..."
pip install -q setuptools wheel cython numpy
pip install -q -r requirements/fairseq-deps.txt
if ! "$venv/bin/python" -c "import fairseq" 2>/dev/null; then
  echo "setup: compiling fairseq-fixed (3-4 minutes the first time) ..."
  # with CUDA_HOME set, its setup.py adds CUDA extensions whose sources the sdist lacks
  env -u CUDA_HOME "$venv/bin/python" -m pip --disable-pip-version-check install -q \
    --no-build-isolation --no-deps "fairseq-fixed==0.12.3.1"
fi
echo "setup: finetune-lab and its requirements ..."
pip install -q -e ".[dev]"
# torchaudio (a CUDA build on PyPI) breaks `import transformers`; CUDA packages only with a GPU
refused='^torchaudio '
[ "$gpu" = 1 ] || refused='^(nvidia-|torchaudio )'
found=$("$venv/bin/python" -m pip list 2>/dev/null | grep -iE "$refused" || true)
if [ -n "$found" ]; then
  echo "setup: these must not be installed here (gpu=$gpu): $(echo $found)" >&2; exit 1
fi
echo "$want" > "$stamp"
echo "setup: done ($venv)"
