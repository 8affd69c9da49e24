#!/usr/bin/env bash
# What a newcomer waits for: clone this repository into a temporary folder beside ../shared (so
# that the clone finds the data root where a checkout does), run `make test` from nothing, and
# print the setup and test times. A benchmark, not a test; the machine's load is printed with it.
#   scripts/newcomer-time.sh            the whole suite
#   NEWCOMER_PYTEST="tests/test_layout.py" scripts/newcomer-time.sh   a smoke run of one file
# KEEP=1 keeps the clone (its path is printed). The clone is of HEAD; NEWCOMER_WORKTREE=1 also
# brings this checkout's uncommitted changes and untracked files (to try a change before a commit).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
parent=$(dirname "$here")
clone=$(mktemp -d "$parent/newcomer-XXXXXX")
trap '[ "${KEEP:-0}" = 1 ] || rm -rf "$clone"' EXIT
echo "newcomer: cloning $(git -C "$here" rev-parse --short HEAD) into $clone ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
git clone -q "$here" "$clone"
cd "$clone"
if [ "${NEWCOMER_WORKTREE:-0}" = 1 ]; then
  git -C "$here" diff --binary HEAD | git apply --allow-empty
  git -C "$here" ls-files -z --others --exclude-standard | (cd "$here" && xargs -0r cp --parents -t "$clone")
fi
start=$(date +%s)
make setup
setup_s=$(( $(date +%s) - start ))
start=$(date +%s)
status=0
if [ -n "${NEWCOMER_PYTEST:-}" ]; then
  # shellcheck disable=SC2086
  .venv/bin/python -m pytest -q $NEWCOMER_PYTEST || status=$?
else
  make test || status=$?
fi
test_s=$(( $(date +%s) - start ))
printf 'newcomer: setup %d s, tests %d s, in all %d min %02d s (exit %d; load now %s)\n' \
  "$setup_s" "$test_s" $(( (setup_s + test_s) / 60 )) $(( (setup_s + test_s) % 60 )) "$status" \
  "$(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
