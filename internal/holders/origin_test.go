package holders

import (
	"slices"
	"testing"
	"time"
)

func blocks(first, n uint64) []uint64 {
	var out []uint64
	for b := first; b < first+n; b++ {
		out = append(out, b)
	}
	return out
}

// TestOriginWindow: the window bounds what is handed out, grows while
// reports come within Target of the least delay, halves when they come
// later than twice that or a block is lost, and never falls below its
// minimum.
func TestOriginWindow(t *testing.T) {
	o := NewOrigin(OriginOptions{Target: time.Second, MinWindow: 4, MaxWindow: 64, Expire: 10 * time.Second})
	now := time.Unix(1000, 0)
	got := o.Hand(now, 1, "a", blocks(0, 10), false)
	if !slices.Equal(got, blocks(0, 4)) {
		t.Fatalf("first hand-out %v, want the window's 4", got)
	}
	if again := o.Hand(now, 1, "b", blocks(10, 4), false); len(again) != 0 {
		t.Fatalf("a full window handed %v", again)
	}
	// Asking again for blocks already handed out is not more of them.
	if again := o.Hand(now, 1, "a", blocks(0, 2), false); !slices.Equal(again, blocks(0, 2)) {
		t.Fatalf("handed again %v, want [0 1]", again)
	}
	// Reports within the target: the window grows by one per block.
	now = now.Add(200 * time.Millisecond)
	o.Held(now, 1, "a", []Range{{0, 4}})
	if w, out := o.Window(); w != 8 || out != 0 {
		t.Fatalf("after 4 prompt reports: window %d, out %d; want 8, 0", w, out)
	}
	// Reports from another node or file release nothing.
	o.Hand(now, 1, "a", blocks(4, 8), false)
	o.Held(now, 2, "a", []Range{{4, 8}})
	o.Held(now, 1, "b", []Range{{4, 8}})
	if _, out := o.Window(); out != 8 {
		t.Fatalf("foreign reports released blocks: %d out, want 8", out)
	}
	// A report 3 s after hand-out (2.8 s above the least delay) halves.
	now = now.Add(3 * time.Second)
	o.Held(now, 1, "a", []Range{{4, 1}})
	if w, _ := o.Window(); w != 4 {
		t.Fatalf("after a late report: window %d, want 4", w)
	}
	// Later reports of the same queue do not cut again within one delay.
	o.Held(now.Add(100*time.Millisecond), 1, "a", []Range{{5, 1}})
	if w, _ := o.Window(); w != 4 {
		t.Fatalf("second late report within a delay cut again: window %d", w)
	}
	// Urgent blocks go beyond a full window, within a reserve, and count
	// in it.
	o.Held(now, 1, "a", []Range{{6, 6}})
	if got := o.Hand(now, 1, "b", blocks(50, 8), false); len(got) != 4 {
		t.Fatalf("hand-out %v, want the window's 4", got)
	}
	if got := o.Hand(now, 1, "c", blocks(100, 4), true); !slices.Equal(got, blocks(100, 2)) {
		t.Fatalf("urgent hand-out %v, want the reserve's 2", got)
	}
	// Failed blocks leave the window; lost ones (not reported within
	// Expire) too.
	o.Failed(now, 1, "c", []Range{{100, 2}})
	o.Failed(now, 1, "b", []Range{{50, 4}})
	now = now.Add(20 * time.Second)
	o.Hand(now, 1, "d", nil, false)
	if w, out := o.Window(); out != 0 || w != 4 {
		t.Fatalf("after failure and expiry: window %d, out %d; want 4 (the minimum), 0", w, out)
	}
	// The window stays within MaxWindow.
	for i := range 100 {
		b := uint64(1000 + i)
		o.Hand(now, 1, "e", []uint64{b}, false)
		o.Held(now.Add(10*time.Millisecond), 1, "e", []Range{{b, 1}})
	}
	if w, _ := o.Window(); w != 64 {
		t.Fatalf("window %d after 100 prompt reports, want the maximum 64", w)
	}
}

// TestExpect: a holder-to-be is named for what it fetches until it
// reports it or PendingTTL passes; what it reported stays for the TTL.
func TestExpect(t *testing.T) {
	tab := New(Options{TTL: time.Minute, PendingTTL: 10 * time.Second})
	now := time.Unix(1000, 0)
	a := Holder{Node: "a", Site: "s1", Addr: "a:1"}
	tab.Expect(now, 7, 1, a, []Range{{0, 4}})
	if got := tab.Lookup(now, 7, 1, []Range{{0, 8}}, nil, "s2", "x", 3, 16); len(got) != 1 || !slices.Equal(got[0].Blocks, []Range{{0, 4}}) {
		t.Fatalf("lookup of a holder-to-be: %+v", got)
	}
	// It reports two of the four; the other two stop counting after
	// PendingTTL, the reported ones do not.
	tab.Report(now.Add(time.Second), 7, 1, a, []Range{{0, 2}})
	later := now.Add(11 * time.Second)
	if got := tab.Lookup(later, 7, 1, []Range{{0, 8}}, nil, "s2", "x", 3, 16); len(got) != 1 || !slices.Equal(got[0].Blocks, []Range{{0, 2}}) {
		t.Fatalf("lookup after PendingTTL: %+v, want blocks [0,2) only", got)
	}
	// Expecting again names it again; the asker is never named.
	tab.Expect(later, 7, 1, a, []Range{{2, 1}})
	if got := tab.Lookup(later, 7, 1, []Range{{0, 8}}, nil, "s2", "x", 3, 16); len(got) != 1 || !slices.Equal(got[0].Blocks, []Range{{0, 3}}) {
		t.Fatalf("lookup after a second Expect: %+v", got)
	}
	if got := tab.Lookup(later, 7, 1, []Range{{0, 8}}, nil, "s2", "a", 3, 16); len(got) != 0 {
		t.Fatalf("the asker named as a holder: %+v", got)
	}
	// A newer version forgets holders-to-be as it forgets holders.
	tab.Expect(later, 7, 2, Holder{Node: "b"}, []Range{{0, 1}})
	if got := tab.Lookup(later, 7, 1, []Range{{0, 8}}, nil, "s2", "x", 3, 16); len(got) != 0 {
		t.Fatalf("old version's holders after a new one: %+v", got)
	}
}

// TestOriginHugeRanges: a report or a tried list naming a huge range (a
// client's input) costs what is handed out, not the range's length.
func TestOriginHugeRanges(t *testing.T) {
	o := NewOrigin(OriginOptions{MinWindow: 4})
	now := time.Unix(1000, 0)
	o.Hand(now, 1, "a", blocks(10, 4), false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.Held(now.Add(100*time.Millisecond), 1, "a", []Range{{0, 1 << 62}})
		o.Failed(now, 1, "a", []Range{{0, ^uint64(0) - 1}})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a huge range kept the window busy")
	}
	if _, out := o.Window(); out != 0 {
		t.Fatalf("%d blocks still out after a report covering them", out)
	}
}
