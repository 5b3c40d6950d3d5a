package server

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// withOp returns a root caller whose request is op seq of session 9.
func withOp(seq, doneBelow uint64) *wire.Caller {
	c := proto.Clone(rootCaller).(*wire.Caller)
	c.Op = &wire.OpRef{Session: 9, Seq: seq, DoneBelow: doneBelow}
	return c
}

// A retried mkdir answers as its first attempt; the session's answered
// records go when it records the next one on the same directory.
func TestOutcomeReplayedAndPurged(t *testing.T) {
	s, ctx := newTestServer(t)
	d := oid.ID(create(t, s, ctx, oid.Root, "d", wire.Type_TYPE_DIR).Id)
	mk := func(name string, seq, below uint64) *wire.CreateResponse {
		t.Helper()
		resp, err := s.Create(ctx, &wire.CreateRequest{Caller: withOp(seq, below), Dir: uint64(d), Name: name,
			Type: wire.Type_TYPE_DIR, Mode: 0o755, Exclusive: true})
		if err != nil {
			t.Fatalf("mkdir %s (op %d): %v", name, seq, err)
		}
		return resp
	}
	first := mk("a", 1, 1)
	if again := mk("a", 1, 1); again.Entry.GetId() != first.Entry.GetId() {
		t.Fatalf("retry answered id %v, first attempt %v", again.Entry.GetId(), first.Entry.GetId())
	}
	mk("b", 2, 1)
	mk("c", 3, 3) // ops 1 and 2 answered
	if n, err := s.Outcomes(d); err != nil || n != 1 {
		t.Fatalf("%d records on d (%v), want 1 (op 3's)", n, err)
	}
}

// The sweep removes expired records and keeps live ones.
func TestSweepOutcomes(t *testing.T) {
	s, ctx := newTestServer(t)
	d := oid.ID(create(t, s, ctx, oid.Root, "d", wire.Type_TYPE_DIR).Id)
	put := func(seq uint64, expiresMs int64) {
		v, _ := proto.Marshal(&wire.OpOutcome{ExpiresMs: expiresMs})
		if err := s.update(ctx, 0, func(tx *store.Tx) error { return tx.SetXattr(d, opKey(9, seq), v) }); err != nil {
			t.Fatal(err)
		}
	}
	put(1, 1)     // long expired
	put(2, 1<<62) // far future
	removed, left, err := s.sweepOutcomes(ctx, d.Slice())
	if err != nil || removed != 1 || left != 1 {
		t.Fatalf("sweep: removed %d, left %d, %v; want 1, 1", removed, left, err)
	}
	if n, _ := s.Outcomes(d); n != 1 {
		t.Fatalf("%d records after the sweep, want 1", n)
	}
}
