#!/usr/bin/env bash
# Records a one-host benchmark and compares it with the last recorded one
# (issue 15's regression guard). Run it as root (cold reads drop the
# kernel's caches) on a quiet machine; CI never runs it: timings do not gate.
#
#   bash scripts/bench-guard.sh [wheelfs bench flags...]
#
# Builds wheelfs from this tree, runs `wheelfs bench --json` (extra
# arguments are passed on, e.g. --size 256MiB --files 5000), writes the
# report to docs/bench/<UTC date>-<commit>.json and runs
# `wheelfs bench compare` against the newest earlier report there: a
# workload whose WheelFS ratio (to the same run's raw disk or loopback)
# fell by more than 20 % is flagged REGRESSED and the script exits 1.
# Commit the new report with the change it measured.
set -euo pipefail
cd "$(dirname "$0")/.."

commit=$(git rev-parse --short=10 HEAD)
if ! git diff --quiet HEAD -- ':!docs/bench'; then
  commit="$commit-dirty"
fi
out="docs/bench/$(date -u +%Y%m%dT%H%M%SZ)-$commit.json"
mkdir -p docs/bench
last=$(ls docs/bench/*.json 2>/dev/null | sort | tail -n 1 || true)

bin=$(mktemp -d)/wheelfs
trap 'rm -rf "$(dirname "$bin")" "$out.tmp"' EXIT
echo "bench-guard: building $bin" >&2
go build -o "$bin" ./cmd/wheelfs

echo "bench-guard: running wheelfs bench --json $* (progress on stderr)" >&2
"$bin" bench --json "$@" >"$out.tmp"
mv "$out.tmp" "$out"
echo "bench-guard: recorded $out" >&2

if [ -z "$last" ]; then
  echo "bench-guard: no earlier report in docs/bench; this one is the baseline" >&2
  exit 0
fi
echo "bench-guard: against $last" >&2
"$bin" bench compare "$last" "$out"
