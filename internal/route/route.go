// Package route tells a client which server is primary for a slice: it
// keeps a watched copy of the configuration service's slice table and a
// pool of authenticated gRPC connections, one per server.
package route

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Options configures a Router.
type Options struct {
	Logger *slog.Logger
	// TLS returns the client TLS configuration for dialing a server.
	TLS func(serverName string) *tls.Config
	// Dial, when set, opens the raw connection (the shaped transport).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// LocalID and Local short-circuit calls to a server in this process.
	LocalID string
	Local   wire.StorageClient
}

// Router implements client.Router over the configuration service.
type Router struct {
	conf configsvc.Service
	opts Options
	log  *slog.Logger
	stop context.CancelFunc
	done chan struct{}

	mu    sync.Mutex
	table *configsvc.Table
	conns map[string]*grpc.ClientConn // by server ID
}

var _ client.Router = (*Router)(nil)

// New returns a router that follows conf's slice table.
func New(ctx context.Context, conf configsvc.Service, o Options) (*Router, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	t, err := conf.Table(ctx)
	if err != nil {
		return nil, fmt.Errorf("route: read slice table: %w", err)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &Router{conf: conf, opts: o, log: o.Logger.With("component", "route"), table: t,
		conns: map[string]*grpc.ClientConn{}, stop: cancel, done: make(chan struct{})}
	go r.follow(wctx)
	return r, nil
}

func (r *Router) follow(ctx context.Context) {
	defer close(r.done)
	for t := range r.conf.Watch(ctx) {
		r.mu.Lock()
		if t.Revision >= r.table.Revision {
			r.table = t
		}
		r.mu.Unlock()
	}
}

// Close stops following the table and closes all connections.
func (r *Router) Close() error {
	r.stop()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.conns {
		c.Close()
		delete(r.conns, id)
	}
	return nil
}

// slice returns the table entry for s, re-reading the table once when the
// slice is unknown (paper §5.2.1: a client meeting an unknown slice fetches
// a new table).
func (r *Router) slice(ctx context.Context, s oid.Slice) (configsvc.Slice, *configsvc.Table, error) {
	r.mu.Lock()
	t := r.table
	r.mu.Unlock()
	if sl, ok := t.Slices[s]; ok && len(sl.Replicas) > 0 {
		return sl, t, nil
	}
	t, err := r.conf.Table(ctx)
	if err != nil {
		return configsvc.Slice{}, nil, fmt.Errorf("route: refresh slice table: %w", err)
	}
	r.mu.Lock()
	if t.Revision >= r.table.Revision {
		r.table = t
	}
	r.mu.Unlock()
	sl, ok := t.Slices[s]
	if !ok || len(sl.Replicas) == 0 {
		return configsvc.Slice{}, nil, fmt.Errorf("route: slice %d unknown: %w", s, fserr.ErrStale)
	}
	return sl, t, nil
}

// Primary implements client.Router.
func (r *Router) Primary(ctx context.Context, s oid.Slice) (client.Conn, error) {
	sl, t, err := r.slice(ctx, s)
	if err != nil {
		return client.Conn{}, err
	}
	id := sl.Replicas[0]
	if sl.Holder != "" {
		id = sl.Holder
	}
	return r.server(t, id)
}

// Replicas implements client.Router.
func (r *Router) Replicas(ctx context.Context, s oid.Slice) ([]client.Conn, error) {
	sl, t, err := r.slice(ctx, s)
	if err != nil {
		return nil, err
	}
	ids := sl.Replicas
	if sl.Holder != "" && !slices.Contains(ids, sl.Holder) {
		ids = append([]string{sl.Holder}, ids...)
	} else if sl.Holder != "" && ids[0] != sl.Holder {
		ids = append([]string{sl.Holder}, slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return id == sl.Holder })...)
	}
	out := make([]client.Conn, 0, len(ids))
	for _, id := range ids {
		c, err := r.server(t, id)
		if err != nil {
			continue // not registered now: try the others
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("route: no replica of slice %d is registered: %w", s, fserr.ErrIO)
	}
	return out, nil
}

// server returns a connection to server id.
func (r *Router) server(t *configsvc.Table, id string) (client.Conn, error) {
	info, ok := t.Servers[id]
	if id == r.opts.LocalID && r.opts.Local != nil {
		return client.Conn{ID: id, Site: info.Site, StorageClient: r.opts.Local}, nil
	}
	if !ok {
		return client.Conn{}, fmt.Errorf("route: server %s is not registered: %w", id, fserr.ErrIO)
	}
	conn, err := r.conn(info)
	if err != nil {
		return client.Conn{}, err
	}
	return client.Conn{ID: id, Site: info.Site, StorageClient: wire.NewStorageClient(conn)}, nil
}

// Peer returns a client for server id's Peer service (server-to-server
// calls: replication, two-step create).
func (r *Router) Peer(ctx context.Context, id string) (wire.PeerClient, error) {
	r.mu.Lock()
	info, ok := r.table.Servers[id]
	r.mu.Unlock()
	if !ok {
		t, err := r.conf.Table(ctx)
		if err != nil {
			return nil, fmt.Errorf("route: read slice table: %w", err)
		}
		if info, ok = t.Servers[id]; !ok {
			return nil, fmt.Errorf("route: server %s is not registered: %w", id, fserr.ErrIO)
		}
	}
	conn, err := r.conn(info)
	if err != nil {
		return nil, err
	}
	return wire.NewPeerClient(conn), nil
}

// WindowSize and ConnWindowSize are the HTTP/2 flow-control windows of
// every connection to a storage server (the servers use the same): large
// enough that a message of a few blocks never waits for a window update
// across the wide area, where each costs a round trip (issue 11).
const (
	WindowSize     = 4 << 20
	ConnWindowSize = 16 << 20
)

func (r *Router) conn(info configsvc.ServerInfo) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c, ok := r.conns[info.ID]; ok && c.Target() == info.Addr {
		return c, nil
	} else if ok {
		c.Close()
	}
	if r.opts.TLS == nil {
		return nil, fmt.Errorf("route: no TLS credentials to reach %s: %w", info.ID, fserr.ErrIO)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(r.opts.TLS(info.ID))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)),
		// HTTP/2's initial 64 KiB window made every message of a 64 KiB
		// block (plus framing) wait a round trip for a window update.
		grpc.WithInitialWindowSize(WindowSize), grpc.WithInitialConnWindowSize(ConnWindowSize),
	}
	if r.opts.Dial != nil {
		dopts = append(dopts, grpc.WithContextDialer(r.opts.Dial))
	}
	c, err := grpc.NewClient(info.Addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("route: connect to %s at %s: %w", info.ID, info.Addr, err)
	}
	r.conns[info.ID] = c
	return c, nil
}

// Describe implements client.Router.
func (r *Router) Describe(ctx context.Context, s oid.Slice) (client.SliceInfo, error) {
	sl, t, err := r.slice(ctx, s)
	if err != nil {
		return client.SliceInfo{}, err
	}
	ref := func(id string) client.ServerRef { return client.ServerRef{Server: id, Site: t.Servers[id].Site} }
	out := client.SliceInfo{Epoch: sl.Epoch, Primary: ref(sl.Replicas[0])}
	if sl.Holder != "" {
		out.Primary = ref(sl.Holder)
	}
	for _, id := range sl.Replicas {
		out.Replicas = append(out.Replicas, ref(id))
	}
	return out, nil
}
