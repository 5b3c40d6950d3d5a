package store

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/poll"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestLazyUpdates: a lazy update is visible at once and left unsynced;
// the next synced update, Flush, a checkpoint or the timer syncs it; and
// every one of them is there after a reopen.
func TestLazyUpdates(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	dirty := func() bool {
		s.commitMu.Lock()
		defer s.commitMu.Unlock()
		return s.walDirty.Load()
	}
	n := uint64(0)
	put := func(ctx context.Context) oid.ID {
		t.Helper()
		n++
		id := oid.Make(1, n)
		if err := s.Update(ctx, func(tx *Tx) error {
			return tx.PutMeta(&wire.Meta{Id: uint64(id), Type: wire.Type_TYPE_FILE, Size: n})
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	lazy := func() oid.ID {
		t.Helper()
		id := put(Lazily(ctx))
		if err := s.View(func(tx *Tx) error { _, err := tx.Meta(id); return err }); err != nil {
			t.Fatalf("a lazy update is not visible once answered: %v", err)
		}
		if !dirty() {
			t.Fatal("a lazy update was synced before its answer")
		}
		return id
	}

	lazy()
	poll.Until(t, 10*DefaultLazyFlushDelay+5*time.Second, "the timer syncs a lazy update", func() error {
		if dirty() {
			return errors.New("log still unsynced")
		}
		return nil
	})
	lazy()
	put(ctx)
	if dirty() {
		t.Error("a synced update left the lazy one before it unsynced")
	}
	lazy()
	if err := s.Flush(); err != nil || dirty() {
		t.Errorf("Flush: %v, dirty %v", err, dirty())
	}
	lazy()
	if err := s.checkpoint(false); err != nil || dirty() {
		t.Errorf("checkpoint: %v, dirty %v", err, dirty())
	}
	lazy()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{})
	for i := uint64(1); i <= n; i++ {
		if err := s.View(func(tx *Tx) error { _, err := tx.Meta(oid.Make(1, i)); return err }); err != nil {
			t.Errorf("update %d after a reopen: %v", i, err)
		}
	}
}

// TestLazySyncFailure: once an fdatasync of lazy records failed, the
// store takes no more updates, even once fdatasync works again (Linux
// would report the lost write-back to no later one), until it reopens.
func TestLazySyncFailure(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()
	put := func(ctx context.Context, n uint64) error {
		return s.Update(ctx, func(tx *Tx) error {
			return tx.PutMeta(&wire.Meta{Id: uint64(oid.Make(1, n)), Type: wire.Type_TYPE_FILE})
		})
	}
	if err := put(Lazily(ctx), 1); err != nil {
		t.Fatal(err)
	}
	s.commitMu.Lock()
	s.logSyncFault = func() error { return syscall.EIO }
	s.commitMu.Unlock()
	if err := s.Flush(); !errors.Is(err, fserr.ErrIO) {
		t.Fatalf("Flush with a failing sync = %v, want EIO", err)
	}
	s.commitMu.Lock()
	s.logSyncFault = nil
	s.commitMu.Unlock()
	if err := s.Flush(); !errors.Is(err, fserr.ErrIO) {
		t.Errorf("Flush after a failed sync = %v, want EIO", err)
	}
	for _, c := range []context.Context{ctx, Lazily(ctx)} {
		if err := put(c, 2); !errors.Is(err, fserr.ErrIO) {
			t.Errorf("update after a failed sync of lazy records = %v, want EIO", err)
		}
	}
	s.Close()
	s = openT(t, dir, Options{})
	if err := s.View(func(tx *Tx) error { _, err := tx.Meta(oid.Make(1, 1)); return err }); err != nil {
		t.Errorf("the lazy update (still in the page cache) after a reopen: %v", err)
	}
	if err := put(ctx, 3); err != nil {
		t.Errorf("update after a reopen: %v", err)
	}
}
