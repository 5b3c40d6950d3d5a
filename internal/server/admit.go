package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

type eventualKey struct{}

// withEventual marks ctx as a request with .EventualConsistency.
func withEventual(ctx context.Context) context.Context {
	return context.WithValue(ctx, eventualKey{}, true)
}

func isEventual(ctx context.Context) bool {
	v, _ := ctx.Value(eventualKey{}).(bool)
	return v
}

// backs reports whether this server keeps a copy of slice sl: it is in
// the slice's replica list.
func (s *Server) backs(sl oid.Slice) bool {
	t := s.table.Load()
	if t == nil {
		return false
	}
	e, ok := t.Slices[sl]
	return ok && slices.Contains(e.Replicas, s.cfg.ID) && s.hasCopy(sl)
}

// hasCopy reports whether this server has received a copy of slice sl:
// a backup just recruited has nothing to answer from yet, and must send
// the client on to another replica rather than answer ENOENT.
func (s *Server) hasCopy(sl oid.Slice) bool {
	var p pos
	_ = s.store.View(func(tx *store.Tx) error { p = readPos(tx, sl); return nil })
	return p != pos{}
}

// admit checks that this server may serve a request about ids: as
// primary of their slices or, for a caller with .EventualConsistency, as
// a server that keeps a copy of them. The context it returns carries the
// eventual flag for update and local.
func (s *Server) admit(ctx context.Context, c *wire.Caller, ids ...oid.ID) (context.Context, error) {
	ev := c.GetEventual()
	for _, id := range ids {
		if err := s.primary(id); err != nil && (!ev || !s.backs(id.Slice())) {
			return ctx, err
		}
	}
	if ev {
		ctx = withEventual(ctx)
	} else if len(c.GetAdopt()) > 0 && c.GetSession() != 0 {
		ctx = context.WithValue(ctx, adopterKey{}, &adopter{session: c.Session, ids: c.Adopt})
	}
	return ctx, nil
}

// adopter is the client session of a mutation that keeps its own leases
// on some of the objects it changes current from the answer
// (Caller.adopt): it serves none of them from its cache meanwhile, so the
// change neither calls it back for them nor waits for it. checkSessions
// made sure the session is the asking node's: it can only skip its own
// callbacks.
type adopter struct {
	session uint64
	ids     []uint64
}

type adopterKey struct{}

// adopterOf returns the adopter of a request admitted with ctx (nil: none).
func adopterOf(ctx context.Context) *adopter {
	a, _ := ctx.Value(adopterKey{}).(*adopter)
	return a
}

// skips reports whether session's lease on id is the adopter's own.
func (a *adopter) skips(session uint64, id oid.ID) bool {
	return a != nil && session == a.session && slices.Contains(a.ids, uint64(id))
}

// local reports whether a request admitted with ctx may use this
// server's copy of id.
func (s *Server) local(ctx context.Context, id oid.ID) bool {
	return s.primary(id) == nil || isEventual(ctx) && s.backs(id.Slice())
}

// primary checks that this server is primary for id's slice: it holds
// the lock, the lock's lease has not run out by the local clock (a paused
// primary must not answer after its lock may have passed to another
// server), and the slice is not being handed over.
func (s *Server) primary(id oid.ID) error {
	sl := id.Slice()
	if !time.Now().Before(s.owned.validity(sl)) {
		return fmt.Errorf("object %v: %w", id, fserr.ErrNotPrimary)
	}
	return nil
}

// primaryOf returns the server the slice table names as sl's primary.
func (s *Server) primaryOf(sl oid.Slice) string {
	t := s.table.Load()
	if t == nil {
		return ""
	}
	if x, ok := t.Slices[sl]; ok && len(x.Replicas) > 0 {
		return x.Replicas[0]
	}
	return ""
}

// sliceFor returns a slice this server is primary for whose policy is p,
// acquiring a new one if needed (paper §5.2.2).
func (s *Server) sliceFor(ctx context.Context, p configsvc.Policy) (oid.Slice, error) {
	id, ok := s.owned.sliceOf(p)
	if ok {
		return id, nil
	}
	for attempt := 0; attempt < 8; attempt++ {
		id := oid.Slice(rand.Uint32N(uint32(oid.MaxSlice-oid.RootSlice))) + oid.RootSlice + 1
		err := s.acquire(ctx, id, p)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, configsvc.ErrLocked) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("server: no free slice for policy %+v: %w", p, fserr.ErrNoSpace)
}
