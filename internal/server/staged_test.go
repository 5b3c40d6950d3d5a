package server_test

import (
	"bytes"
	"crypto/rand"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
)

// TestSlowWriterOutlivesPendingTTL: a file written for longer than the
// server keeps uploaded blocks that no commit names (store.PendingTTL,
// ten minutes; one second here), with pauses longer than that between
// its writes. The blocks uploaded ahead of close used to be forgotten
// before the close committed them: the close failed with EINVAL ("unknown
// block") and the data written so far was lost. The client now commits
// blocks that waited client.Config.StagedFor.
func TestSlowWriterOutlivesPendingTTL(t *testing.T) {
	if client.DefaultStagedFor >= store.PendingTTL/2 {
		t.Fatalf("client.DefaultStagedFor %v is not well inside store.PendingTTL %v", client.DefaultStagedFor, store.PendingTTL)
	}
	const ttl = time.Second
	h := deploytest.Start(t, func(c *deploy.Config) {
		c.Store.PendingTTL = ttl
		c.Client.StagedFor = ttl / 5
	})
	fs := h.Client
	ctx := t.Context()
	f, _, err := fs.CreateOpen(ctx, root, client.NoCues, oid.Root, "slow", client.CreateArgs{Mode: 0o644}, syscall.O_CREAT|syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 24<<20)
	rand.Read(data)
	third := len(data) / 3
	for i := 0; i < 3; i++ {
		if _, err := f.Write(ctx, data[i*third:(i+1)*third], int64(i*third)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * ttl) // past the TTL: the next upload sweeps what is older
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	f.Release(ctx)
	got, err := fs.ReadFile(ctx, root, "/slow")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v", len(got), err)
	}
}
