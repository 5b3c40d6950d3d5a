package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// ownerIdle is how long a client session's binding to its node outlives
// the session's last use here, when nothing of it is left at this server
// (no Callbacks stream, no open handle). Its leases are over by then
// (a lease lasts DefaultLeaseTTL at most).
const ownerIdle = 10 * time.Minute

// sessionOwners binds each client session number (a client core's
// random 64-bit session, which names its Callbacks stream, its leases
// and its open handles) to the node whose certificate first used it at
// this server. Another node naming that session — to attach to its
// lease revocations, to take its leases, or to use or release its
// handles — is refused: knowing the number is not enough.
type sessionOwners struct {
	// held lists the sessions of which something is still held here
	// (their bindings stay, however long they were idle).
	held func() map[uint64]bool
	now  func() time.Time // time.Now; tests move it

	mu    sync.Mutex
	m     map[uint64]*sessionOwner
	swept time.Time
}

type sessionOwner struct {
	node  string
	used  time.Time
	ended bool // it said bye: its client core closed
}

func newSessionOwners(held func() map[uint64]bool) *sessionOwners {
	return &sessionOwners{held: held, now: time.Now, m: map[uint64]*sessionOwner{}}
}

// claim binds session to node, or checks that it is bound to node
// already. Session 0 names no session.
func (o *sessionOwners) claim(node string, session uint64) error {
	if session == 0 {
		return nil
	}
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if now.Sub(o.swept) > ownerIdle {
		o.sweepLocked(now)
	}
	w := o.m[session]
	if w == nil {
		o.m[session] = &sessionOwner{node: node, used: now}
		return nil
	}
	if w.node != node {
		return fmt.Errorf("client session belongs to another node: %w", fserr.ErrPerm)
	}
	w.used, w.ended = now, false
	return nil
}

// nodeOf returns the node session is bound to.
func (o *sessionOwners) nodeOf(session uint64) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.m[session]
	if w == nil {
		return "", false
	}
	return w.node, true
}

// seen returns session's node, when it was last used here, and whether
// it said bye since; known is false for a session not bound here.
func (o *sessionOwners) seen(session uint64) (node string, used time.Time, ended, known bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.m[session]
	if w == nil {
		return "", time.Time{}, false, false
	}
	return w.node, w.used, w.ended, true
}

// touch counts now as a use of session (its back channel just ended:
// idle time starts then, not at its last request).
func (o *sessionOwners) touch(session uint64) {
	now := o.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.m[session]; w != nil {
		w.used = now
	}
}

// end records that session said bye.
func (o *sessionOwners) end(session uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := o.m[session]; w != nil {
		w.ended = true
	}
}

// sweepLocked forgets bindings idle for ownerIdle whose session holds
// nothing here any more, so that a node cannot grow the table without
// bound (each binding costs it a request, within its rate limit).
func (o *sessionOwners) sweepLocked(now time.Time) {
	o.swept = now
	var held map[uint64]bool
	if o.held != nil {
		held = o.held()
	}
	for s, w := range o.m {
		if now.Sub(w.used) > ownerIdle && !held[s] {
			delete(o.m, s)
		}
	}
}

// sessionsOf lists the client session numbers a Storage request names:
// its callers' (leases), and the handles it goes through or releases.
func sessionsOf(req any) []uint64 {
	var out []uint64
	add := func(c *wire.Caller) {
		if c == nil {
			return
		}
		out = append(out, c.Session, c.GetHandle().GetSession())
	}
	if r, ok := req.(interface{ GetCaller() *wire.Caller }); ok {
		add(r.GetCaller())
	}
	switch r := req.(type) {
	case *wire.ReleaseRequest:
		out = append(out, r.GetHandle().GetSession())
	case *wire.CommitRequest:
		for _, a := range r.Attrs {
			add(a.Caller)
		}
	case *wire.ReportHoldingRequest:
		for _, h := range r.Held {
			add(h.Caller)
		}
	}
	return out
}

// checkSessions admits a Storage request only if every client session it
// names is the calling node's (bound on first use). In-process calls
// (no TLS peer) are this server's own client: they bind to "".
func (s *Server) checkSessions(ctx context.Context, req any) error {
	name, _ := pki.PeerName(ctx)
	node := s.sessionNode(name)
	for _, sess := range sessionsOf(req) {
		if err := s.owners.claim(node, sess); err != nil {
			s.log.Warn("request names another node's client session", "node", node)
			return err
		}
	}
	if r, ok := req.(*wire.ReleaseRequest); ok && name != "" && r.GetHandle().GetId() == 0 {
		// Every remote open is counted under a named handle (Open):
		// an anonymous release would end someone else's.
		return fmt.Errorf("release without a handle: %w", fserr.ErrPerm)
	}
	return nil
}

// sessionNode is the node a session is bound to for a caller named name
// ("" in-process): this server's own name is this process too, so that
// its client is one node whether it calls in-process or over TLS.
func (s *Server) sessionNode(name string) string {
	if name == s.cfg.ID {
		return ""
	}
	return name
}

// heldSessions lists the sessions with a Callbacks stream attached or an
// open handle at this server.
func (s *Server) heldSessions() map[uint64]bool {
	out := map[uint64]bool{}
	s.leases.attachedSessions(out)
	s.files.handleSessions(out)
	return out
}
