package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// refsPerFetch is how many block references one GetBlocks call returns.
const refsPerFetch = 1024

// readAhead is how many blocks past a sequential read are prefetched.
const readAhead = 64

// ReadAheadBytes is how far past a sequential read the core prefetches:
// the FUSE mount lets the kernel read ahead as far.
const ReadAheadBytes = readAhead * BlockSize

// window is how many blocks past a sequential read f prefetches: readAhead,
// or a quarter of the memory cache when that is smaller, since a window
// the cache cannot hold is evicted before it is read and fetched again
// (a 4 MiB cache made cold reads 0.6-0.7x, docs/BENCHMARKS.md).
func (f *FS) window() uint64 {
	return uint64(max(1, min(readAhead, f.cfg.CacheBytes/BlockSize/4)))
}

// Read reads up to len(p) bytes at off.
func (h *Handle) Read(ctx context.Context, p []byte, off int64) (int, error) {
	ctx, cancel := h.fs.bound(ctx, h.cues)
	defer cancel()
	st := h.st
	st.mu.Lock()
	if off >= st.size {
		st.mu.Unlock()
		return 0, nil
	}
	if end := st.size - off; int64(len(p)) > end {
		p = p[:end]
	}
	if h.inProcess() {
		return h.readInProcess(ctx, p, off) // unlocks st.mu
	}
	defer st.mu.Unlock()
	return h.readCached(ctx, p, off)
}

// readCached serves a read through the block cache (st.mu held): it
// fetches what the cache lacks and prefetches ahead of a sequential
// reader.
func (h *Handle) readCached(ctx context.Context, p []byte, off int64) (int, error) {
	st := h.st
	first := uint64(off / BlockSize)
	last := uint64((off + int64(len(p)) - 1) / BlockSize)
	blocks, err := st.blocks(ctx, h.fs, h.user, first, last, h.cues.Hotspot)
	if err != nil {
		return 0, fmt.Errorf("read %v at %d: %w", st.id, off, err)
	}
	// Sequential readers get the next window fetched in the background;
	// .WholeFile prefetches the whole file on the first read.
	maxIdx := uint64((st.size - 1) / BlockSize)
	// Refill the window when half of it is consumed, so prefetches go
	// out in large batches.
	w := h.fs.window()
	if last < maxIdx && (off == st.nextRead || h.cues.WholeFile) && last+w/2 >= st.prefetched {
		ahead := min(last+w, maxIdx)
		if h.cues.WholeFile {
			ahead = maxIdx
		}
		st.prefetch(ctx, h.fs, h.user, max(last+1, st.prefetched+1), ahead, h.cues.Hotspot)
		st.prefetched = ahead
	}
	st.nextRead = off + int64(len(p))
	if h.cues.Hotspot {
		h.fs.noteHeld(ctx, h.user, st, first, last)
	}
	n := 0
	for idx := first; idx <= last; idx++ {
		start, want := blockSpan(idx, first, off, len(p)-n)
		fill(p[n:n+want], blocks[idx-first], start)
		n += want
	}
	return n, nil
}

// blockSpan says where a read at off, with left bytes still to fill, uses
// block idx (first is the read's first block): from start, want bytes.
func blockSpan(idx, first uint64, off int64, left int) (start int64, want int) {
	if idx == first {
		start = off % BlockSize
	}
	return start, int(min(int64(left), BlockSize-start))
}

// fill copies block b from start into seg; holes and short blocks read
// as zeros.
func fill(seg, b []byte, start int64) {
	c := 0
	if start < int64(len(b)) {
		c = copy(seg, b[start:])
	}
	clear(seg[c:])
}

// inProcess tells whether this handle's reads go straight to the server in
// this process (the one-host default): not for .Hotspot (holders serve
// those), .EventualConsistency (any replica may) nor .WholeFile (the
// cue asks for the prefetch).
func (h *Handle) inProcess() bool {
	if h.cues.Hotspot || h.cues.WholeFile || h.st.eventual {
		return false
	}
	c, ok := h.fs.primaryAtHand(h.st.id)
	if !ok || !c.InProcess {
		return false
	}
	_, ok = c.StorageClient.(BlocksInto)
	return ok
}

// directRun is a stretch of a read that whole blocks fill back to back,
// to be read by the server straight into p[from:to].
type directRun struct {
	from, to int
	hashes   [][32]byte
}

// readInProcess serves a read from the server in this process (st.mu
// held; it unlocks it). Whole blocks the client does not hold are read by
// the server's store straight into p once st.mu is released, so that the
// kernel's concurrent read-ahead requests overlap and no block is
// allocated, cached or copied: the store's segment files are in this
// host's page cache, as a loopback's file would be. Blocks held dirty or
// cached, holes, and blocks only partly read come through the cache.
// Nothing is prefetched: the kernel reads ahead on the mount.
func (h *Handle) readInProcess(ctx context.Context, p []byte, off int64) (int, error) {
	st, f := h.st, h.fs
	first := uint64(off / BlockSize)
	last := uint64((off + int64(len(p)) - 1) / BlockSize)
	runs, err := h.planInProcess(ctx, p, off, first, last)
	if err != nil {
		st.mu.Unlock()
		return 0, fmt.Errorf("read %v at %d: %w", st.id, off, err)
	}
	st.nextRead = off + int64(len(p))
	st.mu.Unlock()
	for _, r := range runs {
		if err := f.readInto(ctx, h.user, st.id, r.hashes, p[r.from:r.to]); err != nil {
			// The primary moved, or the blocks went with a newer version
			// of the file: read the ordinary way, which sorts that out.
			f.log.Debug("in-process read falls back to the cache", "id", st.id.String(), "err", err)
			st.mu.Lock()
			defer st.mu.Unlock()
			return h.readCached(ctx, p, off)
		}
	}
	return len(p), nil
}

// planInProcess fills what of p does not come straight from the server
// (st.mu held) and returns the runs that do.
func (h *Handle) planInProcess(ctx context.Context, p []byte, off int64, first, last uint64) ([]directRun, error) {
	st, f := h.st, h.fs
	if err := st.loadRefs(ctx, f, h.user, first, last); err != nil {
		return nil, err
	}
	var runs []directRun
	open := false // the last run may grow
	n := 0
	for idx := first; idx <= last; idx++ {
		start, want := blockSpan(idx, first, off, len(p)-n)
		seg := p[n : n+want]
		ref, ok := st.ref(idx)
		_, held := st.buffered(idx)
		if ok && !held && start == 0 && ref.len > 0 && int(ref.len) <= want && !f.cache.Contains(ref.hash) {
			if !open {
				runs = append(runs, directRun{from: n, to: n})
			}
			r := &runs[len(runs)-1]
			r.hashes = append(r.hashes, ref.hash)
			r.to += int(ref.len)
			clear(seg[ref.len:]) // a short block: zeros after it
			open = int(ref.len) == want
		} else {
			open = false
			blocks, err := st.blocks(ctx, f, h.user, idx, idx, false)
			if err != nil {
				return nil, err
			}
			fill(seg, blocks[0], start)
		}
		n += want
	}
	return runs, nil
}

// readInto reads blocks of id from the server in this process straight
// into dst (their total length).
func (f *FS) readInto(ctx context.Context, u User, id oid.ID, hs [][32]byte, dst []byte) error {
	req := &wire.ReadBlocksRequest{Caller: u.caller(), Id: uint64(id), Hashes: make([][]byte, len(hs))}
	for i := range hs {
		req.Hashes[i] = hs[i][:]
	}
	_, err := call(ctx, f, id, func(c wire.StorageClient, ctx context.Context, req *wire.ReadBlocksRequest, _ ...grpc.CallOption) (*wire.ReadBlocksResponse, error) {
		if conn, ok := c.(Conn); ok { // callVia passes the Conn
			c = conn.StorageClient
		}
		into, ok := c.(BlocksInto)
		if !ok {
			return nil, errNotInProcess
		}
		return nil, into.ReadBlocksInto(ctx, req, dst)
	}, req)
	return err
}

// errNotInProcess: the primary is no longer the server in this process.
var errNotInProcess = errors.New("the primary is not in this process")

// blocks returns the contents of blocks first..last (nil for holes),
// fetching what the cache lacks; blocks a prefetch is already bringing are
// waited for, not fetched twice.
func (st *fileState) blocks(ctx context.Context, f *FS, u User, first, last uint64, hot bool) ([][]byte, error) {
	if err := st.loadRefs(ctx, f, u, first, last); err != nil {
		return nil, err
	}
	out := make([][]byte, last-first+1)
	for attempt := 0; ; attempt++ {
		var needed [][32]byte
		for idx := first; idx <= last; idx++ {
			if out[idx-first] != nil {
				continue
			}
			if b, ok := st.buffered(idx); ok {
				out[idx-first] = b
				continue
			}
			ref, ok := st.ref(idx)
			if !ok {
				continue // a hole
			}
			if b, ok := f.cache.Get(ref.hash); ok {
				out[idx-first] = b
				continue
			}
			needed = append(needed, ref.hash)
		}
		if len(needed) == 0 {
			return out, nil
		}
		if attempt == 2 {
			return nil, fmt.Errorf("blocks of %v evicted while reading: %w", st.id, fserr.ErrIO)
		}
		mine, wait := f.claim(needed)
		if !hot && len(mine) > 0 {
			st.askNearGrants(ctx, f, u, first, last)
		}
		fetch := func() error { return f.fetchClaimed(ctx, u, st.id, mine, st.eventual) }
		if hot {
			fetch = func() error { return f.fetchHot(ctx, u, st.hotFile(ctx, mine), mine) }
		}
		if err := fetch(); err != nil {
			return nil, err
		}
		if err := f.awaitClaims(ctx, u, st, needed, wait, hot); err != nil {
			return nil, err
		}
	}
}

// awaitClaims waits for the blocks other fetches bring. A .Hotspot
// prefetch fetches in a random order, so a block a read needs may be far
// down its queue: once half of what was left of the read's time is gone,
// the read takes the blocks still queued and fetches them itself.
func (f *FS) awaitClaims(ctx context.Context, u User, st *fileState, needed [][32]byte, wait []chan struct{}, hot bool) error {
	var valve <-chan time.Time
	if dl, ok := ctx.Deadline(); ok && hot {
		t := time.NewTimer(time.Until(dl) / 2)
		defer t.Stop()
		valve = t.C
	}
	for _, ch := range wait {
		for waiting := true; waiting; {
			select {
			case <-ch:
				waiting = false
			case <-valve:
				valve = nil
				if mine := f.steal(needed); len(mine) > 0 {
					f.log.Debug("hotspot read takes queued blocks", "id", st.id.String(), "blocks", len(mine))
					if err := f.fetchHot(ctx, u, st.hotFile(ctx, mine), mine); err != nil {
						return err
					}
				}
			case <-ctx.Done():
				return fmt.Errorf("waiting for blocks of %v: %w", st.id, fserr.ErrTimeout)
			}
		}
	}
	return nil
}

// prefetch starts fetching blocks from..to in the background, so that a
// sequential reader finds them cached (paper §5.5, .WholeFile); with hot
// (.Hotspot) they come from holders first (prefetchHot).
func (st *fileState) prefetch(ctx context.Context, f *FS, u User, from, to uint64, hot bool) {
	if err := st.loadRefs(ctx, f, u, from, to); err != nil {
		return // the read itself will report it
	}
	var needed [][32]byte
	for idx := from; idx <= to; idx++ {
		if _, ok := st.buffered(idx); ok {
			continue
		}
		if ref, ok := st.ref(idx); ok {
			needed = append(needed, ref.hash)
		}
	}
	mine, _ := f.claim(needed)
	if hot {
		f.prefetchHot(ctx, u, st.hotFile(ctx, mine), mine)
		return
	}
	if len(mine) > 0 {
		st.askNearGrants(ctx, f, u, from, to)
	}
	id, ev := st.id, st.eventual
	// One goroutine per RPC's worth: the reads of the window overlap, so
	// the primary's disk sees several requests at once.
	for chunk := range slices.Chunk(mine, blocksPerRPC) {
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.Timeout)
			defer cancel()
			if err := f.fetchClaimed(ctx, u, id, chunk, ev); err != nil {
				f.log.Debug("prefetch failed", "id", id.String(), "err", err)
			}
		}()
	}
}

// claim splits hashes into those this caller must fetch (now marked in
// flight) and the channels of those another fetch is already bringing.
func (f *FS) claim(hashes [][32]byte) (mine [][32]byte, wait []chan struct{}) {
	f.fetchMu.Lock()
	defer f.fetchMu.Unlock()
	for _, h := range hashes {
		if ch, ok := f.inflight[h]; ok {
			wait = append(wait, ch)
			continue
		}
		if f.cache.Contains(h) { // memory only: no disk read under fetchMu
			continue
		}
		f.inflight[h] = make(chan struct{})
		mine = append(mine, h)
	}
	return mine, wait
}

// fetchClaimed brings claimed blocks into the memory cache, from the disk
// cache or else from the file's primary, releasing each RPC's claims as
// soon as its blocks are cached, and every claim whatever happens.
func (f *FS) fetchClaimed(ctx context.Context, u User, id oid.ID, hashes [][32]byte, ev bool) error {
	defer f.unclaim(hashes)
	var local, remote [][32]byte
	for _, h := range hashes {
		if _, ok := f.cache.Get(h); ok {
			local = append(local, h)
		} else {
			remote = append(remote, h)
		}
	}
	f.unclaim(local)
	_, err := f.readRemote(ctx, u, id, ev, remote)
	return err
}

// unclaim ends the claims on hs (fetched, or given up).
func (f *FS) unclaim(hs [][32]byte) {
	f.fetchMu.Lock()
	for _, h := range hs {
		if ch, ok := f.inflight[h]; ok {
			close(ch)
			delete(f.inflight, h)
		}
	}
	f.fetchMu.Unlock()
}

// readRemote reads claimed blocks from id's primary (or a replica under
// .EventualConsistency) into the cache, releasing each RPC's claims as
// its blocks arrive; n is the bytes read. Blocks of a primary in this
// process stay out of the disk tier.
func (f *FS) readRemote(ctx context.Context, u User, id oid.ID, ev bool, remote [][32]byte) (n int64, err error) {
	local := !ev && f.primaryInProcess(id)
	for chunk := range slices.Chunk(remote, blocksPerRPC) {
		if !ev && !local {
			if data := f.fromNearReplica(ctx, u, id, chunk); data != nil {
				for i, h := range chunk {
					f.cacheBlock(id, false, h, data[i])
					n += int64(len(data[i]))
				}
				f.unclaim(chunk)
				continue
			}
		}
		req := &wire.ReadBlocksRequest{Caller: u.caller(), Id: uint64(id), Hashes: make([][]byte, len(chunk))}
		for i := range chunk {
			req.Hashes[i] = chunk[i][:]
		}
		// Under .EventualConsistency any replica's copy will do: blocks
		// are named by their hash; the answer with the most wins.
		resp, err := readNewest(ctx, f, ev, id, wire.StorageClient.ReadBlocks, req, func(r *wire.ReadBlocksResponse) uint64 {
			return uint64(len(r.GetData()))
		})
		if err != nil {
			return n, err
		}
		if len(resp.Data) != len(chunk) {
			return n, fmt.Errorf("server returned %d of %d blocks: %w", len(resp.Data), len(chunk), fserr.ErrIO)
		}
		for i, h := range chunk {
			f.cacheBlock(id, local, h, resp.Data[i])
			n += int64(len(resp.Data[i]))
		}
		f.unclaim(chunk)
	}
	return n, nil
}

// primaryInProcess tells whether id's primary is the server in this
// process, whose blocks are on this host's disk already. It asks the
// route with a context already done, so that it answers from the slice
// table at hand and never waits for a new one (an unknown slice: false).
func (f *FS) primaryInProcess(id oid.ID) bool {
	c, ok := f.primaryAtHand(id)
	return ok && c.InProcess
}

// primaryAtHand returns the primary of id's slice by the routing table at
// hand, never waiting for a newer one (the context is already done).
func (f *FS) primaryAtHand(id oid.ID) (Conn, bool) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	c, err := f.router.Primary(done, id.Slice())
	return c, err == nil
}

// cacheBlock keeps a block of file id: in memory only when local (its
// primary is in this process: a disk copy would double a cold read's
// writes and save nothing), else in both tiers.
func (f *FS) cacheBlock(id oid.ID, local bool, h [32]byte, data []byte) {
	if local {
		f.cache.AddMemory(h, data)
		return
	}
	f.cache.AddOwned(uint64(id), h, data)
}

// buffered returns block idx's contents if this client holds them
// unuploaded (dirty) or in a running upload.
func (st *fileState) buffered(idx uint64) ([]byte, bool) {
	if b, ok := st.dirty[idx]; ok {
		return b, true
	}
	b, ok := st.uploading[idx]
	return b, ok
}

// ref returns the reference of block idx in the current view of the file.
func (st *fileState) ref(idx uint64) (blockRef, bool) {
	if r, ok := st.staged[idx]; ok {
		return r, true
	}
	r, ok := st.hashes[idx]
	return r, ok
}

// loadRefs makes sure the block references of first..last are known.
func (st *fileState) loadRefs(ctx context.Context, f *FS, u User, first, last uint64) error {
	for chunk := first / refsPerFetch; chunk <= last/refsPerFetch; chunk++ {
		if st.loaded[chunk] {
			continue
		}
		req := &wire.GetBlocksRequest{Caller: u.caller(), Id: uint64(st.id), First: chunk * refsPerFetch, Count: refsPerFetch,
			Site: f.cfg.Site}
		have, haveCert := f.peer.haveCert()
		req.HaveCert = haveCert
		resp, err := readNewest(ctx, f, st.eventual, st.id, wire.StorageClient.GetBlocks, req, func(r *wire.GetBlocksResponse) uint64 {
			return r.GetMeta().GetVersion()
		})
		if err != nil {
			return err
		}
		f.noteNearGrant(st.id, resp, have)
		if resp.Meta.Version != st.version && !st.modified {
			// Another client committed since we opened: read the newer
			// version whole rather than mixing two versions' blocks.
			st.reset(resp.Meta)
		}
		for _, r := range resp.Blocks {
			var ref blockRef
			copy(ref.hash[:], r.Hash)
			ref.len = r.Len
			st.hashes[r.Index] = ref
		}
		st.loaded[chunk] = true
	}
	return nil
}
