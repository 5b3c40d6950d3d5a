// Package route tells a client which server is primary for a slice: it
// keeps a watched copy of the configuration service's slice table and a
// pool of authenticated gRPC connections, one per server.
package route

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/every"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Options configures a Router.
type Options struct {
	Logger *slog.Logger
	// TLS returns the client TLS configuration for dialing a server.
	TLS func(serverName string) *tls.Config
	// Creds, when set, replaces TLS: transport credentials for dialing a
	// server (pki.Credentials.ClientCredentials, whose connections the
	// deny list closes when the server is revoked).
	Creds func(serverName string) credentials.TransportCredentials
	// Dial, when set, opens the raw connection (the shaped transport).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// LocalID and Local short-circuit calls to a server in this process.
	LocalID string
	Local   wire.StorageClient
	// Coord, when set, is this host's network coordinate: calls to servers
	// sample their round trips (netcoord), and a server not sampled
	// within ProbeEvery may be probed.
	Coord *netcoord.Node
	// ProbeEvery is how often one server is probed for a coordinate
	// sample (default DefaultProbeEvery; negative: never).
	ProbeEvery time.Duration
}

// DefaultProbeEvery is how often a host probes one server whose round
// trip its other calls did not sample lately: one empty call every 10 s
// at most.
const DefaultProbeEvery = 10 * time.Second

// probeNeighbors is how many servers a host keeps probing once it is
// connected to that many: Vivaldi needs a few neighbours, not all, and
// each probed server costs an open connection.
const probeNeighbors = 8

// KeepaliveTime is how often an idle connection to a server is pinged
// (servers must permit pings this often).
const KeepaliveTime = 5 * time.Second

// reconnectMax is the longest wait between attempts to connect to a
// server that does not answer, so a server that comes back after a
// partition or a restart is reached within it. (Resetting the back-off
// when the server registers again, with ClientConn.ResetConnectBackoff,
// races inside grpc-go 1.85: it ranges over the connection's sub-conns
// outside the lock that guards them.)
const reconnectMax = 2 * time.Second

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

	probing sync.WaitGroup
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
	if o.ProbeEvery == 0 {
		o.ProbeEvery = DefaultProbeEvery
	}
	r := &Router{conf: conf, opts: o, log: o.Logger.With("component", "route"), table: t,
		conns: map[string]*grpc.ClientConn{}, stop: cancel, done: make(chan struct{})}
	go r.follow(wctx)
	if o.Coord != nil && o.ProbeEvery > 0 {
		r.probing.Add(1)
		go r.probe(wctx)
	}
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
	r.probing.Wait()
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
	t0 := r.table
	r.mu.Unlock()
	if sl, ok := t0.Slices[s]; ok && len(sl.Replicas) > 0 {
		return sl, t0, nil
	}
	// Half of the call's time at most: the rest is for asking this host's
	// server when the configuration service is out of reach.
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok {
		rctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
	}
	t, err := r.conf.Table(rctx)
	cancel()
	if err != nil {
		if r.opts.LocalID != "" && ctx.Err() == nil {
			// A site cut off from the configuration service: a slice this
			// host's server created just before the cut (its primary)
			// may not have reached our copy of the table. The server is
			// the authority on its own locks and refuses otherwise.
			r.log.Debug("slice table out of reach; asking this host's server", "slice", s, "err", err)
			return configsvc.Slice{ID: s, Replicas: []string{r.opts.LocalID}}, t0, nil
		}
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
		return client.Conn{ID: id, Site: info.Site, StorageClient: r.opts.Local, InProcess: true}, nil
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
	var tc credentials.TransportCredentials
	switch {
	case r.opts.Creds != nil:
		tc = r.opts.Creds(info.ID)
	case r.opts.TLS != nil:
		tc = credentials.NewTLS(r.opts.TLS(info.ID))
	default:
		return nil, fmt.Errorf("route: no TLS credentials to reach %s: %w", info.ID, fserr.ErrIO)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(tc),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageSize), grpc.MaxCallSendMsgSize(wire.MaxMessageSize)),
		// HTTP/2's initial 64 KiB window made every message of a 64 KiB
		// block (plus framing) wait a round trip for a window update.
		grpc.WithInitialWindowSize(WindowSize), grpc.WithInitialConnWindowSize(ConnWindowSize),
	}
	if r.opts.Dial != nil {
		dopts = append(dopts, grpc.WithContextDialer(r.opts.Dial))
	}
	if r.opts.Coord != nil {
		// The peer's name is the one TLS checks (TLS(info.ID)).
		dopts = append(dopts, grpc.WithUnaryInterceptor(r.opts.Coord.UnaryClientInterceptor(info.ID)))
	}
	// gRPC's default back-off grows to 2 minutes between connection
	// attempts: a site cut off for three minutes then reached a server
	// again 98 s after the heal (testbed, partition experiment). A server
	// that comes back is tried within reconnectMax.
	// A connection that a cut left hanging (its TCP retransmissions backed
	// off to minutes) is found dead by an unanswered ping and re-dialled;
	// without pings a site cut off for three minutes reached the others
	// again only 99 s after the heal (testbed, partition experiment).
	dopts = append(dopts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
		Time: KeepaliveTime, Timeout: 3 * time.Second, PermitWithoutStream: true}))
	dopts = append(dopts, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMax},
		MinConnectTimeout: 5 * time.Second,
	}))
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

// probe calls one server every ProbeEvery whose round trip no other call
// sampled lately, so that an idle host's coordinate keeps up. Once the
// host is connected to probeNeighbors servers it probes only those.
func (r *Router) probe(ctx context.Context) {
	defer r.probing.Done()
	every.Do(ctx, r.opts.ProbeEvery, nil, func() {
		info, ok := r.probeTarget()
		if !ok {
			return
		}
		conn, err := r.conn(info)
		if err != nil {
			return
		}
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		if _, err := wire.NewStorageClient(conn).Probe(pctx, &wire.ProbeRequest{}); err != nil {
			r.log.Debug("coordinate probe failed", "server", info.ID, "err", err)
		}
	})
}

// probeTimeout bounds one probe.
const probeTimeout = 3 * time.Second

// probeTarget picks a random registered server (not this host's) that is
// due for a sample, among the connected ones when there are enough.
func (r *Router) probeTarget() (configsvc.ServerInfo, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all, connected []configsvc.ServerInfo
	for id, info := range r.table.Servers {
		if id == r.opts.LocalID || !r.opts.Coord.Due(id) {
			continue
		}
		all = append(all, info)
		if _, ok := r.conns[id]; ok {
			connected = append(connected, info)
		}
	}
	if len(r.conns) >= probeNeighbors {
		all = connected
	}
	if len(all) == 0 {
		return configsvc.ServerInfo{}, false
	}
	return all[rand.IntN(len(all))], true
}
