#!/usr/bin/env bash
# The whole lab in one device call, on a bare GPU machine (no fairseq, no network):
#   here:  finetune-lab gpu-bundle            (fills .gpu/: sdist, wheels, texts, plan.json)
#   there: bash scripts/gpu-lab.sh .gpu       (device tool: carry [".gpu"]; $OUT set by it)
#   here:  finetune-lab gpu-unpack DIR        (DIR: where the call's files came back)
# It installs the carried wheels, compiles fairseq's Cython modules, binarizes CLS-Books, runs
# the plan's jobs side by side and writes the new runs to $OUT in pieces under 16 MiB.
# PYTHON picks the interpreter (default python3, the one that holds torch there).
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-.gpu}
out=${2:-${OUT:?set OUT or pass the output folder as the second argument}}
export PYTHONUNBUFFERED=1
exec env PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" \
  -m finetune_lab.gpu_lab "$bundle" "$out" ${GPU_LAB_PARALLEL:+--parallel "$GPU_LAB_PARALLEL"}
