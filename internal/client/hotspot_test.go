package client

import (
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"

	"github.com/wheelfs/wheelfs/internal/holders"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// coordAt is a coordinate x seconds along the first axis.
func coordAt(x float64) *coordinate.Coordinate {
	c := coordinate.NewCoordinate(coordinate.DefaultConfig())
	c.Vec[0] = x
	return c
}

// TestReportAgainWhenCoordinateMoves checks that blocks reported with a
// coordinate that has since moved by more than coordMoved are queued for
// the next report (with the caller they were reported for), at most once
// per coordEvery, and that a small move, or a hint already run out,
// queues nothing.
func TestReportAgainWhenCoordinateMoves(t *testing.T) {
	caller := &wire.Caller{Uid: 1000}
	fresh, stale := oid.ID(7), oid.ID(9)
	r := newHoldReports()
	r.markSent([]oid.ID{fresh, stale}, map[oid.ID]*heldFile{
		fresh: {version: 3, caller: caller, ranges: []holders.Range{{First: 0, Count: 4}}},
		stale: {version: 1, caller: caller, ranges: []holders.Range{{First: 2, Count: 1}}},
	}, coordAt(0))
	r.sent[stale].at = time.Now().Add(-refreshAfter)

	r.coordChanged(coordAt(0.005)) // 5 ms
	if len(r.pending) != 0 {
		t.Fatalf("a 5 ms move queued %v", r.pending)
	}

	r.coordChanged(coordAt(1.35)) // an unsettled first coordinate, as seen in CI
	p := r.pending[fresh]
	if p == nil || p.version != 3 || p.caller != caller || len(p.ranges) != 1 || p.ranges[0] != (holders.Range{First: 0, Count: 4}) {
		t.Fatalf("after a 1.35 s move, pending %+v; want version 3, blocks 0-3, its caller", p)
	}
	if r.pending[stale] != nil {
		t.Errorf("a hint past refreshAfter was queued again")
	}
	if len(r.pending) != 1 {
		t.Errorf("pending %v, want only the fresh file", r.pending)
	}

	// Moves in quick succession queue reports once per coordEvery.
	clear(r.pending)
	r.markSent([]oid.ID{fresh}, map[oid.ID]*heldFile{fresh: {version: 3, caller: caller}}, coordAt(1.35))
	r.coordChanged(coordAt(2))
	if len(r.pending) != 0 {
		t.Errorf("a second move within coordEvery queued %v", r.pending)
	}
	r.coordAt = time.Now().Add(-coordEvery)
	r.coordChanged(coordAt(2))
	if r.pending[fresh] == nil {
		t.Errorf("a move after coordEvery queued nothing")
	}
}
