package server

import (
	"context"
	"fmt"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// digest summarizes this server's copy of a slice.
func (s *Server) digest(sl oid.Slice) (*wire.DigestResponse, error) {
	resp := &wire.DigestResponse{}
	err := s.store.View(func(tx *store.Tx) error {
		at := readPos(tx, sl)
		resp.Epoch, resp.Seq = at.epoch, at.seq
		return tx.SliceMetas(sl, func(m *wire.Meta) bool {
			resp.Ids = append(resp.Ids, m.Id)
			resp.Versions = append(resp.Versions, m.Version)
			resp.Sums = append(resp.Sums, store.MetaSum(m))
			return true
		})
	})
	return resp, err
}

// diff computes the Install requests that make a replica with digest dig
// equal to this server's copy of slice s, read in one consistent view.
// The position they carry is this server's, with the given epoch.
// Objects named in extra are sent whatever the digest says.
func (s *Server) diff(slice oid.Slice, dig *wire.DigestResponse, epoch int64, extra ...oid.ID) ([]*wire.InstallRequest, error) {
	forced := make(map[uint64]bool, len(extra))
	for _, id := range extra {
		forced[uint64(id)] = true
	}
	theirs := make(map[uint64][2]uint64, len(dig.GetIds()))
	for i, id := range dig.GetIds() {
		if i < len(dig.Versions) && i < len(dig.Sums) {
			theirs[id] = [2]uint64{dig.Versions[i], dig.Sums[i]}
		}
	}
	var out []*wire.InstallRequest
	cur := &wire.InstallRequest{Slice: uint32(slice), Epoch: epoch, Source: s.cfg.ID}
	err := s.store.View(func(tx *store.Tx) error {
		p := readPos(tx, slice)
		var ids []oid.ID
		err := tx.SliceMetas(slice, func(m *wire.Meta) bool {
			t, ok := theirs[m.Id]
			delete(theirs, m.Id)
			if !ok || t[0] != m.Version || t[1] != store.MetaSum(m) || forced[m.Id] {
				ids = append(ids, oid.ID(m.Id))
			}
			return true
		})
		if err != nil {
			return err
		}
		for _, id := range ids {
			st, err := tx.ObjectState(id)
			if err != nil {
				return err
			}
			if len(cur.Objects) >= installChunk {
				cur.More = true
				out = append(out, cur)
				cur = &wire.InstallRequest{Slice: uint32(slice), Epoch: epoch, Source: s.cfg.ID}
			}
			cur.Objects = append(cur.Objects, st)
		}
		for id := range theirs {
			cur.Deleted = append(cur.Deleted, id)
		}
		cur.Seq = p.seq
		cur.Counter = tx.Counter(slice)
		for _, r := range out {
			r.Seq, r.Counter = p.seq, cur.Counter
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return append(out, cur), nil
}

// snapshot brings a backup to the primary's state: it asks for the
// backup's digest and installs what differs.
func (r *sliceRepl) snapshot(ctx context.Context, f *follower) error {
	p, err := r.s.peer(ctx, f.id)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, r.s.cfg.PeerTimeout)
	dig, err := p.Digest(dctx, &wire.DigestRequest{Slice: uint32(r.slice)})
	cancel()
	if err != nil {
		return fserr.FromStatus(err)
	}
	if dig.Epoch > r.epoch {
		return errStale
	}
	r.mu.Lock()
	inLog := len(r.log) > 0 && r.log[0].Seq <= dig.Seq+1 || dig.Seq == r.committed
	if !f.force && dig.Epoch == r.epoch && dig.Seq <= r.committed && inLog {
		f.synced, f.acked = true, dig.Seq // a continuation of our own stream
		r.pruneLocked()
		r.signalLocked()
		r.mu.Unlock()
		return nil
	}
	extra := f.extra
	r.mu.Unlock()
	reqs, err := r.s.diff(r.slice, dig, r.epoch, extra...)
	if err != nil {
		return err
	}
	r.mu.Lock()
	f.pin = reqs[len(reqs)-1].Seq
	r.mu.Unlock()
	for _, req := range reqs {
		ictx, cancel := context.WithTimeout(ctx, r.s.cfg.InstallTimeout)
		resp, err := p.Install(ictx, req)
		cancel()
		if err != nil {
			return fserr.FromStatus(err) // follow acts on ENOSPC
		}
		if resp.Status == wire.ReplStatus_REPL_STALE_EPOCH {
			return errStale
		}
		if resp.Status == wire.ReplStatus_REPL_BUSY {
			r.setBusy(f)
			return errBusy
		}
	}
	last := reqs[len(reqs)-1]
	r.mu.Lock()
	f.extra = f.extra[len(extra):] // those added meanwhile go next time
	r.mu.Unlock()
	r.s.log.Info("backup brought up to date", "slice", r.slice, "backup", f.id, "seq", last.Seq)
	return r.outcome(f, wire.ReplStatus_REPL_OK, last.Seq)
}

// install applies a snapshot chunk, fetching the blocks it references
// that this server lacks from req.Source. It reports stale if this
// server has already seen a newer epoch, and busy (applying nothing) if
// refuseDiverged is set and it holds eventual changes of the slice.
func (s *Server) install(ctx context.Context, req *wire.InstallRequest, refuseDiverged bool) (stale, busy bool, err error) {
	if err := s.fetchMissing(ctx, req.Source, req.Objects); err != nil {
		return false, false, err
	}
	sl := oid.Slice(req.Slice)
	err = s.store.Update(ctx, func(tx *store.Tx) error {
		at := readPos(tx, sl)
		if req.Epoch < at.epoch {
			stale = true
			return nil
		}
		if refuseDiverged && diverged(tx, sl) {
			busy = true
			return nil
		}
		for _, o := range req.Objects {
			if oid.ID(o.GetMeta().GetId()).Slice() != sl {
				return fmt.Errorf("object %x is not in slice %d: %w", o.GetMeta().GetId(), sl, fserr.ErrInvalid)
			}
			if err := tx.InstallObject(o); err != nil {
				return err
			}
		}
		for _, id := range req.Deleted {
			if oid.ID(id).Slice() != sl {
				continue
			}
			if err := tx.PurgeObject(oid.ID(id)); err != nil {
				return err
			}
		}
		if err := tx.SetCounterFloor(sl, req.Counter); err != nil {
			return err
		}
		if req.More {
			return nil
		}
		return writePos(tx, sl, pos{req.Epoch, req.Seq})
	})
	return stale, busy, err
}
