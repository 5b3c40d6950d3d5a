package fsck

import (
	"context"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Tables reads the slice table (configsvc.Service does).
type Tables interface {
	Table(ctx context.Context) (*configsvc.Table, error)
}

// Remote reaches a deployment's servers over its mutual-TLS gRPC, as the
// holder of creds: a registered server's, or the CA key holder's
// (pki.CA.RootCredentials). It implements Deployment.
type Remote struct {
	tables Tables
	creds  *pki.Credentials
	dial   func(ctx context.Context, addr string) (net.Conn, error)

	mu    sync.Mutex
	addrs map[string]string // server ID → address, from the last table
	conns map[string]*grpc.ClientConn
}

// NewRemote returns a Remote; dial, if not nil, replaces TCP (tests'
// shaped network). Close it when done.
func NewRemote(tables Tables, creds *pki.Credentials, dial func(ctx context.Context, addr string) (net.Conn, error)) *Remote {
	return &Remote{tables: tables, creds: creds, dial: dial, addrs: map[string]string{}, conns: map[string]*grpc.ClientConn{}}
}

// Table implements Deployment, and learns the servers' addresses.
func (r *Remote) Table(ctx context.Context) (*configsvc.Table, error) {
	t, err := r.tables.Table(ctx)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	for id, info := range t.Servers {
		if old, ok := r.addrs[id]; ok && old != info.Addr {
			if c := r.conns[id]; c != nil {
				c.Close()
				delete(r.conns, id)
			}
		}
		r.addrs[id] = info.Addr
	}
	r.mu.Unlock()
	return t, nil
}

// Peer implements Deployment.
func (r *Remote) Peer(ctx context.Context, server string) (wire.PeerClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[server]; ok {
		return wire.NewPeerClient(c), nil
	}
	addr, ok := r.addrs[server]
	if !ok {
		return nil, fmt.Errorf("fsck: server %s is not registered", server)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(r.creds.ClientCredentials(server)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageSize), grpc.MaxCallSendMsgSize(wire.MaxMessageSize))}
	if r.dial != nil {
		opts = append(opts, grpc.WithContextDialer(r.dial))
	}
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("fsck: server %s at %s: %w", server, addr, err)
	}
	r.conns[server] = c
	return wire.NewPeerClient(c), nil
}

// Close closes the connections.
func (r *Remote) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.conns {
		c.Close()
		delete(r.conns, id)
	}
	return nil
}
