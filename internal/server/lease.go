package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// attachWait bounds how long a request naming a session waits for that
// session's back channel to attach before it is answered without a lease.
const attachWait = 50 * time.Millisecond

// DefaultLeaseTTL is how long a client may use cached meta-data without
// asking the primary. The paper (§8) used one minute; here it is a third
// of the clients' default call bound (client.DefaultTimeout, 30 s),
// because a write whose primary must wait out the lease of a holder it
// cannot call back (a site cut off) waits inside the writer's call: the
// wait then fits with room for the replication round after it. Shorter
// leases cost more renewals across the wide area; longer ones make
// writers wait longer for a holder that is away (docs/ARCHITECTURE.md,
// "Leases"). deploy checks a configured lease against the bound.
const DefaultLeaseTTL = 10 * time.Second

// leases is a primary's table of meta-data leases (paper §5.4): which
// client sessions may use cached meta-data of which objects, until when.
// Before an update changes an object, every lease on it is revoked through
// the holder's Callbacks stream, or waited out when the holder does not
// answer. While an update is being decided or revoked, no new lease on its
// objects is granted, so a lease never covers data an update is replacing.
type leases struct {
	ttl   time.Duration
	valid func(oid.Slice) time.Time // the slice lock's validity: leases never outlive it

	mu       sync.Mutex
	holders  map[oid.ID]map[uint64]holder
	busy     map[oid.ID]int // updates deciding or revoking: no grants
	sessions map[uint64]*callbackStream
	attached chan struct{} // closed (and replaced) whenever a stream attaches
	// fences are committed updates still revoking leases on an object:
	// until they are done, no answer that shows the object leaves this
	// server (settle), since a holder may still use what it replaced.
	fences map[oid.ID][]*fence
}

// fence is one update's revocation of the leases on objects it changed,
// run in parallel with its replication (the change is committed here,
// but no reader sees it until the holders dropped the old state).
type fence struct {
	ids  []oid.ID
	done chan struct{} // closed once every lease on ids is revoked or expired
}

type holder struct {
	until  time.Time
	stream *callbackStream
	// abandoned: an eventual update went on without this holder's
	// acknowledgement (see revoke). Eventual updates no longer wait for
	// it; others still do, until the lease ends.
	abandoned bool
}

// callbackStream is one attached Callbacks stream of a client session.
type callbackStream struct {
	session uint64
	out     chan *wire.Revoke
	dead    chan struct{} // closed when the stream ends
	once    sync.Once

	mu   sync.Mutex
	seq  uint64
	acks map[uint64]*pendingAck

	released atomic.Bool // the client said bye: its leases are void
}

func newLeases(ttl time.Duration, valid func(oid.Slice) time.Time) *leases {
	return &leases{ttl: ttl, valid: valid, holders: map[oid.ID]map[uint64]holder{},
		busy: map[oid.ID]int{}, sessions: map[uint64]*callbackStream{}, fences: map[oid.ID][]*fence{},
		attached: make(chan struct{})}
}

// grant records a lease on ids for the caller's session and returns its
// length in milliseconds, or 0 when none can be granted (no session, no
// callback stream, an update in progress). Call it before reading the
// state the lease covers: an update that follows will revoke it.
func (l *leases) grant(c *wire.Caller, ids ...oid.ID) uint32 {
	if c == nil || c.Session == 0 || c.Eventual || l.ttl <= 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.sessions[c.Session]
	if st == nil {
		// A client sends its session once its back channel's first
		// message is out, on the same connection as this request: the
		// stream attaches at once, or it is not coming.
		deadline := time.Now().Add(attachWait)
		for st == nil {
			left := time.Until(deadline)
			if left <= 0 {
				return 0
			}
			ch := l.attached
			l.mu.Unlock()
			t := time.NewTimer(left)
			select {
			case <-ch:
			case <-t.C:
			}
			t.Stop()
			l.mu.Lock()
			st = l.sessions[c.Session]
		}
	}
	now := time.Now()
	until := now.Add(l.ttl)
	for _, id := range ids {
		if l.busy[id] > 0 {
			return 0
		}
		if v := l.valid(id.Slice()); v.Before(until) {
			until = v
		}
	}
	d := until.Sub(now)
	if d < 10*time.Millisecond {
		return 0
	}
	for _, id := range ids {
		hs := l.holders[id]
		if hs == nil {
			hs = map[uint64]holder{}
			l.holders[id] = hs
		}
		hs[c.Session] = holder{until: until, stream: st}
	}
	return uint32(d / time.Millisecond)
}

// claim marks ids busy for an update and reports those that still have
// live leases to revoke (for an eventual update, leases other eventual
// updates abandoned do not count). With f, the leased ones are fenced by
// f at once (the update goes on and revokes after it commits), and the
// fences of other updates on ids are returned: the update is not
// acknowledged before they are done. A holder whose back channel is
// already broken will not answer: its lease must run out, and readers
// should not wait that long behind a fence, so then nothing is fenced and
// lost is true (the update revokes first, uncommitted, as before issue
// 11). The adopter's own leases on the objects it adopts do not count. It
// runs inside the store's commit, so it only looks at maps.
func (l *leases) claim(ids []oid.ID, f *fence, eventual bool, own *adopter) (leased []oid.ID, others []chan struct{}, lost bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.busy[id]++
		if l.liveLocked(id, now, eventual, own) {
			leased = append(leased, id)
			for sess, h := range l.holders[id] {
				if h.abandoned && eventual || own.skips(sess, id) {
					continue
				}
				select {
				case <-h.stream.dead:
					lost = true
				default:
				}
			}
		}
		for _, o := range l.fences[id] {
			if o != f {
				others = append(others, o.done)
			}
		}
	}
	if f != nil && !lost {
		for _, id := range leased {
			if !slices.Contains(f.ids, id) {
				f.ids = append(f.ids, id)
				l.fences[id] = append(l.fences[id], f)
			}
		}
	}
	return leased, others, lost
}

// lift ends fence f: its revocations are done (or its update failed).
func (l *leases) lift(f *fence) {
	l.mu.Lock()
	for _, id := range f.ids {
		fs := slices.DeleteFunc(l.fences[id], func(o *fence) bool { return o == f })
		if len(fs) == 0 {
			delete(l.fences, id)
		} else {
			l.fences[id] = fs
		}
	}
	l.mu.Unlock()
	close(f.done)
}

// settle waits until no update is still revoking leases on ids. Every
// answer that shows an object's state waits for it after reading that
// state: a reader that saw a committed change must not return while a
// lease holder may still answer from what the change replaced (that
// reader's answer would precede the holder's stale one).
func (l *leases) settle(ctx context.Context, ids ...oid.ID) error {
	for {
		var wait []chan struct{}
		l.mu.Lock()
		for _, id := range ids {
			for _, f := range l.fences[id] {
				wait = append(wait, f.done)
			}
		}
		l.mu.Unlock()
		if len(wait) == 0 {
			return nil
		}
		for _, ch := range wait {
			select {
			case <-ch:
			case <-ctx.Done():
				return fmt.Errorf("waiting for leases to be revoked: %w", fserr.ErrTimeout)
			}
		}
	}
}

// liveLocked reports whether a client holds a live lease on id that an
// update must revoke (skipping abandoned ones if skipAbandoned, and the
// adopter's own), and forgets expired leases.
func (l *leases) liveLocked(id oid.ID, now time.Time, skipAbandoned bool, own *adopter) bool {
	live := false
	for sess, h := range l.holders[id] {
		switch {
		case !h.until.After(now):
			delete(l.holders[id], sess)
		case own.skips(sess, id):
		case !h.abandoned || !skipAbandoned:
			live = true
		}
	}
	if len(l.holders[id]) == 0 {
		delete(l.holders, id)
	}
	return live
}

// leased reports whether a client other than the adopter holds a live
// lease on id that it may still act on (abandoned holders cannot be
// reached: they do not count).
func (l *leases) leased(id oid.ID, own *adopter) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.liveLocked(id, time.Now(), true, own)
}

// unclaim ends an update's claim on ids.
func (l *leases) unclaim(ids []oid.ID) {
	if len(ids) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if l.busy[id]--; l.busy[id] <= 0 {
			delete(l.busy, id)
		}
	}
}

// revoke withdraws every lease on ids: holders are called back and their
// acknowledgements awaited; a holder that cannot be reached is waited out
// until its lease expires. ctx bounds the wait: the update then fails with
// ErrTimeout, and the leases not withdrawn stay recorded, so that the next
// update waits for them too.
//
// An update with .EventualConsistency (eventual) waits for
// acknowledgements only during half of what is left of ctx, then goes on
// without the holders that did not answer, marking their leases
// abandoned (paper §4.5: an eventual write may reach other clients late).
// A holder cut off from this server thus uses what it cached until its
// lease ends; every holder that answers, the writer's own client
// included, has dropped it before the update applies, so the writer reads
// its own write. Later eventual updates skip abandoned leases; other
// updates still wait for them.
func (l *leases) revoke(ctx context.Context, ids []oid.ID, eventual bool, own *adopter) error {
	return l.revokePushing(ctx, ids, eventual, nil, own)
}

// revokePushing is revoke for a committed change: push gives, for some
// ids, the state the change left (a directory's meta-data), which goes
// with the revocation; a holder that acknowledges it keeps its lease on
// that object instead of losing it, so that its next path walk through
// the directory needs no round trip for the directory's attributes. The
// adopter's own leases on what it adopts are left alone.
func (l *leases) revokePushing(ctx context.Context, ids []oid.ID, eventual bool, push func(oid.ID) *wire.LeaseUpdate, own *adopter) error {
	type call struct {
		stream  *callbackStream
		ids     []uint64
		updates []*wire.LeaseUpdate
		until   time.Time
		kept    []uint64 // the pushed updates it adopted
		err     error
	}
	var pushed map[oid.ID]*wire.LeaseUpdate
	if push != nil {
		for _, id := range ids {
			if u := push(id); u != nil {
				if pushed == nil {
					pushed = map[oid.ID]*wire.LeaseUpdate{}
				}
				pushed[id] = u
			}
		}
	}
	now := time.Now()
	calls := map[uint64]*call{}
	l.mu.Lock()
	for _, id := range ids {
		if !l.liveLocked(id, now, eventual, own) {
			continue
		}
		for sess, h := range l.holders[id] {
			if h.abandoned && eventual || own.skips(sess, id) {
				continue
			}
			c := calls[sess]
			if c == nil {
				c = &call{stream: h.stream}
				calls[sess] = c
			}
			c.ids = append(c.ids, uint64(id))
			if u := pushed[id]; u != nil {
				c.updates = append(c.updates, u)
			}
			if h.until.After(c.until) {
				c.until = h.until
			}
		}
	}
	l.mu.Unlock()
	if len(calls) == 0 {
		return nil
	}
	wctx := ctx
	if eventual {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, halfLeft(ctx))
		defer cancel()
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(func() { c.kept, c.err = l.callBack(wctx, c.stream, c.ids, c.updates, c.until) })
	}
	wg.Wait()
	// Forget the leases withdrawn, keep the others: no lease on ids was
	// granted meanwhile (the update claimed them).
	var err error
	goOn := eventual && ctx.Err() == nil
	l.mu.Lock()
	for sess, c := range calls {
		if c.err != nil {
			err = cmp.Or(err, c.err)
		}
		for _, v := range c.ids {
			h, ok := l.holders[oid.ID(v)][sess]
			switch {
			case !ok || h.until.After(c.until):
			case pushed[oid.ID(v)] != nil && slices.Contains(c.kept, v):
				// It holds what the change left: its lease goes on.
			case c.err == nil:
				delete(l.holders[oid.ID(v)], sess)
			case goOn:
				h.abandoned = true
				l.holders[oid.ID(v)][sess] = h
			}
		}
	}
	for _, id := range ids {
		if len(l.holders[id]) == 0 {
			delete(l.holders, id)
		}
	}
	l.mu.Unlock()
	if goOn {
		return nil
	}
	return err
}

// halfLeft is half the time left before ctx's deadline (a second when it
// has none).
func halfLeft(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return time.Second
	}
	return time.Until(dl) / 2
}

// callBack revokes ids from one session and waits for its
// acknowledgement, for its stream to be replaced (a client that
// reconnects has dropped everything it cached from this server), or for
// the lease to expire.
func (l *leases) callBack(ctx context.Context, st *callbackStream, ids []uint64, updates []*wire.LeaseUpdate, until time.Time) (kept []uint64, err error) {
	ack := st.send(ctx, ids, updates)
	var done chan struct{}
	if ack != nil {
		done = ack.done
	}
	dead := st.dead
	expiry := time.NewTimer(time.Until(until))
	defer expiry.Stop()
	for {
		select {
		case <-done:
			return ack.kept, nil
		case <-expiry.C:
			return nil, nil
		case <-dead:
			if l.replaced(st) || st.released.Load() {
				return nil, nil
			}
			dead, done = nil, nil // wait for the expiry
		case <-ctx.Done():
			// The error goes to the writer, another client: it must not
			// learn the holder's session number.
			return nil, fmt.Errorf("revoking the leases of another client (lease left %v): %w",
				time.Until(until).Round(time.Millisecond), fserr.ErrTimeout)
		}
	}
}

// replaced reports whether st's session attached a newer stream.
func (l *leases) replaced(st *callbackStream) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := l.sessions[st.session]
	return cur != nil && cur != st
}

// send queues a revocation and returns the channel closed on its ack
// (nil when the stream is gone, or its queue stayed full until ctx ended:
// a holder cut off stops reading it).
func (st *callbackStream) send(ctx context.Context, ids []uint64, updates []*wire.LeaseUpdate) *pendingAck {
	st.mu.Lock()
	st.seq++
	seq := st.seq
	ack := &pendingAck{done: make(chan struct{})}
	st.acks[seq] = ack
	st.mu.Unlock()
	select {
	case st.out <- &wire.Revoke{Seq: seq, Ids: ids, Updates: updates}:
		return ack
	case <-st.dead:
	case <-ctx.Done():
	}
	st.mu.Lock()
	delete(st.acks, seq)
	st.mu.Unlock()
	return nil
}

// pendingAck is a revocation sent and not acknowledged yet; kept is set
// before done closes.
type pendingAck struct {
	done chan struct{}
	kept []uint64
}

func (st *callbackStream) acked(seq uint64, kept []uint64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if a, ok := st.acks[seq]; ok {
		a.kept = kept
		close(a.done)
		delete(st.acks, seq)
	}
}

// attach registers a session's new stream; its earlier stream, if any,
// is forgotten (the client dropped what it had cached from us).
func (l *leases) attach(session uint64) *callbackStream {
	st := &callbackStream{session: session, out: make(chan *wire.Revoke, 64),
		dead: make(chan struct{}), acks: map[uint64]*pendingAck{}}
	l.mu.Lock()
	old := l.sessions[session]
	l.sessions[session] = st
	close(l.attached)
	l.attached = make(chan struct{})
	l.mu.Unlock()
	if old != nil {
		old.close()
	}
	return st
}

// hasStream reports whether session has a Callbacks stream here.
func (l *leases) hasStream(session uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessions[session] != nil
}

// attachedSessions adds the sessions with a Callbacks stream here to out.
func (l *leases) attachedSessions(out map[uint64]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.sessions {
		out[s] = true
	}
}

func (l *leases) detach(st *callbackStream) {
	l.mu.Lock()
	if l.sessions[st.session] == st {
		delete(l.sessions, st.session)
	}
	l.mu.Unlock()
	st.close()
}

func (st *callbackStream) close() { st.once.Do(func() { close(st.dead) }) }

// release forgets the leases that came through st: its client closed and
// said so (bye), so none of them needs to be revoked or waited out.
func (l *leases) release(st *callbackStream) {
	st.released.Store(true)
	l.mu.Lock()
	for id, hs := range l.holders {
		if h, ok := hs[st.session]; ok && h.stream == st {
			delete(hs, st.session)
			if len(hs) == 0 {
				delete(l.holders, id)
			}
		}
	}
	l.mu.Unlock()
}

// revokeSlice revokes every lease on objects of slice sl (before the
// slice is handed to another server, which knows nothing of them).
func (l *leases) revokeSlice(ctx context.Context, sl oid.Slice) error {
	var ids []oid.ID
	l.mu.Lock()
	for id := range l.holders {
		if id.Slice() == sl {
			ids = append(ids, id)
		}
	}
	l.mu.Unlock()
	if err := l.revoke(ctx, ids, false, nil); err != nil {
		return err
	}
	// Revocations that committed updates still run count too.
	l.mu.Lock()
	ids = ids[:0]
	for id := range l.fences {
		if id.Slice() == sl {
			ids = append(ids, id)
		}
	}
	l.mu.Unlock()
	return l.settle(ctx, ids...)
}

// Callbacks implements wire.StorageServer: the lease back channel.
func (s *Server) Callbacks(stream grpc.BidiStreamingServer[wire.CallbackAck, wire.Revoke]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.Session == 0 {
		return status.Error(codes.InvalidArgument, "callbacks: the first message must name a session")
	}
	// Only the node that uses a session may hear (and acknowledge) its
	// revocations: another one could otherwise displace its stream.
	node, _ := pki.PeerName(stream.Context())
	if err := s.owners.claim(s.sessionNode(node), first.Session); err != nil {
		s.log.Warn("callback stream for another node's client session refused", "node", node)
		return status.Error(codes.PermissionDenied, "callbacks: the session belongs to another node")
	}
	st := s.leases.attach(first.Session)
	defer s.owners.touch(first.Session)
	defer s.leases.detach(st)
	errc := make(chan error, 1)
	go func() {
		for {
			a, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			if a.Bye {
				s.owners.end(first.Session) // its orphans' holders end (orphans.go)
				s.leases.release(st)
				errc <- nil
				return
			}
			st.acked(a.Seq, a.Kept)
		}
	}()
	for {
		select {
		case r := <-st.out:
			if err := stream.Send(r); err != nil {
				return err
			}
		case err := <-errc:
			if err == nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		case <-st.dead:
			return nil
		case <-stream.Context().Done():
			return nil
		case <-s.bg.Done():
			return status.Error(codes.Unavailable, "server stopping")
		}
	}
}
