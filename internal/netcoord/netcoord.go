// Package netcoord keeps a node's Vivaldi network coordinate (paper §5.5,
// through github.com/hashicorp/serf/coordinate), so that the distance
// between any two nodes can be estimated without measuring it.
//
// Samples ride on calls a node makes anyway: a gRPC client interceptor asks
// the server, at most once per peer per SampleEvery, for its coordinate in
// a response header (the server interceptor adds it with the time it spent
// on the call), and the round trip minus that time is one sample. Only
// calls with small messages on a connection that was already up count, so
// neither a bulk transfer nor a handshake passes for latency. A node that
// is idle toward a server probes it (route) at a small bounded rate.
package netcoord

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/wire"
)

// Metadata keys: the request asks for a sample, the response header
// carries a wire.CoordSample.
const (
	wantKey   = "wfs-coord-want"
	sampleKey = "wfs-coord-bin"
)

// DefaultSampleEvery is the least time between two samples of one peer.
const DefaultSampleEvery = time.Second

// maxSampleBytes bounds the request plus response size of a sampled call:
// larger ones measure bandwidth rather than latency (4 KiB take 5 ms over
// 6 Mbit/s).
const maxSampleBytes = 4 << 10

// Options configure a Node.
type Options struct {
	// SampleEvery is the least time between two samples of one peer
	// (default DefaultSampleEvery).
	SampleEvery time.Duration
	// Config is the Vivaldi configuration (default coordinate.DefaultConfig).
	Config *coordinate.Config
}

// Node is one node's coordinate and the bookkeeping of its samples. It is
// safe for concurrent use.
type Node struct {
	id    string
	cfg   *coordinate.Config
	cli   *coordinate.Client
	every time.Duration

	mu    sync.Mutex
	last  map[string]time.Time              // last sample asked of each peer
	peers map[string]*coordinate.Coordinate // each peer's coordinate in its last sample

	samples  atomic.Uint64
	rejected atomic.Uint64
}

// New returns the coordinate of node id, at the origin.
func New(id string, o Options) *Node {
	if o.SampleEvery <= 0 {
		o.SampleEvery = DefaultSampleEvery
	}
	if o.Config == nil {
		o.Config = coordinate.DefaultConfig()
	}
	cli, err := coordinate.NewClient(o.Config)
	if err != nil {
		// Only an invalid configuration fails, and the default is valid.
		panic(fmt.Sprintf("netcoord: %v", err))
	}
	return &Node{id: id, cfg: o.Config, cli: cli, every: o.SampleEvery, last: map[string]time.Time{},
		peers: map[string]*coordinate.Coordinate{}}
}

// ID returns the node's ID.
func (n *Node) ID() string { return n.id }

// Coordinate returns a copy of the node's current coordinate.
func (n *Node) Coordinate() *coordinate.Coordinate { return n.cli.GetCoordinate() }

// Wire returns the node's current coordinate for the wire.
func (n *Node) Wire() *wire.Coord { return ToWire(n.cli.GetCoordinate()) }

// Samples returns how many samples were applied and how many rejected.
func (n *Node) Samples() (applied, rejected uint64) { return n.samples.Load(), n.rejected.Load() }

// due reports whether peer should be sampled now, and if so counts the
// sample as asked for.
func (n *Node) due(peer string, now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t, ok := n.last[peer]; ok && now.Sub(t) < n.every {
		return false
	}
	n.last[peer] = now
	return true
}

// Due reports whether a call to peer now would be sampled.
func (n *Node) Due(peer string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	t, ok := n.last[peer]
	return !ok || time.Since(t) >= n.every
}

// ErrBadSample means a sample was refused: an invalid or incompatible
// coordinate, or an impossible round trip.
var ErrBadSample = errors.New("netcoord: bad sample")

// Observe applies one round-trip sample to peer, whose coordinate is c.
func (n *Node) Observe(peer string, c *coordinate.Coordinate, rtt time.Duration) error {
	if peer == "" || peer == n.id || c == nil {
		n.rejected.Add(1)
		return fmt.Errorf("sample of %q: %w", peer, ErrBadSample)
	}
	if _, err := n.cli.Update(peer, c, rtt); err != nil {
		n.rejected.Add(1)
		return fmt.Errorf("sample of %q (%v): %v: %w", peer, rtt, err, ErrBadSample)
	}
	n.samples.Add(1)
	n.mu.Lock()
	if _, ok := n.peers[peer]; !ok && len(n.peers) >= maxPeers {
		clear(n.peers)
	}
	n.peers[peer] = c
	n.mu.Unlock()
	return nil
}

// maxPeers bounds the peers' coordinates kept.
const maxPeers = 4096

// EstimateTo returns the estimated RTT to peer from the coordinate its
// last sample brought (Unknown when none did).
func (n *Node) EstimateTo(peer string) time.Duration {
	n.mu.Lock()
	c := n.peers[peer]
	n.mu.Unlock()
	return Estimate(n.cli.GetCoordinate(), c)
}

// Forget drops what the node kept of peer (its recent samples).
func (n *Node) Forget(peer string) {
	n.cli.ForgetNode(peer)
	n.mu.Lock()
	delete(n.last, peer)
	delete(n.peers, peer)
	n.mu.Unlock()
}

// ToWire converts a coordinate for the wire (nil for nil).
func ToWire(c *coordinate.Coordinate) *wire.Coord {
	if c == nil {
		return nil
	}
	return &wire.Coord{Vec: append([]float64(nil), c.Vec...), Error: c.Error, Adjustment: c.Adjustment, Height: c.Height}
}

// FromWire converts a coordinate from the wire; it returns nil for one
// that is missing or not usable (wrong dimension, not finite).
func FromWire(w *wire.Coord) *coordinate.Coordinate {
	if w == nil || uint(len(w.Vec)) != coordinate.DefaultConfig().Dimensionality {
		return nil
	}
	c := &coordinate.Coordinate{Vec: append([]float64(nil), w.Vec...), Error: w.Error, Adjustment: w.Adjustment, Height: w.Height}
	if !c.IsValid() {
		return nil
	}
	return c
}

// Unknown is the estimate between coordinates that cannot be compared:
// longer than any real one, so such peers rank last.
const Unknown = time.Duration(math.MaxInt64)

// Estimate returns the estimated RTT between a and b (Unknown when either
// is missing or they are not compatible).
func Estimate(a, b *coordinate.Coordinate) time.Duration {
	if a == nil || b == nil || !a.IsCompatibleWith(b) || !a.IsValid() || !b.IsValid() {
		return Unknown
	}
	return a.DistanceTo(b)
}

// UnaryClientInterceptor samples calls to server peer (its ID, as
// authenticated by TLS) made through one connection.
func (n *Node) UnaryClientInterceptor(peer string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		// A call that has to connect first would count the handshakes.
		if cc.GetState() != connectivity.Ready || !n.due(peer, time.Now()) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		var hdr metadata.MD
		ctx = metadata.AppendToOutgoingContext(ctx, wantKey, "1")
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&hdr))...)
		elapsed := time.Since(start)
		if err != nil {
			return err
		}
		if small(req, reply) {
			n.fromHeader(peer, hdr, elapsed)
		}
		return nil
	}
}

// small reports whether a call's messages are small enough for its round
// trip to measure latency.
func small(req, reply any) bool {
	size := 0
	for _, m := range []any{req, reply} {
		pm, ok := m.(proto.Message)
		if !ok {
			return false
		}
		size += proto.Size(pm)
	}
	return size <= maxSampleBytes
}

// fromHeader applies the sample a response header carries, if any.
func (n *Node) fromHeader(peer string, hdr metadata.MD, elapsed time.Duration) {
	vals := hdr.Get(sampleKey)
	if len(vals) == 0 {
		return // an older server, or an in-process shortcut
	}
	var s wire.CoordSample
	if err := proto.Unmarshal([]byte(vals[0]), &s); err != nil {
		n.rejected.Add(1)
		return
	}
	c := FromWire(s.Coord)
	rtt := elapsed - time.Duration(s.ServerUs)*time.Microsecond
	if c == nil || rtt < 0 {
		n.rejected.Add(1)
		return
	}
	n.Observe(peer, c, rtt) // counts its own refusals
}

// UnaryServerInterceptor answers calls that ask for a sample with the
// node's coordinate and the time spent on the call.
func (n *Node) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if len(md.Get(wantKey)) == 0 {
			return handler(ctx, req)
		}
		start := time.Now()
		resp, err := handler(ctx, req)
		b, merr := proto.Marshal(&wire.CoordSample{Coord: n.Wire(), ServerUs: uint64(time.Since(start).Microseconds())})
		if merr == nil {
			// Fails only when the response already went out, which a unary
			// handler cannot have done.
			_ = grpc.SetHeader(ctx, metadata.Pairs(sampleKey, string(b)))
		}
		return resp, err
	}
}
