package client_test

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// countingRouter counts the blocks clients fetch from storage servers.
type countingRouter struct {
	client.Router
	blocks atomic.Int64
}

func (r *countingRouter) Primary(ctx context.Context, s oid.Slice) (client.Conn, error) {
	c, err := r.Router.Primary(ctx, s)
	if err != nil {
		return c, err
	}
	c.StorageClient = countingStorage{c.StorageClient, r}
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
		r := &countingRouter{Router: h.Router}
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
