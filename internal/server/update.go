package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/grpc"
)

// update runs fn in a store transaction, as primary of every slice it
// changes, and returns once the change is durable here and at sync
// replicas in all (sync 0 means the slice policy's RepLevel; fewer only
// when the deployment has fewer servers, see deploymentSize). It never
// answers with fewer copies than that because backups are missing from
// the slice's replica list: it waits for them to be recruited, or for
// ctx to end.
//
// Leases come first (paper §5.4): when the change touches objects that
// clients hold leases on, it is undone, the leases are revoked (callbacks,
// or waiting for expiry), and it runs again; the objects it touches get no
// new lease until it is committed.
//
// With .EventualConsistency (ctx from admit): a slice this server only
// backs up is changed in backup mode (not replicated; divergence records
// written in the same transaction), and with sync 0 the primary answers
// once its own copy is durable — the stream catches backups up later, so
// a primary cut off from its backups keeps accepting writes, which a
// failover before they reach a backup loses.
func (s *Server) update(ctx context.Context, sync uint32, fn func(tx *store.Tx) error) error {
	return s.updateUndo(ctx, sync, fn, nil)
}

// updateUndo is update for a fn with effects outside the store: undo
// reverts them when an attempt is undone to revoke leases.
//
// Leases on the objects a change touches are revoked in parallel with
// its replication, not before it: the change commits here at once, and
// the objects it leased are fenced (leases.settle) until every holder
// acknowledged or its lease expired, so no answer showing them leaves
// this server meanwhile. The change is acknowledged once both are done
// (and once the fences earlier changes of these objects set are down).
// Two cases revoke first and run again, uncommitted: fn's early refusals
// (mustRevoke), and a holder whose back channel is already broken (its
// lease must run out: readers keep the old state meanwhile instead of
// waiting behind a fence for up to a lease length).
//
// An update with .EventualConsistency waits for holders only during half
// of what is left of its time, then goes on without those that did not
// answer (leases.revoke abandons their leases and the fence is lifted);
// it waits for other updates' fences no longer either.
func (s *Server) updateUndo(ctx context.Context, sync uint32, fn func(tx *store.Tx) error, undo func()) error {
	var claimed []oid.ID
	handed := false // a revocation goroutine took the claims over
	defer func() {
		if !handed {
			s.leases.unclaim(claimed)
		}
	}()
	eventual, own := isEventual(ctx), adopterOf(ctx)
	for {
		f := &fence{done: make(chan struct{})}
		var others []chan struct{}
		committed := false
		err := s.updateOnce(ctx, sync, fn, func(muts []*wire.Mutation) error {
			ids := mutatedObjects(muts)
			claimed = append(claimed, ids...)
			leased, o, lost := s.leases.claim(ids, f, eventual, own)
			if lost {
				return &leasedError{ids: leased}
			}
			others = append(others, o...)
			return nil
		}, func() {
			committed = true
			if len(f.ids) > 0 {
				handed = true
				go s.revokeFenced(ctx, f, claimed, eventual, own)
			}
		})
		if !committed && len(f.ids) > 0 {
			s.leases.lift(f) // nothing became visible
		}
		var le *leasedError
		if !errors.As(err, &le) {
			if err != nil {
				return err
			}
			if d := deferralOf(ctx); d != nil {
				// The client waits for the revocations with the
				// replication (Sync), before its close() returns.
				switch {
				case len(others) > 0:
					d.settle(s, claimed) // earlier updates' fences too
				case len(f.ids) > 0:
					d.settle(s, f.ids)
				}
				return nil
			}
			// Its own fence first: for an eventual update, it is down
			// once the holders that did not answer were abandoned.
			if len(f.ids) > 0 {
				select {
				case <-f.done:
				case <-ctx.Done():
					return fmt.Errorf("revoking leases: %w", fserr.ErrTimeout)
				}
			}
			if len(others) == 0 {
				return nil
			}
			wctx := ctx
			if eventual {
				var cancel context.CancelFunc
				wctx, cancel = context.WithTimeout(ctx, halfLeft(ctx))
				defer cancel()
			}
			for _, ch := range others {
				select {
				case <-ch:
				case <-wctx.Done():
					if eventual && ctx.Err() == nil {
						return nil // goes on without them
					}
					return fmt.Errorf("revoking leases: %w", fserr.ErrTimeout)
				}
			}
			return nil
		}
		if undo != nil {
			undo()
		}
		// No grants on them until we are done.
		claimed = append(claimed, le.ids...)
		s.leases.claim(le.ids, nil, eventual, own)
		if err := s.leases.revoke(ctx, le.ids, eventual, own); err != nil {
			return err
		}
	}
}

// revokeFenced revokes the leases fence f covers, then lifts it and ends
// the update's claims. It outlives the request that committed the change
// (whose deadline may pass first): a holder's lease is over by the lease
// length at the latest. An eventual update's revocation keeps the
// request's deadline instead, so that holders that do not answer are
// abandoned (leases.revoke) while the request still waits for it.
func (s *Server) revokeFenced(req context.Context, f *fence, claimed []oid.ID, eventual bool, own *adopter) {
	ctx, cancel := context.WithTimeout(s.bg, s.leases.ttl+time.Second)
	defer cancel()
	if dl, ok := req.Deadline(); ok && eventual {
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	var push func(oid.ID) *wire.LeaseUpdate
	if !eventual {
		push = s.pushedMeta
	}
	if err := s.leases.revokePushing(ctx, f.ids, eventual, push, own); err != nil {
		s.log.Warn("revoking leases after a commit", "ids", f.ids, "err", err)
	}
	s.leases.lift(f)
	s.leases.unclaim(claimed)
}

// pushedMeta is what a revocation after a commit carries of id: the
// meta-data of a directory this server is primary for (a create or
// remove in it changed its times and size, rarely what a path walk
// checks). Files are revoked outright: their data changed too.
func (s *Server) pushedMeta(id oid.ID) *wire.LeaseUpdate {
	m, err := s.primaryMeta(id)
	if err != nil || m.Type != wire.Type_TYPE_DIR {
		return nil
	}
	return &wire.LeaseUpdate{Id: uint64(id), Meta: m}
}

// leasedError undoes an update attempt whose objects must have their
// leases revoked first (mustRevoke; a holder that cannot be called back).
type leasedError struct {
	ids []oid.ID
}

func (e *leasedError) Error() string { return fmt.Sprintf("objects %v are leased", e.ids) }

// mustRevoke lets fn stop an attempt before it does something outside the
// store that a holder of id's lease could race with (marking an object
// dying, which makes an open the holder is registering fail): the update
// revokes the lease and runs fn again. The adopter of ctx does not count:
// it waited for its own registrations before it asked.
func (s *Server) mustRevoke(ctx context.Context, id oid.ID) error {
	if s.leases.leased(id, adopterOf(ctx)) {
		return &leasedError{ids: []oid.ID{id}}
	}
	return nil
}

// mutatedObjects lists the objects whose state mutations change.
func mutatedObjects(muts []*wire.Mutation) []oid.ID {
	ids := make([]oid.ID, 0, 2)
	for _, m := range muts {
		if m.Kind == wire.MutationKind_MUT_COUNTER_FLOOR || hiddenXattrChange(m) {
			continue
		}
		if id := oid.ID(m.Id); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// hiddenXattrChange reports whether m sets or removes one of the
// server's own attributes (tombstones, exactly-once outcomes, open-file
// holders): no client sees them, so no lease needs revoking for them.
// The periodic sweeps that purge them changed nothing else, and revoking
// the directories they touch made a mount drop every name the kernel
// held every 5 s while it was busy in a directory (docs/BENCHMARKS.md).
func hiddenXattrChange(m *wire.Mutation) bool {
	return (m.Kind == wire.MutationKind_MUT_SET_XATTR || m.Kind == wire.MutationKind_MUT_REMOVE_XATTR) && hidden(m.Name)
}

// updateOnce is one attempt of update; check sees the change's mutations
// before they are numbered and may undo it; committed runs once the
// change is committed here, before waiting for the backups.
func (s *Server) updateOnce(ctx context.Context, sync uint32, fn func(tx *store.Tx) error, check func([]*wire.Mutation) error, committed func()) error {
	type waiter struct {
		r     *sliceRepl
		seq   uint64
		watch *unstableBatch
	}
	var waits []waiter
	var read []oid.ID // what an answer without a change is built from
	// A deployment of one server tracks nothing (stable.go): no reads to
	// keep, no batches to watch.
	watching := s.deploymentSize() > 1 && !isEventual(ctx)
	track := watching || s.deploymentSize() > 1 && sync > 0
	writer := anyReader // who may see the change before its backups have it
	if track && deferralOf(ctx) != nil {
		// A deferred change is answered before it is durable, so its
		// client core shows it to its processes already; its reads of it
		// need not wait. Any other change is hidden from every reader,
		// the writer's own client included (another process there).
		writer, _ = s.clientNode(ctx)
	}
	err := s.store.Update(ctx, func(tx *store.Tx) error {
		waits, read = waits[:0], read[:0]
		err := fn(tx)
		if watching {
			read = append(read, tx.Read()...)
		}
		if err != nil {
			return err
		}
		// Removed entries leave tombstones; entries put back lose theirs.
		removed := tx.RemovedEntries()
		muts := tx.Mutations()
		if err := tombstones(tx, removed, muts, s.nextSeq); err != nil {
			return err
		}
		muts = append(muts, tx.Mutations()...)
		if len(muts) == 0 {
			return nil
		}
		if err := check(muts); err != nil {
			return err
		}
		// Group by slice, keeping order (an update touches one or two).
		type group struct {
			sl   oid.Slice
			muts []*wire.Mutation
		}
		var groups []group
	next:
		for _, m := range muts {
			sl := store.MutationSlice(m)
			for i := range groups {
				if groups[i].sl == sl {
					groups[i].muts = append(groups[i].muts, m)
					continue next
				}
			}
			groups = append(groups, group{sl, []*wire.Mutation{m}})
		}
		for _, g := range groups {
			r := s.owned.repl(g.sl)
			if r != nil && isEventual(ctx) && s.primary(oid.Make(g.sl, 0)) != nil {
				r = nil // the lock may have passed on: backup mode
			}
			if r == nil {
				// A copy this server keeps as a backup changes only in
				// backup mode.
				if !isEventual(ctx) || !s.backs(g.sl) {
					return fmt.Errorf("update of slice %d: %w", g.sl, fserr.ErrNotPrimary)
				}
				if err := s.diverge(tx, g.sl, g.muts, 0); err != nil {
					return err
				}
				continue
			}
			if writesTombstone(g.muts) {
				r.markTombs()
			}
			var watch *unstableBatch
			if track {
				watch = &unstableBatch{sync: sync, need: -1, ids: mutatedObjects(g.muts), node: writer}
			}
			seq, err := r.assign(tx, g.muts, watch)
			if err != nil {
				return err
			}
			if isEventual(ctx) && sync == 0 {
				// Not waiting for backups: should this server lose the
				// slice before they have it, the next primary is pushed it.
				if err := s.diverge(tx, g.sl, g.muts, seq); err != nil {
					return err
				}
			}
			waits = append(waits, waiter{r, seq, watch})
		}
		return nil
	})
	if err != nil || len(waits) == 0 {
		// A refusal, or an answer that changed nothing, shows what it
		// read: as a read does, it waits for that to be stable.
		var le *leasedError
		if !errors.As(err, &le) {
			if werr := s.stable(ctx, read); werr != nil {
				return werr
			}
		}
		return err
	}
	deferred := deferralOf(ctx)
	for _, w := range waits {
		if deferred != nil {
			w.r.commitQuiet(w.seq)
		} else {
			w.r.commit(w.seq)
		}
	}
	committed()
	if h := s.cfg.AfterCommit; h != nil {
		if method, ok := grpc.Method(ctx); ok {
			if err := h(method); err != nil {
				return err
			}
		}
	}
	if isEventual(ctx) && sync == 0 {
		return nil
	}
	// A deployment of fewer servers than the policy asks for gives what
	// it has; a replica list shorter than that (backups not recruited
	// yet) is waited on, never taken as enough. Every batch learns its
	// need before any wait can fail (an unknown need keeps it, and those
	// after it, remembered as unstable).
	needs := make([]int, len(waits))
	for i, w := range waits {
		needs[i] = s.need(ctx, w.r, sync)
		w.r.settleNeed(w.watch, needs[i])
	}
	if deferred != nil {
		for i, w := range waits {
			if needs[i] > 1 { // else durable already: its own disk
				deferred.add(w.r, w.seq)
			}
		}
		return nil
	}
	for i, w := range waits {
		if err := s.waitBackups(ctx, w.r, w.seq, needs[i]); err != nil {
			return err
		}
	}
	// What the change was built on, in other slices, is stable too.
	return s.stable(ctx, read)
}

// lazily lets an unlink, rmdir, chmod, chown or utimes (and a create with
// defer_sync, CreateResponse.lazy) be answered before its store record is
// synced (store.Lazily: within store.Options.LazyFlushDelay,
// or with the next synced change, or at a Sync with no changes, which
// fsync(2) of a directory and close(2) after such a change send), as a
// local file system makes them durable at its next journal commit or
// fsync. Only where nothing else depends on the order of this server's
// durable records: a deployment of one server (no backups), a caller in
// this process (whose close and fsync call Sync here), no
// .EventualConsistency.
func (s *Server) lazily(ctx context.Context) context.Context {
	if !s.mayBeLazy(ctx) {
		return ctx
	}
	return store.Lazily(ctx)
}

// mayBeLazy reports whether ctx's change may be answered before it is
// durable (lazily).
func (s *Server) mayBeLazy(ctx context.Context) bool {
	if s.deploymentSize() != 1 || isEventual(ctx) {
		return false
	}
	_, err := pki.PeerName(ctx)
	return err != nil // else over the network
}
