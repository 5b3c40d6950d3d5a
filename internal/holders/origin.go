package holders

import (
	"slices"
	"sync"
	"time"
)

// Origin paces the blocks a primary hands out for .Hotspot readers at other
// sites to read from it ("direct" blocks), so that its uplink sends each
// block about once and never queues more than about Target of data: a
// reader that gets no direct block and finds no holder asks again later,
// when other readers have become holders.
//
// The window (blocks handed out and not yet reported held) follows the
// delay from handing a block out to its report, as LEDBAT follows one-way
// delay: it grows by one block per block reported within Target of the
// least delay seen, and halves (at most once per delay) when a report
// comes later than twice that, or a block is not reported within Expire.
// The least delay is what the path costs with nothing queued; the rest is
// the queue at the uplink, which is what the window bounds.
//
// The window is shared out evenly among the sites asking: a block the
// origin sends to one site is what that site's uplink then sends to every
// other site, so a site that got more than its share (it asked first or
// most often) became a second bottleneck (filedist, 50 MB: one site of
// five got 46–58 % of the origin's blocks, and its uplink sent 65 MB
// against 36–56 MB for the others).
type Origin struct {
	opts OriginOptions

	mu       sync.Mutex
	window   float64
	out      map[handed]handout // blocks handed out
	perSite  map[string]int     // blocks out, by the asker's site
	askedAt  map[string]time.Time
	ever     map[uint64]*everHanded // by file: blocks handed out at least once
	base     time.Duration          // least delay seen since baseAt
	baseAt   time.Time
	cutAt    time.Time
	expireAt time.Time
}

type handed struct {
	file  uint64
	node  string
	block uint64
}

type handout struct {
	at   time.Time
	site string
}

// everHanded is the blocks of one file handed out at least once.
type everHanded struct {
	blocks map[uint64]struct{}
	at     time.Time // last hand-out
	newAt  time.Time // last hand-out of a block for the first time
}

// endGameFor is how long after the last block's first hand-out the end
// game lasts: readers that come later find holders everywhere and read
// from them, as the origin's uplink is again what every site shares.
const endGameFor = 20 * time.Second

// maxEverFiles bounds the files whose hand-outs are remembered (the least
// recently handed is forgotten first): those being distributed now.
const maxEverFiles = 64

// maxEverBlocks bounds the blocks remembered per file (64 GiB of 64 KiB
// blocks): a larger file never reaches its end game, which only costs
// its last blocks a second hop.
const maxEverBlocks = 1 << 20

// activeFor is how long a site that asked counts among the sites the
// window is shared by (a waiting reader asks at least every second).
const activeFor = 3 * time.Second

// maxSites bounds the sites remembered (a client names its own site).
const maxSites = 1024

// OriginOptions tune an Origin; zero values take the defaults.
type OriginOptions struct {
	// Target is the queueing delay the window aims at (default 1 s).
	Target time.Duration
	// MinWindow and MaxWindow bound the window in blocks (defaults 8 and
	// 4096).
	MinWindow, MaxWindow int
	// Expire is when a block handed out and not reported counts as lost
	// (default 15 s).
	Expire time.Duration
}

// baseFor is how long the least delay seen stands: routes and loads
// change, and a base that never rises would make every later delay look
// queued.
const baseFor = 2 * time.Minute

// NewOrigin returns an Origin with a window of MinWindow blocks.
func NewOrigin(o OriginOptions) *Origin {
	if o.Target <= 0 {
		o.Target = time.Second
	}
	if o.MinWindow <= 0 {
		o.MinWindow = 8
	}
	if o.MaxWindow < o.MinWindow {
		o.MaxWindow = max(4096, o.MinWindow)
	}
	if o.Expire <= 0 {
		o.Expire = 15 * time.Second
	}
	return &Origin{opts: o, window: float64(o.MinWindow), out: map[handed]handout{},
		perSite: map[string]int{}, askedAt: map[string]time.Time{}, ever: map[uint64]*everHanded{}}
}

// Hand returns those of blocks of file that node, at site, may read from
// this server now, in order, within the window and within site's even
// share of it among the sites that asked in the last activeFor; a block
// handed to node before and not yet reported is handed again (node asks
// once more). Urgent blocks (a read waits for them, not a prefetch) may
// also use a reserve of a quarter of the window (and of the share) beyond
// it, so that a read is not starved by prefetches, and count in it.
func (o *Origin) Hand(now time.Time, file uint64, node, site string, blocks []uint64, urgent bool) []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.handLocked(now, file, node, site, blocks, urgent)
}

// HandLast is Hand for blocks that others hold or are fetching, but
// nobody at site: the end game. Once every one of the file's total blocks
// has been handed out, the origin's uplink has nothing new to send, while
// the last blocks would cross a second, busy uplink (a holder's) to reach
// the sites without them; for endGameFor after that the origin sends
// them too, within the same window and share. Otherwise it hands out none.
func (o *Origin) HandLast(now time.Time, file uint64, node, site string, blocks []uint64, total uint64) []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e := o.ever[file]; e == nil || uint64(len(e.blocks)) < total || now.Sub(e.newAt) >= endGameFor {
		return nil
	}
	return o.handLocked(now, file, node, site, blocks, false)
}

func (o *Origin) handLocked(now time.Time, file uint64, node, site string, blocks []uint64, urgent bool) []uint64 {
	o.expireLocked(now)
	if _, ok := o.askedAt[site]; !ok && len(o.askedAt) >= maxSites {
		clear(o.askedAt)
	}
	o.askedAt[site] = now
	active := 0
	for _, at := range o.askedAt {
		if now.Sub(at) < activeFor {
			active++
		}
	}
	limit := int(o.window)
	share := (limit + active - 1) / active
	if urgent {
		limit += max(limit/4, 2)
		share += max(share/4, 2)
	}
	var out []uint64
	for _, b := range blocks {
		k := handed{file, node, b}
		if _, again := o.out[k]; !again {
			if len(o.out) >= limit || o.perSite[site] >= share {
				continue
			}
			o.perSite[site]++
		} else if h := o.out[k]; h.site != site {
			o.dropLocked(k, h)
			o.perSite[site]++
		}
		o.out[k] = handout{now, site}
		out = append(out, b)
	}
	if len(out) > 0 {
		o.noteEverLocked(now, file, out)
	}
	return out
}

// noteEverLocked records blocks of file as handed out at least once.
func (o *Origin) noteEverLocked(now time.Time, file uint64, blocks []uint64) {
	e := o.ever[file]
	if e == nil {
		if len(o.ever) >= maxEverFiles {
			var oldest *everHanded
			var oldestFile uint64
			for f, x := range o.ever {
				if oldest == nil || x.at.Before(oldest.at) {
					oldest, oldestFile = x, f
				}
			}
			delete(o.ever, oldestFile)
		}
		e = &everHanded{blocks: map[uint64]struct{}{}}
		o.ever[file] = e
	}
	e.at = now
	for _, b := range blocks {
		if _, seen := e.blocks[b]; !seen && len(e.blocks) < maxEverBlocks {
			e.blocks[b] = struct{}{}
			e.newAt = now
		}
	}
}

// dropLocked takes k out of what is handed out.
func (o *Origin) dropLocked(k handed, h handout) {
	delete(o.out, k)
	if o.perSite[h.site]--; o.perSite[h.site] <= 0 {
		delete(o.perSite, h.site)
	}
}

// Held records node's report that it has blocks rs of file: those handed
// to it leave the window, and their delay tunes it.
func (o *Origin) Held(now time.Time, file uint64, node string, rs []Range) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.takeLocked(file, node, rs, func(h handout) { o.sampleLocked(now, now.Sub(h.at)) })
}

// takeLocked removes the blocks of rs handed to node for file, calling
// took with when each was handed out. It walks whichever is shorter, the
// ranges or what is handed out: a client's ranges can be huge.
func (o *Origin) takeLocked(file uint64, node string, rs []Range, took func(handout)) {
	var n uint64
	for _, r := range rs {
		n += min(r.Count, uint64(len(o.out))+1) // no overflow
	}
	if n > uint64(len(o.out)) {
		for k, h := range o.out {
			if k.file == file && k.node == node && slices.ContainsFunc(rs, func(r Range) bool { return r.First <= k.block && k.block < r.end() }) {
				o.dropLocked(k, h)
				took(h)
			}
		}
		return
	}
	for _, r := range rs {
		for b := r.First; b < r.end(); b++ {
			k := handed{file, node, b}
			if h, ok := o.out[k]; ok {
				o.dropLocked(k, h)
				took(h)
			}
		}
	}
}

// Failed records that node could not read blocks rs of file that were
// handed to it: they leave the window, which halves (a loss).
func (o *Origin) Failed(now time.Time, file uint64, node string, rs []Range) {
	o.mu.Lock()
	defer o.mu.Unlock()
	lost := false
	o.takeLocked(file, node, rs, func(handout) { lost = true })
	if lost {
		o.cutLocked(now, o.opts.Target)
	}
}

// Window returns the window and the blocks handed out and not reported.
func (o *Origin) Window() (window, out int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return int(o.window), len(o.out)
}

func (o *Origin) sampleLocked(now time.Time, d time.Duration) {
	if o.baseAt.IsZero() || d < o.base || now.Sub(o.baseAt) > baseFor {
		o.base, o.baseAt = d, now
	}
	switch queued := d - o.base; {
	case queued <= o.opts.Target:
		o.window = min(o.window+1, float64(o.opts.MaxWindow))
	case queued > 2*o.opts.Target:
		o.cutLocked(now, d)
	}
}

// cutLocked halves the window, at most once per every (one delay: the
// reports of blocks handed out before the last cut still show its queue).
func (o *Origin) cutLocked(now time.Time, every time.Duration) {
	if now.Sub(o.cutAt) < every {
		return
	}
	o.cutAt = now
	o.window = max(o.window/2, float64(o.opts.MinWindow))
}

// expireLocked drops blocks handed out longer than Expire ago (a loss),
// looking at most once per second.
func (o *Origin) expireLocked(now time.Time) {
	if now.Before(o.expireAt) {
		return
	}
	o.expireAt = now.Add(time.Second)
	lost := false
	for k, h := range o.out {
		if now.Sub(h.at) >= o.opts.Expire {
			o.dropLocked(k, h)
			lost = true
		}
	}
	for site, at := range o.askedAt {
		if now.Sub(at) >= activeFor {
			delete(o.askedAt, site)
		}
	}
	if lost {
		o.cutLocked(now, o.opts.Target)
	}
}
