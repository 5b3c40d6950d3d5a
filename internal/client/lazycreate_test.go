package client_test

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
)

// TestCreateDurableByItsClose: on one host, open(O_CREAT) is answered
// before the create's record is synced (CreateResponse.lazy), and close()
// returns only once it is: a file written is made durable by its commit
// alone (one fdatasync of the log for create, write and close), an empty
// one by a barrier at close, whether opened for writing or read-only. A
// mkdir stays durable when it returns. The store's own timer is off, so
// nothing but these calls syncs the log.
func TestCreateDurableByItsClose(t *testing.T) {
	h := deploytest.Start(t, func(c *deploy.Config) { c.Store.LazyFlushDelay = time.Hour })
	fs := h.Client
	ctx := context.Background()
	usage := func() store.Usage {
		t.Helper()
		u, err := h.Store.Usage()
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	// step runs do and checks how many fdatasyncs of the log it cost and
	// whether it left lazy records unsynced.
	step := func(what string, syncs int64, unsynced bool, do func()) {
		t.Helper()
		before := usage()
		do()
		after := usage()
		if got := after.LogSyncs - before.LogSyncs; got != syncs || after.Unsynced != unsynced {
			t.Errorf("%s: %d log syncs, unsynced %v; want %d, %v", what, got, after.Unsynced, syncs, unsynced)
		}
	}
	open := func(name string, flags uint32) *client.Handle {
		t.Helper()
		fh, _, err := fs.CreateOpen(ctx, root, client.NoCues, oid.Root, name, client.CreateArgs{Mode: 0o644}, flags|syscall.O_CREAT|syscall.O_EXCL)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return fh
	}
	closeFile := func(fh *client.Handle) {
		t.Helper()
		if err := fh.Flush(ctx); err != nil {
			t.Fatalf("close: %v", err)
		}
		fh.Release(ctx)
	}

	var fh *client.Handle
	step("mkdir", 1, false, func() {
		if _, err := fs.Mkdir(ctx, root, "/d", 0o755); err != nil {
			t.Fatal(err)
		}
	})
	step("open(O_CREAT|O_WRONLY)", 0, true, func() { fh = open("written", syscall.O_WRONLY) })
	step("write", 0, true, func() {
		if _, err := fh.Write(ctx, []byte("durable at close"), 0); err != nil {
			t.Fatal(err)
		}
	})
	step("close of the written file", 1, false, func() { closeFile(fh) })

	step("open(O_CREAT|O_WRONLY) of an empty file", 0, true, func() { fh = open("empty", syscall.O_WRONLY) })
	step("close of the empty file", 1, false, func() { closeFile(fh) })

	step("open(O_CREAT|O_RDONLY)", 0, true, func() { fh = open("readonly", syscall.O_RDONLY) })
	step("close of the read-only open", 1, false, func() { closeFile(fh) })

	// fsync(2) before close: the create and the write are durable then;
	// the close has nothing left to sync.
	step("open(O_CREAT|O_RDWR)", 0, true, func() { fh = open("fsynced", syscall.O_RDWR) })
	step("write and fsync", 1, false, func() {
		if _, err := fh.Write(ctx, []byte("fsynced"), 0); err != nil {
			t.Fatal(err)
		}
		if err := fh.Fsync(ctx); err != nil {
			t.Fatal(err)
		}
	})
	step("close after fsync", 0, false, func() { closeFile(fh) })

	got, err := fs.ReadFile(ctx, root, "/written")
	if err != nil || !bytes.Equal(got, []byte("durable at close")) {
		t.Errorf("read back: %q, %v", got, err)
	}
}
