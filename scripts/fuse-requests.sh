#!/usr/bin/env bash
# Counts the FUSE requests the kernel sends, by opcode, while `tar -x` of
# $GOROOT/src runs on the bench's loopback and on a one-host WheelFS
# (`wheelfs up`): which requests a workload costs each file system, as
# opposed to what each costs (`wheelfs bench`). Needs root and perf (the
# fuse:fuse_request_send tracepoint, Linux 6.x).
#
#   bash scripts/fuse-requests.sh
set -euo pipefail
cd "$(dirname "$0")/.."

command -v perf >/dev/null || { echo "fuse-requests: perf is not installed" >&2; exit 1; }
base=$(mktemp -d /var/tmp/wheelfs-fusereq-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for m in "$base/wfs" "$base/lb"; do
    mountpoint -q "$m" && { fusermount3 -u "$m" 2>/dev/null || umount -l "$m"; }
  done
  rm -rf "$base"
}
trap cleanup EXIT

echo "fuse-requests: building wheelfs" >&2
go build -o "$base/wheelfs" ./cmd/wheelfs
mkdir -p "$base/wfs" "$base/wfs-data" "$base/lb" "$base/lb-backing"
tar -cf "$base/gosrc.tar" -C "$(go env GOROOT)" src
"$base/wheelfs" up --data "$base/wfs-data" "$base/wfs" 2>"$base/wfs.log" &
pids+=($!)
"$base/wheelfs" bench loopback "$base/lb" "$base/lb-backing" 2>"$base/lb.log" &
pids+=($!)
for _ in $(seq 100); do
  mountpoint -q "$base/wfs" && mountpoint -q "$base/lb" && break
  sleep 0.2
done
mountpoint -q "$base/wfs" && mountpoint -q "$base/lb" || { echo "fuse-requests: a mount did not come up" >&2; exit 1; }

for t in lb wfs; do
  mkdir "$base/$t/tar"
  sync
  echo "== $t: tar -x of $(tar -tf "$base/gosrc.tar" | wc -l) entries" 
  perf record -q -e fuse:fuse_request_send -a -o "$base/$t.perf" -- tar -xf "$base/gosrc.tar" -C "$base/$t/tar"
  # Only this mount's connection: other FUSE mounts may be busy too.
  dev=$(stat -c %d "$base/$t")
  perf script -i "$base/$t.perf" 2>/dev/null | grep "connection $dev req" | grep -o "(FUSE_[A-Z_0-9]*)" | sort | uniq -c | sort -rn
done
