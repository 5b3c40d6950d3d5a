#!/usr/bin/env bash
# The bench's metadata sequence (creates, 1.5 s, stats, unlinks, in one
# directory) on a one-host WheelFS (`wheelfs up`), on the bench's loopback
# and on the loopback with the kernel's permission checks
# (`--allow-other`, which adds default_permissions as WheelFS mounts).
# For each phase it prints the wall time per op and the FUSE requests the
# kernel sent that mount (perf's fuse:fuse_request_send tracepoint); for
# the unlinks also the daemon's context switches and CPU per op
# (`perf stat -p`). Needs root, perf and python3; CI never runs it.
#
#   sudo bash scripts/meta-requests.sh [files per phase, default 5000]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-5000}

for c in perf python3; do
  command -v "$c" >/dev/null || { echo "meta-requests: $c is not installed" >&2; exit 1; }
done
base=$(mktemp -d /var/tmp/wheelfs-metareq-XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  for m in "$base"/mnt-*; do
    mountpoint -q "$m" && { fusermount3 -u "$m" 2>/dev/null || umount -l "$m"; }
  done
  rm -rf "$base"
}
trap cleanup EXIT

echo "meta-requests: building wheelfs" >&2
go build -o "$base/wheelfs" ./cmd/wheelfs

cat >"$base/ops.py" <<'PY'
import os, subprocess, sys, time
pid, d, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
os.mkdir(d)
dev = os.stat(d).st_dev

def perf_stat(text):
    got = {}
    for line in text.strip().splitlines():
        f = line.split(',')
        if len(f) > 2:
            try:
                got[f[2]] = float(f[0])
            except ValueError:
                pass
    return got

def phase(name, op, stat=False):
    rec = os.path.join(out, name + '.perf')  # not on the mount: perf's own writes would be traced
    tr = subprocess.Popen(['perf', 'record', '-q', '-e', 'fuse:fuse_request_send', '-a', '-o', rec, '--', 'sleep', '100000'])
    st = subprocess.Popen(['perf', 'stat', '-x', ',', '-e', 'context-switches,task-clock', '-p', pid],
                          stderr=subprocess.PIPE, text=True) if stat else None
    time.sleep(1)
    t = time.time()
    for i in range(n):
        op('%s/f%06d' % (d, i))
    wall = time.time() - t
    tr.terminate(); tr.wait()
    extra = ''
    if st:
        st.send_signal(2)
        got = perf_stat(st.communicate()[1])
        extra = '; daemon per op: %.1f context switches, %.0f us CPU' % (
            got.get('context-switches', 0) / n, got.get('task-clock', 0) * 1e3 / n)
    listing = subprocess.run("perf script -i %s 2>/dev/null | grep 'connection %d req' | grep -o '(FUSE_[A-Z_0-9]*)' | sort | uniq -c | sort -rn" % (rec, dev),
                         shell=True, capture_output=True, text=True).stdout
    reqs = ', '.join('%s %s' % (c, req.strip('()')[5:]) for c, req in (l.split() for l in listing.strip().splitlines()))
    print('  %-6s %5.0f us/op  requests: %s%s' % (name, wall / n * 1e6, reqs or 'none', extra), flush=True)

phase('create', lambda p: os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)))
time.sleep(1.5)  # the loopback's 1 s entry and attribute caches expire, as in the bench
phase('stat', os.lstat)
phase('unlink', os.unlink, stat=True)
PY

run() { # name, then the command that serves $base/mnt-name
  local name=$1; shift
  local mnt="$base/mnt-$name"
  mkdir -p "$mnt" "$base/data-$name"
  "$@" >"$base/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.2; done
  mountpoint -q "$mnt" || { echo "meta-requests: $name did not mount (log: $base/$name.log)" >&2; exit 1; }
  echo "== $name, $n files"
  mkdir -p "$base/perf-$name"
  python3 "$base/ops.py" "$pid" "$mnt/d" "$n" "$base/perf-$name"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  pid=
}

run wheelfs "$base/wheelfs" up --data "$base/data-wheelfs" "$base/mnt-wheelfs"
run loopback "$base/wheelfs" bench loopback "$base/mnt-loopback" "$base/data-loopback"
run loopback-perm "$base/wheelfs" bench loopback "$base/mnt-loopback-perm" "$base/data-loopback-perm" --allow-other
