package client

import (
	"testing"
	"time"
)

// TestSiteCost: the per-site cost of far fetches is a moving average per
// block; an unknown site costs nothing (worth a try), and a failed
// request counts as one block that took the whole try.
func TestSiteCost(t *testing.T) {
	var p peerState
	p.init(PeerConfig{})
	if c := p.siteCost("eu"); c != 0 {
		t.Fatalf("unknown site costs %v", c)
	}
	p.noteSiteCost("eu", 200*time.Millisecond, 2) // 100 ms a block
	if c := p.siteCost("eu"); c != 100*time.Millisecond {
		t.Fatalf("first sample: %v, want 100ms", c)
	}
	p.noteSiteCost("eu", 5*time.Second, 0) // a try that ran out
	if c := p.siteCost("eu"); c != 100*time.Millisecond+(5*time.Second-100*time.Millisecond)*3/10 {
		t.Fatalf("after a failure: %v", c)
	}
	p.noteSiteCost("east", 50*time.Millisecond, 1)
	if p.siteCost("east") >= p.siteCost("eu") {
		t.Fatalf("east (%v) should look cheaper than eu (%v)", p.siteCost("east"), p.siteCost("eu"))
	}
}
