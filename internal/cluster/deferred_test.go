package cluster

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// startWithDirAtWest starts three sites 20 ms apart whose clients bound a
// call at 6 s (longer than a slice lock, 2 s: a close may meet a new
// primary) and makes /d through west's client.
func startWithDirAtWest(t *testing.T) (*Cluster, context.Context, *client.FS, oid.ID) {
	t.Helper()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ClientTimeout: 6 * time.Second,
		RTT: UniformRTT(20 * time.Millisecond)})
	ctx := opCtx(t)
	fs := c.Servers("west")[0].Client()
	if _, err := fs.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	return c, ctx, fs, mustID(t, fs, "/d")
}

// TestCreateDurableAtClose: open(O_CREAT) is answered once the create is
// committed at the primary, and its replication overlaps the writes
// (CreateRequest.defer_sync); close() still returns success only once
// the create and the data are at SyncLevel replicas. With the backups'
// sites cut off the open succeeds at once and the close fails with
// ETIMEDOUT; with the primary crashed between open and close, a close
// that succeeds left a file that outlives the crash.
func TestCreateDurableAtClose(t *testing.T) {
	t.Parallel()
	c, ctx, fs, d := startWithDirAtWest(t)
	west := c.Servers("west")[0]
	// Not waiting for /d to reach its backups: right after start west's
	// table may list no other server, and the close must still wait for
	// three copies (issue 16 item 12).
	create := func(name string) (*client.Handle, time.Duration) {
		t.Helper()
		began := time.Now()
		h, _, err := fs.CreateOpen(ctx, Owner(), client.NoCues, d, name, client.CreateArgs{Mode: 0o644}, syscall.O_CREAT|syscall.O_WRONLY)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		if _, err := h.Write(ctx, []byte("data of "+name), 0); err != nil {
			t.Fatal(err)
		}
		return h, time.Since(began)
	}

	c.PartitionLink("west", "east")
	c.PartitionLink("west", "eu")
	h, took := create("cut")
	if took > time.Second {
		t.Errorf("open(O_CREAT) with the backups cut off took %v; want it answered from the primary", took)
	}
	err := h.Flush(ctx)
	h.Release(ctx)
	t.Logf("close with the backups cut off: %v", err)
	if !errors.Is(err, fserr.ErrTimeout) && !errors.Is(err, fserr.ErrIO) {
		t.Errorf("close with the backups cut off: %v, want ETIMEDOUT or EIO (the create is not at its replicas)", err)
	}
	c.HealLink("west", "east")
	c.HealLink("west", "eu")

	// Crash the primary between open and close: the close either fails or
	// left a file that every site reads after the failover.
	h, _ = create("crash")
	c.Crash(west)
	err = h.Flush(ctx)
	t.Logf("close after the primary crashed: %v", err)
	if err == nil {
		east := c.Servers("east")[0].Client()
		c.WaitFor(60*time.Second, "east reads the file whose close succeeded", func() error {
			got, err := east.ReadFile(ctx, Owner(), "/d/crash")
			if err == nil && !bytes.Equal(got, []byte("data of crash")) {
				t.Fatalf("after the failover /d/crash holds %q", got)
			}
			return err
		})
	}
}

// TestSyncDirWaitsForOpenCreates: fsync(2) of a directory covers the
// creates whose files are still open, whose replication only their close
// waits for otherwise: with the backups' sites cut off it fails
// (ETIMEDOUT or EIO), after the heal it succeeds, and the file's close
// then has nothing left to wait for.
func TestSyncDirWaitsForOpenCreates(t *testing.T) {
	t.Parallel()
	c, ctx, fs, d := startWithDirAtWest(t)
	c.PartitionLink("west", "east")
	c.PartitionLink("west", "eu")
	h, _, err := fs.CreateOpen(ctx, Owner(), client.NoCues, d, "journal", client.CreateArgs{Mode: 0o644}, syscall.O_CREAT|syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(ctx)
	err = fs.SyncDir(ctx, Owner(), client.NoCues, d)
	if !errors.Is(err, fserr.ErrTimeout) && !errors.Is(err, fserr.ErrIO) {
		t.Errorf("fsync of the directory with the backups cut off: %v, want ETIMEDOUT or EIO (the create is not at its replicas)", err)
	}
	c.HealLink("west", "east")
	c.HealLink("west", "eu")
	c.WaitFor(60*time.Second, "fsync of the directory after the heal", func() error {
		return fs.SyncDir(ctx, Owner(), client.NoCues, d)
	})
	if err := h.Flush(ctx); err != nil {
		t.Errorf("close after the directory's fsync: %v", err)
	}
}
