#!/usr/bin/env bash
# Time a cold render (no _freeze/: every chapter executes) and then a frozen one, in one run, on
# this machine. The _freeze/ found here is put back afterwards, whatever happens: a measurement
# leaves the tree as it was. Arguments go to scripts/render.sh (e.g. --to html).
set -euo pipefail
cd "$(dirname "$0")/.."
aside=$(mktemp -d)
[ -d _freeze ] && mv _freeze "$aside/"
restore() {
  rm -rf _freeze
  if [ -d "$aside/_freeze" ]; then mv "$aside/_freeze" _freeze; fi
  rmdir "$aside"
}
trap restore EXIT
now() { date +%s.%N; }
t0=$(now)
bash scripts/render.sh "$@" >/dev/null
t1=$(now)
bash scripts/render.sh "$@" >/dev/null
t2=$(now)
awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN {
  printf "cold render:   %5.1f s\nfrozen render: %5.1f s\ndifference:    %5.1f s\n", b-a, c-b, (b-a)-(c-b) }'
