#!/usr/bin/env bash
# Render the book (HTML and PDF) from the cached runs, with the project's virtual environment.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
export PATH="$PWD/$venv/bin:$PATH" QUARTO_PYTHON="$PWD/$venv/bin/python"
if ! command -v quarto >/dev/null 2>&1; then
  cat >&2 <<'MSG'
render: Quarto is not installed (the `quarto` command is not on PATH).
  Install Quarto >= 1.11 from https://quarto.org/docs/get-started/ (or, where GitHub downloads
  are allowed, `pip install quarto-cli` into the venv), then run `make site` again.
  Everything else is set up: `make test` runs the chapters through Jupyter without Quarto.
MSG
  exit 127
fi
# Quarto's own output is kept as _site/render.log: tests/test_render.py fails on its warnings.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# --execute-daemon: one kernel per chapter, kept for both formats (HTML, then Typst), so a chapter
# that must execute imports its modules once. Quarto turns the kernel daemon off in a project
# render of more than 3 files unless this flag asks for it; the kernel ends 30 s after its last use.
quarto render --execute-daemon 30 "$@" 2>&1 | tee "$log"
mkdir -p _site && cp "$log" _site/render.log
echo "render: done; open _site/index.html (PDF: _site/*.pdf); check it with"
echo "  $venv/bin/python -m pytest tests/test_render.py"
