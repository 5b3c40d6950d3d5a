package server

import (
	"context"
	"fmt"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// The backup side of replication: fencing by epoch and applying the
// primary's stream (repl.go is the primary side).

// knownEpoch is the newest epoch of slice s this server has seen in the
// slice table; no primary with an older one may change its copy.
func (s *Server) knownEpoch(sl oid.Slice) int64 {
	t := s.table.Load()
	if t == nil {
		return 0
	}
	return t.Slices[sl].Epoch
}

// fence handles a peer's epoch for slice sl: a newer one means this
// server's own lock (if any) is gone.
func (s *Server) fence(sl oid.Slice, epoch int64) bool {
	l, held := s.owned.lock(sl)
	if held && l.Epoch > epoch {
		return false
	}
	if held && l.Epoch < epoch {
		s.lostSlice(sl, l.Epoch, "another server replicates it with a newer epoch")
	}
	return epoch >= s.knownEpoch(sl)
}

// applyReplicate is a backup applying a primary's stream request (Peer.Replicate).
func (s *Server) applyReplicate(ctx context.Context, req *wire.ReplicateRequest) (*wire.ReplicateResponse, error) {
	sl := oid.Slice(req.Slice)
	if !s.fence(sl, req.Epoch) {
		return &wire.ReplicateResponse{Status: wire.ReplStatus_REPL_STALE_EPOCH}, nil
	}
	if len(req.Blocks) > 0 {
		for _, b := range req.Blocks {
			if len(b) > blockSize {
				return nil, fmt.Errorf("block of %d bytes: %w", len(b), fserr.ErrInvalid)
			}
		}
		if _, err := s.store.PutBlocks(req.Blocks); err != nil {
			return nil, err
		}
	}
	// Every block the request sets and this server holds stays held
	// until the request is applied: an earlier batch may free it and a
	// later one set it again (two files of the same bytes, both
	// rewritten), which the request cannot carry when the primary has
	// freed it too.
	held := map[[32]byte]bool{}
	for _, b := range req.Batches {
		for _, m := range b.Mutations {
			if m.Kind == wire.MutationKind_MUT_SET_BLOCK && len(m.Data) == 32 {
				if h := [32]byte(m.Data); !held[h] {
					held[h] = s.store.Retain(h)
				}
			}
		}
	}
	has := func(h [32]byte) bool { return held[h] }
	// A block that a later mutation of this request overwrites may be
	// gone at the primary already: such a SetBlock is skipped.
	skip := supersededBlocks(req.Batches, has)
	var missing [][]byte
	for bi, b := range req.Batches {
		for mi, m := range b.Mutations {
			if m.Kind == wire.MutationKind_MUT_SET_BLOCK && len(m.Data) == 32 &&
				!skip[[2]int{bi, mi}] && !has([32]byte(m.Data)) {
				missing = append(missing, m.Data)
			}
		}
	}
	if len(missing) > 0 {
		return &wire.ReplicateResponse{Status: wire.ReplStatus_REPL_MISSING_BLOCKS, Missing: missing}, nil
	}
	resp := &wire.ReplicateResponse{}
	err := s.store.Update(ctx, func(tx *store.Tx) error {
		at := readPos(tx, sl)
		resp.Status, resp.Seq, resp.Epoch = wire.ReplStatus_REPL_OK, at.seq, at.epoch
		switch {
		case req.Epoch < at.epoch:
			resp.Status = wire.ReplStatus_REPL_STALE_EPOCH
			return nil
		case req.Epoch > at.epoch:
			resp.Status = wire.ReplStatus_REPL_NEED_SYNC
			return nil
		case len(req.Batches) > 0 && diverged(tx, sl):
			// Eventual changes here would be overwritten: push them first.
			resp.Status = wire.ReplStatus_REPL_BUSY
			return nil
		}
		for bi, b := range req.Batches {
			if b.Seq <= at.seq {
				continue // already have it
			}
			if b.Seq != at.seq+1 {
				resp.Status = wire.ReplStatus_REPL_NEED_SYNC
				break
			}
			for mi, m := range b.Mutations {
				if skip[[2]int{bi, mi}] {
					continue
				}
				if store.MutationSlice(m) != sl {
					return fmt.Errorf("batch %d of slice %d changes slice %d: %w", b.Seq, sl, store.MutationSlice(m), fserr.ErrInvalid)
				}
				if err := tx.Apply(m); err != nil {
					return err
				}
			}
			at.seq = b.Seq
		}
		resp.Seq = at.seq
		return writePos(tx, sl, at)
	})
	if err != nil {
		return nil, fmt.Errorf("replicate slice %d: %w", sl, err)
	}
	return resp, nil
}

// supersededBlocks returns the positions of SetBlock mutations whose block
// is absent (has reports false) and whose (file, index) a later mutation
// of the same batches sets again, clears, truncates or deletes.
func supersededBlocks(batches []*wire.Batch, has func([32]byte) bool) map[[2]int]bool {
	type pos2 struct{ b, m int }
	var absent []pos2
	for bi, b := range batches {
		for mi, m := range b.Mutations {
			if m.Kind == wire.MutationKind_MUT_SET_BLOCK && len(m.Data) == 32 && !has([32]byte(m.Data)) {
				absent = append(absent, pos2{bi, mi})
			}
		}
	}
	out := map[[2]int]bool{}
	for _, p := range absent {
		m := batches[p.b].Mutations[p.m]
		later := func(bi, mi int) bool { return bi > p.b || bi == p.b && mi > p.m }
	search:
		for bi := p.b; bi < len(batches); bi++ {
			for mi, n := range batches[bi].Mutations {
				if !later(bi, mi) || n.Id != m.Id {
					continue
				}
				switch n.Kind {
				case wire.MutationKind_MUT_SET_BLOCK, wire.MutationKind_MUT_CLEAR_BLOCK:
					if n.Index != m.Index {
						continue
					}
				case wire.MutationKind_MUT_TRUNCATE_BLOCKS:
					if n.Index > m.Index {
						continue
					}
				case wire.MutationKind_MUT_DELETE_OBJECT:
				default:
					continue
				}
				out[[2]int{p.b, p.m}] = true
				break search
			}
		}
	}
	return out
}
