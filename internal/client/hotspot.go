package client

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/serf/coordinate"

	"github.com/wheelfs/wheelfs/internal/holders"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// .Hotspot (paper §5.5): a client reading with the cue tells each file's
// primary, in batches, which blocks of which version it has cached; a
// reader asks the primary for holders of the blocks it needs, nearest
// (by network coordinates) first.

// DefaultReportEvery is how often held blocks are reported.
const DefaultReportEvery = 500 * time.Millisecond

// Bounds of the reporter's memory: files waiting to be reported, and files
// remembered as reported (not reported again until refreshAfter).
const (
	maxPendingFiles = 4096
	maxSentFiles    = 4096
	refreshAfter    = holders.DefaultTTL / 2
	reportTimeout   = 5 * time.Second
	// coordMoved is how far this host's coordinate may drift from the one
	// its reports carried before what it holds is reported again: a
	// primary ranks holders by the coordinate of their last report, and
	// one sent before the coordinate settled (a host just started) would
	// otherwise misplace the holder until refreshAfter.
	coordMoved = 10 * time.Millisecond
	// coordEvery bounds how often a moving coordinate alone sends
	// everything held again (a jittery link keeps coordinates moving).
	coordEvery = 5 * time.Second
)

// holdReports collects the blocks this client cached for .Hotspot reads
// and reports them to the files' primaries.
type holdReports struct {
	mu      sync.Mutex
	pending map[oid.ID]*heldFile
	sent    map[oid.ID]*heldFile
	coord   *coordinate.Coordinate // what the last report carried
	coordAt time.Time              // when a move last queued reports (coordChanged)
	running bool
	now     chan struct{} // a report is wanted at once (kick)
	stop    chan struct{}
	done    chan struct{}
	closed  sync.Once
}

type heldFile struct {
	version uint64
	caller  *wire.Caller
	ranges  []holders.Range
	at      time.Time // when sent
}

func newHoldReports() *holdReports {
	return &holdReports{pending: map[oid.ID]*heldFile{}, sent: map[oid.ID]*heldFile{},
		now: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// covered reports whether sorted ranges rs hold all of r.
func covered(rs []holders.Range, r holders.Range) bool {
	i, _ := slices.BinarySearchFunc(rs, r.First, func(x holders.Range, v uint64) int {
		if x.First+x.Count <= v {
			return -1
		}
		return 1
	})
	return i < len(rs) && rs[i].First <= r.First && rs[i].First+rs[i].Count >= r.First+r.Count
}

// noteHeld records that blocks first..last of st (those that are not
// holes) are in this client's cache. Called under st.mu.
func (f *FS) noteHeld(ctx context.Context, u User, st *fileState, first, last uint64) {
	if st.modified || len(st.dirty) > 0 || len(st.staged) > 0 {
		return // not a committed version's blocks
	}
	var rs []holders.Range
	for idx := first; idx <= last; idx++ {
		if _, ok := st.hashes[idx]; ok {
			rs = holders.Add(rs, holders.Range{First: idx, Count: 1})
		}
	}
	f.reports.add(ctx, f, u, st.id, st.version, rs)
}

// add queues ranges of version of id for the next report, leaving out
// what was reported recently, and starts the reporter.
func (r *holdReports) add(ctx context.Context, f *FS, u User, id oid.ID, version uint64, rs []holders.Range) {
	if len(rs) == 0 {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.sent[id]; s != nil && s.version == version && now.Sub(s.at) < refreshAfter {
		rs = slices.DeleteFunc(rs, func(x holders.Range) bool { return covered(s.ranges, x) })
		if len(rs) == 0 {
			return
		}
	}
	p := r.pending[id]
	if p == nil || p.version != version {
		if p == nil && len(r.pending) >= maxPendingFiles {
			return // soft state: a hint lost
		}
		p = &heldFile{version: version}
		r.pending[id] = p
	}
	p.caller = u.caller()
	for _, x := range rs {
		p.ranges = holders.Add(p.ranges, x)
	}
	if !r.running {
		r.running = true
		go r.run(context.WithoutCancel(ctx), f)
	}
}

// run reports every ReportEvery until the FS closes.
func (r *holdReports) run(ctx context.Context, f *FS) {
	defer close(r.done)
	t := time.NewTicker(f.cfg.ReportEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			if f.cfg.Coord != nil {
				r.coordChanged(f.cfg.Coord.Coordinate())
			}
			r.flush(ctx, f)
		case <-r.now:
			r.flush(ctx, f)
		}
	}
}

// coordChanged queues again, for the next report, what was reported
// within refreshAfter with a coordinate more than coordMoved from cur (at
// most once per coordEvery; the report then carries cur).
func (r *holdReports) coordChanged(cur *coordinate.Coordinate) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.coord == nil || now.Sub(r.coordAt) < coordEvery || netcoord.Estimate(r.coord, cur) <= coordMoved {
		return // Estimate is Unknown (negative) when either is missing
	}
	r.coordAt = now
	for id, s := range r.sent {
		if now.Sub(s.at) < refreshAfter { // past it, the hint has run out: only a read reports it again
			r.requeueLocked(id, &heldFile{version: s.version, caller: s.caller, ranges: slices.Clone(s.ranges)})
		}
	}
}

// kick makes the reporter send what is pending now, not at its next tick.
func (r *holdReports) kick() {
	select {
	case r.now <- struct{}{}:
	default:
	}
}

// flush sends what is pending: one request per slice (one primary).
func (r *holdReports) flush(ctx context.Context, f *FS) {
	r.mu.Lock()
	pending := r.pending
	r.pending = map[oid.ID]*heldFile{}
	r.mu.Unlock()
	bySlice := map[oid.Slice][]oid.ID{}
	for id := range pending {
		bySlice[id.Slice()] = append(bySlice[id.Slice()], id)
	}
	for _, ids := range bySlice {
		req := &wire.ReportHoldingRequest{Node: f.cfg.Node, Site: f.cfg.Site, PeerAddr: f.peer.cfg.Addr}
		var coord *coordinate.Coordinate
		if f.cfg.Coord != nil {
			coord = f.cfg.Coord.Coordinate()
			req.Coord = netcoord.ToWire(coord)
		}
		for _, id := range ids {
			p := pending[id]
			held := &wire.HeldBlocks{Caller: p.caller, Id: uint64(id), Version: p.version}
			for _, x := range p.ranges {
				held.Blocks = append(held.Blocks, &wire.BlockRange{First: x.First, Count: x.Count})
			}
			req.Held = append(req.Held, held)
		}
		cctx, cancel := context.WithTimeout(ctx, reportTimeout)
		_, err := call(cctx, f, ids[0], wire.StorageClient.ReportHolding, req)
		cancel()
		if err != nil {
			// Often only the answer was late (the primary's uplink busy
			// sending blocks): report these again with the next batch.
			f.log.Debug("report of held blocks failed", "files", len(ids), "err", err)
			r.requeue(ids, pending)
			continue
		}
		r.markSent(ids, pending, coord)
	}
}

// requeue puts back what a failed report carried, unless a newer version
// is pending or the pending list is full (soft state: a hint lost).
func (r *holdReports) requeue(ids []oid.ID, pending map[oid.ID]*heldFile) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		r.requeueLocked(id, pending[id])
	}
}

// requeueLocked queues old for id's next report, merged into what is
// pending of the same version (r.mu held).
func (r *holdReports) requeueLocked(id oid.ID, old *heldFile) {
	p := r.pending[id]
	switch {
	case p == nil && len(r.pending) < maxPendingFiles:
		r.pending[id] = old
	case p != nil && p.version == old.version:
		for _, x := range old.ranges {
			p.ranges = holders.Add(p.ranges, x)
		}
	}
}

func (r *holdReports) markSent(ids []oid.ID, pending map[oid.ID]*heldFile, coord *coordinate.Coordinate) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if coord != nil {
		r.coord = coord
	}
	for _, id := range ids {
		p := pending[id]
		s := r.sent[id]
		if s == nil || s.version != p.version || now.Sub(s.at) >= refreshAfter {
			s = &heldFile{version: p.version}
			r.sent[id] = s
		}
		s.at, s.caller = now, p.caller
		for _, x := range p.ranges {
			s.ranges = holders.Add(s.ranges, x)
		}
	}
	for id := range r.sent { // over the cap: forget some (they are reported again)
		if len(r.sent) <= maxSentFiles {
			break
		}
		delete(r.sent, id)
	}
}

// close stops the reporter.
func (r *holdReports) close() {
	r.closed.Do(func() {
		r.mu.Lock()
		running := r.running
		r.running = true // no start after close
		r.mu.Unlock()
		close(r.stop)
		if running {
			<-r.done
		}
	})
}

// BlockHolder is a client that recently cached blocks of a file.
type BlockHolder struct {
	Node string
	Site string
	// RTT is the estimated round trip from this client (negative when
	// either has no coordinate yet).
	RTT    time.Duration
	Blocks []holders.Range
}

// Holders asks the file's primary which clients recently cached blocks
// first .. first+count-1 of the version this handle reads, nearest first.
// An empty answer means none (or the file changed since it was opened).
func (h *Handle) Holders(ctx context.Context, first, count uint64) ([]BlockHolder, error) {
	ctx, cancel := h.fs.bound(ctx, h.cues)
	defer cancel()
	h.st.mu.Lock()
	id, version := h.st.id, h.st.version
	h.st.mu.Unlock()
	f := h.fs
	req := &wire.HoldersRequest{Caller: h.user.caller(), Id: uint64(id), Version: version,
		Blocks: []*wire.BlockRange{{First: first, Count: count}}, Node: f.cfg.Node, Site: f.cfg.Site}
	if f.cfg.Coord != nil {
		req.Coord = f.cfg.Coord.Wire()
	}
	resp, err := call(ctx, f, id, wire.StorageClient.Holders, req)
	if err != nil {
		return nil, fmt.Errorf("holders of %v: %w", id, err)
	}
	if resp.Version != version {
		return nil, nil
	}
	out := make([]BlockHolder, 0, len(resp.Holders))
	for _, x := range resp.Holders {
		bh := BlockHolder{Node: x.Node, Site: x.Site, RTT: -1}
		if x.RttMs >= 0 {
			bh.RTT = time.Duration(x.RttMs * float64(time.Millisecond))
		}
		for _, b := range x.Blocks {
			bh.Blocks = append(bh.Blocks, holders.Range{First: b.First, Count: b.Count})
		}
		out = append(out, bh)
	}
	return out, nil
}
