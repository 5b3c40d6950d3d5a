package server

import (
	"context"
	"fmt"
	"strings"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/grpc"
)

// peerMethods prefixes the full method names of the Peer service.
var peerMethods = "/" + wire.Peer_ServiceDesc.ServiceName + "/"

// UnaryInterceptor is the gRPC edge of both services: it admits Peer calls
// only from registered servers and maps every handler error to a status
// (fserr.ToStatus), so handlers return plain wrapped errors. The
// in-process client (LocalClient) goes through it too.
func (s *Server) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, peerMethods) {
			if err := s.authPeer(ctx); err != nil {
				return nil, fserr.ToStatus(err)
			}
		} else if err := s.checkUser(ctx, req); err != nil {
			return nil, fserr.ToStatus(err)
		}
		resp, err := handler(ctx, req)
		if err != nil {
			return nil, fserr.ToStatus(err)
		}
		return resp, nil
	}
}

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
	t := s.table.Load()
	if t != nil {
		if _, ok := t.Servers[name]; ok {
			return nil
		}
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
	if t := s.table.Load(); t != nil {
		if _, ok := t.Servers[name]; ok {
			return name, true
		}
	}
	return name, false
}

// checkUser admits a Storage request's uid (Config.Users).
func (s *Server) checkUser(ctx context.Context, req any) error {
	if s.cfg.Users == nil {
		return nil
	}
	r, ok := req.(interface{ GetCaller() *wire.Caller })
	if !ok {
		return nil // logins, releases of handles: no uid to act as
	}
	node, trusted := s.clientNode(ctx)
	if trusted || rootAttrs(req) {
		return nil
	}
	return s.cfg.Users.Check(ctx, node, r.GetCaller())
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
