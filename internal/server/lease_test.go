package server

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// silentHolder grants session sess a lease of ttl on id through a stream
// that nobody reads: a client cut off from the server.
func silentHolder(t *testing.T, l *leases, sess uint64, id oid.ID) {
	t.Helper()
	l.attach(sess)
	if ms := l.grant(&wire.Caller{Session: sess}, id); ms == 0 {
		t.Fatal("no lease granted")
	}
}

func farValidity(oid.Slice) time.Time { return time.Now().Add(time.Hour) }

// TestRevokeBoundedByCaller: waiting out the lease of a holder that does
// not answer ends with the caller's deadline (ErrTimeout), even once the
// holder's stream queue is full; the lease is still recorded afterwards,
// so the next update waits for it too.
func TestRevokeBoundedByCaller(t *testing.T) {
	l := newLeases(time.Minute, farValidity)
	id := oid.Make(5, 1)
	silentHolder(t, l, 7, id)
	st := l.sessions[7]
	for range cap(st.out) { // a holder cut off reads nothing
		st.out <- &wire.Revoke{}
	}
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		began := time.Now()
		l.claim([]oid.ID{id}, nil, false, nil)
		err := l.revoke(ctx, []oid.ID{id}, false, nil)
		l.unclaim([]oid.ID{id})
		cancel()
		if took := time.Since(began); !errors.Is(err, fserr.ErrTimeout) || took > time.Second {
			t.Fatalf("revoke: %v after %v, want ErrTimeout at the deadline", err, took)
		}
		if !l.leased(id, nil) {
			t.Fatal("a lease that could not be revoked was forgotten")
		}
	}
}

// TestEventualRevokeGoesOn: an eventual update waits for a silent holder
// during half of its time, then goes on; the lease is abandoned — later
// eventual updates skip it, others still wait for it.
func TestEventualRevokeGoesOn(t *testing.T) {
	l := newLeases(time.Minute, farValidity)
	id := oid.Make(5, 1)
	silentHolder(t, l, 7, id)
	ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
	defer cancel()
	if leased, _, _ := l.claim([]oid.ID{id}, nil, true, nil); len(leased) != 1 {
		t.Fatalf("claim reports %v leased, want %v", leased, id)
	}
	began := time.Now()
	err := l.revoke(ctx, []oid.ID{id}, true, nil)
	took := time.Since(began)
	l.unclaim([]oid.ID{id})
	if err != nil || took < 150*time.Millisecond || took > 350*time.Millisecond {
		t.Fatalf("eventual revoke: %v after %v, want success after about half of 400ms", err, took)
	}
	if leased, _, _ := l.claim([]oid.ID{id}, nil, true, nil); len(leased) != 0 {
		t.Errorf("an eventual update waits again for an abandoned lease: %v", leased)
	}
	l.unclaim([]oid.ID{id})
	if l.leased(id, nil) {
		t.Error("an abandoned lease still counts as one its holder may act on")
	}
	if leased, _, _ := l.claim([]oid.ID{id}, nil, false, nil); len(leased) != 1 {
		t.Errorf("an abandoned lease does not hold up a strict update: %v", leased)
	}
	l.unclaim([]oid.ID{id})
	sctx, scancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer scancel()
	if err := l.revoke(sctx, []oid.ID{id}, false, nil); !errors.Is(err, fserr.ErrTimeout) {
		t.Errorf("strict revoke of an abandoned lease: %v, want ErrTimeout (it waits for it)", err)
	}
}

// TestEventualFenceAbandons: a committed eventual update's fence covers a
// silent holder only until its revocation abandons the lease (half of
// the update's time); a later eventual update then neither fences nor
// waits for it, a strict one fences it again.
func TestEventualFenceAbandons(t *testing.T) {
	l := newLeases(time.Minute, farValidity)
	id := oid.Make(5, 1)
	silentHolder(t, l, 7, id)
	f := &fence{done: make(chan struct{})}
	if leased, others, lost := l.claim([]oid.ID{id}, f, true, nil); len(leased) != 1 || len(others) != 0 || lost {
		t.Fatalf("claim: leased %v, %d other fences, lost %v; want %v fenced by this update alone", leased, len(others), lost, id)
	}
	if !slices.Equal(f.ids, []oid.ID{id}) {
		t.Fatalf("fence covers %v, want %v", f.ids, id)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
	defer cancel()
	// A reader behind the fence waits for it.
	sctx, scancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer scancel()
	if err := l.settle(sctx, id); !errors.Is(err, fserr.ErrTimeout) {
		t.Fatalf("settle behind a fence: %v, want ErrTimeout", err)
	}
	began := time.Now()
	if err := l.revoke(ctx, f.ids, true, nil); err != nil {
		t.Fatalf("eventual revoke: %v", err)
	}
	l.lift(f)
	l.unclaim([]oid.ID{id})
	if took := time.Since(began); took > 350*time.Millisecond {
		t.Fatalf("the fence stayed up %v, want about half of 400ms", took)
	}
	if err := l.settle(t.Context(), id); err != nil {
		t.Fatalf("settle after the fence was lifted: %v", err)
	}
	g := &fence{done: make(chan struct{})}
	if leased, _, _ := l.claim([]oid.ID{id}, g, true, nil); len(leased) != 0 || len(g.ids) != 0 {
		t.Errorf("a later eventual update fences an abandoned lease: leased %v, fence %v", leased, g.ids)
	}
	l.unclaim([]oid.ID{id})
	h := &fence{done: make(chan struct{})}
	if leased, _, lost := l.claim([]oid.ID{id}, h, false, nil); len(leased) != 1 || lost || len(h.ids) != 1 {
		t.Errorf("a strict update does not fence an abandoned lease: leased %v, lost %v, fence %v", leased, lost, h.ids)
	}
	l.lift(h)
	l.unclaim([]oid.ID{id})
}
