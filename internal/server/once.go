package server

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Exactly-once mutations (the idea of NFSv4.1 sessions and of Raft's
// client sessions). A client stamps every mutation with its op session
// and a sequence number that the operation's retries share (Caller.op).
// The primary records the answer in the same transaction as the change,
// as a hidden attribute of the object the request names first (the
// directory of a create, remove, link or rename; the object of a
// setattr or an xattr change): replicated, snapshotted and installed with
// that object, so a retry after a broken connection, a timeout or a
// failover finds the original answer wherever the change itself is, and
// runs again wherever the change is not.
//
// A record lives until the client says it has the answer (done_below:
// the session's lower records on the object go when it records another
// there, in the same transaction) or until its retries can no longer
// come: the call's deadline and opMargin for clock skew (opRetention
// without a deadline), after which maintenance sweeps it (sweepOutcomes).
// The update path finds the session's lower records in memory
// (outcomeIndex) and deletes them by key: a scan of the object's
// attributes would walk every record deleted since the store's last
// checkpoint. Records the index does not know (written before a restart
// or a failover) are left to the sweep.
//
// Only changes are recorded: a request that failed, or changed nothing
// (an open(O_CREAT) of an existing file), runs again on a retry, which
// is equivalent (nothing happened in between on its behalf).
const opPrefix = "\x00op/"

const (
	opMargin    = time.Minute
	opRetention = 5 * time.Minute
	// opSweepPeriods is how many maintenance periods apart a primary
	// sweeps a slice that had records written.
	opSweepPeriods = 60
)

// opKey names a record; fixed-width hex keeps a session's records in seq
// order.
func opKey(session, seq uint64) string {
	return hexKey2(opPrefix, session, seq)
}

// eachOutcome calls fn for id's records whose names start with prefix
// (opPrefix or a session's), in name order, until fn returns false.
func eachOutcome(tx *store.Tx, id oid.ID, prefix string, fn func(name string, v []byte) bool) {
	tx.EachXattr(id, prefix, func(name string, v []byte) bool {
		return strings.HasPrefix(name, prefix) && fn(name, v)
	})
}

// onceOp is one mutation's exactly-once state at this server.
type onceOp struct {
	s       *Server
	anchor  oid.ID
	ref     *wire.OpRef
	node    string
	expires int64 // unix ms
	resp    proto.Message
	// answered is set when the answer came from a record: the change
	// was made by an earlier attempt.
	answered bool
}

// once prepares exactly-once execution of the mutation c asks for, whose
// answer fn fills into resp, recorded on anchor. It returns nil (run as
// usual) when the request carries no op.
func (s *Server) once(ctx context.Context, c *wire.Caller, anchor oid.ID, resp proto.Message) *onceOp {
	ref := c.GetOp()
	if ref.GetSeq() == 0 {
		return nil
	}
	node, _ := s.clientNode(ctx)
	exp := time.Now().Add(opRetention)
	if d, ok := ctx.Deadline(); ok {
		exp = d.Add(opMargin)
	}
	return &onceOp{s: s, anchor: anchor, ref: ref, node: node, expires: exp.UnixMilli(), resp: resp}
}

// lookup reads tx for this op's recorded answer and, if there is one,
// decodes it into resp. Requests whose steps before their transaction act
// on other servers (placement elsewhere, a remove or rename across
// servers) call it in the view they read first, so that a retry does not
// repeat those steps; the check inside the transaction (wrap) is what
// counts for the change itself.
func (o *onceOp) lookup(tx *store.Tx) bool {
	if o == nil {
		return false
	}
	v, err := tx.Xattr(o.anchor, opKey(o.ref.Session, o.ref.Seq))
	if err != nil {
		return false
	}
	var out wire.OpOutcome
	if proto.Unmarshal(v, &out) != nil || out.Node != o.node {
		return false // not this node's: never shown to another
	}
	proto.Reset(o.resp)
	if proto.Unmarshal(out.Response, o.resp) != nil {
		return false
	}
	o.answered = true
	return true
}

// replayed reports whether the answer came from an earlier attempt's
// record.
func (o *onceOp) replayed() bool { return o != nil && o.answered }

// setAnswer makes m the answer to record (for a request whose answer
// comes from a step before its transaction).
func (o *onceOp) setAnswer(m proto.Message) {
	if o != nil {
		proto.Reset(o.resp)
		proto.Merge(o.resp, m)
	}
}

// wrap returns fn made exactly-once: the transaction answers from the
// record when there is one, and otherwise runs fn and, if fn changed
// anything, records resp with the change.
func (o *onceOp) wrap(fn func(tx *store.Tx) error) func(tx *store.Tx) error {
	if o == nil {
		return fn
	}
	return func(tx *store.Tx) error {
		o.answered = false
		if o.lookup(tx) {
			return nil
		}
		if err := fn(tx); err != nil {
			return err
		}
		if !tx.Changed() {
			return nil
		}
		if !tx.HasObject(o.anchor) {
			return nil // the anchor went with the change: nothing to keep the record on
		}
		return o.record(tx)
	}
}

// outcomeIndex remembers, per session and anchor, the records this
// server wrote and has not removed yet: soft state, bounded by the
// operations in flight per session and anchor and by the sweep, which
// forgets the expired ones.
type outcomeIndex struct {
	mu sync.Mutex
	m  map[outcomeAt][]outcomeSeq
}

type outcomeAt struct {
	session uint64
	anchor  oid.ID
}

type outcomeSeq struct {
	seq     uint64
	expires int64 // unix ms
}

// swap adds seq to (session, anchor) (once: a transaction function may
// run again) and takes out the seqs below doneBelow, which it returns.
func (x *outcomeIndex) swap(at outcomeAt, add outcomeSeq, doneBelow uint64) (answered []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.m == nil {
		x.m = map[outcomeAt][]outcomeSeq{}
	}
	keep, have := x.m[at][:0], false
	for _, e := range x.m[at] {
		switch {
		case e.seq < doneBelow:
			answered = append(answered, e.seq)
		default:
			have = have || e.seq == add.seq
			keep = append(keep, e)
		}
	}
	if !have {
		keep = append(keep, add)
	}
	x.m[at] = keep
	return answered
}

// forgetExpired drops entries whose records have expired (the sweep
// removes the records themselves).
func (x *outcomeIndex) forgetExpired(nowMs int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for at, es := range x.m {
		es = slices.DeleteFunc(es, func(e outcomeSeq) bool { return e.expires < nowMs })
		if len(es) == 0 {
			delete(x.m, at)
		} else {
			x.m[at] = es
		}
	}
}

// record writes the outcome and removes the session's answered records
// on the anchor (below done_below) that this server wrote.
func (o *onceOp) record(tx *store.Tx) error {
	resp, err := proto.Marshal(o.resp)
	if err != nil {
		return err
	}
	v, err := proto.Marshal(&wire.OpOutcome{Node: o.node, ExpiresMs: o.expires, Response: resp})
	if err != nil {
		return err
	}
	// A transaction that does not commit leaves the index ahead of the
	// store: a key removed twice is absent (ignored), one forgotten here
	// but kept by the store waits for the sweep.
	at := outcomeAt{o.ref.Session, o.anchor}
	for _, seq := range o.s.outcomes.swap(at, outcomeSeq{o.ref.Seq, o.expires}, o.ref.DoneBelow) {
		if err := tx.RemoveXattr(o.anchor, opKey(o.ref.Session, seq)); err != nil && !errors.Is(err, fserr.ErrNoAttr) {
			return err
		}
	}
	if r := o.s.owned.repl(o.anchor.Slice()); r != nil {
		r.markOutcomes()
	}
	return tx.SetXattr(o.anchor, opKey(o.ref.Session, o.ref.Seq), v)
}

// outcomeExpired reports whether an outcome record (v) can no longer be
// asked for; an undecodable one is.
func outcomeExpired(v []byte, nowMs int64) bool {
	var out wire.OpOutcome
	return proto.Unmarshal(v, &out) != nil || out.ExpiresMs < nowMs
}

// settle makes a replayed answer as durable as the first attempt promised:
// the first attempt may still be replicating, or revoking leases, when
// its retry arrives. Acknowledgements are cumulative, so waiting for the
// slice's last committed change covers it.
func (o *onceOp) settle(ctx context.Context, sync uint32) error {
	if !o.replayed() {
		return nil
	}
	s := o.s
	if r := s.owned.repl(o.anchor.Slice()); r != nil && !(isEventual(ctx) && sync == 0) {
		r.kick()
		if err := s.waitBackups(ctx, r, r.lastCommitted(), s.need(ctx, r, sync)); err != nil {
			return err
		}
	}
	return s.leases.settle(ctx, o.anchor)
}

// sweepOutcomes removes the expired outcome records of slice sl and
// returns how many it removed and how many it left (not expired yet).
func (s *Server) sweepOutcomes(ctx context.Context, sl oid.Slice) (removed, left int, err error) {
	type rec struct {
		id   oid.ID
		name string
	}
	var old []rec
	now := time.Now().UnixMilli()
	s.outcomes.forgetExpired(now)
	err = s.store.View(func(tx *store.Tx) error {
		return tx.SliceMetas(sl, func(m *wire.Meta) bool {
			id := oid.ID(m.Id)
			eachOutcome(tx, id, opPrefix, func(name string, v []byte) bool {
				if outcomeExpired(v, now) {
					old = append(old, rec{id, name})
				} else {
					left++
				}
				return true
			})
			return true
		})
	})
	if err != nil || len(old) == 0 {
		return 0, left, err
	}
	err = s.update(withEventual(ctx), 0, func(tx *store.Tx) error {
		for _, r := range old {
			if err := tx.RemoveXattr(r.id, r.name); err != nil && !errors.Is(err, fserr.ErrNoAttr) {
				return err
			}
		}
		return nil
	})
	return len(old), left, err
}

// Outcomes returns the number of outcome records on this server's copy
// of id (tests check that they are bounded and collected).
func (s *Server) Outcomes(id oid.ID) (int, error) {
	n := 0
	err := s.store.View(func(tx *store.Tx) error {
		eachOutcome(tx, id, opPrefix, func(string, []byte) bool {
			n++
			return true
		})
		return nil
	})
	return n, err
}
