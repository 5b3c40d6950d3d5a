package server

import (
	"context"
	"fmt"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
)

// lockValidity is until when this server may serve slice sl as primary
// (zero when it may not): no lease it grants lasts longer, so a primary
// that takes over never meets a lease of its predecessor.
func (s *Server) lockValidity(sl oid.Slice) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.locks[sl]; !ok || s.moving[sl] {
		return time.Time{}
	}
	return s.valid[sl]
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
	s.mu.Lock()
	if old := s.repls[l.Slice]; old != nil {
		defer old.close()
	}
	s.locks[l.Slice] = l
	// The lock shares the session lease, which may have been renewed
	// last before this acquisition: count from the earlier of the two.
	from := locked
	if !s.lastRenew.IsZero() && s.lastRenew.Before(from) {
		from = s.lastRenew
	}
	s.valid[l.Slice] = from.Add(s.lockTTL)
	s.policies[l.Slice] = p
	s.repls[l.Slice] = r
	delete(s.moving, l.Slice)
	if _, ok := s.bySlice[p]; !ok && !p.KeepTogether {
		s.bySlice[p] = l.Slice
	}
	s.mu.Unlock()
	r.setFollowers(replicas)
}

// lostSlice stops acting as primary of slice sl (if still at epoch).
func (s *Server) lostSlice(sl oid.Slice, epoch int64, why string) {
	s.mu.Lock()
	l, ok := s.locks[sl]
	if !ok || l.Epoch != epoch {
		s.mu.Unlock()
		return
	}
	delete(s.locks, sl)
	delete(s.policies, sl)
	delete(s.valid, sl)
	for p, id := range s.bySlice {
		if id == sl {
			delete(s.bySlice, p)
		}
	}
	r := s.repls[sl]
	delete(s.repls, sl)
	s.mu.Unlock()
	s.log.Warn("no longer primary of slice", "slice", sl, "epoch", epoch, "why", why)
	if r != nil {
		go r.close() // may be called from one of r's own goroutines
	}
}

// renewLoop renews every held lock at a third of its length. A lock that
// cannot be renewed is dropped: this server stops acting as its primary.
func (s *Server) renewLoop(ctx context.Context) {
	defer s.renewing.Done()
	t := time.NewTicker(max(s.lockTTL/3, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.paused.Load() {
			continue
		}
		s.mu.Lock()
		locks := make([]configsvc.Lock, 0, len(s.locks))
		for _, l := range s.locks {
			locks = append(locks, l)
		}
		s.mu.Unlock()
		s.renewAll(ctx, locks)
	}
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
	s.mu.Lock()
	s.lastRenew = start
	for _, l := range locks {
		if cur, ok := s.locks[l.Slice]; ok && cur.Epoch == l.Epoch && !gone[l.Slice] {
			s.valid[l.Slice] = start.Add(s.lockTTL)
		}
	}
	s.mu.Unlock()
}

// Slices returns the slices this server is primary for.
func (s *Server) Slices() []oid.Slice {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]oid.Slice, 0, len(s.locks))
	for id := range s.locks {
		out = append(out, id)
	}
	return out
}
