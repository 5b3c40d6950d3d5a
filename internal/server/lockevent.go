package server

import (
	"context"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// A takeover is safe only once the previous primary's lock can have
// expired by its own count (last renewal sent + L): until then it still
// serves reads and keeps the leases it granted. Fencing epochs protect
// writes either way. Config.OnLock lets fault tests assert it.

// LockEventKind says what happened to a slice lock.
type LockEventKind int

const (
	LockTaken    LockEventKind = iota // acquired (a new epoch, or our own again)
	LockRenewed                       // the shared lease was kept alive
	LockReleased                      // about to be given up: no longer counted held
)

func (k LockEventKind) String() string {
	return [...]string{"taken", "renewed", "released"}[k]
}

// LockEvent is one change in what a server believes of a slice lock.
type LockEvent struct {
	Kind   LockEventKind
	Slice  oid.Slice
	Holder string
	Epoch  int64
	At     time.Time // taken: once the configuration service granted it
	Until  time.Time // taken, renewed: counted held until then
}

func (s *Server) lockEvent(k LockEventKind, l configsvc.Lock, until time.Time) {
	if s.cfg.OnLock != nil {
		s.cfg.OnLock(LockEvent{Kind: k, Slice: l.Slice, Holder: l.Holder, Epoch: l.Epoch, At: time.Now(), Until: until})
	}
}

// release gives lock l up; it stops counting the lock held first, since
// another server may take it the moment it is released.
func (s *Server) release(ctx context.Context, l configsvc.Lock) error {
	s.lockEvent(LockReleased, l, time.Time{})
	return s.conf.Release(ctx, l)
}

// heldUntil is until when lock l, asked for at locked, counts as held: it
// shares its holder's lease, which may have last been renewed before the
// Acquire (l.Since).
func heldUntil(l configsvc.Lock, locked time.Time, ttl time.Duration) time.Time {
	from := locked
	if !l.Since.IsZero() && l.Since.Before(from) {
		from = l.Since
	}
	return from.Add(ttl)
}
