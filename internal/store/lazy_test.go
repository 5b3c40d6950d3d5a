package store

import (
	"context"
	"errors"
	"testing"
	"time"

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
		return s.walDirty
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
	poll.Until(t, 10*LazyFlushDelay+5*time.Second, "the timer syncs a lazy update", func() error {
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
