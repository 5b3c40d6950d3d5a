package server

import (
	"sync"
	"time"
)

// Block transfers between servers (replication, fetches) go in calls of
// a size the link carries well within PeerTimeout: a fixed 8 MiB call
// over a 6 Mbit/s uplink takes 11 s and, bounded by a 10 s timeout, never
// completes. Each peer's rate is learnt from the calls themselves.

const (
	minTransfer   = blockSize // one block: a call always makes progress
	firstTransfer = 2 << 20   // before anything is known of the link
	maxTransfer   = maxInlineBlocks
)

// transfers sizes block-carrying calls per peer.
type transfers struct {
	timeout time.Duration // the bound of one call (PeerTimeout)
	mu      sync.Mutex
	rate    map[string]float64 // peer → bytes per second, smoothed
	size    map[string]int     // peer → bytes per call
}

func newTransfers(timeout time.Duration) *transfers {
	return &transfers{timeout: timeout, rate: map[string]float64{}, size: map[string]int{}}
}

// blocks returns how many blocks the next call with peer should carry.
func (t *transfers) blocks(peer string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.size[peer]
	if !ok {
		n = firstTransfer
	}
	return max(1, n/blockSize)
}

// duration is how long n bytes take to peer at the rate seen (0: not
// known yet).
func (t *transfers) duration(peer string, n int) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rate[peer]
	if !ok || r <= 0 || n <= 0 {
		return 0
	}
	return time.Duration(float64(n) / r * float64(time.Second))
}

// done records a call with peer that moved n bytes in d, or failed with
// a timeout (timedOut): the next call is sized to take a quarter of the
// timeout at the rate seen, and a timed-out call quarters it.
func (t *transfers) done(peer string, n int, d time.Duration, timedOut bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur, ok := t.size[peer]
	if !ok {
		cur = firstTransfer
	}
	if timedOut {
		t.size[peer] = max(minTransfer, cur/4)
		return
	}
	if n < minTransfer || d <= 0 {
		return // too small to say anything about the rate
	}
	r := float64(n) / d.Seconds()
	if old, ok := t.rate[peer]; ok {
		r = 0.7*old + 0.3*r
	}
	t.rate[peer] = r
	want := int(r * t.timeout.Seconds() / 4)
	t.size[peer] = min(maxTransfer, max(minTransfer, want))
}
