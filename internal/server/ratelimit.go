package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Defaults of RateLimit: far above what one busy mount sends (a client
// core answers most lookups from leases, and moves 16 blocks per call),
// far below what it takes to keep a server from everyone else.
const (
	DefaultClientRate  = 2000
	DefaultClientBurst = 4000
	DefaultClientWait  = 250 * time.Millisecond
)

// RateLimit bounds the Storage requests of each client node (one token
// bucket per certificate name), so that one client cannot starve a
// server. The Peer service (replication, reconciliation, two-step
// operations) is not limited: only registered servers may call it. Calls
// from this process (the host's own mount) are not limited either.
type RateLimit struct {
	// Rate is the sustained requests per second of one node (0:
	// DefaultClientRate; negative: no limit). A request that moves
	// blocks costs one more per 16 blocks.
	Rate float64
	// Burst is how many requests a node may make at once (0:
	// DefaultClientBurst).
	Burst int
	// Wait is how long a request over the rate may wait for its turn;
	// one that would wait longer is refused at once with EAGAIN
	// (codes.ResourceExhausted), which the client core retries with
	// backoff within the operation's time bound (0: DefaultClientWait).
	Wait time.Duration
}

func (r RateLimit) withDefaults() RateLimit {
	if r.Rate == 0 {
		r.Rate = DefaultClientRate
	}
	if r.Burst <= 0 {
		r.Burst = DefaultClientBurst
	}
	if r.Wait <= 0 {
		r.Wait = DefaultClientWait
	}
	return r
}

// Bounds of the limiter's memory: buckets idle this long are dropped
// (they would be full again), looked for once this many exist.
const (
	bucketIdle   = time.Minute
	bucketsPrune = 1024
	// warnEvery spaces the warnings about one throttled node.
	warnEvery = 10 * time.Second
)

// rateLimits holds the token buckets of the client nodes.
type rateLimits struct {
	cfg RateLimit
	log *slog.Logger

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	lim    *rate.Limiter
	used   time.Time // last request
	warned time.Time // last warning
}

func newRateLimits(cfg RateLimit, log *slog.Logger) *rateLimits {
	return &rateLimits{cfg: cfg.withDefaults(), log: log, buckets: map[string]*bucket{}}
}

// cost is what a request takes from its node's bucket.
func cost(req any) int {
	n := 0
	switch r := req.(type) {
	case *wire.ReadBlocksRequest:
		n = len(r.Hashes)
	case *wire.PutBlocksRequest:
		n = len(r.Data)
	}
	return 1 + n/16
}

// wait takes n tokens from node's bucket, waiting up to cfg.Wait for
// them; a request that would wait longer is refused with ErrAgain.
func (l *rateLimits) wait(ctx context.Context, node string, n int) error {
	if l.cfg.Rate < 0 {
		return nil
	}
	n = min(n, l.cfg.Burst)
	now := time.Now()
	l.mu.Lock()
	b := l.buckets[node]
	if b == nil {
		if len(l.buckets) >= bucketsPrune {
			for k, x := range l.buckets {
				if now.Sub(x.used) > bucketIdle {
					delete(l.buckets, k)
				}
			}
		}
		b = &bucket{lim: rate.NewLimiter(rate.Limit(l.cfg.Rate), l.cfg.Burst)}
		l.buckets[node] = b
	}
	b.used = now
	r := b.lim.ReserveN(now, n)
	d := r.DelayFrom(now)
	if d > l.cfg.Wait {
		r.CancelAt(now)
		warn := now.Sub(b.warned) >= warnEvery
		if warn {
			b.warned = now
		}
		l.mu.Unlock()
		if warn {
			l.log.Warn("client over its request rate; refusing requests", "node", node, "rate", l.cfg.Rate, "burst", l.cfg.Burst)
		}
		return fmt.Errorf("client %s over its rate of %v requests/s: %w", node, l.cfg.Rate, fserr.ErrAgain)
	}
	l.mu.Unlock()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.Cancel()
		return ctx.Err()
	}
}
