package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// EventualTimeout is the time limit of an .EventualConsistency operation
// without .MaxTime (paper §4.5: one second).
const EventualTimeout = time.Second

// suspectFor is how long a primary that did not answer in time is skipped
// by .EventualConsistency operations, which go straight to the fallbacks:
// the several steps of one system call then pay for it once.
const suspectFor = 5 * time.Second

// unreachable reports whether err means no answer came in time (as
// opposed to an answer, such as ENOENT).
func unreachable(err error) bool {
	return errors.Is(err, fserr.ErrTimeout) || errors.Is(err, fserr.ErrNotPrimary) || errors.Is(err, fserr.ErrIO)
}

// suspect marks server id as not answering.
func (f *FS) suspect(id string) {
	f.suspectMu.Lock()
	if f.suspects == nil {
		f.suspects = map[string]time.Time{}
	}
	f.suspects[id] = time.Now().Add(suspectFor)
	f.suspectMu.Unlock()
}

func (f *FS) suspected(id string) bool {
	f.suspectMu.Lock()
	defer f.suspectMu.Unlock()
	until, ok := f.suspects[id]
	if ok && time.Now().After(until) {
		delete(f.suspects, id)
		return false
	}
	return ok
}

// primaryFirst runs the primary's attempt of an .EventualConsistency
// operation with half of what is left of ctx's time, unless the primary is
// suspected already. done is true when that settled the operation (an
// answer, or an error that is an answer).
func primaryFirst[Resp any](ctx context.Context, f *FS, id oid.ID, try func(ctx context.Context) (Resp, error)) (resp Resp, err error, done bool) {
	p, perr := f.router.Primary(ctx, id.Slice())
	if perr == nil && f.suspected(p.ID) {
		return resp, fmt.Errorf("primary %s of %v recently unreachable: %w", p.ID, id, fserr.ErrTimeout), false
	}
	pctx, cancel := context.WithTimeout(ctx, half(ctx))
	defer cancel()
	resp, err = try(pctx)
	if err == nil || !unreachable(err) {
		return resp, err, true
	}
	if perr == nil && ctx.Err() == nil {
		f.suspect(p.ID)
	}
	return resp, err, false
}

// half is half the time left before ctx's deadline.
func half(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return EventualTimeout / 2
	}
	return time.Until(dl) / 2
}

// fallbacks returns the servers an .EventualConsistency operation asks
// when id's primary did not answer in time: every replica of the slice,
// those at this client's site first, and the primary last among its own
// site's. The primary is asked again because the request they get carries
// the eventual flag, under which a server that keeps a copy answers from
// it even if it is no longer primary: a primary cut off from the
// configuration service refuses ordinary requests once its slice lock
// lapsed, and at the cut-off site it may be the only copy in reach.
func (f *FS) fallbacks(ctx context.Context, id oid.ID) ([]Conn, error) {
	all, err := f.router.Replicas(ctx, id.Slice())
	if err != nil || len(all) == 0 {
		return nil, fserr.FromStatus(err)
	}
	primary := all[0].ID
	key := func(c Conn) int {
		k := 0
		if c.Site != f.cfg.Site {
			k += 2
		}
		if c.ID == primary {
			k++
		}
		return k
	}
	slices.SortStableFunc(all, func(a, b Conn) int { return key(a) - key(b) })
	return all, nil
}

// eventually returns a copy of req that a backup may answer.
func eventually[Req request](req Req) Req {
	r := proto.CloneOf(req)
	r.GetCaller().Eventual = true
	r.GetCaller().Session = 0
	return r
}

// readEventual runs a read under .EventualConsistency (paper §4.5): the
// primary first, with half the time limit (a refusal as not primary ends
// that at once); then every replica at once (fallbacks), and the answer
// with the highest version wins. Those answers carry no lease. An error
// that is an answer (ENOENT) counts as version 0.
func readEventual[Req request, Resp any](ctx context.Context, f *FS, id oid.ID, rpc rpcFunc[Req, Resp], req Req, version func(Resp) uint64) (Resp, leaseToken, error) {
	var tok leaseToken
	resp, err, done := primaryFirst(ctx, f, id, func(ctx context.Context) (Resp, error) {
		var r Resp
		var err error
		r, tok, err = callLeased(ctx, f, id, rpc, req, true)
		return r, err
	})
	if done {
		return resp, tok, err
	}
	firstErr := err
	copies, err := f.fallbacks(ctx, id)
	if err != nil || len(copies) == 0 {
		return resp, leaseToken{}, firstErr
	}
	type answer struct {
		resp Resp
		err  error
	}
	answers := make(chan answer, len(copies))
	breq := eventually(req)
	for _, b := range copies {
		go func() {
			r, err := rpc(b.StorageClient, ctx, breq)
			answers <- answer{r, fserr.FromStatus(err)}
		}()
	}
	// Take every answer that comes within the time limit, but do not wait
	// for silent replicas once one answered and a short grace passed.
	var best *answer
	var grace <-chan time.Time
	for range copies {
		select {
		case a := <-answers:
			if a.err != nil && unreachable(a.err) {
				continue
			}
			if best == nil || (a.err == nil && (best.err != nil || version(a.resp) > version(best.resp))) {
				best = &a
			}
			if grace == nil {
				grace = time.After(min(50*time.Millisecond, half(ctx)))
			}
			continue
		case <-grace:
		case <-ctx.Done():
		}
		break
	}
	if best == nil {
		return resp, leaseToken{}, firstErr
	}
	return best.resp, leaseToken{}, best.err
}

// writeEventual runs an update under .EventualConsistency: the primary
// first, with half the time limit (a refusal as not primary ends that at
// once); then the replicas one after the other (fallbacks), the ones at
// this client's site first (paper §4.5: "writes to a backup if the primary
// is not available"). Maintenance reconciles them later.
func writeEventual[Req request, Resp any](ctx context.Context, f *FS, id oid.ID, rpc rpcFunc[Req, Resp], req Req) (Resp, error) {
	// The cue travels to the primary too: it then acknowledges once its
	// own copy is durable, even when its backups are cut off.
	req.GetCaller().Eventual = true
	resp, err, done := primaryFirst(ctx, f, id, func(ctx context.Context) (Resp, error) {
		return callVia(ctx, f, id, rpc, req, callOpts{refusalEnds: true})
	})
	if done {
		return resp, err
	}
	firstErr := err
	copies, err := f.fallbacks(ctx, id)
	if err != nil {
		return resp, firstErr
	}
	breq := eventually(req)
	for i, b := range copies {
		if c, ok := any(breq).(*wire.CreateRequest); ok {
			c.Attempt = uint32(i + 1) // which copy made it, should several
		}
		r, err := rpc(b.StorageClient, ctx, breq)
		if err == nil {
			return r, nil
		}
		if err = fserr.FromStatus(err); !unreachable(err) {
			return r, err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return resp, firstErr
}
