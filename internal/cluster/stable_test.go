package cluster

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestAnswersWaitForBackups (issue 16): a change the primary has committed
// but no backup has yet is shown to nobody, neither by a read nor by a
// mutation that fails on it. TestLinearizableUnderFaults once saw a reader
// at the primary's cut-off site look up a renamed file under its new name
// while the rename, never replicated, was lost in the failover and its
// retry answered ENOENT.
func TestAnswersWaitForBackups(t *testing.T) {
	t.Parallel()
	// Locks outlast the test: no failover, so what is waited for is the
	// backups alone.
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: time.Minute,
		RTT: UniformRTT(10 * time.Millisecond), ClientTimeout: 30 * time.Second})
	ctx := opCtx(t)
	writer, reader := c.Client("east"), c.Servers("east")[0].Client()
	dm, err := writer.Mkdir(ctx, Owner(), "/d", 0o777)
	if err != nil {
		t.Fatal(err)
	}
	d := oid.ID(dm.Id)
	if err := writer.WriteFile(ctx, Owner(), "/d/f2", []byte("f2"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := c.Primary(ctx, d.Slice())
	if err != nil || p.Site != "east" {
		t.Fatalf("the primary of /d is %v (%v), want one at east", p, err)
	}

	c.PartitionSite("east")
	renamed := make(chan error, 1)
	go func() { renamed <- writer.Rename(ctx, Owner(), client.NoCues, d, "f2", d, "f3", 0) }()
	c.WaitFor(20*time.Second, "the rename committed at the primary", func() error {
		return p.Host().Store.View(func(tx *store.Tx) error {
			_, err := tx.Entry(d, "f3")
			return err
		})
	})

	// While no backup has the rename, no answer shows it.
	shown := func(what string, err error) {
		t.Helper()
		if err == nil || isNotExist(err) {
			t.Errorf("%s answered %v while the rename is at the primary only; want it to wait", what, err)
		}
	}
	for _, name := range []string{"f3", "f2"} {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := reader.Lookup(lctx, Owner(), client.NoCues, d, name)
		cancel()
		shown("lookup "+name, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, _, err = reader.ReadDir(lctx, Owner(), client.NoCues, d)
	cancel()
	if err == nil {
		t.Errorf("readdir answered while the rename is at the primary only; want it to wait")
	}
	// A mutation refused because of the rename (f3 exists) shows it too.
	lctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	_, err = reader.Create(lctx, Owner(), client.NoCues, d, "f3",
		client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644, Exclusive: true})
	cancel()
	if err == nil || fserr.Errno(err) == syscall.EEXIST {
		t.Errorf("create(O_EXCL) f3 answered %v while the rename is at the primary only; want it to wait", err)
	}
	// One on a name the rename holds waits for it, within its own bound.
	lctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	err = reader.Remove(lctx, Owner(), client.NoCues, d, "f2", false)
	cancel()
	shown("unlink f2", err)

	c.HealSite("east")
	select {
	case err := <-renamed:
		if err != nil {
			t.Fatalf("rename after the heal: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the rename did not finish after the heal")
	}
	if _, err := reader.Lookup(ctx, Owner(), client.NoCues, d, "f3"); err != nil {
		t.Fatalf("lookup f3 after the heal: %v", err)
	}
	if _, err := reader.Lookup(ctx, Owner(), client.NoCues, d, "f2"); !isNotExist(err) {
		t.Fatalf("lookup f2 after the heal: %v, want ENOENT", err)
	}
}
