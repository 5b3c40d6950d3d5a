package server

import (
	"testing"
	"time"
)

func TestTransfersSizeCallsByRate(t *testing.T) {
	x := newTransfers(10 * time.Second)
	if got := x.blocks("p"); got != firstTransfer/blockSize {
		t.Fatalf("first call: %d blocks, want %d", got, firstTransfer/blockSize)
	}
	// 6 Mbit/s: a call should take a quarter of the timeout, 2.5 s.
	const rate = 750_000
	for range 20 {
		x.done("p", 2<<20, time.Duration(2<<20*int64(time.Second)/rate), false)
	}
	want := rate * 10 / 4 / blockSize
	if got := x.blocks("p"); got < want-1 || got > want+1 {
		t.Errorf("at 6 Mbit/s: %d blocks per call, want about %d", got, want)
	}
	// A timeout quarters the size, down to one block.
	before := x.blocks("p")
	x.done("p", 0, 10*time.Second, true)
	if got := x.blocks("p"); got != max(1, before/4) {
		t.Errorf("after a timeout: %d blocks, want %d", got, max(1, before/4))
	}
	for range 10 {
		x.done("p", 0, 10*time.Second, true)
	}
	if got := x.blocks("p"); got != 1 {
		t.Errorf("after many timeouts: %d blocks, want 1", got)
	}
	// A fast link is capped; other peers are unaffected.
	for range 20 {
		x.done("lan", 8<<20, 10*time.Millisecond, false)
	}
	if got := x.blocks("lan"); got != maxTransfer/blockSize {
		t.Errorf("fast link: %d blocks, want the cap %d", got, maxTransfer/blockSize)
	}
	if got := x.blocks("p"); got != 1 {
		t.Errorf("slow peer after the fast one's calls: %d blocks, want 1", got)
	}
}
