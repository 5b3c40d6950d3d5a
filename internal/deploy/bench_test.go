package deploy

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// BenchmarkCoreSequentialWrite measures the client core and server without
// FUSE: 1 MiB writes into one file, committed on close.
func BenchmarkCoreSequentialWrite(b *testing.B) {
	h := startHost(&testing.T{}, b.TempDir())
	defer h.Close()
	ctx := context.Background()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	const size = 256 << 20
	b.SetBytes(size)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		m, err := h.Client.Create(ctx, root, client.NoCues, oid.Root, fmt.Sprintf("f%d", i), client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644})
		if err != nil {
			b.Fatal(err)
		}
		i++
		fh, _, err := h.Client.Open(ctx, root, client.NoCues, oid.ID(m.Id), syscall.O_WRONLY)
		if err != nil {
			b.Fatal(err)
		}
		for off := int64(0); off < size; off += int64(len(buf)) {
			buf[0]++ // distinct blocks: no dedup
			if _, err := fh.Write(ctx, buf, off); err != nil {
				b.Fatal(err)
			}
		}
		if err := fh.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		fh.Release(ctx)
	}
}

// BenchmarkCoreCreate measures durable creates of empty files.
func BenchmarkCoreCreate(b *testing.B) {
	h := startHost(&testing.T{}, b.TempDir())
	defer h.Close()
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := h.Client.Create(ctx, root, client.NoCues, oid.Root, fmt.Sprintf("f%d", i), client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkCoreCreateRemove creates and removes one file per iteration
// (the unlink half of tar -x / rm -rf workloads, and both sides of the
// exactly-once records: one written, the previous one purged).
func BenchmarkCoreCreateRemove(b *testing.B) {
	h := startHost(&testing.T{}, b.TempDir())
	defer h.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Client.Create(ctx, root, client.NoCues, oid.Root, "f", client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644}); err != nil {
			b.Fatal(err)
		}
		if err := h.Client.Remove(ctx, root, client.NoCues, oid.Root, "f", false); err != nil {
			b.Fatal(err)
		}
	}
}
