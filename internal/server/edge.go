package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// peerMethods prefixes the full method names of the Peer service.
var peerMethods = "/" + wire.Peer_ServiceDesc.ServiceName + "/"

// UnaryInterceptor is the gRPC edge of both services: it admits Peer calls
// only from registered servers (fsck's also from the CA key's holder,
// authAdmin); it holds each client node to its request
// rate (RateLimit), checks a Storage request's limits (limits.go) and its
// callers' sessions (Config.Users); it maps every handler error to a
// status (fserr.ToStatus), so handlers return plain wrapped errors; and it
// turns a handler's panic into codes.Internal, logged with its stack, so
// that one bad request cannot take the server down. The in-process client
// (LocalClient) goes through it too.
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer s.recoverPanic(info.FullMethod, &err)
		if isFsckMethod(info.FullMethod) {
			if err := s.authAdmin(ctx); err != nil {
				return nil, fserr.ToStatus(err)
			}
		} else if strings.HasPrefix(info.FullMethod, peerMethods) {
			if err := s.authPeer(ctx); err != nil {
				return nil, fserr.ToStatus(err)
			}
		} else if err := s.admitClient(ctx, req); err != nil {
			return nil, fserr.ToStatus(err)
		}
		resp, err = handler(ctx, req)
		if err != nil {
			return nil, fserr.ToStatus(err)
		}
		if h := s.cfg.AfterApply; h != nil && !strings.HasPrefix(info.FullMethod, peerMethods) {
			if err := h(info.FullMethod, req); err != nil {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
		}
		return resp, nil
	}
}

// StreamInterceptor is the edge of the Callbacks stream: opening one
// costs its node a request (RateLimit); a client that closes its side
// ends the stream cleanly (not codes.Unknown "EOF"); other errors map as
// in UnaryInterceptor, and panics are recovered.
func (s *Server) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer s.recoverPanic(info.FullMethod, &err)
		if node, err := pki.PeerName(ss.Context()); err == nil && s.limits != nil {
			if err := s.limits.wait(ss.Context(), node, 1); err != nil {
				return fserr.ToStatus(err)
			}
		}
		err = handler(srv, ss)
		if errors.Is(err, io.EOF) {
			return nil
		}
		return fserr.ToStatus(err)
	}
}

// admitClient admits a Storage request: within its node's rate, within
// the protocol's limits, and for callers with a session.
func (s *Server) admitClient(ctx context.Context, req any) error {
	if node, err := pki.PeerName(ctx); err == nil && s.limits != nil {
		if err := s.limits.wait(ctx, node, cost(req)); err != nil {
			return err
		}
	}
	if err := checkRequest(req); err != nil {
		return err
	}
	if err := s.checkSessions(ctx, req); err != nil {
		return err
	}
	return s.checkUser(ctx, req)
}

// recoverPanic, deferred, turns a panic into codes.Internal in *err; the
// stack goes to the log, not to the client.
func (s *Server) recoverPanic(method string, err *error) {
	p := recover()
	if p == nil {
		return
	}
	s.panics.Add(1)
	log := s.log
	if log == nil {
		log = slog.Default()
	}
	log.Error("request handler panicked", "method", method, "panic", p, "stack", string(debug.Stack()))
	*err = status.Errorf(codes.Internal, "wheelfs: internal error in %s (logged at the server)", method)
}

// Panics counts the handler panics the edge recovered from (tests fail
// on any).
func (s *Server) Panics() int64 { return s.panics.Load() }

// callUnary runs handler h for method through interceptor edge, as gRPC
// would.
func callUnary[Req, Resp any](ctx context.Context, edge grpc.UnaryServerInterceptor, srv any, method string, in Req, h func(context.Context, Req) (Resp, error)) (Resp, error) {
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: method}
	out, err := edge(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return h(ctx, req.(Req))
	})
	if err != nil {
		var zero Resp
		return zero, err
	}
	return out.(Resp), nil
}

// authPeer admits only callers whose certificate names a registered
// server. In-process calls (no TLS peer) come from this process.
func (s *Server) authPeer(ctx context.Context) error {
	name, err := pki.PeerName(ctx)
	if err != nil {
		return nil // in-process
	}
	if name == s.cfg.ID {
		return nil
	}
	if s.registeredServer(ctx, name) {
		return nil
	}
	return fmt.Errorf("peer call from %q, which is not a registered server: %w", name, fserr.ErrPerm)
}

// clientNode names the client node that sent a Storage request, and
// whether its uids are trusted without a session: this process (the
// in-process client has no TLS peer), or a registered server — root there
// holds a server's key and store, so a session would not stop it.
func (s *Server) clientNode(ctx context.Context) (string, bool) {
	name, err := pki.PeerName(ctx)
	if err != nil {
		return "", true // in-process
	}
	if name == s.cfg.ID {
		return name, true
	}
	return name, s.registeredServer(ctx, name)
}

// freshTableEvery bounds how often one unknown node with the server role
// makes this server read the table from the configuration service.
const freshTableEvery = time.Second

// freshFoundFor is how long a fresh read that found a server vouches for
// it while this server's watch has not brought its registration yet.
const freshFoundFor = 10 * time.Second

// registeredServer reports whether name, the caller of ctx, is a
// registered server. A node registers moments before its own client's
// first request, which may arrive before this server's watch brings the
// registration: a caller missing from the table whose certificate has the
// server role is then looked up in a table read now (registeredNow).
func (s *Server) registeredServer(ctx context.Context, name string) bool {
	if t := s.table.Load(); t != nil {
		if _, ok := t.Servers[name]; ok {
			return true
		}
	}
	cert, _ := pki.PeerCertificate(ctx)
	return s.registeredNow(ctx, name, pki.HasServerRole(cert))
}

// registeredNow reports whether name, a serverRole caller, is in a table
// read from the configuration service after this call began: a read that
// began earlier may predate a registration whose node is calling now (its
// ready file was written in between; refusing it made a user's first
// write at a fresh node EACCES). Reads are shared, at most one per
// freshTableEvery per name, so a call may wait that long (or until ctx
// ends); a read that found name vouches for it for freshFoundFor.
func (s *Server) registeredNow(ctx context.Context, name string, serverRole bool) bool {
	if !serverRole {
		return false
	}
	began := time.Now()
	for {
		c, wait, read := s.unknownPeers.next(name, began)
		if read {
			t, err := s.conf.Table(ctx)
			if err != nil {
				s.log.Warn("cannot read the table to check a peer's registration", "node", name, "err", err)
			} else {
				_, c.found = t.Servers[name]
			}
			close(c.done)
			return c.found
		}
		if wait == nil {
			return c.found
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return false
		}
	}
}

// peerChecks shares the fresh table reads per unknown node name.
type peerChecks struct {
	mu   sync.Mutex
	last map[string]*peerCheck
}

// peerCheck is one fresh read for a name.
type peerCheck struct {
	started time.Time
	done    chan struct{} // closed when found is set
	found   bool
}

// maxPeerChecks bounds the names remembered (then all are forgotten).
const maxPeerChecks = 1024

// next says what a check of name that began at began does: use c's
// answer (wait nil), wait for wait and ask again, or make the read c
// (read; the caller closes c.done).
func (p *peerChecks) next(name string, began time.Time) (c *peerCheck, wait <-chan struct{}, read bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	c = p.last[name]
	if c != nil {
		select {
		case <-c.done:
			switch {
			case c.found && now.Sub(c.started) < freshFoundFor, !c.started.Before(began):
				return c, nil, false
			case now.Sub(c.started) < freshTableEvery:
				return c, after(c.started.Add(freshTableEvery).Sub(now)), false
			}
		default:
			return c, c.done, false // in flight: its answer, or a later read
		}
	}
	if p.last == nil || len(p.last) >= maxPeerChecks {
		p.last = map[string]*peerCheck{}
	}
	c = &peerCheck{started: now, done: make(chan struct{})}
	p.last[name] = c
	return c, nil, true
}

// after returns a channel closed once d has passed.
func after(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	time.AfterFunc(d, func() { close(ch) })
	return ch
}

// checkUser admits a Storage request's uids (Config.Users): its caller,
// and the callers of the changes it carries (a commit's deferred chmod,
// chown and utimens; a report of cached blocks), which act too.
func (s *Server) checkUser(ctx context.Context, req any) error {
	if s.cfg.Users == nil {
		return nil
	}
	r, ok := req.(interface{ GetCaller() *wire.Caller })
	if !ok {
		if _, ok := req.(*wire.ReportHoldingRequest); !ok {
			return nil // logins, releases of handles: no uid to act as
		}
	}
	node, trusted := s.clientNode(ctx)
	if trusted || rootAttrs(req) {
		return nil
	}
	if ok {
		if err := s.cfg.Users.Check(ctx, node, r.GetCaller()); err != nil {
			return err
		}
	}
	switch r := req.(type) {
	case *wire.CommitRequest:
		for _, a := range r.Attrs {
			if err := s.cfg.Users.Check(ctx, node, a.Caller); err != nil {
				return err
			}
		}
	case *wire.ReportHoldingRequest:
		for _, h := range r.Held {
			if err := s.cfg.Users.Check(ctx, node, h.Caller); err != nil {
				return err
			}
		}
	}
	return nil
}

// rootAttrs reports whether req only reads the root directory's
// attributes, which any authenticated client node may do for any uid: the
// kernel checks them (as root, for the mounting process) before a mount is
// ready, when nobody can have logged in at that mount yet. They say no
// more than the mode and owner of "/".
func rootAttrs(req any) bool {
	r, ok := req.(*wire.GetAttrRequest)
	return ok && oid.ID(r.Id) == oid.Root
}
