package client

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// refsPerFetch is how many block references one GetBlocks call returns.
const refsPerFetch = 1024

// blocksPerRPC bounds the blocks moved by one ReadBlocks/PutBlocks call.
const blocksPerRPC = 16

// readAhead is how many blocks past a sequential read are prefetched.
const readAhead = 64

type blockRef struct {
	hash [32]byte
	len  uint32
}

// fileState is what a client knows about one open file: the block list of
// the version it read, and the writes it buffers until close or fsync.
// All handles of the file on this client share it, as POSIX requires.
type fileState struct {
	mu   sync.Mutex
	id   oid.ID
	refs int

	version uint64 // server version that hashes describes
	size    int64  // current size, local writes included
	hashes  map[uint64]blockRef
	loaded  map[uint64]bool // which refsPerFetch-chunks of hashes are known

	nextRead   int64  // offset after the last read, to detect sequential reads
	prefetched uint64 // last block index a prefetch was started for

	dirty      map[uint64][]byte   // written blocks not yet uploaded
	dirtyBytes int64               // bytes held by dirty
	uploading  map[uint64][]byte   // blocks a background upload is sending
	upDone     chan struct{}       // closed when that upload ends; nil if none
	upErr      error               // a background upload's failure, for the next write or flush
	staged     map[uint64]blockRef // uploaded, not yet committed
	modified   bool
	mtimeNs    int64

	// view is the file's meta-data as this client sees it: the server's,
	// plus buffered writes and the attribute changes in pending, which
	// are committed with the data.
	view    *wire.Meta
	pending []*wire.SetAttrRequest

	// eventual: a handle opened it with .EventualConsistency, so reads
	// may come from backups, and written data stays in memory until a
	// commit succeeds (it may have to go to a backup instead).
	eventual bool
}

func newFileState(id oid.ID, m *wire.Meta) *fileState {
	st := &fileState{id: id, dirty: map[uint64][]byte{}, staged: map[uint64]blockRef{}, uploading: map[uint64][]byte{}}
	st.reset(m)
	return st
}

// reset forgets the block list and adopts the server's version m.
func (st *fileState) reset(m *wire.Meta) {
	st.view = proto.CloneOf(m)
	st.version = m.Version
	st.size = int64(m.Size)
	st.hashes = map[uint64]blockRef{}
	st.loaded = map[uint64]bool{}
	st.nextRead, st.prefetched = 0, 0
}

// updateMeta adopts meta-data the server returned after a change this
// client made (a truncate drops the cached block list).
func (st *fileState) updateMeta(m *wire.Meta, sizeChanged bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.modified {
		return
	}
	if sizeChanged || m.Version != st.version+1 {
		st.reset(m)
		return
	}
	st.version = m.Version
	st.size = int64(m.Size)
	st.view = proto.CloneOf(m)
}

// deferAttr applies a chmod/chown/utimens to a file with buffered writes
// locally, checking permission as the server will, so that it travels in
// the same commit as the data: one durable write instead of several.
// ok is false when the file has nothing buffered.
func (st *fileState) deferAttr(u User, req *wire.SetAttrRequest) (m *wire.Meta, ok bool, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.modified {
		return nil, false, nil
	}
	req = proto.CloneOf(req)
	req.Caller = u.caller()
	if err := attrs.Apply(attrs.Cred(req.Caller), st.view, req, time.Now().UnixNano()); err != nil {
		return nil, true, err
	}
	if req.Valid&wire.SetMtime != 0 {
		st.mtimeNs = st.view.MtimeNs
	}
	st.pending = append(st.pending, req)
	return st.snapshot(), true, nil
}

// snapshot returns a copy of the client's view of the file.
func (st *fileState) snapshot() *wire.Meta {
	m := proto.CloneOf(st.view)
	m.Size = uint64(st.size)
	if st.mtimeNs != 0 {
		m.MtimeNs = st.mtimeNs
	}
	return m
}

// Handle is an open file.
type Handle struct {
	fs   *FS
	st   *fileState
	user User
	cues cue.Set
	// Writable reports whether the handle was opened for writing.
	Writable bool
	// registered delivers whether the primary counted this open, for an
	// open served from the cache (registered in the background); nil
	// when the open was counted before it returned (counted) or by no one.
	registered chan bool
	counted    bool
	obj        oid.ID
}

func (f *FS) openState(id oid.ID) *fileState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[id]
}

// overlay returns m as this client sees it: with buffered writes applied.
func (f *FS) overlay(m *wire.Meta) *wire.Meta {
	if m == nil || m.Type != wire.Type_TYPE_FILE {
		return m
	}
	st := f.openState(oid.ID(m.Id))
	if st == nil {
		return m
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.modified {
		return m
	}
	return st.snapshot()
}

// Open opens a file. flags are open(2) flags; the server checks the
// caller's permission for them. Close-to-open: the version comes from the
// primary, or from meta-data cached under a valid lease (a read-only open
// then needs no round trip: its permission is checked here, on the same
// rules, and the primary counts the handle in the background). Cached
// blocks are reused only if the version is unchanged.
func (f *FS) Open(ctx context.Context, u User, cues cue.Set, id oid.ID, flags uint32) (*Handle, *wire.Meta, error) {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	writable := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	h := &Handle{fs: f, user: u, cues: cues, Writable: writable, obj: id}
	req := &wire.OpenRequest{Caller: u.caller(), Id: uint64(id), Flags: flags}
	m, ok := f.leases.meta(id, false)
	if ok && !writable && flags&syscall.O_TRUNC == 0 {
		if err := perm.Access(attrs.Cred(req.Caller), attrs.Of(m), perm.R); err != nil {
			return nil, nil, fmt.Errorf("open %v: %w", id, err)
		}
		h.registered = f.registerOpen(req)
	} else {
		resp, tok, err := readLeased(ctx, f, cues, id, wire.StorageClient.Open, req, func(r *wire.OpenResponse) uint64 {
			return r.GetMeta().GetVersion()
		})
		if err != nil && cues.EventualConsistency && unreachable(err) && !writable {
			if sm, ok := f.leases.meta(id, true); ok {
				resp, err = &wire.OpenResponse{Meta: sm}, nil
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("open %v: %w", id, err)
		}
		m = resp.Meta
		// Only the primary counts handles (a backup or the cache did not).
		h.counted = tok.server != ""
		f.leases.record(tok, resp.LeaseMs, id, func(c *cached) { c.meta = proto.CloneOf(m) })
	}
	if m.Type == wire.Type_TYPE_DIR && writable {
		h.releaseAt(ctx)
		return nil, nil, fmt.Errorf("open %v for writing: %w", id, fserr.ErrIsDir)
	}
	f.mu.Lock()
	st := f.files[id]
	if st == nil {
		st = newFileState(id, m)
		if hashes, loaded, ok := f.leases.takeRefs(id, m.Version); ok {
			st.hashes, st.loaded = hashes, loaded
		}
		f.files[id] = st
	}
	st.refs++
	f.mu.Unlock()
	h.st = st

	st.mu.Lock()
	if !st.modified && m.Version != st.version {
		st.reset(m)
	}
	st.eventual = st.eventual || cues.EventualConsistency
	st.mu.Unlock()
	if flags&syscall.O_TRUNC != 0 && h.Writable && m.Type == wire.Type_TYPE_FILE && m.Size > 0 {
		var err error
		m, err = f.SetAttr(ctx, u, cues, id, &wire.SetAttrRequest{Valid: wire.SetSize, Size: 0})
		if err != nil {
			h.Release(ctx)
			return nil, nil, err
		}
	}
	return h, f.overlay(m), nil
}

// registration counts the opens of one object being registered at its
// primary in the background; done closes when there are none left.
type registration struct {
	n    int
	done chan struct{}
}

// registerOpen tells the primary about an open served from the cache, in
// the background; the result says whether it counted it. Revocations of
// the object wait for it (waitRegistrations), so an unlink the primary is
// about to apply finds the handle and keeps the file as an orphan.
func (f *FS) registerOpen(req *wire.OpenRequest) chan bool {
	id := oid.ID(req.Id)
	f.regMu.Lock()
	r := f.regs[id]
	if r == nil {
		r = &registration{done: make(chan struct{})}
		f.regs[id] = r
	}
	r.n++
	f.regMu.Unlock()
	req.Caller.Session = 0
	out := make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(f.leases.ctx, f.cfg.Timeout)
		defer cancel()
		_, err := call(ctx, f, id, wire.StorageClient.Open, req)
		if err != nil {
			f.log.Warn("open served from the cache was not registered", slog.String("id", id.String()), slog.Any("err", err))
		}
		out <- err == nil
		f.regMu.Lock()
		if r.n--; r.n == 0 {
			close(r.done)
			delete(f.regs, id)
		}
		f.regMu.Unlock()
	}()
	return out
}

// Version returns the file version this client last saw committed.
func (h *Handle) Version() uint64 {
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	return h.st.version
}

// ID returns the open object's ID.
func (h *Handle) ID() oid.ID { return h.st.id }

// Read reads up to len(p) bytes at off.
func (h *Handle) Read(ctx context.Context, p []byte, off int64) (int, error) {
	ctx, cancel := h.fs.bound(ctx, h.cues)
	defer cancel()
	st := h.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if off >= st.size {
		return 0, nil
	}
	if end := st.size - off; int64(len(p)) > end {
		p = p[:end]
	}
	first := uint64(off / BlockSize)
	last := uint64((off + int64(len(p)) - 1) / BlockSize)
	blocks, err := st.blocks(ctx, h.fs, h.user, first, last)
	if err != nil {
		return 0, fmt.Errorf("read %v at %d: %w", st.id, off, err)
	}
	// Sequential readers get the next window fetched in the background;
	// .WholeFile prefetches the whole file on the first read.
	maxIdx := uint64((st.size - 1) / BlockSize)
	// Refill the window when half of it is consumed, so prefetches go
	// out in large batches.
	if last < maxIdx && (off == st.nextRead || h.cues.WholeFile) && last+readAhead/2 > st.prefetched {
		ahead := min(last+readAhead, maxIdx)
		if h.cues.WholeFile {
			ahead = maxIdx
		}
		st.prefetch(ctx, h.fs, h.user, max(last+1, st.prefetched+1), ahead)
		st.prefetched = ahead
	}
	st.nextRead = off + int64(len(p))
	n := 0
	for idx := first; idx <= last; idx++ {
		b := blocks[idx-first]
		start := int64(0)
		if idx == first {
			start = off % BlockSize
		}
		want := min(int64(len(p)-n), BlockSize-start)
		seg := p[n : n+int(want)]
		c := 0
		if start < int64(len(b)) {
			c = copy(seg, b[start:])
		}
		clear(seg[c:]) // holes and short blocks read as zeros
		n += int(want)
	}
	return n, nil
}

// blocks returns the contents of blocks first..last (nil for holes),
// fetching what the cache lacks; blocks a prefetch is already bringing are
// waited for, not fetched twice.
func (st *fileState) blocks(ctx context.Context, f *FS, u User, first, last uint64) ([][]byte, error) {
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
		if err := f.fetchClaimed(ctx, u, st.id, mine, st.eventual); err != nil {
			return nil, err
		}
		for _, ch := range wait {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, fmt.Errorf("waiting for blocks of %v: %w", st.id, fserr.ErrTimeout)
			}
		}
	}
}

// prefetch starts fetching blocks from..to in the background, so that a
// sequential reader finds them cached (paper §5.5, .WholeFile).
func (st *fileState) prefetch(ctx context.Context, f *FS, u User, from, to uint64) {
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
	release := func(hs [][32]byte) {
		f.fetchMu.Lock()
		for _, h := range hs {
			if ch, ok := f.inflight[h]; ok {
				close(ch)
				delete(f.inflight, h)
			}
		}
		f.fetchMu.Unlock()
	}
	defer release(hashes)
	var local, remote [][32]byte
	for _, h := range hashes {
		if _, ok := f.cache.Get(h); ok {
			local = append(local, h)
		} else {
			remote = append(remote, h)
		}
	}
	release(local)
	for chunk := range slices.Chunk(remote, blocksPerRPC) {
		req := &wire.ReadBlocksRequest{Caller: u.caller(), Id: uint64(id), Hashes: make([][]byte, len(chunk))}
		for i := range chunk {
			req.Hashes[i] = chunk[i][:]
		}
		var resp *wire.ReadBlocksResponse
		var err error
		if ev {
			// Any replica's copy will do: blocks are named by their hash.
			resp, _, err = readEventual(ctx, f, id, wire.StorageClient.ReadBlocks, req, func(r *wire.ReadBlocksResponse) uint64 {
				return uint64(len(r.GetData()))
			})
		} else {
			resp, err = call(ctx, f, id, wire.StorageClient.ReadBlocks, req)
		}
		if err != nil {
			return err
		}
		if len(resp.Data) != len(chunk) {
			return fmt.Errorf("server returned %d of %d blocks: %w", len(resp.Data), len(chunk), fserr.ErrIO)
		}
		for i, h := range chunk {
			f.cache.Add(h, resp.Data[i])
		}
		release(chunk)
	}
	return nil
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
		req := &wire.GetBlocksRequest{Caller: u.caller(), Id: uint64(st.id), First: chunk * refsPerFetch, Count: refsPerFetch}
		var resp *wire.GetBlocksResponse
		var err error
		if st.eventual {
			resp, _, err = readEventual(ctx, f, st.id, wire.StorageClient.GetBlocks, req, func(r *wire.GetBlocksResponse) uint64 {
				return r.GetMeta().GetVersion()
			})
		} else {
			resp, err = call(ctx, f, st.id, wire.StorageClient.GetBlocks, req)
		}
		if err != nil {
			return err
		}
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

// blockBufs recycles write buffers: written blocks are not kept in the
// read cache (writes should not evict what readers use), so a buffer is
// free again once its block is stored, and fresh 64 KiB allocations (page
// faults, GC) were a third of a large write's CPU.
var blockBufs = sync.Pool{New: func() any { b := make([]byte, 0, BlockSize); return &b }}

func newBlockBuf() []byte { return (*blockBufs.Get().(*[]byte))[:0] }

func freeBlockBuf(b []byte) {
	if cap(b) == BlockSize {
		b = b[:0]
		blockBufs.Put(&b)
	}
}

// blockLen is how many bytes of block idx lie inside a file of size.
func blockLen(idx uint64, size int64) int64 {
	start := int64(idx) * BlockSize
	if size <= start {
		return 0
	}
	return min(size-start, BlockSize)
}

// Write buffers p at off; the data reaches the server on close or fsync
// (full blocks may travel earlier to bound memory, uncommitted).
func (h *Handle) Write(ctx context.Context, p []byte, off int64) (int, error) {
	if !h.Writable {
		return 0, fmt.Errorf("write on read-only handle: %w", fserr.ErrBadFD)
	}
	ctx, cancel := h.fs.bound(ctx, h.cues)
	defer cancel()
	st := h.st
	st.mu.Lock()
	defer st.mu.Unlock()
	total := len(p)
	for len(p) > 0 {
		idx := uint64(off / BlockSize)
		boff := off % BlockSize
		n := int(min(int64(len(p)), BlockSize-boff))
		buf, ok := st.dirty[idx]
		if !ok {
			var err error
			if buf, err = st.startBlock(ctx, h.fs, h.user, idx, boff, int64(n)); err != nil {
				return total - len(p), fmt.Errorf("write %v at %d: %w", st.id, off, err)
			}
			st.dirty[idx] = buf
			st.dirtyBytes += BlockSize
		}
		if old := int64(len(buf)); old < boff+int64(n) {
			buf = buf[:boff+int64(n)]
			if old < boff {
				clear(buf[old:boff]) // a recycled buffer: a gap must read as zeros
			}
			st.dirty[idx] = buf
		}
		copy(buf[boff:], p[:n])
		p = p[n:]
		off += int64(n)
	}
	st.size = max(st.size, off)
	st.modified = true
	st.mtimeNs = time.Now().UnixNano()
	for _, a := range st.pending {
		a.Valid &^= wire.SetMtime // this write is newer than an earlier utimens
	}
	if st.dirtyBytes > h.fs.cfg.DirtyBytes && !st.eventual {
		// Full blocks go to the primary in the background while the
		// application keeps writing; one upload at a time bounds memory.
		st.waitUpload()
		if err := st.upErr; err != nil {
			st.upErr = nil
			return total, err
		}
		st.startUpload(ctx, h.fs, h.user)
	}
	return total, nil
}

// startBlock returns a buffer for a block about to be written at
// [boff, boff+n): the block's current contents when the write covers only
// part of the existing data, zeros otherwise.
func (st *fileState) startBlock(ctx context.Context, f *FS, u User, idx uint64, boff, n int64) ([]byte, error) {
	buf := newBlockBuf()
	existing := blockLen(idx, st.size)
	if existing == 0 || (boff == 0 && n >= existing) {
		return buf, nil
	}
	old, err := st.blocks(ctx, f, u, idx, idx)
	if err != nil {
		return nil, err
	}
	buf = buf[:existing]
	clear(buf[copy(buf, old[0]):]) // holes and short blocks read as zeros
	return buf, nil
}

// waitUpload waits, with st.mu held, until no background upload runs.
func (st *fileState) waitUpload() {
	for st.upDone != nil {
		ch := st.upDone
		st.mu.Unlock()
		<-ch
		st.mu.Lock()
	}
}

// startUpload hands the full dirty blocks to a background upload.
func (st *fileState) startUpload(ctx context.Context, f *FS, u User) {
	var idxs []uint64
	for idx, b := range st.dirty {
		if len(b) == BlockSize {
			idxs = append(idxs, idx)
			st.uploading[idx] = b
			delete(st.dirty, idx)
			st.dirtyBytes -= BlockSize
		}
	}
	if len(idxs) == 0 {
		return
	}
	slices.Sort(idxs)
	bufs := make([][]byte, len(idxs))
	for i, idx := range idxs {
		bufs[i] = st.uploading[idx] // never written again: writers copy it
	}
	done := make(chan struct{})
	st.upDone = done
	ctx = context.WithoutCancel(ctx)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
		defer cancel()
		err := st.sendBlocks(ctx, f, u, idxs, bufs, func(idx uint64, ref blockRef, data []byte) {
			st.mu.Lock()
			st.staged[idx] = ref
			st.mu.Unlock()
		})
		st.mu.Lock()
		for _, idx := range idxs {
			b := st.uploading[idx]
			delete(st.uploading, idx)
			if _, newer := st.dirty[idx]; err != nil && !newer {
				st.dirty[idx] = b // keep it for the next attempt
				st.dirtyBytes += BlockSize
			} else {
				freeBlockBuf(b)
			}
		}
		if err != nil {
			st.upErr = err
		}
		st.upDone = nil
		st.mu.Unlock()
		close(done)
	}()
}

// sendBlocks uploads bufs[i] as block idxs[i] with PutBlocks and hands
// each stored block's reference to stage.
func (st *fileState) sendBlocks(ctx context.Context, f *FS, u User, idxs []uint64, bufs [][]byte, stage func(idx uint64, ref blockRef, data []byte)) error {
	for start := 0; start < len(idxs); start += blocksPerRPC {
		end := min(start+blocksPerRPC, len(idxs))
		req := &wire.PutBlocksRequest{Caller: u.caller(), Id: uint64(st.id), Data: bufs[start:end]}
		resp, err := call(ctx, f, st.id, wire.StorageClient.PutBlocks, req)
		if err != nil {
			return fmt.Errorf("upload blocks of %v: %w", st.id, err)
		}
		if len(resp.Hashes) != end-start {
			return fmt.Errorf("server stored %d of %d blocks: %w", len(resp.Hashes), end-start, fserr.ErrIO)
		}
		for i, h := range resp.Hashes {
			ref := blockRef{len: uint32(len(bufs[start+i]))}
			copy(ref.hash[:], h)
			stage(idxs[start+i], ref, bufs[start+i])
		}
	}
	return nil
}

// upload sends dirty blocks to the primary (only full ones when onlyFull)
// and keeps their references staged for the next commit. st.mu is held.
func (st *fileState) upload(ctx context.Context, f *FS, u User, onlyFull bool) error {
	idxs := make([]uint64, 0, len(st.dirty))
	for idx, b := range st.dirty {
		if !onlyFull || len(b) == BlockSize {
			idxs = append(idxs, idx)
		}
	}
	slices.Sort(idxs)
	bufs := make([][]byte, len(idxs))
	for i, idx := range idxs {
		bufs[i] = st.dirty[idx]
	}
	return st.sendBlocks(ctx, f, u, idxs, bufs, func(idx uint64, ref blockRef, data []byte) {
		st.staged[idx] = ref
		delete(st.dirty, idx)
		st.dirtyBytes -= BlockSize
		freeBlockBuf(data)
	})
}

// flush commits buffered writes as a new version; close() and fsync()
// return only after the primary has them durably at the cue's SyncLevel.
func (st *fileState) flush(ctx context.Context, f *FS, u User, cues cue.Set) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.waitUpload()
	st.upErr = nil // its blocks went back to dirty: upload them again now
	if !st.modified {
		return nil
	}
	if st.eventual {
		return st.flushEventual(ctx, f, u, cues)
	}
	if err := st.upload(ctx, f, u, false); err != nil {
		return err
	}
	resp, err := call(ctx, f, st.id, wire.StorageClient.Commit, st.commitRequest(u, cues))
	if err != nil {
		return fmt.Errorf("commit %v: %w", st.id, err)
	}
	st.committed(resp.Meta)
	return nil
}

// commitRequest describes the buffered changes whose blocks are staged.
func (st *fileState) commitRequest(u User, cues cue.Set) *wire.CommitRequest {
	req := &wire.CommitRequest{Caller: u.caller(), Id: uint64(st.id), Size: uint64(st.size),
		MtimeNs: st.mtimeNs, SyncLevel: syncLevel(cues), Blocks: make([]*wire.BlockRef, 0, len(st.staged)),
		Attrs: st.pending}
	for idx, ref := range st.staged {
		req.Blocks = append(req.Blocks, &wire.BlockRef{Index: idx, Hash: ref.hash[:], Len: ref.len})
	}
	return req
}

// flushEventual commits under .EventualConsistency: the written blocks
// and the commit go together to the primary, or, when it does not answer
// within half the time limit, to a backup (paper §4.5). The data stays
// in memory until one of them took it.
func (st *fileState) flushEventual(ctx context.Context, f *FS, u User, cues cue.Set) error {
	idxs := make([]uint64, 0, len(st.dirty))
	for idx := range st.dirty {
		idxs = append(idxs, idx)
	}
	slices.Sort(idxs)
	bufs := make([][]byte, len(idxs))
	for i, idx := range idxs {
		bufs[i] = st.dirty[idx]
	}
	var refs map[uint64]blockRef // the blocks as the answering server stored them
	// commitAt stores the blocks and commits at one server.
	commitAt := func(ctx context.Context, c wire.StorageClient, req *wire.CommitRequest) (*wire.CommitResponse, error) {
		refs = map[uint64]blockRef{}
		caller := req.Caller
		for start := 0; start < len(idxs); start += blocksPerRPC {
			end := min(start+blocksPerRPC, len(idxs))
			resp, err := c.PutBlocks(ctx, &wire.PutBlocksRequest{Caller: caller, Id: uint64(st.id), Data: bufs[start:end]})
			if err != nil {
				return nil, fserr.FromStatus(err)
			}
			if len(resp.Hashes) != end-start {
				return nil, fmt.Errorf("server stored %d of %d blocks: %w", len(resp.Hashes), end-start, fserr.ErrIO)
			}
			for i, h := range resp.Hashes {
				ref := blockRef{len: uint32(len(bufs[start+i]))}
				copy(ref.hash[:], h)
				refs[idxs[start+i]] = ref
				req.Blocks = append(req.Blocks, &wire.BlockRef{Index: idxs[start+i], Hash: ref.hash[:], Len: ref.len})
			}
		}
		resp, err := c.Commit(ctx, req)
		return resp, fserr.FromStatus(err)
	}
	resp, err := writeEventual(ctx, f, st.id, func(c wire.StorageClient, ctx context.Context, req *wire.CommitRequest, _ ...grpc.CallOption) (*wire.CommitResponse, error) {
		return commitAt(ctx, c, proto.CloneOf(req))
	}, st.commitRequest(u, cues))
	if err != nil {
		return fmt.Errorf("commit %v: %w", st.id, err)
	}
	for i, idx := range idxs {
		st.staged[idx] = refs[idx]
		delete(st.dirty, idx)
		st.dirtyBytes -= BlockSize
		freeBlockBuf(bufs[i])
	}
	st.committed(resp.Meta)
	return nil
}

// committed adopts the meta-data of a commit of this client's changes.
func (st *fileState) committed(m *wire.Meta) {
	if m.Version == st.version+1 {
		for idx, ref := range st.staged {
			st.hashes[idx] = ref
		}
		st.version = m.Version
		st.size = int64(m.Size)
	} else {
		st.reset(m)
	}
	clear(st.staged)
	st.pending = nil
	st.view = proto.CloneOf(m)
	st.modified = false
	st.mtimeNs = 0
}

// Flush commits this file's buffered writes (close(2)).
func (h *Handle) Flush(ctx context.Context) error {
	if !h.Writable {
		return nil
	}
	ctx, cancel := h.fs.bound(ctx, h.cues)
	defer cancel()
	return h.st.flush(ctx, h.fs, h.user, h.cues)
}

// Fsync is Flush: a commit is durable at the promised SyncLevel.
func (h *Handle) Fsync(ctx context.Context) error { return h.Flush(ctx) }

// Release drops the handle; the primary counts every handle (Open), so
// each one is released there. The last handle of a file forgets its state.
func (h *Handle) Release(ctx context.Context) {
	f, st := h.fs, h.st
	f.mu.Lock()
	st.refs--
	last := st.refs == 0
	if last {
		delete(f.files, st.id)
	}
	f.mu.Unlock()
	if last {
		st.mu.Lock()
		lost := st.modified
		if !lost && st.upDone == nil {
			f.leases.keepRefs(st.id, st.version, st.hashes, st.loaded)
		}
		st.mu.Unlock()
		if lost {
			f.log.Error("writes dropped: file released with uncommitted data", slog.String("id", st.id.String()))
		}
	}
	// The primary's count only matters to reclaim unlinked files: tell it
	// in the background, close(2) need not wait a round trip.
	go func() {
		ctx, cancel := f.bound(context.WithoutCancel(ctx), h.cues)
		defer cancel()
		h.releaseAt(ctx)
	}()
}

// releaseAt tells the primary this handle is gone, if it counted it.
func (h *Handle) releaseAt(ctx context.Context) {
	if h.registered != nil {
		if !<-h.registered {
			return
		}
	} else if !h.counted {
		return
	}
	h.fs.release(ctx, h.obj)
}

// release tells the primary one open of id is gone, so an unlinked file can
// be reclaimed.
func (f *FS) release(ctx context.Context, id oid.ID) {
	if _, err := call(ctx, f, id, wire.StorageClient.Release, &wire.ReleaseRequest{Id: uint64(id)}); err != nil {
		f.log.Warn("release failed", slog.String("id", id.String()), slog.Any("err", err))
	}
}
