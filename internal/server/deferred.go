package server

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Deferred durability (CreateRequest.defer_sync): a create+write+close
// would otherwise wait for two replication rounds one after the other,
// the create's before open() returns and the commit's before close()
// does. A create made with defer_sync is answered once it is committed
// here and the leases it changed are revoked; its replication goes on
// and the client waits for it before close() or fsync() returns, beside
// the commit's own round (or, with nothing written, with Sync). So
// close() still returns only once both are at SyncLevel replicas, in one
// round instead of two; open() promises nothing durable (as on a local
// file system, a crash before close may lose the create).

// deferral collects the replication an update did not wait for.
type deferral struct {
	mu      sync.Mutex
	pending []*wire.Unsynced
}

type deferralKey struct{}

// withDeferral makes update answer without waiting for backups and record
// what it did not wait for in d.
func withDeferral(ctx context.Context, d *deferral) context.Context {
	return context.WithValue(ctx, deferralKey{}, d)
}

func deferralOf(ctx context.Context) *deferral {
	d, _ := ctx.Value(deferralKey{}).(*deferral)
	return d
}

func (d *deferral) add(r *sliceRepl, seq uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pending = append(d.pending, &wire.Unsynced{Slice: uint32(r.slice), Epoch: uint64(r.epoch), Seq: seq})
}

// settle adds ids to the changes of their slices, for Sync to wait until
// no revocation of their leases is under way.
func (d *deferral) settle(s *Server, ids []oid.ID) {
	d.mu.Lock()
	defer d.mu.Unlock()
next:
	for _, id := range ids {
		for _, u := range d.pending {
			if oid.Slice(u.Slice) == id.Slice() {
				if !slices.Contains(u.Settle, uint64(id)) {
					u.Settle = append(u.Settle, uint64(id))
				}
				continue next
			}
		}
		// Nothing to replicate in its slice (SyncLevel 1): only the
		// revocations to wait for (seq 0).
		if r := s.owned.repl(id.Slice()); r != nil {
			d.pending = append(d.pending, &wire.Unsynced{Slice: uint32(r.slice), Epoch: uint64(r.epoch), Settle: []uint64{uint64(id)}})
		}
	}
}

// addCommitted records slice sl's last committed change, when this server
// is its primary: a retried create found done by its first attempt, whose
// replication nobody may have waited for.
func (s *Server) addCommitted(d *deferral, sl oid.Slice) {
	if r := s.owned.repl(sl); r != nil {
		d.add(r, r.lastCommitted())
	}
}

// Sync waits until the changes listed are at the sync level's replicas.
// A change made under another epoch of the slice (its primary changed
// since) cannot be told apart from one the takeover lost: the answer is
// EIO, and close() reports it.
func (s *Server) Sync(ctx context.Context, req *wire.SyncRequest) (*wire.SyncResponse, error) {
	if len(req.Changes) == 0 {
		// A barrier: what this server answered so far is durable here
		// (lazily).
		if err := s.store.Flush(); err != nil {
			return nil, fmt.Errorf("sync: %w", err)
		}
		return &wire.SyncResponse{}, nil
	}
	sl := oid.Slice(req.Changes[0].Slice)
	ctx, aerr := s.admit(ctx, req.Caller, oid.Make(sl, 0))
	if aerr != nil {
		return nil, aerr
	}
	r := s.owned.repl(sl)
	if r == nil {
		return nil, fmt.Errorf("sync of slice %d: %w", sl, fserr.ErrNotPrimary)
	}
	var seq uint64
	for _, c := range req.Changes {
		if oid.Slice(c.Slice) != sl {
			return nil, fmt.Errorf("sync of slices %d and %d in one request: %w", sl, c.Slice, fserr.ErrInvalid)
		}
		if int64(c.Epoch) != r.epoch {
			return nil, fmt.Errorf("slice %d changed primary (epoch %d, now %d) before a change was known to be at its backups: %w",
				sl, c.Epoch, r.epoch, fserr.ErrIO)
		}
		seq = max(seq, c.Seq)
	}
	// seq 0: the client's commit in this slice waits for the replication.
	if seq > 0 {
		r.kick() // held back for a commit that did not come (commitQuiet)
		// Acknowledgements are cumulative: the last change covers the others.
		if err := s.waitBackups(ctx, r, seq, s.need(ctx, r, req.SyncLevel)); err != nil {
			return nil, fmt.Errorf("sync of slice %d: %w", sl, err)
		}
	}
	var ids []oid.ID
	for _, c := range req.Changes {
		for _, id := range c.Settle {
			ids = append(ids, oid.ID(id))
		}
	}
	if err := s.leases.settle(ctx, ids...); err != nil {
		return nil, fmt.Errorf("sync of slice %d: %w", sl, err)
	}
	return &wire.SyncResponse{}, nil
}
