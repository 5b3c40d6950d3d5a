package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/every"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Maintenance (paper §5.3): every MaintainPeriod, and whenever the slice
// table changes, each server looks at the slices it replicates. As
// primary it replaces dead backups (from the same site if possible),
// repairs replica lists that do not meet their policy, and hands a slice
// back to its policy's home site when a server there is up. As backup it
// takes over a slice whose primary's lock has expired, after collecting
// newer versions from the other backups.

// watchTable keeps s.table current and wakes the maintenance loop.
func (s *Server) watchTable(ctx context.Context) {
	defer s.renewing.Done()
	for t := range s.conf.Watch(ctx) {
		if old := s.table.Load(); old == nil || t.Revision >= old.Revision {
			s.table.Store(t)
		}
		select {
		case s.tableC <- struct{}{}:
		default:
		}
	}
}

func (s *Server) maintainLoop(ctx context.Context) {
	defer s.renewing.Done()
	defer s.tendWG.Wait()
	every.Do(ctx, s.cfg.MaintainPeriod, s.tableC, func() {
		if s.paused.Load() {
			return
		}
		s.publishSpace(ctx)
		s.maintain(ctx)
		// Push eventual changes in the background: a push waits on a
		// peer, and one round at a time is enough.
		if s.reconciling.CompareAndSwap(false, true) {
			s.tendWG.Add(1)
			go func() {
				defer s.tendWG.Done()
				defer s.reconciling.Store(false)
				s.reconcile(ctx)
			}()
		}
	})
}

// maintain does one round of maintenance. Slices are tended
// concurrently (a few at a time), so that one slice waiting on an
// unresponsive peer does not hold up the others; a slice still being
// tended from an earlier round is skipped.
func (s *Server) maintain(ctx context.Context) {
	t := s.table.Load()
	if t == nil {
		return
	}
	ids := make([]oid.Slice, 0, len(t.Slices))
	for id := range t.Slices {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if ctx.Err() != nil {
			return
		}
		sl := t.Slices[id]
		l, held := s.owned.lock(id)
		r := s.owned.repl(id)
		busy := s.maint.busy(id, sl.Holder != "")
		var work func(context.Context) error
		switch {
		case busy:
		case held && sl.Epoch > l.Epoch:
			s.lostSlice(id, l.Epoch, "the slice table shows a newer lock")
		case held && r != nil:
			work = func(ctx context.Context) error { return s.tend(ctx, sl, l, r) }
		case sl.Holder == "" && s.successor(sl):
			work = func(ctx context.Context) error {
				if err := s.takeOver(ctx, sl); !errors.Is(err, configsvc.ErrLocked) {
					return err
				}
				return nil
			}
		}
		if work == nil {
			continue
		}
		select {
		case s.maintSem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		s.maint.setTending(id, true)
		s.tendWG.Add(1)
		go func() {
			defer s.tendWG.Done()
			mctx, cancel := context.WithTimeout(ctx, max(10*s.cfg.MaintainPeriod, 10*time.Second))
			err := work(mctx)
			cancel()
			s.maint.setTending(id, false)
			<-s.maintSem
			if err != nil && ctx.Err() == nil {
				s.log.Warn("slice maintenance failed", "slice", id, "err", err)
			}
		}()
	}
}

// successor reports whether this server should take over an unlocked
// slice now. Registered replicas take turns in replica-list order: the
// k-th may try once the slice has been seen unlocked for k maintenance
// periods.
// The first is the intended primary (a restarted primary, or the target
// of a hand-over); a primary that let its lock expire while still
// registered (a paused process) is passed over after one grace period.
func (s *Server) successor(sl configsvc.Slice) bool {
	since, handed, wasHanded := s.maint.unlocked(sl.ID)
	if wasHanded && time.Since(handed) < 10*s.cfg.MaintainPeriod {
		return false // just handed it home: let the others take it
	}
	rank := 0
	for _, id := range sl.Replicas {
		if !s.registered(id) {
			continue
		}
		if id == s.cfg.ID {
			return time.Since(since) >= time.Duration(rank)*s.cfg.MaintainPeriod
		}
		rank++
	}
	return false
}

// takeOver becomes primary of sl: it takes the lock (a new fencing
// epoch), collects the newest copy of the slice from the registered
// replicas, and starts serving and replicating.
func (s *Server) takeOver(ctx context.Context, sl configsvc.Slice) error {
	replicas := []string{s.cfg.ID}
	for _, id := range sl.Replicas {
		if id != s.cfg.ID {
			replicas = append(replicas, id)
		}
	}
	start := time.Now()
	l, err := s.conf.Acquire(ctx, sl.ID, s.cfg.ID, sl.Policy, replicas)
	if err != nil {
		return fmt.Errorf("take over slice %d: %w", sl.ID, err)
	}
	s.lockEvent(LockTaken, l, heldUntil(l, start, s.lockTTL))
	// Our own eventual changes, read before collecting overwrites them.
	own, err := s.pendingPush(sl.ID)
	if err != nil {
		return err
	}
	seq, answered, err := s.collect(ctx, sl.ID, replicas[1:])
	if err != nil {
		// Give the lock back so that another replica can try.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PeerTimeout)
		_ = s.release(rctx, l)
		cancel()
		return fmt.Errorf("take over slice %d: %w", sl.ID, err)
	}
	if err := s.store.Update(ctx, func(tx *store.Tx) error {
		// IDs start in a fresh block: the old primary may have handed
		// out IDs after the ones its backups saw (eventual creates do
		// not wait for backups), and its changes are merged later.
		if err := tx.SetCounterFloor(sl.ID, tailFloor(tx.Counter(sl.ID))); err != nil {
			return err
		}
		return writePos(tx, sl.ID, pos{l.Epoch, seq})
	}); err != nil {
		return err
	}
	// Backups that did not answer are most likely down with the old
	// primary: drop those beyond the policy's RepLevel now, and let
	// maintenance replace the others when servers to replace them with
	// are up. They stay listed until then (keepFloor): after a restart
	// of every node a list shrunk to this server alone would let writes
	// be acknowledged with no copy anywhere else.
	if len(answered) < len(replicas)-1 {
		kept := keepFloor(append([]string{s.cfg.ID}, answered...), replicas, sl.Policy.RepLevel)
		if !sameSet(kept, replicas) {
			if err := s.conf.UpdateReplicas(ctx, l, kept); err == nil {
				replicas = kept
			}
		}
	}
	s.serve(l, sl.Policy, replicas, seq, start)
	s.log.Info("took over slice", "slice", sl.ID, "epoch", l.Epoch, "seq", seq, "replicas", replicas)
	if len(own.stamps) > 0 {
		err := s.mergePush(ctx, own.req)
		if err == nil {
			err = s.clearPushed(ctx, own)
		}
		if err != nil {
			s.log.Warn("merge own eventual changes after takeover; maintenance retries", "slice", sl.ID, "err", err)
		}
	}
	s.kick()
	return nil
}

// kick wakes the maintenance loop.
func (s *Server) kick() {
	select {
	case s.tableC <- struct{}{}:
	default:
	}
}

// collect brings this server's copy of slice sl up to the newest among
// the reachable backups (SyncLevel < RepLevel can leave one ahead) and
// returns the resulting stream position's seq and the backups that
// answered.
func (s *Server) collect(ctx context.Context, sl oid.Slice, backups []string) (uint64, []string, error) {
	mine, err := s.digest(sl)
	if err != nil {
		return 0, nil, err
	}
	// Ask every registered backup at once, each bounded by ProbeTimeout.
	digests := make([]*wire.DigestResponse, len(backups))
	var wg sync.WaitGroup
	for i, id := range backups {
		if !s.registered(id) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.peer(ctx, id)
			if err == nil {
				dctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
				digests[i], err = p.Digest(dctx, &wire.DigestRequest{Slice: uint32(sl)})
				cancel()
			}
			if err != nil {
				s.log.Warn("backup unreachable while taking over", "slice", sl, "backup", id, "err", err)
				s.suspect(id)
			}
		}()
	}
	wg.Wait()
	var answered []string
	best, bestID := pos{mine.Epoch, mine.Seq}, ""
	for i, d := range digests {
		if d == nil {
			continue
		}
		answered = append(answered, backups[i])
		if at := (pos{d.Epoch, d.Seq}); best.less(at) {
			best, bestID = at, backups[i]
		}
	}
	if bestID == "" {
		return mine.Seq, answered, nil
	}
	p, err := s.peer(ctx, bestID)
	if err != nil {
		return 0, nil, err
	}
	for {
		dctx, cancel := context.WithTimeout(ctx, s.cfg.InstallTimeout)
		req, err := p.Diff(dctx, &wire.DiffRequest{Slice: uint32(sl), Digest: mine})
		cancel()
		if err != nil {
			return 0, nil, fmt.Errorf("collect newer versions from %s: %w", bestID, err)
		}
		if _, _, err := s.install(ctx, req, false); err != nil {
			return 0, nil, err
		}
		if !req.More {
			s.log.Info("collected newer versions", "slice", sl, "from", bestID, "objects", len(req.Objects), "seq", req.Seq)
			return req.Seq, answered, nil
		}
		if mine, err = s.digest(sl); err != nil {
			return 0, nil, err
		}
	}
}

// tend keeps a slice this server is primary for healthy.
func (s *Server) tend(ctx context.Context, sl configsvc.Slice, l configsvc.Lock, r *sliceRepl) error {
	// The table may not show the list this server wrote last yet: choosing
	// again from the older one would start another new backup.
	sl.Replicas = r.currentList(sl.Replicas)
	s.pingIdle(ctx, r)
	health := r.followerHealth()
	keep := []string{s.cfg.ID}
	var deadSites []string
	t := s.table.Load()
	for _, id := range sl.Replicas[min(1, len(sl.Replicas)):] {
		failing, ok := health[id]
		dead := !s.registered(id) || s.suspected(id) || ok && !failing.IsZero() && time.Since(failing) > s.cfg.DeadAfter
		if !dead {
			keep = append(keep, id)
		} else if si, known := t.Servers[id]; known && !s.suspected(id) {
			// In place of the old one (paper §5.3) — unless it stopped
			// answering, which may be its whole site cut off.
			deadSites = append(deadSites, si.Site)
		}
	}
	// A server at the policy's home site, when the primary is elsewhere.
	var home string
	if site := sl.Policy.Site; site != "" && site != s.cfg.Site {
		for _, id := range s.siteServers(site, fmt.Sprint(sl.ID)) {
			home = id
			if slices.Contains(keep, id) {
				break
			}
		}
		if home != "" && !slices.Contains(keep, home) {
			keep = slices.Insert(keep, 1, home)
		}
	}
	want := keepFloor(s.chooseReplicas(sl.Policy, keep, deadSites...), sl.Replicas, sl.Policy.RepLevel)
	// New backups must answer first; if one does not, choose again
	// without it (it is suspected now).
	for range 3 {
		var fresh []string
		for _, id := range want {
			if !slices.Contains(sl.Replicas, id) {
				fresh = append(fresh, id)
			}
		}
		if len(fresh) == 0 || len(s.answering(ctx, fresh, time.Second)) == len(fresh) {
			break
		}
		want = keepFloor(s.chooseReplicas(sl.Policy, keep, deadSites...), sl.Replicas, sl.Policy.RepLevel)
	}
	if home != "" && !slices.Contains(want, home) {
		want = append(want, home) // temporarily one more, to hand over
	}
	if !sameSet(want, sl.Replicas) {
		if err := s.conf.UpdateReplicas(ctx, l, want); err != nil {
			if errors.Is(err, configsvc.ErrLockLost) {
				s.lostSlice(sl.ID, l.Epoch, "lock lost")
			}
			return err
		}
		s.log.Info("replica list changed", "slice", sl.ID, "from", sl.Replicas, "to", want)
		r.wroteList(sl.Replicas, want)
	}
	r.setFollowers(want)
	s.checkReplicas(ctx, sl.ID, want, r)
	if home != "" && r.streaming(home) {
		return s.handOver(ctx, l, r, home, want)
	}
	return nil
}

// pingIdle pings, in parallel, the backups of r not heard from for a
// maintenance period: an idle slice learns of a dead backup as fast as a
// busy one (paper §5.3: replicas ping each other).
func (s *Server) pingIdle(ctx context.Context, r *sliceRepl) {
	// In the background: a ping that waits out ProbeTimeout must not hold
	// up this slice's next round (a kick after a stalled backup). The
	// answer counts from the next round on.
	for _, id := range r.idle(s.cfg.MaintainPeriod) {
		if s.suspected(id) || !r.startPing(id) {
			continue
		}
		s.tendWG.Add(1)
		go func() {
			defer s.tendWG.Done()
			defer r.endPing(id)
			// Not the round's context: the round ends before the answer.
			err := s.ping(s.bg, id, s.cfg.ProbeTimeout)
			if s.bg.Err() == nil {
				r.contact(id, err)
			}
		}()
	}
}

// ping asks server id whether it is there, within d.
func (s *Server) ping(ctx context.Context, id string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	p, err := s.peer(ctx, id)
	if err == nil {
		_, err = p.Ping(ctx, &wire.PingRequest{})
	}
	return err
}

// answering returns the servers of ids that answer a ping within d, in
// order; the others are suspected (a new backup chosen at a site that
// has just been cut off would stall writes again).
func (s *Server) answering(ctx context.Context, ids []string, d time.Duration) []string {
	ok := make([]bool, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok[i] = s.ping(ctx, id, d) == nil; !ok[i] {
				s.suspect(id)
			}
		}()
	}
	wg.Wait()
	var out []string
	for i, id := range ids {
		if ok[i] {
			out = append(out, id)
		}
	}
	return out
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) || len(a) > 0 && a[0] != b[0] {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// handOver gives slice l to target, a caught-up backup at the policy's
// home site: stop accepting requests, let the backup catch up with the
// last ones, make it first in the replica list and release the lock; its
// maintenance then takes the slice over.
func (s *Server) handOver(ctx context.Context, l configsvc.Lock, r *sliceRepl, target string, replicas []string) error {
	s.owned.setMoving(l.Slice, true)
	undo := func() { s.owned.setMoving(l.Slice, false) }
	wctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	// The next primary knows nothing of our leases: end them first.
	if err := s.leases.revokeSlice(wctx, l.Slice); err != nil {
		undo()
		return fmt.Errorf("hand slice %d to %s: %w", l.Slice, target, err)
	}
	for !r.caughtUp(target) {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-wctx.Done():
			undo()
			return fmt.Errorf("hand slice %d to %s: backup did not catch up", l.Slice, target)
		}
	}
	order := []string{target}
	for _, id := range replicas {
		if id != target {
			order = append(order, id)
		}
	}
	if err := s.conf.UpdateReplicas(ctx, l, order); err != nil {
		undo()
		return err
	}
	s.maint.markHanded(l.Slice)
	s.lostSlice(l.Slice, l.Epoch, "handed to "+target+" at the policy's home site")
	if err := s.release(ctx, l); err != nil {
		return err
	}
	s.log.Info("handed slice home", "slice", l.Slice, "to", target)
	return nil
}

// maintState is what maintenance remembers between rounds.
type maintState struct {
	mu sync.Mutex
	// freeSince is when maintenance first saw an unlocked slice.
	freeSince map[oid.Slice]time.Time
	// suspects are servers that recently failed to answer (placement
	// avoids them even while their membership lease lasts).
	suspects map[string]time.Time
	// handed records when this server handed a slice to its home site.
	handed map[oid.Slice]time.Time
	// tending marks slices whose maintenance is running.
	tending map[oid.Slice]bool
}

func newMaintState() maintState {
	return maintState{
		freeSince: map[oid.Slice]time.Time{},
		suspects:  map[string]time.Time{},
		handed:    map[oid.Slice]time.Time{},
		tending:   map[oid.Slice]bool{},
	}
}

// busy reports whether sl's maintenance is running; locked (the table
// shows a holder) restarts its free time.
func (m *maintState) busy(sl oid.Slice, locked bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if locked {
		delete(m.freeSince, sl)
	}
	return m.tending[sl]
}

func (m *maintState) setTending(sl oid.Slice, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if on {
		m.tending[sl] = true
	} else {
		delete(m.tending, sl)
	}
}

// unlocked returns since when sl has been seen unlocked, and when this
// server handed it home, if it did.
func (m *maintState) unlocked(sl oid.Slice) (since, handed time.Time, wasHanded bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	since, ok := m.freeSince[sl]
	if !ok {
		since = time.Now()
		m.freeSince[sl] = since
	}
	handed, wasHanded = m.handed[sl]
	return since, handed, wasHanded
}

func (m *maintState) markHanded(sl oid.Slice) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handed[sl] = time.Now()
}
