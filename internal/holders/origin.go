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
type Origin struct {
	opts OriginOptions

	mu       sync.Mutex
	window   float64
	out      map[handed]time.Time // blocks handed out, when
	base     time.Duration        // least delay seen since baseAt
	baseAt   time.Time
	cutAt    time.Time
	expireAt time.Time
}

type handed struct {
	file  uint64
	node  string
	block uint64
}

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
	return &Origin{opts: o, window: float64(o.MinWindow), out: map[handed]time.Time{}}
}

// Hand returns those of blocks of file that node may read from this
// server now, in order, within the window; a block handed to node before
// and not yet reported is handed again (node asks once more). Urgent
// blocks (a read waits for them, not a prefetch) may also use a reserve
// of a quarter of the window beyond it, so that a read is not starved by
// prefetches, and count in it.
func (o *Origin) Hand(now time.Time, file uint64, node string, blocks []uint64, urgent bool) []uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now)
	limit := int(o.window)
	if urgent {
		limit += max(int(o.window)/4, 2)
	}
	var out []uint64
	for _, b := range blocks {
		k := handed{file, node, b}
		if _, again := o.out[k]; !again && len(o.out) >= limit {
			continue
		}
		o.out[k] = now
		out = append(out, b)
	}
	return out
}

// Held records node's report that it has blocks rs of file: those handed
// to it leave the window, and their delay tunes it.
func (o *Origin) Held(now time.Time, file uint64, node string, rs []Range) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.takeLocked(file, node, rs, func(at time.Time) { o.sampleLocked(now, now.Sub(at)) })
}

// takeLocked removes the blocks of rs handed to node for file, calling
// took with when each was handed out. It walks whichever is shorter, the
// ranges or what is handed out: a client's ranges can be huge.
func (o *Origin) takeLocked(file uint64, node string, rs []Range, took func(at time.Time)) {
	var n uint64
	for _, r := range rs {
		n += min(r.Count, uint64(len(o.out))+1) // no overflow
	}
	if n > uint64(len(o.out)) {
		for k, at := range o.out {
			if k.file == file && k.node == node && slices.ContainsFunc(rs, func(r Range) bool { return r.First <= k.block && k.block < r.end() }) {
				delete(o.out, k)
				took(at)
			}
		}
		return
	}
	for _, r := range rs {
		for b := r.First; b < r.end(); b++ {
			k := handed{file, node, b}
			if at, ok := o.out[k]; ok {
				delete(o.out, k)
				took(at)
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
	o.takeLocked(file, node, rs, func(time.Time) { lost = true })
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
	for k, at := range o.out {
		if now.Sub(at) >= o.opts.Expire {
			delete(o.out, k)
			lost = true
		}
	}
	if lost {
		o.cutLocked(now, o.opts.Target)
	}
}
