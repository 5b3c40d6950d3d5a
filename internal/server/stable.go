package server

import (
	"context"
	"fmt"
	"slices"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// Answers show only what a failover keeps.
//
// A primary commits a change at once and replicates it in parallel
// (update): until the batch reaches the backups its writer waits for, the
// change is visible in the primary's store and exists nowhere else. A
// reader shown it then, followed by a failover before the batch left (the
// primary crashed or was cut off), has seen a change the next primary
// never had: TestLinearizableUnderFaults saw a client look up f3 and get
// f2's contents while the rename's own retry, at the next primary,
// answered ENOENT. So the primary remembers, per object, its latest change
// not yet at those backups, and an answer that shows the object waits
// until it is (Raft's read index, per object instead of per log, so that
// a busy directory does not hold up reads of its neighbours). A mutation
// that fails or changes nothing answers from what it read, so it waits in
// the same way for the objects it read (store.Tx.Read).
//
// Changes made with .EventualConsistency and no SyncLevel promise no
// backup and are not tracked; .EventualConsistency reads do not wait.

// unstableBatch is one committed batch that has not yet reached the
// backups its writer waits for.
type unstableBatch struct {
	seq  uint64
	sync uint32 // the writer's SyncLevel (0: the policy's)
	// need is the copies the writer waits for (placement.go need), or
	// -1 until the writer has worked it out after its commit.
	need int
	ids  []oid.ID
	// node is the client node (clientNode) whose reads need not wait for
	// this batch: the writer's, for a deferred change (answered before it
	// is durable, so its client core shows it already), else anyReader.
	node string
}

// anyReader is an unstableBatch's node when no reader may see it early.
const anyReader = "\x00nobody"

// maxUnstable bounds the batches a primary remembers. Only a slice whose
// backups stopped answering for that many changes (each of which failed
// with a timeout) reaches it; the oldest are then forgotten, and reads of
// their objects no longer wait for them.
const maxUnstable = 1 << 16

// watchLocked registers b (numbered seq) as visible here and not yet at
// the backups (r.mu held; called in the store's commit loop before the
// batch becomes visible).
func (r *sliceRepl) watchLocked(b *unstableBatch) {
	if r.byObject == nil {
		r.byObject = map[oid.ID][]*unstableBatch{}
	}
	r.unstable = append(r.unstable, b)
	r.anyUnstable.Store(true)
	for _, id := range b.ids {
		r.byObject[id] = append(r.byObject[id], b)
	}
	if len(r.unstable) > maxUnstable {
		r.s.log.Warn("replication: backups behind by too many changes; reads stop waiting for the oldest",
			"slice", r.slice, "seq", r.unstable[0].seq)
		r.forgetLocked(r.unstable[0])
		r.unstable[0] = nil
		r.unstable = r.unstable[1:]
	}
}

// unwatchLocked takes back the last registered batch if it is seq (its
// commit failed: unassign).
func (r *sliceRepl) unwatchLocked(seq uint64) {
	n := len(r.unstable)
	if n == 0 || r.unstable[n-1].seq != seq {
		return
	}
	b := r.unstable[n-1]
	r.unstable[n-1] = nil
	r.unstable = r.unstable[:n-1]
	r.anyUnstable.Store(len(r.unstable) > 0)
	r.forgetLocked(b)
}

// forgetLocked drops b from its objects' lists.
func (r *sliceRepl) forgetLocked(b *unstableBatch) {
	for _, id := range b.ids {
		l := slices.DeleteFunc(r.byObject[id], func(x *unstableBatch) bool { return x == b })
		if len(l) == 0 {
			delete(r.byObject, id)
		} else {
			r.byObject[id] = l
		}
	}
}

// settleNeed records how many copies b's writer waits for.
func (r *sliceRepl) settleNeed(b *unstableBatch, need int) {
	if b == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b.need = need
	r.pruneLocked()
}

// pruneLocked forgets the oldest batches while they are at enough
// backups. Acknowledgements are cumulative, so the oldest goes first.
func (r *sliceRepl) pruneLocked() {
	defer func() { r.anyUnstable.Store(len(r.unstable) > 0) }()
	for len(r.unstable) > 0 {
		b := r.unstable[0]
		// A deployment that shrank since cannot give the copies asked
		// for; its writers now ask for what it has (need), and so does
		// this.
		if b.need < 0 || r.ackedLocked(b.seq) < min(b.need, r.s.deploymentSize())-1 {
			return
		}
		r.forgetLocked(b)
		r.unstable[0] = nil
		r.unstable = r.unstable[1:]
	}
}

// ackedLocked counts the backups that have seq.
func (r *sliceRepl) ackedLocked(seq uint64) int {
	n := 0
	for _, f := range r.followers {
		if f.synced && f.acked >= seq {
			n++
		}
	}
	return n
}

// unstableOf returns the latest batch changing id that another client
// node than reader made and that may not be at its backups yet (a copy:
// the batch may be pruned meanwhile). Acknowledgements are cumulative, so
// it covers the earlier batches of id too.
func (r *sliceRepl) unstableOf(id oid.ID, reader string) (unstableBatch, bool) {
	if !r.anyUnstable.Load() {
		return unstableBatch{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.byObject[id]
	for i := len(l) - 1; i >= 0; i-- {
		if b := l[i]; b.node != reader {
			return unstableBatch{seq: b.seq, sync: b.sync, need: b.need}, true
		}
	}
	return unstableBatch{}, false
}

// stable returns once the last changes of ids that this server made as
// primary are at the backups their writers wait for (see above), or
// fails when ctx ends first or the slice is no longer this server's.
func (s *Server) stable(ctx context.Context, ids []oid.ID) error {
	if isEventual(ctx) {
		return nil
	}
	var reader string
	known := false
	var r *sliceRepl
	var rOf oid.Slice
	looked := false
	for _, id := range ids {
		if id == 0 {
			continue
		}
		if !looked || id.Slice() != rOf { // a listing's objects share a slice or a few
			r, rOf, looked = s.owned.repl(id.Slice()), id.Slice(), true
		}
		if r == nil || !r.anyUnstable.Load() {
			continue
		}
		if !known {
			reader, _ = s.clientNode(ctx)
			known = true
		}
		b, ok := r.unstableOf(id, reader)
		if !ok {
			continue
		}
		need := s.need(ctx, r, b.sync) // what the deployment gives now
		if b.need >= 0 {
			need = min(need, b.need)
		}
		if need <= 1 {
			continue
		}
		r.kick() // a deferred change may be held back (commitQuiet)
		if err := r.wait(ctx, b.seq, need-1); err != nil {
			return fmt.Errorf("%v changed here and is not at its backups yet: %w", id, err)
		}
	}
	return nil
}

// settle returns once an answer that shows ids may leave: their last
// changes are where a failover finds them (stable) and no update has them
// fenced while it revokes leases (leases.settle).
func (s *Server) settle(ctx context.Context, ids ...oid.ID) error {
	if err := s.stable(ctx, ids); err != nil {
		return err
	}
	return s.leases.settle(ctx, ids...)
}

// settled returns err, an answer built from what this server has of ids
// (a refusal too: ENOENT, EEXIST, ENODATA show state as much as a value
// does), once settle allows it to leave; or the error of waiting.
func (s *Server) settled(ctx context.Context, err error, ids ...oid.ID) error {
	if werr := s.settle(ctx, ids...); werr != nil {
		return werr
	}
	return err
}
