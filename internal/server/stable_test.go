package server

import (
	"errors"
	"testing"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestUnstableBookkeeping: the primary remembers each object's latest
// change not yet at its backups, gives it back when the batch does not
// commit (the earlier change of the object counts again), and forgets
// batches once enough backups acknowledged them, oldest first.
func TestUnstableBookkeeping(t *testing.T) {
	running, ctx := newTestServer(t)
	// A server of a deployment of three (the batches' needs are capped
	// by it) that is not running (no maintenance replaces its table),
	// on the running one's store.
	s := placementServer(configsvc.ServerInfo{ID: "s1", Site: "west"}, configsvc.ServerInfo{ID: "b1", Site: "west"},
		configsvc.ServerInfo{ID: "b2", Site: "west"})
	s.store, s.bg = running.store, ctx
	const sl = oid.Slice(77)
	r := newSliceRepl(s, sl, 1, 3, 0)
	t.Cleanup(r.close)
	a, b := oid.Make(sl, 100), oid.Make(sl, 101)
	f, g := &follower{id: "b1"}, &follower{id: "b2"}
	r.followers[f.id], r.followers[g.id] = f, g
	assign := func(fail bool, ids ...oid.ID) *unstableBatch {
		t.Helper()
		w := &unstableBatch{need: -1, ids: ids, node: "writer"}
		boom := errors.New("fails after numbering")
		err := s.store.Update(ctx, func(tx *store.Tx) error {
			if _, err := r.assign(tx, nil, w); err != nil {
				return err
			}
			if fail {
				return boom
			}
			return nil
		})
		if fail != errors.Is(err, boom) || !fail && err != nil {
			t.Fatalf("update: %v", err)
		}
		return w
	}
	latest := func(id oid.ID) uint64 {
		t.Helper()
		u, ok := r.unstableOf(id, "reader")
		if !ok {
			return 0
		}
		return u.seq
	}

	first := assign(false, a, b)
	second := assign(false, a)
	if latest(a) != second.seq || latest(b) != first.seq {
		t.Fatalf("latest a=%d b=%d, want %d and %d", latest(a), latest(b), second.seq, first.seq)
	}
	assign(true, b) // not committed: b's latest is first's again
	if latest(b) != first.seq {
		t.Fatalf("after a failed batch, latest b=%d, want %d", latest(b), first.seq)
	}

	// The reader's own change is its own to see: not waited for, and it
	// hides no other writer's earlier one.
	own := &unstableBatch{need: -1, ids: []oid.ID{b}, node: "reader"}
	if err := s.store.Update(ctx, func(tx *store.Tx) error {
		_, err := r.assign(tx, nil, own)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if latest(b) != first.seq {
		t.Fatalf("with the reader's own later change, latest b=%d, want %d (the other writer's)", latest(b), first.seq)
	}
	r.settleNeed(own, 1)

	r.settleNeed(first, 2)
	r.settleNeed(second, 4) // more copies than the deployment has: capped to 3
	if latest(a) == 0 || latest(b) == 0 {
		t.Fatal("batches forgotten before any backup acknowledged them")
	}
	if err := r.outcome(f, wire.ReplStatus_REPL_OK, first.seq); err != nil {
		t.Fatal(err)
	}
	if latest(b) != 0 || latest(a) != second.seq {
		t.Fatalf("after the ack of %d: latest a=%d b=%d, want %d and 0", first.seq, latest(a), latest(b), second.seq)
	}
	if err := r.outcome(f, wire.ReplStatus_REPL_OK, second.seq); err != nil {
		t.Fatal(err)
	}
	if latest(a) != second.seq {
		t.Fatalf("batch %d (3 copies) forgotten with one backup's ack", second.seq)
	}
	if err := r.outcome(g, wire.ReplStatus_REPL_OK, second.seq); err != nil {
		t.Fatal(err)
	}
	if latest(a) != 0 || r.anyUnstable.Load() {
		t.Fatalf("after the ack of %d: latest a=%d, any=%v", second.seq, latest(a), r.anyUnstable.Load())
	}
}
