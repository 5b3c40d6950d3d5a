package server

import (
	"context"
	"slices"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// reconcile pushes this server's divergence records of every slice to
// the slice's primary (or merges them itself if it is the primary now),
// and clears those that were merged.
func (s *Server) reconcile(ctx context.Context) {
	t := s.table.Load()
	if t == nil {
		return
	}
	for _, sl := range s.divergedSlices() {
		if ctx.Err() != nil {
			return
		}
		e, ok := t.Slices[sl]
		if !ok || e.Holder == "" || e.Holder == s.cfg.ID {
			// No primary yet (the one that takes over merges its own or
			// is pushed to), or ours: the stream carries our changes, and
			// clearAcked drops the records.
			continue
		}
		p, err := s.pendingPush(sl)
		if err != nil {
			s.log.Warn("read divergence records", "slice", sl, "err", err)
			continue
		}
		if err = s.sendPush(ctx, e.Holder, p.req); err != nil {
			s.log.Debug("reconciliation postponed", "slice", sl, "primary", e.Holder, "err", err)
			continue
		}
		if err := s.clearPushed(ctx, p); err != nil {
			s.log.Warn("clear divergence records", "slice", sl, "err", err)
			continue
		}
		s.log.Info("reconciled eventual changes", "slice", sl, "primary", e.Holder,
			"objects", len(p.req.Objects), "entries", len(p.req.Entries))
	}
}

// checkReplicas runs for a slice this server is primary for. Every 30
// maintenance periods it compares the digest of every caught-up backup
// with its own and resends a snapshot to one that differs (a change no
// stream batch or divergence record describes, e.g. a backup restored
// from an old disk); every 5 it collects the tombstones every replica
// has; every opSweepPeriods it sweeps expired outcome records.
func (s *Server) checkReplicas(ctx context.Context, sl oid.Slice, replicas []string, r *sliceRepl) {
	if low, ok := r.everyoneHas(replicas); ok {
		if err := s.clearAcked(ctx, sl, low); err != nil {
			s.log.Warn("clear acknowledged divergence records", "slice", sl, "err", err)
		}
	}
	if r.due(&r.checked, 30*s.cfg.MaintainPeriod) {
		s.compareDigests(ctx, sl, r)
	}
	if r.due(&r.swept, opSweepPeriods*s.cfg.MaintainPeriod) && r.takeOutcomes() {
		n, left, err := s.sweepOutcomes(ctx, sl)
		if err != nil || left > 0 {
			r.markOutcomes() // again next time
		}
		if err != nil {
			s.log.Warn("sweep outcome records", "slice", sl, "err", err)
		} else if n > 0 {
			s.log.Debug("outcome records swept", "slice", sl, "count", n, "left", left)
		}
	}
	if r.orphansDue(s.cfg.MaintainPeriod) {
		if err := s.sweepOrphans(ctx, sl, r); err != nil {
			s.log.Warn("sweep orphans", "slice", sl, "err", err)
		}
	}
	if !r.due(&r.collected, 5*s.cfg.MaintainPeriod) {
		return
	}
	if upTo, ok := r.everyoneHas(replicas); ok && r.hasTombs() {
		n, err := s.collectTombstones(ctx, sl, upTo)
		if err != nil {
			s.log.Warn("collect tombstones", "slice", sl, "err", err)
		} else if n > 0 {
			s.log.Info("tombstones collected", "slice", sl, "count", n, "up_to_seq", upTo)
		}
	}
}

// compareDigests resends a snapshot to every caught-up backup whose copy
// differs from this primary's at the same stream position.
func (s *Server) compareDigests(ctx context.Context, sl oid.Slice, r *sliceRepl) {
	mine, err := s.digest(sl)
	if err != nil {
		return
	}
	for _, id := range r.caughtUpAt(mine.Seq) {
		pc, err := s.peer(ctx, id)
		if err != nil {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
		d, err := pc.Digest(dctx, &wire.DigestRequest{Slice: uint32(sl)})
		cancel()
		if err != nil || d.Epoch != mine.Epoch || d.Seq != mine.Seq {
			continue // moved on meanwhile: next time
		}
		if !sameDigest(mine, d) {
			s.log.Warn("backup differs from the primary at the same position; resending a snapshot", "slice", sl, "backup", id)
			r.resync(id)
		}
	}
}

func sameDigest(a, b *wire.DigestResponse) bool {
	return slices.Equal(a.Ids, b.Ids) && slices.Equal(a.Versions, b.Versions) && slices.Equal(a.Sums, b.Sums)
}
