package holders

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
)

func TestAdd(t *testing.T) {
	tests := []struct {
		in   []Range
		add  Range
		want []Range
	}{
		{nil, Range{5, 2}, []Range{{5, 2}}},
		{[]Range{{5, 2}}, Range{0, 0}, []Range{{5, 2}}},
		{[]Range{{5, 2}}, Range{7, 1}, []Range{{5, 3}}},                  // adjacent after
		{[]Range{{5, 2}}, Range{3, 2}, []Range{{3, 4}}},                  // adjacent before
		{[]Range{{5, 2}}, Range{0, 2}, []Range{{0, 2}, {5, 2}}},          // apart before
		{[]Range{{5, 2}}, Range{9, 2}, []Range{{5, 2}, {9, 2}}},          // apart after
		{[]Range{{0, 2}, {5, 2}, {9, 2}}, Range{1, 9}, []Range{{0, 11}}}, // swallows
		{[]Range{{0, 2}, {5, 2}, {20, 1}}, Range{6, 3}, []Range{{0, 2}, {5, 4}, {20, 1}}},
	}
	for _, tt := range tests {
		got := Add(slices.Clone(tt.in), tt.add)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Add(%v, %v) = %v, want %v", tt.in, tt.add, got, tt.want)
		}
	}
	rs := []Range{{0, 2}, {5, 2}}
	for idx, want := range map[uint64]bool{0: true, 1: true, 2: false, 4: false, 5: true, 6: true, 7: false} {
		if Contains(rs, idx) != want {
			t.Errorf("Contains(%v, %d) = %v", rs, idx, !want)
		}
	}
}

// at returns a coordinate ms milliseconds from the origin along the first
// axis (no height), so distances are differences of ms.
func at(ms float64) *coordinate.Coordinate {
	c := coordinate.NewCoordinate(coordinate.DefaultConfig())
	c.Vec[0] = ms / 1000
	c.Height = 0
	return c
}

func nodes(rs []Result) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Node)
	}
	return out
}

func TestLookupRanksByDistance(t *testing.T) {
	tb := New(Options{})
	now := time.Unix(1000, 0)
	all := []Range{{0, 10}}
	tb.Report(now, 1, 3, Holder{Node: "far", Coord: at(200)}, all)
	tb.Report(now, 1, 3, Holder{Node: "near", Coord: at(10)}, all)
	tb.Report(now, 1, 3, Holder{Node: "mid", Coord: at(90)}, all)
	tb.Report(now, 1, 3, Holder{Node: "nocoord"}, all)
	tb.Report(now, 1, 3, Holder{Node: "me", Coord: at(0)}, all)

	got := tb.Lookup(now, 1, 3, []Range{{2, 3}}, at(0), "", "me", 10, 10)
	if want := []string{"near", "mid", "far", "nocoord"}; !slices.Equal(nodes(got), want) {
		t.Fatalf("order %v, want %v", nodes(got), want)
	}
	if got[0].RTT < 9*time.Millisecond || got[0].RTT > 11*time.Millisecond {
		t.Errorf("near RTT %v, want 10ms", got[0].RTT)
	}
	if !slices.Equal(got[0].Blocks, []Range{{2, 3}}) {
		t.Errorf("blocks %v, want only the asked ones", got[0].Blocks)
	}
	// perBlock 2: the two nearest cover every block twice.
	if got := tb.Lookup(now, 1, 3, []Range{{0, 10}}, at(0), "", "me", 2, 10); !slices.Equal(nodes(got), []string{"near", "mid"}) {
		t.Errorf("perBlock 2 gave %v", nodes(got))
	}
	if got := tb.Lookup(now, 1, 3, []Range{{0, 10}}, at(0), "", "me", 10, 1); !slices.Equal(nodes(got), []string{"near"}) {
		t.Errorf("max 1 gave %v", nodes(got))
	}
}

// TestLookupOwnSiteFirst: holders at the asker's site come first even
// when their coordinates put them farther than a holder elsewhere.
func TestLookupOwnSiteFirst(t *testing.T) {
	tb := New(Options{})
	now := time.Unix(1000, 0)
	all := []Range{{0, 10}}
	tb.Report(now, 1, 3, Holder{Node: "there", Site: "east", Coord: at(10)}, all)
	tb.Report(now, 1, 3, Holder{Node: "here", Site: "west", Coord: at(40)}, all)
	if got := nodes(tb.Lookup(now, 1, 3, all, at(0), "west", "", 1, 10)); !slices.Equal(got, []string{"here"}) {
		t.Errorf("asker at west: %v, want only here (one holder per block)", got)
	}
	if got := nodes(tb.Lookup(now, 1, 3, all, at(0), "", "", 1, 10)); !slices.Equal(got, []string{"there"}) {
		t.Errorf("asker of no site: %v, want the nearer there", got)
	}
}

func TestLookupSkipsHoldersWithoutNeededBlocks(t *testing.T) {
	tb := New(Options{})
	now := time.Unix(1000, 0)
	tb.Report(now, 1, 1, Holder{Node: "near", Coord: at(1)}, []Range{{0, 5}})
	tb.Report(now, 1, 1, Holder{Node: "mid", Coord: at(5)}, []Range{{0, 5}})
	tb.Report(now, 1, 1, Holder{Node: "far", Coord: at(50)}, []Range{{5, 5}})
	got := tb.Lookup(now, 1, 1, []Range{{0, 10}}, at(0), "", "", 1, 10)
	if !slices.Equal(nodes(got), []string{"near", "far"}) {
		t.Errorf("got %v, want near (blocks 0-4) and far (5-9)", nodes(got))
	}
}

func TestVersions(t *testing.T) {
	tb := New(Options{})
	now := time.Unix(1000, 0)
	tb.Report(now, 1, 5, Holder{Node: "a"}, []Range{{0, 1}})
	tb.Report(now, 1, 4, Holder{Node: "old"}, []Range{{0, 1}}) // older: ignored
	if got := tb.Lookup(now, 1, 5, []Range{{0, 1}}, nil, "", "", 3, 8); !slices.Equal(nodes(got), []string{"a"}) {
		t.Fatalf("version 5 holders %v, want [a]", nodes(got))
	}
	if got := tb.Lookup(now, 1, 4, []Range{{0, 1}}, nil, "", "", 3, 8); got != nil {
		t.Errorf("a lookup of an older version got %v", nodes(got))
	}
	// A newer version reported forgets the older's holdings.
	tb.Report(now, 1, 6, Holder{Node: "b"}, []Range{{0, 1}})
	if got := tb.Lookup(now, 1, 6, []Range{{0, 1}}, nil, "", "", 3, 8); !slices.Equal(nodes(got), []string{"b"}) {
		t.Errorf("version 6 holders %v, want [b]", nodes(got))
	}
	// A newer version asked for forgets too.
	if got := tb.Lookup(now, 1, 7, []Range{{0, 1}}, nil, "", "", 3, 8); got != nil {
		t.Errorf("version 7 holders %v, want none", nodes(got))
	}
	if n, cost := tb.Size(); n != 0 || cost != 0 {
		t.Errorf("size %d cost %d after a newer version was asked for, want 0", n, cost)
	}
	tb.Report(now, 2, 1, Holder{Node: "a"}, []Range{{0, 1}})
	tb.Forget(2)
	if n, _ := tb.Size(); n != 0 {
		t.Errorf("%d holdings after Forget", n)
	}
}

func TestExpiry(t *testing.T) {
	tb := New(Options{TTL: time.Minute})
	t0 := time.Unix(1000, 0)
	tb.Report(t0, 1, 1, Holder{Node: "a"}, []Range{{0, 1}})
	tb.Report(t0.Add(30*time.Second), 1, 1, Holder{Node: "b"}, []Range{{0, 1}})
	got := tb.Lookup(t0.Add(70*time.Second), 1, 1, []Range{{0, 1}}, nil, "", "", 3, 8)
	if !slices.Equal(nodes(got), []string{"b"}) {
		t.Errorf("after 70 s: %v, want [b]", nodes(got))
	}
	// A fresh report keeps a holding alive.
	tb.Report(t0.Add(80*time.Second), 1, 1, Holder{Node: "b"}, []Range{{1, 1}})
	got = tb.Lookup(t0.Add(130*time.Second), 1, 1, []Range{{0, 2}}, nil, "", "", 3, 8)
	if !slices.Equal(nodes(got), []string{"b"}) || !slices.Equal(got[0].Blocks, []Range{{0, 2}}) {
		t.Errorf("after 130 s: %v, want b with blocks 0-1", got)
	}
	if n, _ := tb.Size(); n != 1 {
		t.Errorf("%d holdings, want 1", n)
	}
}

func TestBounded(t *testing.T) {
	tb := New(Options{MaxCost: 100, MaxRanges: 4})
	now := time.Unix(1000, 0)
	for i := range 1000 {
		// Every other block: one range per block, up to MaxRanges.
		var rs []Range
		for b := range 10 {
			rs = append(rs, Range{First: uint64(2 * b), Count: 1})
		}
		tb.Report(now.Add(time.Duration(i)*time.Millisecond), uint64(i%50), 1, Holder{Node: fmt.Sprint("n", i%37)}, rs)
		if _, cost := tb.Size(); cost > 100 {
			t.Fatalf("cost %d after %d reports, cap 100", cost, i+1)
		}
	}
	n, cost := tb.Size()
	if n == 0 || cost > 100 {
		t.Errorf("%d holdings, cost %d", n, cost)
	}
	// The most recent report survives; the oldest went.
	if got := tb.Lookup(now.Add(time.Second), 999%50, 1, []Range{{0, 1}}, nil, "", "", 1, 1); len(got) != 1 || got[0].Node != fmt.Sprint("n", 999%37) {
		t.Errorf("the newest holding is gone: %v", got)
	}
	// Ten single-block ranges were reported; MaxRanges kept four.
	got := tb.Lookup(now.Add(time.Second), 999%50, 1, []Range{{0, 20}}, nil, "", "", 1, 1)
	if len(got) != 1 || len(got[0].Blocks) != 4 {
		t.Errorf("newest holding: %v, want 4 ranges", got)
	}
}
