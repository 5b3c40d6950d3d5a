package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// request is a storage request that names its caller.
type request interface {
	proto.Message
	GetCaller() *wire.Caller
}

// rpcFunc is a wire.StorageClient method as a function of its client.
type rpcFunc[Req, Resp any] func(wire.StorageClient, context.Context, Req, ...grpc.CallOption) (Resp, error)

// server returns the primary for id.
func (f *FS) server(ctx context.Context, id oid.ID) (Conn, error) {
	c, err := f.router.Primary(ctx, id.Slice())
	if err != nil {
		return Conn{}, fserr.FromStatus(err)
	}
	return c, nil
}

// call runs one RPC against id's primary and converts its error. While the
// slice has no reachable primary (failover, a refusal by a server that is
// no longer primary, a connection that cannot be made) it retries with
// backoff until ctx ends, then fails with ErrTimeout wrapping the last
// error. A request whose connection broke after it was sent may reach a
// server twice: mutations go through update, whose op makes the second
// attempt answer as the first did.
func call[Req, Resp any](ctx context.Context, f *FS, id oid.ID, rpc rpcFunc[Req, Resp], req Req) (Resp, error) {
	return callVia(ctx, f, id, rpc, req, callOpts{})
}

// callOpts adjust callVia.
type callOpts struct {
	// prep runs before each attempt on the server about to be asked (to
	// ask for a lease from that server).
	prep func(Conn)
	// refusalEnds ends the call at the first refusal by a server that is
	// not the primary (ErrNotPrimary) instead of waiting for the slice's
	// next primary: an .EventualConsistency operation asks the replicas
	// then, the refusing one included (it may keep a copy: a primary cut
	// off from the configuration service refuses once its lock lapsed).
	refusalEnds bool
}

// callVia is call with options.
func callVia[Req, Resp any](ctx context.Context, f *FS, id oid.ID, rpc rpcFunc[Req, Resp], req Req, o callOpts) (Resp, error) {
	var zero Resp
	backoff := 20 * time.Millisecond
	began := time.Now()
	var last string    // the server asked last
	var unreached bool // and it could not be reached (not: it was slow)
	defer func() {
		// Not for an eventual operation's first try at the primary: that
		// has half a short bound, and the answer is then sought elsewhere.
		if ctx.Err() == context.DeadlineExceeded && unreached && !o.refusalEnds && !isTry(ctx) {
			f.silent.mark(id.Slice(), last, time.Since(began))
		}
	}()
	for {
		switch ctx.Err() {
		case context.DeadlineExceeded:
			return zero, fmt.Errorf("before calling the primary of %v: %w", id, fserr.ErrTimeout)
		case context.Canceled:
			return zero, fmt.Errorf("before calling the primary of %v: %w", id, context.Canceled)
		}
		var resp Resp
		c, err := f.server(ctx, id)
		if err == nil && f.silent.silent(id.Slice(), c.ID) {
			// One system call is several FUSE requests, each with the
			// whole bound: a primary that just let one run out gets a
			// short probe, not the whole bound again.
			pctx, cancel := context.WithTimeout(ctx, silentProbe)
			back := alive(pctx, c)
			swallowed := pctx.Err() != nil // no answer at all, not a refusal
			cancel()
			if !back && swallowed {
				return zero, fmt.Errorf("primary %s of %v did not answer moments ago, nor a probe now: %w", c.ID, id, fserr.ErrTimeout)
			}
			// An answer, or a refused connection: a server process that
			// is gone (its host answers) is being failed over, so the call
			// waits for the next primary within its bound, as always.
			f.silent.clear(id.Slice())
		}
		if err == nil {
			last = c.ID
			if o.prep != nil {
				o.prep(c)
			}
			// A call still unanswered at half its time is joined by a
			// probe: one that stays unanswered too means the server is
			// away, not busy (waiting out a lease, say).
			var away atomic.Bool
			tried := time.Now()
			probed := make(chan struct{})
			probe := time.AfterFunc(half(ctx), func() {
				defer close(probed)
				away.Store(!alive(ctx, c))
			})
			resp, err = rpc(c, ctx, req)
			if !probe.Stop() && ctx.Err() != nil {
				// The call ran out while the probe ran: its verdict decides
				// whether the primary is marked silent, and it ends with ctx
				// too (under load, maybe after rpc returned).
				<-probed
			}
			if err == nil {
				f.silent.answered(c.ID)
				return resp, nil
			}
			unreached = (retryable(err) || away.Load()) && !f.silent.heardSince(c.ID, tried)
			switch ctx.Err() {
			case context.DeadlineExceeded:
				return resp, fmt.Errorf("%v: %w", err, fserr.ErrTimeout)
			case context.Canceled:
				return resp, fmt.Errorf("%v: %w", err, context.Canceled)
			}
			if !retryable(err) {
				return resp, fserr.FromStatus(err)
			}
			if err := fserr.FromStatus(err); o.refusalEnds && errors.Is(err, fserr.ErrNotPrimary) {
				return resp, err
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.Canceled) {
				return zero, fmt.Errorf("%v: %w", err, context.Canceled)
			}
			return zero, fmt.Errorf("no primary of %v answered in time (%v): %w", id, fserr.FromStatus(err), fserr.ErrTimeout)
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// tryKey marks a context whose deadline bounds one try of a .Hotspot
// fetch rather than a caller's operation.
type tryKey struct{}

// asTry marks ctx as one try: its running out says the server was slow
// for this fetch (a primary whose uplink is busy sending blocks answers a
// small call late behind them), not that it is away, so it does not make
// the client fail other calls at once (silent).
func asTry(ctx context.Context) context.Context { return context.WithValue(ctx, tryKey{}, true) }

func isTry(ctx context.Context) bool { return ctx.Value(tryKey{}) != nil }

// retryable reports whether an RPC error means "not here, not now": the
// server is not the primary, it could not be reached, or it holds this
// client to its request rate (EAGAIN, not a message over the size limit,
// which is ResourceExhausted too).
func retryable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Unavailable:
		return true
	case codes.ResourceExhausted:
		return errors.Is(fserr.FromStatus(err), fserr.ErrAgain)
	}
	return false
}

// callLeased is call for a read that may bring a lease: it sends this
// client's session when the answering server's back channel is up.
// refusalEnds is callOpts.refusalEnds.
func callLeased[Req request, Resp any](ctx context.Context, f *FS, id oid.ID, rpc rpcFunc[Req, Resp], req Req, refusalEnds bool) (Resp, leaseToken, error) {
	var tok leaseToken
	resp, err := callVia(ctx, f, id, rpc, req, callOpts{refusalEnds: refusalEnds, prep: func(c Conn) {
		var sess uint64
		sess, tok = f.leases.begin(ctx, c)
		req.GetCaller().Session = sess
	}})
	if err == nil {
		f.noteAdmitted(req)
	}
	return resp, tok, err
}

// readLeased runs a read that may bring a lease: on id's primary, or under
// .EventualConsistency as readEventual does (version orders the answers).
func readLeased[Req request, Resp any](ctx context.Context, f *FS, cues cue.Set, id oid.ID, rpc rpcFunc[Req, Resp], req Req, version func(Resp) uint64) (Resp, leaseToken, error) {
	if cues.EventualConsistency {
		return readEventual(ctx, f, id, rpc, req, version)
	}
	return callLeased(ctx, f, id, rpc, req, false)
}

// read runs a read RPC on id's primary, or with .EventualConsistency on
// the replica with the newest answer when the primary cannot be reached.
func read[Req request, Resp any](ctx context.Context, f *FS, cues cue.Set, id oid.ID, rpc rpcFunc[Req, Resp], req Req) (Resp, error) {
	return readNewest(ctx, f, cues.EventualConsistency, id, rpc, req, func(Resp) uint64 { return 0 })
}

// readNewest is read for a caller that knows whether it is eventual
// (an open file), with version ordering the replicas' answers.
func readNewest[Req request, Resp any](ctx context.Context, f *FS, eventual bool, id oid.ID, rpc rpcFunc[Req, Resp], req Req, version func(Resp) uint64) (Resp, error) {
	if eventual {
		resp, _, err := readEventual(ctx, f, id, rpc, req, version)
		return resp, err
	}
	return call(ctx, f, id, rpc, req)
}

// update runs a state-changing RPC on id's primary, or with
// .EventualConsistency on a backup when the primary cannot be reached.
// Its retries are one operation (Caller.op): a server that applied it
// already answers as it did then.
func update[Req request, Resp any](ctx context.Context, f *FS, cues cue.Set, id oid.ID, rpc rpcFunc[Req, Resp], req Req) (Resp, error) {
	if c := req.GetCaller(); c != nil {
		defer f.ops.stamp(c)()
	}
	if cues.EventualConsistency {
		return writeEventual(ctx, f, id, rpc, req)
	}
	return call(ctx, f, id, rpc, req)
}

// alive reports whether server c answers an empty call before ctx ends.
func alive(ctx context.Context, c Conn) bool {
	_, err := c.Probe(ctx, &wire.ProbeRequest{})
	return err == nil
}

// silence remembers, per slice, a primary that could not be reached for
// a whole call (its connection broken, or no answer to a probe within the
// call): for as long as that call waited, at most maxSilence, a call to it
// first probes it for at most silentProbe and fails if that goes
// unanswered. An answer, a refused connection (the process is gone and
// its slices are being taken over) or a new primary of the slice ends it.
//
// A server that answered any call since is busy, not away: behind a
// saturated uplink (fifteen readers pulling one file through 6 Mbit/s)
// a probe waits seconds behind the blocks queued before it, and taking
// that for silence failed every reader's next read at once.
type silence struct {
	mu sync.Mutex
	m  map[oid.Slice]silentPrimary
	// heard is when each server last answered a call (server ID →
	// *atomic.Int64, unix ns).
	heard sync.Map
}

type silentPrimary struct {
	id        string
	at, until time.Time
}

// answered notes an answer from server id.
func (s *silence) answered(id string) {
	now := time.Now().UnixNano()
	if v, ok := s.heard.Load(id); ok {
		v.(*atomic.Int64).Store(now)
		return
	}
	v := new(atomic.Int64)
	v.Store(now)
	s.heard.Store(id, v)
}

// heardSince reports whether server id answered a call after t.
func (s *silence) heardSince(id string, t time.Time) bool {
	v, ok := s.heard.Load(id)
	return ok && v.(*atomic.Int64).Load() > t.UnixNano()
}

// silentProbe bounds the probe a call to a silent primary sends first.
const silentProbe = time.Second

// maxSilence is how long a silent primary stays marked at most: the
// requests of one system call follow each other within milliseconds.
const maxSilence = 5 * time.Second

func (s *silence) mark(sl oid.Slice, id string, waited time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[oid.Slice]silentPrimary{}
	}
	now := time.Now()
	s.m[sl] = silentPrimary{id, now, now.Add(min(waited, maxSilence))}
}

func (s *silence) clear(sl oid.Slice) {
	s.mu.Lock()
	delete(s.m, sl)
	s.mu.Unlock()
}

func (s *silence) silent(sl oid.Slice, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.m[sl]
	if !ok {
		return false
	}
	if p.id != id || time.Now().After(p.until) || s.heardSince(id, p.at) {
		delete(s.m, sl)
		return false
	}
	return true
}
