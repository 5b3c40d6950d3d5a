package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/every"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
)

// lockValidity is until when this server may serve slice sl as primary
// (zero when it may not): no lease it grants lasts longer, so a primary
// that takes over never meets a lease of its predecessor.
func (s *Server) lockValidity(sl oid.Slice) time.Time {
	return s.owned.validity(sl)
}

func (s *Server) defaultPolicy() configsvc.Policy {
	return configsvc.Policy{Site: s.cfg.Site, RepLevel: DefaultRepLevel}
}

// acquire takes the lock of a new slice id with policy p and replicas
// chosen by placement.
func (s *Server) acquire(ctx context.Context, id oid.Slice, p configsvc.Policy) error {
	replicas := s.chooseReplicas(p, []string{s.cfg.ID})
	start := time.Now()
	l, err := s.conf.Acquire(ctx, id, s.cfg.ID, p, replicas)
	if err != nil {
		return fmt.Errorf("server: acquire slice %d: %w", id, err)
	}
	s.lockEvent(LockTaken, l, heldUntil(l, start, s.lockTTL))
	var at pos
	if err := s.store.Update(ctx, func(tx *store.Tx) error {
		at = readPos(tx, id)
		at.epoch = l.Epoch
		return writePos(tx, id, at)
	}); err != nil {
		return err
	}
	s.serve(l, p, replicas, at.seq, start)
	s.log.Info("new slice", "slice", id, "policy", p, "replicas", replicas, "epoch", l.Epoch)
	return nil
}

// serve starts acting as primary of a slice whose lock l this server
// holds, with replicas[1:] as backups.
func (s *Server) serve(l configsvc.Lock, p configsvc.Policy, replicas []string, seq uint64, locked time.Time) {
	r := newSliceRepl(s, l.Slice, l.Epoch, p.RepLevel, seq)
	old := s.owned.add(l, p, r, locked, s.lockTTL)
	r.setFollowers(replicas)
	if old != nil {
		old.close()
	}
}

// lostSlice stops acting as primary of slice sl (if still at epoch).
func (s *Server) lostSlice(sl oid.Slice, epoch int64, why string) {
	r, ok := s.owned.remove(sl, epoch)
	if !ok {
		return
	}
	s.log.Warn("no longer primary of slice", "slice", sl, "epoch", epoch, "why", why)
	if r != nil {
		go r.close() // may be called from one of r's own goroutines
	}
}

// renewLoop renews every held lock at a third of its length. A lock that
// cannot be renewed is dropped: this server stops acting as its primary.
func (s *Server) renewLoop(ctx context.Context) {
	defer s.renewing.Done()
	every.Do(ctx, max(s.lockTTL/3, 100*time.Millisecond), nil, func() {
		if !s.paused.Load() {
			s.renewAll(ctx, s.owned.heldLocks())
		}
	})
}

// renewAll extends every held lock (one keep-alive of the server's session
// lease) and records until when each is believed held.
func (s *Server) renewAll(ctx context.Context, locks []configsvc.Lock) {
	if len(locks) == 0 {
		return
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, max(s.lockTTL/3, time.Second))
	lost, err := s.conf.RenewAll(rctx, locks)
	cancel()
	gone := map[oid.Slice]bool{}
	for _, l := range lost {
		gone[l.Slice] = true
		s.lostSlice(l.Slice, l.Epoch, "lock lost")
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("slice lock renewal failed; will retry", "locks", len(locks), "err", err)
		}
		return
	}
	for _, l := range s.owned.renewed(locks, gone, start, s.lockTTL) {
		s.lockEvent(LockRenewed, l, start.Add(s.lockTTL))
	}
}

// Slices returns the slices this server is primary for.
func (s *Server) Slices() []oid.Slice {
	locks := s.owned.heldLocks()
	out := make([]oid.Slice, 0, len(locks))
	for _, l := range locks {
		out = append(out, l.Slice)
	}
	return out
}

// sliceLocks are the slice locks of the configuration service.
type sliceLocks interface {
	Acquire(ctx context.Context, s oid.Slice, holder string, p configsvc.Policy, replicas []string) (configsvc.Lock, error)
	RenewAll(ctx context.Context, locks []configsvc.Lock) (lost []configsvc.Lock, err error)
	UpdateReplicas(ctx context.Context, l configsvc.Lock, replicas []string) error
	Release(ctx context.Context, l configsvc.Lock) error
}

// ownership is the state of the slices this server is primary for. Its
// lock is never held while taking another: callers get copies or the
// *sliceRepl, whose own lock comes after.
type ownership struct {
	mu       sync.Mutex
	locks    map[oid.Slice]configsvc.Lock
	bySlice  map[configsvc.Policy]oid.Slice // where new objects of a policy go
	policies map[oid.Slice]configsvc.Policy // the policy of each slice held
	repls    map[oid.Slice]*sliceRepl
	valid    map[oid.Slice]time.Time // lock believed held until
	moving   map[oid.Slice]bool      // being handed to another server
}

func newOwnership() ownership {
	return ownership{
		locks:    map[oid.Slice]configsvc.Lock{},
		bySlice:  map[configsvc.Policy]oid.Slice{},
		policies: map[oid.Slice]configsvc.Policy{},
		repls:    map[oid.Slice]*sliceRepl{},
		valid:    map[oid.Slice]time.Time{},
		moving:   map[oid.Slice]bool{},
	}
}

// add records lock l, taken at locked, with its policy and replication
// state, and returns the replication state it replaces, if any.
func (o *ownership) add(l configsvc.Lock, p configsvc.Policy, r *sliceRepl, locked time.Time, ttl time.Duration) (old *sliceRepl) {
	o.mu.Lock()
	defer o.mu.Unlock()
	old = o.repls[l.Slice]
	o.locks[l.Slice] = l
	o.valid[l.Slice] = heldUntil(l, locked, ttl)
	o.policies[l.Slice] = p
	o.repls[l.Slice] = r
	delete(o.moving, l.Slice)
	if _, ok := o.bySlice[p]; !ok && !p.KeepTogether {
		o.bySlice[p] = l.Slice
	}
	return old
}

// remove forgets slice sl if it is still held at epoch, returning its
// replication state.
func (o *ownership) remove(sl oid.Slice, epoch int64) (*sliceRepl, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l, ok := o.locks[sl]
	if !ok || l.Epoch != epoch {
		return nil, false
	}
	delete(o.locks, sl)
	delete(o.policies, sl)
	delete(o.valid, sl)
	for p, id := range o.bySlice {
		if id == sl {
			delete(o.bySlice, p)
		}
	}
	r := o.repls[sl]
	delete(o.repls, sl)
	return r, true
}

// dropAll forgets every slice, returning their locks and replication state.
func (o *ownership) dropAll() ([]configsvc.Lock, map[oid.Slice]*sliceRepl) {
	o.mu.Lock()
	defer o.mu.Unlock()
	locks := make([]configsvc.Lock, 0, len(o.locks))
	for _, l := range o.locks {
		locks = append(locks, l)
	}
	repls := o.repls
	o.locks = map[oid.Slice]configsvc.Lock{}
	o.repls = map[oid.Slice]*sliceRepl{}
	return locks, repls
}

// renewed extends the validity of the locks renewed at start, except
// those gone or since replaced.
func (o *ownership) renewed(locks []configsvc.Lock, gone map[oid.Slice]bool, start time.Time, ttl time.Duration) (kept []configsvc.Lock) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, l := range locks {
		if cur, ok := o.locks[l.Slice]; ok && cur.Epoch == l.Epoch && !gone[l.Slice] {
			o.valid[l.Slice] = start.Add(ttl)
			kept = append(kept, l)
		}
	}
	return kept
}

func (o *ownership) heldLocks() []configsvc.Lock {
	o.mu.Lock()
	defer o.mu.Unlock()
	locks := make([]configsvc.Lock, 0, len(o.locks))
	for _, l := range o.locks {
		locks = append(locks, l)
	}
	return locks
}

func (o *ownership) lock(sl oid.Slice) (configsvc.Lock, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	l, ok := o.locks[sl]
	return l, ok
}

func (o *ownership) repl(sl oid.Slice) *sliceRepl {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.repls[sl]
}

func (o *ownership) policy(sl oid.Slice) (configsvc.Policy, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p, ok := o.policies[sl]
	return p, ok
}

// validity is until when sl may be served (zero: not held, or moving).
func (o *ownership) validity(sl oid.Slice) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.locks[sl]; !ok || o.moving[sl] {
		return time.Time{}
	}
	return o.valid[sl]
}

func (o *ownership) setMoving(sl oid.Slice, moving bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if moving {
		o.moving[sl] = true
	} else {
		delete(o.moving, sl)
	}
}

// sliceOf returns a held slice of policy p that is not moving away.
func (o *ownership) sliceOf(p configsvc.Policy) (oid.Slice, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	id, ok := o.bySlice[p]
	if !ok { // a slice of that policy taken over from another server
		for sl, q := range o.policies {
			if q == p && !o.moving[sl] {
				id, ok = sl, true
				o.bySlice[p] = sl
				break
			}
		}
	}
	return id, ok
}
