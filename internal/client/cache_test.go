package client_test

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// countingRouter counts the blocks clients fetch from storage servers;
// with remote, it shows the test's in-process server as one elsewhere.
type countingRouter struct {
	client.Router
	blocks atomic.Int64
	remote bool
}

func (r *countingRouter) Primary(ctx context.Context, s oid.Slice) (client.Conn, error) {
	c, err := r.Router.Primary(ctx, s)
	if err != nil {
		return c, err
	}
	c.StorageClient = countingStorage{c.StorageClient, r}
	if r.remote {
		c.InProcess = false
	}
	return c, nil
}

type countingStorage struct {
	wire.StorageClient
	r *countingRouter
}

func (c countingStorage) ReadBlocks(ctx context.Context, req *wire.ReadBlocksRequest, opts ...grpc.CallOption) (*wire.ReadBlocksResponse, error) {
	c.r.blocks.Add(int64(len(req.Hashes)))
	return c.StorageClient.ReadBlocks(ctx, req, opts...)
}

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestDiskCacheSurvivesRestart reads a file through one client core, stops
// it, and reads the file again through a new core on the same cache
// directory: every block must come from the disk cache, none from the
// server.
func TestDiskCacheSurvivesRestart(t *testing.T) {
	h := deploytest.Start(t, nil)
	ctx := context.Background()
	data := randomBytes(20*client.BlockSize+123, 5)
	if err := h.Client.WriteFile(ctx, root, "/cached", data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := client.NewConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.CacheDir = filepath.Join(t.TempDir(), "cache")
	read := func() *countingRouter {
		r := &countingRouter{Router: h.Router, remote: true}
		fs := client.New(cfg, r)
		defer fs.Close()
		got, err := fs.ReadFile(ctx, root, "/cached")
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read: %d bytes, %v", len(got), err)
		}
		return r
	}
	cold := read()
	if n := cold.blocks.Load(); n != 21 {
		t.Fatalf("cold read fetched %d blocks, want 21", n)
	}
	warm := read()
	if n := warm.blocks.Load(); n != 0 {
		t.Fatalf("read after restart fetched %d blocks from the server, want 0", n)
	}
	// Without the disk tier the same restart fetches everything again.
	cfg.CacheDir = ""
	if r := read(); r.blocks.Load() != 21 {
		t.Fatalf("memory-only client fetched %d blocks, want 21", r.blocks.Load())
	}
}

// TestDiskCacheSkipsInProcessServer reads a file whose primary is the
// server in the reader's own process: its blocks are on this disk
// already, so none is written to the disk tier (a cold read would
// otherwise write everything it reads), and a restarted reader fetches
// them from that server again.
func TestDiskCacheSkipsInProcessServer(t *testing.T) {
	h := deploytest.Start(t, nil)
	ctx := context.Background()
	data := randomBytes(20*client.BlockSize+123, 6)
	if err := h.Client.WriteFile(ctx, root, "/local", data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := client.NewConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.CacheDir = filepath.Join(t.TempDir(), "cache")
	for round := range 2 {
		r := &countingRouter{Router: h.Router}
		fs := client.New(cfg, r)
		got, err := fs.ReadFile(ctx, root, "/local")
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round %d: read %d bytes, %v", round, len(got), err)
		}
		_, _, _, disk := fs.CacheStats()
		fs.Close()
		if n := r.blocks.Load(); n != 21 {
			t.Fatalf("round %d fetched %d blocks, want 21 (none from the disk tier)", round, n)
		}
		if disk.Written != 0 || disk.Skipped != 0 || disk.Used != 0 {
			t.Fatalf("round %d: disk tier holds %+v, want nothing", round, disk)
		}
	}
}

// TestReadInProcessSkipsCache reads a file whose primary is the server in
// the reader's own process: whole blocks go from its store straight into
// the reader's buffer, so none is cached; a read that starts or ends
// inside a block caches just those blocks; blocks this client holds dirty,
// holes and the short last block read as they must.
func TestReadInProcessSkipsCache(t *testing.T) {
	h := deploytest.Start(t, nil)
	ctx := context.Background()
	const bs = client.BlockSize
	data := randomBytes(20*bs+123, 7)
	if err := h.Client.WriteFile(ctx, root, "/direct", data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := client.NewConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	fs := client.New(cfg, h.Router)
	defer fs.Close()
	open := func(path string, flags uint32) *client.Handle {
		r, err := fs.Resolve(ctx, root, path)
		if err != nil {
			t.Fatal(err)
		}
		hd, _, err := fs.Open(ctx, root, r.Cues, oid.ID(r.Meta.Id), flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { hd.Release(ctx) })
		return hd
	}
	read := func(hd *client.Handle, off, n int, want []byte) {
		t.Helper()
		buf := make([]byte, n)
		got, err := hd.Read(ctx, buf, int64(off))
		if err != nil || !bytes.Equal(buf[:got], want) {
			t.Fatalf("read %d at %d: %d bytes, %v; want %d bytes of the file", n, off, got, err, len(want))
		}
	}
	cached := func() int64 { _, _, used, _ := fs.CacheStats(); return used }

	hd := open("/direct", syscall.O_RDONLY)
	calls := fs.Stats().Calls["ReadBlocks"]
	for off := 0; off < 20*bs; off += 2 * bs { // the kernel's 128 KiB reads
		read(hd, off, 2*bs, data[off:off+2*bs])
	}
	read(hd, 20*bs, bs, data[20*bs:]) // the short last block
	if used := cached(); used != 0 {
		t.Fatalf("whole-block reads left %d bytes in the cache, want none", used)
	}
	if n := fs.Stats().Calls["ReadBlocks"] - calls; n != 11 {
		t.Fatalf("11 reads asked the server %d times, want 11", n)
	}
	read(hd, bs+1000, 3*bs, data[bs+1000:4*bs+1000])
	if used := cached(); used != 2*bs {
		t.Fatalf("an unaligned read cached %d bytes, want its two partial blocks (%d)", used, 2*bs)
	}

	// Dirty blocks come from this client, the rest from the server.
	rw := open("/direct", syscall.O_RDWR)
	patch := randomBytes(bs/2, 8)
	if _, err := rw.Write(ctx, patch, 6*bs+100); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), data[4*bs:10*bs]...)
	copy(want[2*bs+100:], patch)
	read(rw, 4*bs, 6*bs, want)

	// Holes read as zeros.
	if err := h.Client.WriteFile(ctx, root, "/sparse", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sp := open("/sparse", syscall.O_RDWR)
	tail := randomBytes(bs, 9)
	if _, err := sp.Write(ctx, tail, 4*bs); err != nil {
		t.Fatal(err)
	}
	if err := sp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fresh := client.New(cfg, h.Router)
	defer fresh.Close()
	fs = fresh
	read(open("/sparse", syscall.O_RDONLY), 2*bs, 3*bs, append(make([]byte, 2*bs), tail...))
}

// TestPrefetchFitsTheCache reads a file sequentially from a server shown
// as remote through a memory cache of eight blocks and no disk tier: the
// prefetch window shrinks to what the cache holds, so each block is
// fetched once (a 64-block window would be evicted before it is read, and
// fetched again by the read).
func TestPrefetchFitsTheCache(t *testing.T) {
	h := deploytest.Start(t, nil)
	ctx := context.Background()
	const bs, blocks = client.BlockSize, 100
	data := randomBytes(blocks*bs, 10)
	if err := h.Client.WriteFile(ctx, root, "/seq", data, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := client.NewConfig()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.CacheBytes = 8 * bs
	r := &countingRouter{Router: h.Router, remote: true}
	fs := client.New(cfg, r)
	defer fs.Close()
	res, err := fs.Resolve(ctx, root, "/seq")
	if err != nil {
		t.Fatal(err)
	}
	hd, _, err := fs.Open(ctx, root, res.Cues, oid.ID(res.Meta.Id), syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer hd.Release(ctx)
	buf := make([]byte, 2*bs) // the kernel's 128 KiB reads
	for off := 0; off < blocks*bs; off += len(buf) {
		n, err := hd.Read(ctx, buf, int64(off))
		if err != nil || !bytes.Equal(buf[:n], data[off:off+len(buf)]) {
			t.Fatalf("read at %d: %d bytes, %v; want the file's %d", off, n, err, len(buf))
		}
	}
	if n := r.blocks.Load(); n != blocks {
		t.Fatalf("a sequential read of %d blocks fetched %d, want each once", blocks, n)
	}
}
