// Package holders is a file primary's soft state for .Hotspot (paper
// §5.5): which clients recently cached (or are fetching) which blocks of
// which version of a file, which of them are nearest to a reader by
// network coordinates, and how many blocks the primary may hand far
// readers to read from it (Origin).
//
// The table is bounded (a cost cap: one unit per holding plus one per
// block range, the least recently reported holdings go first), forgets a
// holding TTL after its last report, forgets a file's holdings when a newer
// version is reported or asked for, and lives in memory only: a server
// that takes a slice over starts with nothing, and clients report again.
package holders

import (
	"cmp"
	"container/list"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/serf/coordinate"

	"github.com/wheelfs/wheelfs/internal/netcoord"
)

// Range is blocks First .. First+Count-1 of a file.
type Range struct{ First, Count uint64 }

func (r Range) end() uint64 { return r.First + r.Count }

// Add returns rs (sorted, disjoint, not adjacent) with r merged in.
func Add(rs []Range, r Range) []Range {
	if r.Count == 0 {
		return rs
	}
	i, _ := slices.BinarySearchFunc(rs, r.First, func(x Range, f uint64) int { return cmp.Compare(x.end(), f) })
	// rs[i] is the first range that ends at or after r.First: it and the
	// ones after it that start by r's end merge with r.
	j := i
	for j < len(rs) && rs[j].First <= r.end() {
		first := min(rs[j].First, r.First)
		r = Range{First: first, Count: max(rs[j].end(), r.end()) - first}
		j++
	}
	return slices.Replace(rs, i, j, r)
}

// Contains reports whether sorted ranges rs hold block idx.
func Contains(rs []Range, idx uint64) bool {
	i, _ := slices.BinarySearchFunc(rs, idx, func(x Range, v uint64) int {
		if x.end() <= v {
			return -1
		}
		return 1
	})
	return i < len(rs) && rs[i].First <= idx
}

// Holder is a client that caches blocks.
type Holder struct {
	Node  string
	Site  string
	Coord *coordinate.Coordinate // nil when unknown: ranked last
	Addr  string                 // where it serves its cache ("": nowhere)
}

// Result is one holder of some asked-for blocks.
type Result struct {
	Holder
	// RTT is the estimated round trip to the asker (netcoord.Unknown
	// without coordinates).
	RTT    time.Duration
	Blocks []Range // the asked-for blocks it holds
}

// Options bound a Table.
type Options struct {
	// MaxCost caps the table: one unit per holding plus one per range
	// (default 1<<20, some tens of MiB).
	MaxCost int
	// MaxRanges caps one holding's ranges (default 4096); more are not
	// recorded.
	MaxRanges int
	// TTL is how long a report counts (default DefaultTTL).
	TTL time.Duration
	// MaxAsk caps the blocks one lookup considers (default 4096).
	MaxAsk int
	// PendingTTL is how long a holder-to-be counts for blocks it is
	// fetching (Expect) before it reports them (default DefaultPendingTTL).
	PendingTTL time.Duration
}

// DefaultPendingTTL is how long a reader counts as a holder of blocks it
// said it is fetching: a few tries' worth. A reader that failed to get
// them stops being named after it.
const DefaultPendingTTL = 15 * time.Second

// DefaultTTL is how long a report counts: a client's memory cache turns
// over in minutes under load, and a stale holder costs a reader only a
// failed fetch before the next one.
const DefaultTTL = 2 * time.Minute

// Table is the soft state of one server. It is safe for concurrent use.
type Table struct {
	opts Options

	mu    sync.Mutex
	files map[uint64]*file
	lru   list.List // of *holding; front: most recently reported
	cost  int
}

type file struct {
	version  uint64
	holdings map[string]*holding
}

type holding struct {
	file    uint64
	holder  Holder
	ranges  []Range
	pending []expected // blocks being fetched, not reported yet
	at      time.Time
	elem    *list.Element
}

// expected is blocks a holder-to-be said (at) it is fetching.
type expected struct {
	Range
	at time.Time
}

func (h *holding) cost() int { return 1 + len(h.ranges) + len(h.pending) }

// prunePending drops what the holder expected to have before now-ttl.
func (h *holding) prunePending(now time.Time, ttl time.Duration) {
	h.pending = slices.DeleteFunc(h.pending, func(e expected) bool { return now.Sub(e.at) >= ttl })
}

// has reports whether the holder has (or is fetching) block idx.
func (h *holding) has(idx uint64, now time.Time, ttl time.Duration) bool {
	if Contains(h.ranges, idx) {
		return true
	}
	for _, e := range h.pending {
		if now.Sub(e.at) < ttl && e.First <= idx && idx < e.end() {
			return true
		}
	}
	return false
}

// New returns an empty table.
func New(o Options) *Table {
	if o.MaxCost <= 0 {
		o.MaxCost = 1 << 20
	}
	if o.MaxRanges <= 0 {
		o.MaxRanges = 4096
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.MaxAsk <= 0 {
		o.MaxAsk = 4096
	}
	if o.PendingTTL <= 0 {
		o.PendingTTL = DefaultPendingTTL
	}
	return &Table{opts: o, files: map[uint64]*file{}}
}

// Report records that h cached blocks of version of file at now. A report
// of a version older than the newest known is ignored; a newer one
// forgets every holding of the older.
func (t *Table) Report(now time.Time, fileID, version uint64, h Holder, blocks []Range) {
	t.update(now, fileID, version, h, func(hd *holding) {
		for _, r := range blocks {
			if next := Add(hd.ranges, r); len(next) <= t.opts.MaxRanges {
				hd.ranges = next
			}
		}
	})
}

// Expect records that h is fetching blocks of version of file at now: it
// is named as their holder for PendingTTL, or until it reports them. A
// holder-to-be serves a block as soon as it has it, so that a block
// leaves its origin once and spreads from the readers that have it
// (BitTorrent's pipelining).
func (t *Table) Expect(now time.Time, fileID, version uint64, h Holder, blocks []Range) {
	if len(blocks) == 0 {
		return
	}
	t.update(now, fileID, version, h, func(hd *holding) {
		for _, r := range blocks {
			if r.Count > 0 && len(hd.pending) < t.opts.MaxRanges {
				hd.pending = append(hd.pending, expected{Range: r, at: now})
			}
		}
	})
}

// update applies change to h's holding of version of fileID (made the
// most recent, its stale expectations dropped) and keeps the table
// within its cost.
func (t *Table) update(now time.Time, fileID, version uint64, h Holder, change func(*holding)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	hd := t.holdingLocked(now, fileID, version, h)
	if hd == nil {
		return
	}
	before := hd.cost()
	hd.prunePending(now, t.opts.PendingTTL)
	change(hd)
	t.cost += hd.cost() - before
	for t.cost > t.opts.MaxCost && t.lru.Len() > 0 {
		t.dropLocked(t.lru.Back().Value.(*holding))
	}
}

// holdingLocked returns h's holding of version of fileID, made the most
// recent (a new one if needed); nil when version is older than the
// newest known.
func (t *Table) holdingLocked(now time.Time, fileID, version uint64, h Holder) *holding {
	f := t.fileLocked(fileID, version)
	if f == nil {
		return nil
	}
	hd := f.holdings[h.Node]
	if hd == nil {
		hd = &holding{file: fileID}
		hd.elem = t.lru.PushFront(hd)
		f.holdings[h.Node] = hd
		t.cost += hd.cost()
	} else {
		t.lru.MoveToFront(hd.elem)
	}
	hd.holder, hd.at = h, now
	return hd
}

// fileLocked returns fileID's entry at version, a fresh one if version is
// newer than what is kept, nil if it is older.
func (t *Table) fileLocked(fileID, version uint64) *file {
	f := t.files[fileID]
	switch {
	case f != nil && version < f.version:
		return nil
	case f != nil && version > f.version:
		t.forgetLocked(fileID)
		f = nil
	}
	if f == nil {
		f = &file{version: version, holdings: map[string]*holding{}}
		t.files[fileID] = f
	}
	return f
}

// Forget drops every holding of file (it changed, or moved away).
func (t *Table) Forget(fileID uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(fileID)
}

func (t *Table) forgetLocked(fileID uint64) {
	if f := t.files[fileID]; f != nil {
		for _, hd := range f.holdings {
			t.dropLocked(hd)
		}
	}
}

func (t *Table) dropLocked(hd *holding) {
	t.lru.Remove(hd.elem)
	t.cost -= hd.cost()
	f := t.files[hd.file]
	delete(f.holdings, hd.holder.Node)
	if len(f.holdings) == 0 {
		delete(t.files, hd.file)
	}
}

// expireLocked drops holdings not reported within TTL (the LRU list is
// in report order, so they are at its back).
func (t *Table) expireLocked(now time.Time) {
	for e := t.lru.Back(); e != nil; e = t.lru.Back() {
		hd := e.Value.(*holding)
		if now.Sub(hd.at) < t.opts.TTL {
			return
		}
		t.dropLocked(hd)
	}
}

// Size returns the number of holdings and the table's cost.
func (t *Table) Size() (holdings, cost int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len(), t.cost
}

// Lookup returns holders of the asked blocks of version of file (those
// that reported them, and holders-to-be), those at site first, then
// nearest to from first, leaving out node exclude (the asker). Holders are taken in
// order of distance while they add a block that has fewer than perBlock
// holders so far, up to max holders. A version other than the newest
// known returns nothing (a newer one forgets the older's holdings).
func (t *Table) Lookup(now time.Time, fileID, version uint64, asked []Range, from *coordinate.Coordinate, site, exclude string, perBlock, max int) []Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	f := t.files[fileID]
	if f != nil && version > f.version {
		t.forgetLocked(fileID)
		return nil
	}
	if f == nil || version != f.version || max <= 0 || perBlock <= 0 {
		return nil
	}
	var want []uint64 // the asked blocks, sorted, at most MaxAsk
	var norm []Range
	for _, r := range asked {
		norm = Add(norm, r)
	}
	for _, r := range norm {
		for idx := r.First; idx < r.end() && len(want) < t.opts.MaxAsk; idx++ {
			want = append(want, idx)
		}
	}
	cands := make([]Result, 0, len(f.holdings))
	for node, hd := range f.holdings {
		if node == exclude {
			continue
		}
		cands = append(cands, Result{Holder: hd.holder, RTT: netcoord.Estimate(from, hd.holder.Coord)})
	}
	// Holders at the asker's site first whatever the coordinates say
	// (an estimate's error can exceed a LAN's RTT, and a holder there
	// costs no site's uplink); then by distance, give or take a random
	// 30%: holders about as far apart are named about as often, so that
	// no one site's uplink carries every reader's fetches.
	elsewhere := func(r Result) bool { return site == "" || r.Site != site }
	jittered := make(map[string]float64, len(cands))
	for _, c := range cands {
		jittered[c.Node] = float64(c.RTT) * (1 + 0.3*rand.Float64())
	}
	slices.SortFunc(cands, func(a, b Result) int {
		return cmp.Or(cmp.Compare(boolInt(elsewhere(a)), boolInt(elsewhere(b))), cmp.Compare(jittered[a.Node], jittered[b.Node]), cmp.Compare(a.Node, b.Node))
	})
	count := make([]int, len(want))
	var out []Result
	for _, c := range cands {
		if len(out) == max {
			break
		}
		hd := f.holdings[c.Node]
		var has []int // positions in want
		useful := false
		for i, idx := range want {
			if hd.has(idx, now, t.opts.PendingTTL) {
				has = append(has, i)
				useful = useful || count[i] < perBlock
			}
		}
		if !useful {
			continue
		}
		for _, i := range has {
			c.Blocks = Add(c.Blocks, Range{First: want[i], Count: 1})
			count[i]++
		}
		out = append(out, c)
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
