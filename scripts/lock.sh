#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml and requirements/*.txt (`make lock`):
#   requirements/lock.txt     every Python dependency, fairseq's requirements and the build
#                             tools included, exact versions with sha256 hashes; torch left out
#                             (its version is pyproject.toml's pin, its build setup.sh's choice)
#   requirements/fairseq.txt  fairseq-fixed, built from its sdist by setup.sh (--no-deps)
#   requirements/uv.txt       the installer setup.sh uses for everything else
# The resolution is for Linux x86_64 and Python 3.11 (this project's machines and CI), against
# the CPU build of torch, so that no CUDA package enters the lock. UV picks the uv binary
# (default: `uv` on PATH, else one installed into a scratch venv under ${TMPDIR:-/tmp}).
# Usage: scripts/lock.sh [--upgrade]   (without it, versions already locked are kept if they fit)
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-}
if [ -z "$uv" ]; then
  if command -v uv >/dev/null 2>&1; then uv=uv; else
    scratch=${TMPDIR:-/tmp}/finetune-lab-uv
    [ -x "$scratch/bin/uv" ] || { python3 -m venv "$scratch" && "$scratch/bin/pip" install -q uv; }
    uv=$scratch/bin/uv
  fi
fi
torch=$(sed -n 's/^ *"torch==\([^"]*\)".*/\1/p' pyproject.toml)
[ -n "$torch" ] || { echo "lock: pyproject.toml pins no torch==VERSION" >&2; exit 1; }
# The CPU build of torch: a local wheel where pip finds one (this workplace's machines), else
# PyTorch's CPU index. Either way its metadata lists no CUDA package.
torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
for dir in ${FINETUNE_LAB_TORCH_WHEELS:-/opt/wheels}; do
  if compgen -G "$dir/torch-$torch+cpu-*.whl" >/dev/null; then torch_source=(--find-links "$dir"); fi
done
common=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header
        --custom-compile-command "scripts/lock.sh")
"$uv" pip compile "${common[@]}" "${torch_source[@]}" "$@" pyproject.toml --extra dev \
  requirements/fairseq-deps.txt requirements/build.txt --no-emit-package torch \
  -o requirements/lock.txt
"$uv" pip compile "${common[@]}" --no-deps "$@" - -o requirements/fairseq.txt <<<"fairseq-fixed==0.12.3.1"
"$uv" pip compile "${common[@]}" --no-deps "$@" - -o requirements/uv.txt <<<"uv==$("$uv" --version | cut -d' ' -f2)"
if grep -qiE '^(nvidia-|triton|torchaudio|torch==)' requirements/lock.txt; then
  echo "lock: requirements/lock.txt names a CUDA package or torch itself; see above" >&2; exit 1
fi
echo "lock: requirements/lock.txt ($(grep -c '==' requirements/lock.txt) packages), fairseq.txt, uv.txt (torch $torch: pyproject.toml)"
