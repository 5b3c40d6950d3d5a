#!/usr/bin/env bash
# Runs every WheelFS test: formatting and vet, unit and in-process cluster
# tests under the race detector, and the FUSE end-to-end suite (as root
# with /dev/fuse; it skips itself otherwise). Installs what the tests need
# on a fresh Debian/Ubuntu machine.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for tool in fusermount3:fuse3 rsync:rsync getfattr:attr sqlite3:sqlite3 make:make tar:tar git:git gcc:gcc setfacl:acl; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "test.sh: missing ${need[*]}; FUSE end-to-end tests that need them will fail or skip" >&2
  fi
fi

echo "== gofmt, go vet" >&2
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt needed on:" >&2; echo "$unformatted" >&2; exit 1
fi
go vet ./...

echo "== unit and in-process tests (race detector)" >&2
# The in-process cluster tests alone take about 15 minutes on a 2-core CI
# machine: the timeout leaves them room.
go test -race -count=1 -timeout 30m ./internal/... ./cmd/...

echo "== FUSE end-to-end tests" >&2
go test -count=1 -timeout 30m ./test/...
