package client

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/holders"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// A .Hotspot read fetches each block it lacks from the nearest client
// that holds it (the file's primary names them, with a grant), falling
// back to the next holder, then to the replicas (own site first), then to
// the primary, all within the call's deadline. Every block is checked
// against its SHA-256 before use; a peer that sends wrong data is skipped.

const (
	// hotChunk is how many blocks one holders query and its fetches
	// cover: small enough that the blocks of one file spread over many
	// holders, large enough that the query's round trip is shared.
	hotChunk = 8
	// maxAttempt bounds one try at one holder or replica, so that a
	// holder that vanished leaves time for the next.
	maxAttempt = 5 * time.Second
	// assumedBandwidth is the per-reader bandwidth the prefetch window
	// is sized for (bytes per second) when nothing better is known.
	assumedBandwidth = 4 << 20
	// minWindow and maxWindow bound the chunks a .WholeFile+.Hotspot
	// read has in flight (chunkLimit adapts within them).
	minWindow, maxWindow = 2, 16
)

// hotFile is what a .Hotspot fetch needs of an open file.
type hotFile struct {
	id      oid.ID
	version uint64
	ev      bool
	index   map[[32]byte][]uint64 // hash → its block indices in version
	note    bool                  // report fetched blocks as held
	tally   *hotTally             // where a prefetch's blocks came from (nil: not counted)
	// background: a prefetch's fetch, which takes farInFlight slots; a
	// read's own blocks (few) go at once.
	background bool
	// attempt bounds one try at one holder or replica (a fifth of the
	// read's time limit, at most maxAttempt), also in the prefetches the
	// read waits on.
	attempt time.Duration
}

// hotFile describes the blocks hashes of st for fetchHot. Called under st.mu.
func (st *fileState) hotFile(ctx context.Context, hashes [][32]byte) hotFile {
	want := make(map[[32]byte]bool, len(hashes))
	for _, h := range hashes {
		want[h] = true
	}
	hf := hotFile{id: st.id, version: st.version, ev: st.eventual, index: map[[32]byte][]uint64{},
		note: !st.modified && len(st.dirty) == 0 && len(st.staged) == 0, attempt: maxAttempt}
	if dl, ok := ctx.Deadline(); ok {
		hf.attempt = min(hf.attempt, time.Until(dl)/5)
	}
	for idx, r := range st.hashes {
		if want[r.hash] {
			hf.index[r.hash] = append(hf.index[r.hash], idx)
		}
	}
	return hf
}

func (hf hotFile) ranges(hashes [][32]byte) []holders.Range {
	var rs []holders.Range
	for _, h := range hashes {
		for _, idx := range hf.index[h] {
			rs = holders.Add(rs, holders.Range{First: idx, Count: 1})
		}
	}
	return rs
}

// prefetchHot fetches claimed blocks in the background for a
// .WholeFile+.Hotspot read: in an order that starts at a random point per
// client, so that readers that start together hold different blocks and
// can serve each other (paper §5.5), a window of chunks at a time sized from the
// bandwidth-delay product to the primary. Each chunk has its own time
// limit: a large file takes longer than one call's bound. Blocks the
// primary has neither holders for nor hands out yet go to the back of the
// queue; a block that keeps coming back for longer than one call's bound
// is left to the read that needs it. A read that waits too long for a
// block still queued takes it (steal).
func (f *FS) prefetchHot(ctx context.Context, u User, hf hotFile, mine [][32]byte) {
	if len(mine) == 0 {
		return
	}
	// Every reader goes round the same ring (blocks ordered by their
	// hash, a random permutation every reader computes alike), each from
	// a random point of its own: a reader reaching blocks another started
	// from finds them all held, where with independent orders each block
	// had an even chance of being fetched again from elsewhere.
	slices.SortFunc(mine, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
	at := rand.IntN(len(mine))
	mine = append(mine[at:], mine[:at]...)
	q := &hotQueue{left: mine, progress: time.Now()}
	f.fetchMu.Lock()
	for _, h := range mine {
		f.queued[h] = q
	}
	f.fetchMu.Unlock()
	lim := newChunkLimit(f.hotWindow())
	base := asTry(context.WithoutCancel(ctx))
	hf.tally, hf.background = &hotTally{}, true
	began := time.Now()
	var wg sync.WaitGroup
	for range maxWindow {
		wg.Go(func() {
			pause := firstPause
			for {
				lim.acquire()
				chunk := f.nextQueued(q, hotChunk)
				if len(chunk) == 0 {
					lim.release(true)
					return
				}
				ctx, cancel := context.WithTimeout(base, f.cfg.Timeout)
				later, failed, err := f.fetchHotChunk(ctx, u, hf, f.uncached(chunk))
				cancel()
				lim.release(!failed && err == nil)
				if err != nil {
					f.log.Debug("hotspot prefetch failed", "id", hf.id.String(), "err", err)
				}
				later = f.requeue(q, later, len(later) < len(chunk), f.cfg.Timeout)
				f.unclaim(slices.DeleteFunc(chunk, func(h [32]byte) bool { return slices.Contains(later, h) }))
				if len(later) < len(chunk) {
					pause = firstPause
					continue
				}
				// Nothing to fetch now: others are becoming holders.
				select {
				case <-time.After(pause):
				case <-base.Done():
				}
				pause = min(2*pause, maxPause)
			}
		})
	}
	go func() {
		wg.Wait()
		t := hf.tally
		f.log.Info("hotspot prefetch done", "id", hf.id.String(), "blocks", len(mine), "took", time.Since(began).Round(time.Millisecond),
			"near_holders", t[fromNearHolders].Load(), "near_replicas", t[fromNearReplicas].Load(), "far_holders", t[fromFarHolders].Load(),
			"far_replicas", t[fromFarReplicas].Load(), "primary", t[fromThePrimary].Load())
	}()
}

// chunkLimit is how many chunks a .Hotspot prefetch works on at once,
// adapted as TCP's window is: one more per window's worth of chunks whose
// every source answered, half when a source failed (a holder's or
// replica's try ran out, or it was busy). More chunks in flight than the
// senders' uplinks carry only lengthen their queues until tries run out
// and the blocks sent are wasted (the 50 MB distribution with a fixed 6
// moved every block about twice across the wide area).
type chunkLimit struct {
	mu    sync.Mutex
	cond  *sync.Cond
	limit float64
	inUse int
}

func newChunkLimit(start int) *chunkLimit {
	l := &chunkLimit{limit: float64(start)}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *chunkLimit) acquire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.inUse >= int(l.limit) {
		l.cond.Wait()
	}
	l.inUse++
}

func (l *chunkLimit) release(ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inUse--
	if ok {
		l.limit = min(l.limit+1/l.limit, maxWindow)
	} else {
		l.limit = max(l.limit/2, minWindow)
	}
	l.cond.Broadcast()
}

// A reader the primary has nothing for now asks again after a pause that
// doubles from firstPause to maxPause while nothing comes.
const (
	firstPause = 100 * time.Millisecond
	maxPause   = time.Second
)

// hotTally counts the blocks of one prefetch by where they came from.
type hotTally [numSources]atomic.Int64

// Where a .Hotspot block came from.
const (
	fromNearHolders = iota
	fromNearReplicas
	fromFarHolders
	fromFarReplicas
	fromThePrimary
	numSources
)

func (t *hotTally) add(from, n int) {
	if t != nil && n > 0 {
		t[from].Add(int64(n))
	}
}

// hotQueue is the blocks of one .Hotspot prefetch not yet started, in
// fetch order, and when one of its chunks last brought a block (guarded
// by FS.fetchMu).
type hotQueue struct {
	left     [][32]byte
	progress time.Time
}

// nextQueued starts up to n blocks of q.
func (f *FS) nextQueued(q *hotQueue, n int) [][32]byte {
	f.fetchMu.Lock()
	defer f.fetchMu.Unlock()
	var out [][32]byte
	for len(q.left) > 0 && len(out) < n {
		h := q.left[0]
		q.left = q.left[1:]
		if f.queued[h] == q { // not stolen
			delete(f.queued, h)
			out = append(out, h)
		}
	}
	return out
}

// requeue puts blocks back at the end of q, still claimed, and returns
// them; progressed says the chunk they were part of brought a block. When
// no chunk of q brought a block for stall, it gives up on them (and on
// those cached since): a read that needs them fetches them itself. A
// prefetch waiting on the origin's uplink for a large file progresses
// for minutes; one whose sources all fail stops after stall.
func (f *FS) requeue(q *hotQueue, hs [][32]byte, progressed bool, stall time.Duration) [][32]byte {
	now := time.Now()
	f.fetchMu.Lock()
	defer f.fetchMu.Unlock()
	if progressed {
		q.progress = now
	}
	stalled := now.Sub(q.progress) > stall
	var out [][32]byte
	for _, h := range hs {
		if stalled || f.cache.Contains(h) {
			continue
		}
		q.left = append(q.left, h)
		f.queued[h] = q
		out = append(out, h)
	}
	return out
}

// steal takes those of hashes that a prefetch has claimed but not
// started: the caller now fetches them (and releases their claims).
func (f *FS) steal(hashes [][32]byte) [][32]byte {
	f.fetchMu.Lock()
	defer f.fetchMu.Unlock()
	var out [][32]byte
	for _, h := range hashes {
		if _, ok := f.queued[h]; ok {
			delete(f.queued, h)
			out = append(out, h)
		}
	}
	return out
}

// hotWindow is how many chunks a parallel .Hotspot read keeps in flight:
// the bandwidth-delay product (the least recent holders query's round
// trip × assumedBandwidth) in chunks, within [minWindow, maxWindow]. The
// least, not the last: a round trip that grew is a queue at some uplink,
// which more requests in flight would only lengthen.
func (f *FS) hotWindow() int {
	rtt := time.Duration(f.peer.rtt.Load())
	if rtt <= 0 {
		rtt = 100 * time.Millisecond
	}
	bdp := float64(assumedBandwidth) * rtt.Seconds()
	return min(max(int(bdp/(hotChunk*BlockSize))+1, minWindow), maxWindow)
}

// uncached returns the blocks of hashes not cached, releasing the claims
// of the others.
func (f *FS) uncached(hashes [][32]byte) [][32]byte {
	var remote [][32]byte
	for _, h := range hashes {
		if _, ok := f.cache.Get(h); ok {
			f.unclaim([][32]byte{h})
		} else {
			remote = append(remote, h)
		}
	}
	return remote
}

// fetchHot brings claimed blocks of hf that a read waits for into the
// cache from holders, replicas or the primary, asking again after a pause
// for those the primary has no source for yet, until ctx ends; it
// releases every claim.
func (f *FS) fetchHot(ctx context.Context, u User, hf hotFile, hashes [][32]byte) error {
	defer f.unclaim(hashes)
	remote := f.uncached(hashes)
	// Chunks in parallel, a window at a time: one slow holder holds up
	// only its own blocks.
	sem := make(chan struct{}, f.hotWindow())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for chunk := range slices.Chunk(remote, hotChunk) {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f.fetchHotUntil(ctx, u, hf, chunk); err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// fetchHotUntil fetches chunk, asking again after a pause for what is to
// come later, until ctx ends.
func (f *FS) fetchHotUntil(ctx context.Context, u User, hf hotFile, chunk [][32]byte) error {
	for pause := firstPause; ; pause = min(2*pause, maxPause) {
		later, _, err := f.fetchHotChunk(ctx, u, hf, chunk)
		if err != nil || len(later) == 0 {
			return err
		}
		chunk = later
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return fmt.Errorf("waiting for a source of %d blocks of %v: %w", len(chunk), hf.id, fserr.ErrTimeout)
		}
	}
}

// try bounds one try at one source: a fifth of what is left, at most
// hf.attempt.
func (hf hotFile) try(ctx context.Context) (context.Context, context.CancelFunc) {
	d := hf.attempt
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)/5)
	}
	return context.WithTimeout(asTry(ctx), d)
}

// fetchHotChunk tries once to bring the blocks of chunk into the cache
// and returns those to ask for again later. The primary names holders
// (and holders-to-be) of each block and hands out the blocks nobody has,
// as many as its uplink can send soon: those are read from it, the others
// from holders at this site, replicas here, holders elsewhere and
// replicas elsewhere (not at the primary's site: its uplink is the
// primary's), in that order. Blocks that failed are shown to the primary
// once more as tried, so that it may send them itself; the rest wait for
// a later ask. err is set only when there is no primary to ask.
func (f *FS) fetchHotChunk(ctx context.Context, u User, hf hotFile, chunk [][32]byte) (later [][32]byte, failed bool, err error) {
	left := map[[32]byte]bool{}
	for _, h := range chunk {
		left[h] = true
	}
	got := func(h [32]byte, b []byte) {
		f.cache.AddOwned(uint64(hf.id), h, b)
		f.unclaim([][32]byte{h})
		delete(left, h)
		if hf.note { // a holder as soon as the block is verified
			f.reports.add(ctx, f, u, hf.id, hf.version, hf.ranges([][32]byte{h}))
		}
	}
	var tried [][32]byte
	for round := 0; round < 2 && len(left) > 0; round++ {
		ask := slices.Collect(maps.Keys(left))
		if round == 1 {
			if len(tried) == 0 {
				break
			}
			ask = tried
		}
		resp, err := f.askHolders(ctx, u, hf, ask, tried)
		if err != nil || resp.Version != hf.version {
			// No pacing and no holders: the primary, as without the cue.
			f.log.Debug("no holders; reading from the primary", "id", hf.id.String(), "err", err)
			rest := slices.Collect(maps.Keys(left))
			_, err := f.fromPrimary(ctx, u, hf, rest, false)
			return nil, err != nil, err
		}
		direct := map[[32]byte]bool{}
		for _, h := range ask {
			if slices.ContainsFunc(hf.index[h], func(idx uint64) bool { return inRanges(resp.Direct, idx) }) {
				direct[h] = true
				delete(left, h)
			}
		}
		var fetched map[[32]byte]bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			fetched, _ = f.fromPrimary(ctx, u, hf, slices.Collect(maps.Keys(direct)), true)
		}()
		if round == 0 && resp.Grant != nil { // no grant: no holder or replica to show one to
			named := f.fromSources(ctx, u, hf, resp, left, got)
			tried = slices.Collect(maps.Keys(named))
			failed = len(tried) > 0
		} else {
			tried = nil // not from holders again: they failed once
		}
		<-done
		for h := range direct {
			if !fetched[h] {
				left[h] = true
				tried = append(tried, h)
			}
		}
	}
	return slices.Collect(maps.Keys(left)), failed, nil
}

// askHolders asks the primary for holders of hashes and which of them to
// read from it; tried are blocks the sources it named before failed to
// give. This client becomes a holder-to-be of what it will fetch when it
// serves its cache.
func (f *FS) askHolders(ctx context.Context, u User, hf hotFile, hashes, tried [][32]byte) (*wire.HoldersResponse, error) {
	req := &wire.HoldersRequest{Caller: u.caller(), Id: uint64(hf.id), Version: hf.version, Node: f.cfg.Node, Site: f.cfg.Site,
		WantGrant: true, Urgent: !hf.background}
	for _, r := range hf.ranges(hashes) {
		req.Blocks = append(req.Blocks, &wire.BlockRange{First: r.First, Count: r.Count})
	}
	for _, r := range hf.ranges(tried) {
		req.Tried = append(req.Tried, &wire.BlockRange{First: r.First, Count: r.Count})
	}
	if hf.note && f.peer.cfg.Grants != nil {
		req.PeerAddr = f.peer.cfg.Addr
	}
	if f.cfg.Coord != nil {
		req.Coord = f.cfg.Coord.Wire()
	}
	have, haveCert := f.peer.haveCert()
	req.HaveCert = haveCert
	actx, cancel := hf.try(ctx)
	defer cancel()
	began := time.Now()
	resp, err := call(actx, f, hf.id, wire.StorageClient.Holders, req)
	if err != nil {
		return nil, err
	}
	f.peer.noteRTT(time.Now(), time.Since(began))
	if g := resp.Grant; g != nil && !f.peer.fillCert(g, have) {
		resp.Grant = nil // its certificate is gone from here: no holder to show it to
	}
	return resp, nil
}

// fromSources fetches blocks in left from what resp names, own site
// first (holders, then replicas: the LAN is free, and every site's uplink
// is the scarce resource), then elsewhere, and returns those still left
// that some holder or replica was asked for.
func (f *FS) fromSources(ctx context.Context, u User, hf hotFile, resp *wire.HoldersResponse, left map[[32]byte]bool, got func([32]byte, []byte)) (named map[[32]byte]bool) {
	if len(left) == 0 {
		return nil
	}
	before := maps.Clone(left)
	replicas := f.replicasBeside(ctx, hf.id)
	n := len(left)
	f.fromHolders(ctx, hf, resp, left, got, true)
	hf.tally.add(fromNearHolders, n-len(left))
	n = len(left)
	f.fromReplicas(ctx, u, hf, resp.Grant, replicas, left, got, true)
	hf.tally.add(fromNearReplicas, n-len(left))
	// A block a site-mate has or is fetching waits for one later ask
	// before it is fetched from elsewhere too: by then the site-mate has
	// it (its fetch outlasted this try), or stops being named. Once per
	// block: two site-mates each fetching from the other would otherwise
	// wait on each other for good.
	now := time.Now()
	mates := slices.DeleteFunc(slices.Clone(resp.Holders), func(x *wire.Holder) bool {
		return x.Site != f.cfg.Site || x.Node == f.cfg.Node || x.Addr == "" || f.peer.skipPeer(x.Node, now)
	})
	far := maps.Clone(left)
	for h := range far {
		if slices.ContainsFunc(mates, func(x *wire.Holder) bool { return holds(hf, x, h) }) && f.peer.deferOnce(h) {
			delete(far, h)
		}
	}
	gotFar := func(h [32]byte, b []byte) {
		got(h, b)
		delete(far, h)
	}
	n = len(left)
	f.fromHolders(ctx, hf, resp, far, gotFar, false)
	hf.tally.add(fromFarHolders, n-len(left))
	n = len(left)
	f.fromReplicas(ctx, u, hf, resp.Grant, replicas, far, gotFar, false)
	hf.tally.add(fromFarReplicas, n-len(left))
	named = map[[32]byte]bool{}
	for h := range far {
		if before[h] && (len(replicas) > 0 || slices.ContainsFunc(resp.Holders, func(x *wire.Holder) bool { return holds(hf, x, h) })) {
			named[h] = true
		}
	}
	return named
}

// holds reports whether holder x was named for block h of hf.
func holds(hf hotFile, x *wire.Holder, h [32]byte) bool {
	return slices.ContainsFunc(hf.index[h], func(idx uint64) bool { return inRanges(x.Blocks, idx) })
}

// fromPrimary reads blocks from the primary in small requests and
// returns those it got. Blocks it handed out (paced) are asked for at
// once: the primary's window already bounds them, and a wait here would
// count in its delay; others wait for far slots (its uplink is the one
// every reader shares first).
func (f *FS) fromPrimary(ctx context.Context, u User, hf hotFile, hs [][32]byte, paced bool) (map[[32]byte]bool, error) {
	var mu sync.Mutex
	fetched := map[[32]byte]bool{}
	var first error
	var wg sync.WaitGroup
	for part := range slices.Chunk(hs, farRequestBlocks) {
		wg.Go(func() {
			release, ok := f.peer.farSlot(ctx, hf.background && !paced)
			if !ok {
				mu.Lock()
				first = cmp.Or(first, fmt.Errorf("waiting to read blocks of %v: %w", hf.id, fserr.ErrTimeout))
				mu.Unlock()
				return
			}
			n, err := f.readRemote(ctx, u, hf.id, hf.ev, part)
			release()
			f.peer.fromPrimary.Add(n)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				first = cmp.Or(first, err)
				return
			}
			for _, h := range part {
				fetched[h] = true
			}
			hf.tally.add(fromThePrimary, len(part))
			if hf.note {
				// Reported at once: the primary paces what it hands out
				// by how soon the blocks arrive.
				f.reports.add(ctx, f, u, hf.id, hf.version, hf.ranges(part))
				f.reports.kick()
			}
		})
	}
	wg.Wait()
	return fetched, first
}

// fromHolders fetches blocks in left from the holders resp names at this
// client's site (near) or elsewhere: each block from its nearest holder,
// then its next, holders asked in parallel. Holders about as near are
// taken in a random order, so that readers spread over them.
func (f *FS) fromHolders(ctx context.Context, hf hotFile, resp *wire.HoldersResponse, left map[[32]byte]bool, got func([32]byte, []byte), near bool) {
	if f.peer.cfg.Dial == nil || len(left) == 0 {
		return
	}
	now := time.Now()
	var xs []*wire.Holder
	for _, x := range resp.Holders {
		if x.Addr == "" || x.Node == f.cfg.Node || (x.Site == f.cfg.Site) != near || f.peer.skipPeer(x.Node, now) {
			continue
		}
		xs = append(xs, x)
	}
	cands := map[[32]byte][]*wire.Holder{}
	for h := range left {
		for _, x := range xs {
			if slices.ContainsFunc(hf.index[h], func(idx uint64) bool { return inRanges(x.Blocks, idx) }) {
				cands[h] = append(cands[h], x)
			}
		}
		c := cands[h]
		rand.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
		slices.SortStableFunc(c, func(a, b *wire.Holder) int { return cmp.Compare(rttBand(a), rttBand(b)) })
		// Of the first two about as near, the one whose site has been
		// sending faster (two random choices: readers do not all herd to
		// the site that was fastest a moment ago).
		if !near && len(c) > 1 && rttBand(c[0]) == rttBand(c[1]) && f.peer.siteCost(c[1].Site) < f.peer.siteCost(c[0].Site) {
			c[0], c[1] = c[1], c[0]
		}
	}
	// A holder elsewhere sends through its site's uplink, shared with
	// others: small requests finish within a try (a late answer is
	// wasted), and spread a chunk over several holders.
	per := hotChunk
	if !near {
		per = farRequestBlocks
	}
	var mu sync.Mutex
	for round := 0; len(left) > 0; round++ {
		ask := map[*wire.Holder][][32]byte{}
		for h := range left {
			if c := cands[h]; round < len(c) {
				ask[c[round]] = append(ask[c[round]], h)
			}
		}
		if len(ask) == 0 {
			return
		}
		var wg sync.WaitGroup
		for x, hs := range ask {
			for part := range slices.Chunk(hs, per) {
				wg.Go(func() {
					for h, b := range f.fromPeer(ctx, hf, x, resp.Grant, part, !near) {
						mu.Lock()
						got(h, b)
						mu.Unlock()
					}
				})
			}
		}
		wg.Wait()
	}
}

// farRequestBlocks is how many blocks one request to a holder or replica
// at another site asks for.
const farRequestBlocks = 2

// rttBand groups holders whose estimated RTTs differ by less than 20 ms
// (coordinates are estimates); unknown ones come last.
func rttBand(x *wire.Holder) int {
	if x.RttMs < 0 {
		return math.MaxInt
	}
	return int(x.RttMs / 20)
}

// fromPeer asks one holder for blocks and returns those that match their
// hash; a holder that sends wrong data is logged, counted and skipped for
// a while.
func (f *FS) fromPeer(ctx context.Context, hf hotFile, x *wire.Holder, g *wire.Grant, hs [][32]byte, far bool) map[[32]byte][]byte {
	if far {
		release, ok := f.peer.farSlot(ctx, hf.background)
		if !ok {
			return nil
		}
		defer release()
	}
	actx, cancel := hf.try(ctx)
	defer cancel()
	pc, err := f.peer.cfg.Dial(actx, x.Node, x.Addr)
	if err != nil {
		f.peer.markBad(x.Node, time.Now(), slowPeerFor)
		f.log.Debug("peer unreachable", "peer", x.Node, "err", err)
		return nil
	}
	req := &wire.FetchCachedRequest{Grant: g, Hashes: make([][]byte, len(hs))}
	for i := range hs {
		req.Hashes[i] = hs[i][:]
	}
	began := time.Now()
	resp, err := pc.FetchCached(actx, req)
	if n := countData(resp.GetData()); far && (n > 0 || err != nil) { // an empty answer says nothing of the site's uplink
		f.peer.noteSiteCost(x.Site, time.Since(began), n)
	}
	if err != nil {
		if status.Code(err) != codes.ResourceExhausted { // busy is fine; silent or gone is not
			f.peer.markBad(x.Node, time.Now(), slowPeerFor)
		}
		f.log.Debug("peer fetch failed", "peer", x.Node, "blocks", len(hs), "err", err)
		return nil
	}
	out := map[[32]byte][]byte{}
	for i, b := range resp.Data {
		if i >= len(hs) || len(b) == 0 {
			continue
		}
		if sha256.Sum256(b) != hs[i] {
			f.peer.corrupt.Add(1)
			f.peer.markBad(x.Node, time.Now(), badPeerFor)
			f.log.Warn("peer sent a block that does not match its hash; skipping the peer", "peer", x.Node, "addr", x.Addr)
			return out
		}
		out[hs[i]] = b
		f.peer.fromPeers.Add(int64(len(b)))
	}
	return out
}

// countData counts the blocks an answer carries.
func countData(data [][]byte) int {
	n := 0
	for _, b := range data {
		if len(b) > 0 {
			n++
		}
	}
	return n
}

// replicasBeside returns the replicas of id's slice that a .Hotspot read
// may ask besides the primary: not the primary, and none at the primary's
// site elsewhere than this client's (they send through the primary's
// uplink, whose every block the primary paces).
func (f *FS) replicasBeside(ctx context.Context, id oid.ID) []Conn {
	info, err := f.router.Describe(ctx, id.Slice())
	if err != nil {
		return nil
	}
	conns, err := f.router.Replicas(ctx, id.Slice())
	if err != nil {
		return nil
	}
	return slices.DeleteFunc(conns, func(c Conn) bool {
		return c.ID == info.Primary.Server || (c.Site == info.Primary.Site && c.Site != f.cfg.Site)
	})
}

// fromReplicas asks replicas (of replicasBeside) at this client's site
// (own) or elsewhere, in a random order, for the blocks in left, showing
// the grant (blocks are named by their hash: any replica's copy will do).
// Requests elsewhere are small and in parallel, as to holders there.
func (f *FS) fromReplicas(ctx context.Context, u User, hf hotFile, g *wire.Grant, replicas []Conn, left map[[32]byte]bool, got func([32]byte, []byte), own bool) {
	if len(left) == 0 {
		return
	}
	conns := slices.DeleteFunc(slices.Clone(replicas), func(c Conn) bool { return (c.Site == f.cfg.Site) != own })
	rand.Shuffle(len(conns), func(i, j int) { conns[i], conns[j] = conns[j], conns[i] })
	per := hotChunk
	if !own {
		per = farRequestBlocks
	}
	var mu sync.Mutex
	for _, c := range conns {
		hs := slices.Collect(maps.Keys(left))
		if len(hs) == 0 {
			return
		}
		var wg sync.WaitGroup
		for part := range slices.Chunk(hs, per) {
			wg.Go(func() {
				if !own {
					release, ok := f.peer.farSlot(ctx, hf.background)
					if !ok {
						return
					}
					defer release()
				}
				req := &wire.ReadBlocksRequest{Caller: u.caller(), Id: uint64(hf.id), Grant: g, Hashes: make([][]byte, len(part))}
				for i := range part {
					req.Hashes[i] = part[i][:]
				}
				actx, cancel := hf.try(ctx)
				resp, err := c.ReadBlocks(actx, req)
				cancel()
				if err != nil || len(resp.Data) != len(part) {
					f.log.Debug("replica did not serve blocks", "server", c.ID, "blocks", len(part), "err", err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for i, b := range resp.Data {
					if sha256.Sum256(b) == part[i] {
						f.peer.fromReplicas.Add(int64(len(b)))
						got(part[i], b)
					}
				}
			})
		}
		wg.Wait()
	}
}

func inRanges(rs []*wire.BlockRange, idx uint64) bool {
	for _, r := range rs {
		if r.First <= idx && idx < r.First+r.Count {
			return true
		}
	}
	return false
}
