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
	got := o.Hand(now, 1, "a", "s", blocks(0, 10), false)
	if !slices.Equal(got, blocks(0, 4)) {
		t.Fatalf("first hand-out %v, want the window's 4", got)
	}
	if again := o.Hand(now, 1, "b", "s", blocks(10, 4), false); len(again) != 0 {
		t.Fatalf("a full window handed %v", again)
	}
	// Asking again for blocks already handed out is not more of them.
	if again := o.Hand(now, 1, "a", "s", blocks(0, 2), false); !slices.Equal(again, blocks(0, 2)) {
		t.Fatalf("handed again %v, want [0 1]", again)
	}
	// Reports within the target: the window grows by one per block.
	now = now.Add(200 * time.Millisecond)
	o.Held(now, 1, "a", []Range{{0, 4}})
	if w, out := o.Window(); w != 8 || out != 0 {
		t.Fatalf("after 4 prompt reports: window %d, out %d; want 8, 0", w, out)
	}
	// Reports from another node or file release nothing.
	o.Hand(now, 1, "a", "s", blocks(4, 8), false)
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
	if got := o.Hand(now, 1, "b", "s", blocks(50, 8), false); len(got) != 4 {
		t.Fatalf("hand-out %v, want the window's 4", got)
	}
	if got := o.Hand(now, 1, "c", "s", blocks(100, 4), true); !slices.Equal(got, blocks(100, 2)) {
		t.Fatalf("urgent hand-out %v, want the reserve's 2", got)
	}
	// Failed blocks leave the window; lost ones (not reported within
	// Expire) too.
	o.Failed(now, 1, "c", []Range{{100, 2}})
	o.Failed(now, 1, "b", []Range{{50, 4}})
	now = now.Add(20 * time.Second)
	o.Hand(now, 1, "d", "s", nil, false)
	if w, out := o.Window(); out != 0 || w != 4 {
		t.Fatalf("after failure and expiry: window %d, out %d; want 4 (the minimum), 0", w, out)
	}
	// The window stays within MaxWindow.
	for i := range 100 {
		b := uint64(1000 + i)
		o.Hand(now, 1, "e", "s", []uint64{b}, false)
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
	o.Hand(now, 1, "a", "s", blocks(10, 4), false)
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

// TestOriginSharesBySite: the window is shared evenly among the sites
// that asked within activeFor, whoever asks first; a site alone gets all
// of it; the urgent reserve applies to the share too.
func TestOriginSharesBySite(t *testing.T) {
	o := NewOrigin(OriginOptions{MinWindow: 12})
	now := time.Unix(1000, 0)
	if got := o.Hand(now, 1, "a1", "A", blocks(0, 20), false); len(got) != 12 {
		t.Fatalf("a site alone got %d blocks, want the whole window of 12", len(got))
	}
	o.Held(now.Add(10*time.Millisecond), 1, "a1", []Range{{0, 12}}) // window 24
	now = now.Add(20 * time.Millisecond)
	o.Hand(now, 1, "b1", "B", nil, false)
	o.Hand(now, 1, "c1", "C", nil, false)
	if w, _ := o.Window(); w != 24 {
		t.Fatalf("window %d, want 24", w)
	}
	// Three sites asking: 8 each, however many nodes a site has and
	// whoever asks first.
	a := len(o.Hand(now, 1, "a1", "A", blocks(100, 20), false)) + len(o.Hand(now, 1, "a2", "A", blocks(200, 20), false))
	b := len(o.Hand(now, 1, "b1", "B", blocks(300, 20), false))
	c := len(o.Hand(now, 1, "c1", "C", blocks(400, 20), true))
	if a != 8 || b != 8 || c != 8+2 {
		t.Fatalf("site A got %d, B %d, C (urgent) %d; want 8, 8 and 10 (8 + the reserve)", a, b, c)
	}
	// A site that stopped asking leaves its share to the others.
	o.Held(now, 1, "a1", []Range{{100, 8}})
	o.Held(now, 1, "b1", []Range{{300, 8}})
	o.Held(now, 1, "c1", []Range{{400, 10}})
	now = now.Add(activeFor)
	w, _ := o.Window()
	if got := o.Hand(now, 1, "b1", "B", blocks(500, 100), false); len(got) != w {
		t.Fatalf("the only site still asking got %d blocks, want the window's %d", len(got), w)
	}
}

// TestOriginEndGame: blocks others hold are handed out only once every
// block of the file has been handed out, within the window and share,
// and only for endGameFor after the last block's first hand-out.
func TestOriginEndGame(t *testing.T) {
	o := NewOrigin(OriginOptions{MinWindow: 8})
	now := time.Unix(1000, 0)
	if got := o.HandLast(now, 1, "b1", "B", blocks(0, 4), 6); len(got) != 0 {
		t.Fatalf("end game before any hand-out: %v", got)
	}
	o.Hand(now, 1, "a1", "A", blocks(0, 5), false)
	if got := o.HandLast(now, 1, "b1", "B", blocks(0, 4), 6); len(got) != 0 {
		t.Fatalf("end game with block 5 of 6 never handed out: %v", got)
	}
	o.Hand(now, 1, "a1", "A", blocks(5, 1), false) // 6 of 8 out
	if got := o.HandLast(now, 1, "b1", "B", blocks(0, 4), 6); !slices.Equal(got, blocks(0, 2)) {
		t.Fatalf("end game handed %v, want [0 1] (the window's 8)", got)
	}
	o.Held(now.Add(time.Second), 1, "a1", []Range{{0, 6}})
	o.Held(now.Add(time.Second), 1, "b1", []Range{{0, 2}})
	later := now.Add(endGameFor)
	if got := o.HandLast(later, 1, "c1", "C", blocks(0, 4), 6); len(got) != 0 {
		t.Fatalf("end game %v after endGameFor: late readers read from holders", got)
	}
}
