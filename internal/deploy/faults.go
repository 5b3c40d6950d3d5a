package deploy

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Pause makes the host's server stop answering, for fault tests: incoming
// gRPC calls block until Resume or their deadline, and the server stops
// renewing its slice locks (server.Freeze). Calls through the in-process
// shortcut are not blocked.
func (h *Host) Pause() {
	h.gate.close()
	if h.Server != nil {
		h.Server.Freeze()
	}
}

// Resume undoes Pause.
func (h *Host) Resume() {
	if h.Server != nil {
		h.Server.Thaw()
	}
	h.gate.open()
}

// gate blocks incoming gRPC calls while closed. The zero gate is open.
type gate struct {
	mu     sync.Mutex
	closed chan struct{} // non-nil while closed; closed by open
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// wait returns when the gate is open, or ctx's error.
func (g *gate) wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.closed
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (g *gate) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *gate) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.wait(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}
