package client

import (
	"context"
	"crypto/sha256"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/blockgrant"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Clients serve their caches to each other (.Hotspot, paper §5.5–5.6): a
// client reading with the cue shows a holder the grant its file's primary
// signed, and the holder sends the named blocks it has cached, no faster
// than its upload limit.

// PeerConfig configures the peer side of a client.
type PeerConfig struct {
	// Addr is where this client serves its cache (reported to primaries
	// with the blocks it holds); empty: it does not serve.
	Addr string
	// Dial returns a client of the PeerCache service of node at addr,
	// authenticated as node (mutual TLS). Nil: no fetching from peers.
	Dial func(ctx context.Context, node, addr string) (wire.PeerCacheClient, error)
	// Grants checks the grants shown to this client (nil: it serves
	// nobody).
	Grants *blockgrant.Verifier
	// UploadRate bounds the bytes per second served to peers (0:
	// unlimited).
	UploadRate int64
	// UploadConcurrency bounds the requests served at once (default
	// DefaultUploadConcurrency); as many more may wait, the rest are
	// turned away so that their readers try another holder.
	UploadConcurrency int
	// ServeHook, for fault tests, alters (or holds up) every block this
	// client serves.
	ServeHook func(b []byte) []byte
}

// DefaultUploadConcurrency is how many peer requests a client serves at
// once by default.
const DefaultUploadConcurrency = 4

// PeerStats counts the .Hotspot traffic of a client.
type PeerStats struct {
	// FromPeers, FromReplicas and FromPrimary are block bytes this client
	// fetched for .Hotspot reads from other clients' caches, from replicas
	// that are not the primary, and from the primary.
	FromPeers, FromReplicas, FromPrimary int64
	// Served is block bytes this client sent to other clients.
	Served int64
	// Corrupt counts blocks a peer sent that did not match their hash.
	Corrupt int64
	// Refused counts peer requests this client refused (bad grant, or
	// too many waiting).
	Refused int64
}

type peerState struct {
	cfg   PeerConfig
	sem   chan struct{} // requests being served
	queue chan struct{} // requests being served or waiting
	limit *rate.Limiter // nil: unlimited
	fromPeers, fromReplicas, fromPrimary,
	served, corrupt, refused atomic.Int64
	rtt      atomic.Int64  // the least recent holders query's round trip (ns)
	rttAt    atomic.Int64  // when it was taken (unix ns)
	awaiting atomic.Int64  // requests waiting for blocks being fetched
	far      chan struct{} // requests for blocks from other sites in flight

	mu  sync.Mutex
	bad map[string]time.Time // peers that sent corrupt data, until when skipped
	// cost is, per site, a moving average of the time a request for
	// blocks from a holder there took per block (guarded by mu).
	cost map[string]time.Duration
	// deferred: blocks left once for a site-mate to bring (mu).
	deferred map[[32]byte]struct{}
	// certs: grant signers' certificates by SHA-256, last the latest
	// (mu): a primary leaves out of a grant the one a reader holds.
	certs map[[32]byte][]byte
	last  [32]byte
}

func (p *peerState) init(cfg PeerConfig) {
	if cfg.UploadConcurrency <= 0 {
		cfg.UploadConcurrency = DefaultUploadConcurrency
	}
	p.cfg = cfg
	p.sem = make(chan struct{}, cfg.UploadConcurrency)
	p.queue = make(chan struct{}, 2*cfg.UploadConcurrency)
	if cfg.UploadRate > 0 {
		p.limit = rate.NewLimiter(rate.Limit(cfg.UploadRate), max(int(cfg.UploadRate/10), BlockSize))
	}
	p.bad = map[string]time.Time{}
	p.cost = map[string]time.Duration{}
	p.deferred = map[[32]byte]struct{}{}
	p.certs = map[[32]byte][]byte{}
	p.far = make(chan struct{}, farInFlight)
}

// noteRTT records a holders query's round trip d, taken at now: the
// least seen within rttFor stands.
func (p *peerState) noteRTT(now time.Time, d time.Duration) {
	cur := time.Duration(p.rtt.Load())
	if cur <= 0 || d < cur || now.Sub(time.Unix(0, p.rttAt.Load())) > rttFor {
		p.rtt.Store(int64(d))
		p.rttAt.Store(now.UnixNano())
	}
}

// rttFor is how long the least round trip seen stands (routes change).
const rttFor = time.Minute

// farInFlight bounds this client's .Hotspot requests for blocks at other
// sites. Their senders' uplinks are what every reader shares: a reader
// with more in flight than its share there moves them no faster, only
// makes every request queue longer, until the tries run out and the
// blocks already sent are wasted (4 × farRequestBlocks blocks is 512 KiB,
// 5 Mbit/s per reader at 100 ms).
const farInFlight = 4

// farSlot waits for a slot for a background request to another site
// (others need none); ok is false when ctx ended first.
func (p *peerState) farSlot(ctx context.Context, background bool) (release func(), ok bool) {
	if !background {
		return func() {}, true
	}
	select {
	case p.far <- struct{}{}:
		return func() { <-p.far }, true
	case <-ctx.Done():
		return nil, false
	}
}

// PeerStats returns the counts of .Hotspot traffic so far.
func (f *FS) PeerStats() PeerStats {
	p := &f.peer
	return PeerStats{FromPeers: p.fromPeers.Load(), FromReplicas: p.fromReplicas.Load(), FromPrimary: p.fromPrimary.Load(),
		Served: p.served.Load(), Corrupt: p.corrupt.Load(), Refused: p.refused.Load()}
}

// PeerService returns this client's PeerCache service (deploy serves it
// on the --peer-listen address).
func (f *FS) PeerService() wire.PeerCacheServer { return peerService{f: f} }

type peerService struct {
	wire.UnimplementedPeerCacheServer
	f *FS
}

// FetchCached implements wire.PeerCacheServer: the asked blocks this
// client has cached, for a caller holding a grant that names it, this
// client, and every asked block, signed by a server of the file's slice.
func (s peerService) FetchCached(ctx context.Context, req *wire.FetchCachedRequest) (*wire.FetchCachedResponse, error) {
	f, p := s.f, &s.f.peer
	if err := s.admit(ctx, req); err != nil {
		p.refused.Add(1)
		f.log.Info("peer request refused", "err", err)
		return nil, err
	}
	if err := s.awaitFetching(ctx, req.Hashes); err != nil {
		return nil, err
	}
	select {
	case p.queue <- struct{}{}:
		defer func() { <-p.queue }()
	default:
		p.refused.Add(1)
		return nil, status.Error(codes.ResourceExhausted, "too many peer requests")
	}
	select {
	case p.sem <- struct{}{}:
		defer func() { <-p.sem }()
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	resp := &wire.FetchCachedResponse{Data: make([][]byte, len(req.Hashes))}
	for i, h := range req.Hashes {
		b, ok := f.cache.Get([32]byte(h))
		if !ok {
			continue
		}
		if p.limit != nil {
			if err := p.limit.WaitN(ctx, len(b)); err != nil {
				return resp, nil // what is sent so far; the reader asks elsewhere for the rest
			}
		}
		if p.cfg.ServeHook != nil {
			b = p.cfg.ServeHook(slices.Clone(b))
		}
		resp.Data[i] = b
		p.served.Add(int64(len(b)))
	}
	return resp, nil
}

// answerMargin is how long before the asker's deadline a holder stops
// waiting for a block it is fetching and answers without it.
const answerMargin = 300 * time.Millisecond

// maxAwaiting bounds the peer requests waiting for blocks this client is
// still fetching.
const maxAwaiting = 64

// awaitFetching waits (within ctx) for those of hashes this client is
// fetching: a reader the primary named as a holder-to-be serves a block
// as soon as it has it, so that the block spreads from it before it has
// the rest (pipelined, as BitTorrent's pieces). A block neither cached
// nor being fetched (or only queued) is answered as missing at once.
func (s peerService) awaitFetching(ctx context.Context, hashes [][]byte) error {
	f, p := s.f, &s.f.peer
	var wait []chan struct{}
	f.fetchMu.Lock()
	for _, h := range hashes {
		if len(h) != 32 {
			continue
		}
		if _, queued := f.queued[[32]byte(h)]; queued {
			continue // not started: it may be long
		}
		if ch, ok := f.inflight[[32]byte(h)]; ok {
			wait = append(wait, ch)
		}
	}
	f.fetchMu.Unlock()
	if len(wait) == 0 {
		return nil
	}
	if p.awaiting.Add(1) > maxAwaiting {
		p.awaiting.Add(-1)
		p.refused.Add(1)
		return status.Error(codes.ResourceExhausted, "too many peer requests waiting")
	}
	defer p.awaiting.Add(-1)
	// Answer (with what is cached) a little before the asker gives up: an
	// empty answer sends it elsewhere, a late one has it skip this holder.
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-answerMargin))
		defer cancel()
	}
	for _, ch := range wait {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil // the caller gave up: what is cached is all there is
		}
	}
	return nil
}

// admit checks req's grant for the calling node.
func (s peerService) admit(ctx context.Context, req *wire.FetchCachedRequest) error {
	f := s.f
	if f.peer.cfg.Grants == nil {
		return status.Error(codes.Unavailable, "this client serves no peers")
	}
	asker, err := pki.PeerName(ctx)
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	b, err := f.peer.cfg.Grants.Check(req.Grant, time.Now())
	if err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	if b.Asker != asker || !slices.Contains(b.Holders, f.cfg.Node) {
		return status.Errorf(codes.PermissionDenied, "grant for %s from %v, asked by %s of %s", b.Asker, b.Holders, asker, f.cfg.Node)
	}
	info, err := f.router.Describe(ctx, oid.ID(b.Id).Slice())
	if err != nil {
		return status.Errorf(codes.Unavailable, "slice of %v: %v", oid.ID(b.Id), err)
	}
	signer := info.Primary.Server == b.Signer || slices.ContainsFunc(info.Replicas, func(r ServerRef) bool { return r.Server == b.Signer })
	if !signer {
		return status.Errorf(codes.PermissionDenied, "grant for %v signed by %s, no server of its slice", oid.ID(b.Id), b.Signer)
	}
	ok := blockgrant.Hashes(b)
	for _, h := range req.Hashes {
		if len(h) != 32 || !ok[[32]byte(h)] {
			return status.Error(codes.PermissionDenied, "a block the grant does not name")
		}
	}
	return nil
}

// skipPeer reports whether node recently sent corrupt data.
func (p *peerState) skipPeer(node string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.bad[node]
	if ok && now.After(until) {
		delete(p.bad, node)
		return false
	}
	return ok
}

// A peer that sent corrupt data is not asked again for badPeerFor, one
// that did not answer in time (or could not be reached) for slowPeerFor.
const (
	badPeerFor  = time.Minute
	slowPeerFor = 10 * time.Second
)

// noteSiteCost records that a request to a holder at site took d and
// brought n blocks (none: d counts as one block's).
func (p *peerState) noteSiteCost(site string, d time.Duration, n int) {
	per := d / time.Duration(max(n, 1))
	p.mu.Lock()
	defer p.mu.Unlock()
	old, ok := p.cost[site]
	if !ok && len(p.cost) >= maxBadPeers {
		clear(p.cost)
	}
	if ok {
		per = old + (per-old)*3/10
	}
	p.cost[site] = per
}

// siteCost returns the average time per block from holders at site (0
// when none was asked yet: worth a try).
func (p *peerState) siteCost(site string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cost[site]
}

// maxCerts bounds the signer certificates a client keeps.
const maxCerts = 64

// lastCert returns the SHA-256 of the last signer certificate received
// (zero: none).
func (p *peerState) lastCert() [32]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// haveCert returns the SHA-256 of the last signer certificate received,
// and the same for a request's have_cert (nil: none).
func (p *peerState) haveCert() ([32]byte, []byte) {
	have := p.lastCert()
	if have == ([32]byte{}) {
		return have, nil
	}
	return have, have[:]
}

// fillCert keeps the certificate g carries, or puts back the one whose
// SHA-256 is have when g came without; false if it has no such one.
func (p *peerState) fillCert(g *wire.Grant, have [32]byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(g.Cert) > 0 {
		sum := sha256.Sum256(g.Cert)
		if _, ok := p.certs[sum]; !ok && len(p.certs) >= maxCerts {
			clear(p.certs)
		}
		p.certs[sum], p.last = g.Cert, sum
		return true
	}
	c, ok := p.certs[have]
	g.Cert = c
	return ok
}

// maxDeferred bounds the blocks remembered as deferred once.
const maxDeferred = 1 << 16

// deferOnce reports whether block h was not left for a site-mate before
// (and now is).
func (p *peerState) deferOnce(h [32]byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.deferred[h]; ok {
		return false
	}
	if len(p.deferred) >= maxDeferred {
		clear(p.deferred)
	}
	p.deferred[h] = struct{}{}
	return true
}

// maxBadPeers bounds the list of peers being skipped.
const maxBadPeers = 1024

func (p *peerState) markBad(node string, now time.Time, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bad) >= maxBadPeers {
		clear(p.bad)
	}
	if until := now.Add(d); until.After(p.bad[node]) {
		p.bad[node] = until
	}
}
