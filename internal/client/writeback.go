package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// blocksPerRPC bounds the blocks moved by one ReadBlocks/PutBlocks call.
const blocksPerRPC = 16

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
	st.writer = h
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
	old, err := st.blocks(ctx, f, u, idx, idx, false)
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
	idxs, bufs := st.dirtyBlocks(true)
	if len(idxs) == 0 {
		return
	}
	for i, idx := range idxs {
		st.uploading[idx] = bufs[i] // never written again: writers copy it
		delete(st.dirty, idx)
		st.dirtyBytes -= BlockSize
	}
	done := make(chan struct{})
	st.upDone = done
	ctx = context.WithoutCancel(ctx)
	local := f.primaryInProcess(st.id)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
		defer cancel()
		err := st.sendBlocks(ctx, f, u, idxs, bufs, func(idx uint64, ref blockRef, data []byte) {
			if !local {
				st.keepStaged(f, ref, data)
			}
			st.mu.Lock()
			st.stage(f, idx, ref)
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

// sendBlocks uploads bufs[i] as block idxs[i] to the primary and hands
// each stored block's reference to stage.
func (st *fileState) sendBlocks(ctx context.Context, f *FS, u User, idxs []uint64, bufs [][]byte, stage func(idx uint64, ref blockRef, data []byte)) error {
	put := func(ctx context.Context, req *wire.PutBlocksRequest) (*wire.PutBlocksResponse, error) {
		return call(ctx, f, st.id, wire.StorageClient.PutBlocks, req)
	}
	return putBlocks(ctx, put, u.caller(), st.id, idxs, bufs, stage)
}

// putBlocks stores bufs[i] as block idxs[i] of id with put, blocksPerRPC
// at a time, and hands each stored block's reference to stage.
func putBlocks(ctx context.Context, put func(context.Context, *wire.PutBlocksRequest) (*wire.PutBlocksResponse, error),
	caller *wire.Caller, id oid.ID, idxs []uint64, bufs [][]byte, stage func(idx uint64, ref blockRef, data []byte)) error {
	for start := 0; start < len(idxs); start += blocksPerRPC {
		end := min(start+blocksPerRPC, len(idxs))
		resp, err := put(ctx, &wire.PutBlocksRequest{Caller: caller, Id: uint64(id), Data: bufs[start:end]})
		if err != nil {
			return fmt.Errorf("upload blocks of %v: %w", id, err)
		}
		if len(resp.Hashes) != end-start {
			return fmt.Errorf("server stored %d of %d blocks of %v: %w", len(resp.Hashes), end-start, id, fserr.ErrIO)
		}
		for i, h := range resp.Hashes {
			ref := blockRef{len: uint32(len(bufs[start+i]))}
			copy(ref.hash[:], h)
			stage(idxs[start+i], ref, bufs[start+i])
		}
	}
	return nil
}

// dirtyBlocks returns the dirty blocks (only full ones when onlyFull) in
// file order.
func (st *fileState) dirtyBlocks(onlyFull bool) (idxs []uint64, bufs [][]byte) {
	idxs = make([]uint64, 0, len(st.dirty))
	for idx, b := range st.dirty {
		if !onlyFull || len(b) == BlockSize {
			idxs = append(idxs, idx)
		}
	}
	slices.Sort(idxs)
	bufs = make([][]byte, len(idxs))
	for i, idx := range idxs {
		bufs[i] = st.dirty[idx]
	}
	return idxs, bufs
}

// upload sends dirty blocks to the primary (only full ones when onlyFull)
// and keeps their references staged for the next commit. st.mu is held.
func (st *fileState) upload(ctx context.Context, f *FS, u User, onlyFull bool) error {
	idxs, bufs := st.dirtyBlocks(onlyFull)
	local := f.primaryInProcess(st.id)
	return st.sendBlocks(ctx, f, u, idxs, bufs, func(idx uint64, ref blockRef, data []byte) {
		if !local {
			st.keepStaged(f, ref, data)
		}
		st.stage(f, idx, ref)
		delete(st.dirty, idx)
		st.dirtyBytes -= BlockSize
		freeBlockBuf(data)
	})
}

// keepStaged caches a copy of a block just uploaded as ref to a primary
// in another process (one in this process dies with this client). A
// primary keeps uploaded blocks in memory until a commit names them, so
// one that restarts or hands the file over meanwhile loses them; the
// commit then sends them again from the cache (resend). The copy also
// serves reads of what was just written.
func (st *fileState) keepStaged(f *FS, ref blockRef, data []byte) {
	f.cacheBlock(st.id, false, ref.hash, bytes.Clone(data))
}

// resend uploads again, from the block cache, the staged blocks that
// req names, for a commit that failed with EIO: the primary may have
// lost them. It fails when any of them is no longer cached. Blocks are
// named by their content's hash, so req and the staged references stay
// as they are. st.mu is held.
func (st *fileState) resend(ctx context.Context, f *FS, u User, req *wire.CommitRequest) error {
	idxs := make([]uint64, len(req.Blocks))
	bufs := make([][]byte, len(req.Blocks))
	for i, b := range req.Blocks {
		data, ok := f.cache.Get([32]byte(b.Hash))
		if !ok || len(data) != int(b.Len) {
			return fmt.Errorf("block %d of %v, uploaded before, is no longer cached: %w", b.Index, st.id, fserr.ErrIO)
		}
		idxs[i], bufs[i] = b.Index, data
	}
	return st.sendBlocks(ctx, f, u, idxs, bufs, func(uint64, blockRef, []byte) {})
}

// stage records an uploaded block for the next commit (st.mu held). The
// first one staged starts the clock: the server forgets uploaded blocks
// that no commit names after store.PendingTTL, so blocks that waited
// Config.StagedFor are committed then, as fsync would, whether the
// application still writes or has gone quiet. A failed commit is tried
// again a period later; close() makes the last attempt.
func (st *fileState) stage(f *FS, idx uint64, ref blockRef) {
	st.staged[idx] = ref
	if st.stagedCommit != nil {
		return
	}
	var t *time.Timer
	t = time.AfterFunc(f.cfg.StagedFor, func() {
		st.mu.Lock()
		w := st.writer
		current := st.stagedCommit == t
		st.mu.Unlock()
		if !current || w == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.cfg.Timeout)
		defer cancel()
		if err := st.flush(ctx, f, w.user, w.cues); err != nil {
			f.log.Warn("commit of blocks uploaded ahead of close failed; retrying", "id", st.id.String(), "err", err)
			st.mu.Lock()
			if st.stagedCommit == t {
				t.Reset(f.cfg.StagedFor)
			}
			st.mu.Unlock()
		}
	})
	st.stagedCommit = t
}

// flush commits buffered writes as a new version; close() and fsync()
// return only after the primary has them durably at the cue's SyncLevel.
// The commit goes through the open that wrote last, as its user (u only
// when no handle wrote).
func (st *fileState) flush(ctx context.Context, f *FS, u User, cues cue.Set) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.waitUpload()
	st.upErr = nil // its blocks went back to dirty: upload them again now
	if !st.modified {
		if err := st.syncCreate(ctx, f, u, cues); err != nil {
			return err
		}
		return st.syncLazy(ctx, f, u)
	}
	if st.writer != nil {
		u = st.writer.user
	}
	if st.eventual {
		if err := st.flushEventual(ctx, f, u, cues); err != nil {
			return err
		}
		return st.syncCreate(ctx, f, u, cues)
	}
	// The create's replication, where the commit's does not cover it,
	// is waited for beside the commit's: one round for both.
	if len(st.unsynced) == 0 {
		return st.commit(ctx, f, u, cues)
	}
	created := make(chan error, 1)
	go func(pending []*wire.Unsynced) { created <- syncChanges(ctx, f, u, cues, pending, st.id) }(st.unsynced)
	err := st.commit(ctx, f, u, cues)
	if cerr := <-created; err == nil && cerr != nil {
		err = fmt.Errorf("close of %v: the create: %w", st.id, cerr)
	}
	if err == nil {
		st.unsynced = nil
	}
	return err
}

// commit commits the buffered writes at the file's primary; the caller
// holds st.mu.
func (st *fileState) commit(ctx context.Context, f *FS, u User, cues cue.Set) error {
	req := st.commitRequest(u, cues)
	idxs, bufs := st.dirtyBlocks(false)
	var sum int
	for _, b := range bufs {
		sum += len(b)
	}
	if sum <= commitInline {
		// A small write travels inside its commit: one round trip.
		for i, idx := range idxs {
			req.Inline = append(req.Inline, &wire.BlockData{Index: idx, Data: bufs[i]})
		}
	} else {
		if err := st.upload(ctx, f, u, false); err != nil {
			return err
		}
		req = st.commitRequest(u, cues)
		idxs, bufs = nil, nil
	}
	done := f.ops.stamp(req.Caller) // a retried commit must not undo a later writer's
	resp, err := st.commitAt(ctx, f, req)
	if errors.Is(err, fserr.ErrIO) && len(req.Blocks) > 0 && ctx.Err() == nil {
		// The primary may have restarted, or another server taken the
		// file over, since the upload: the staged blocks are gone there.
		// Send them again and commit once more, as the same operation (a
		// first attempt that did apply answers as it did then).
		if rerr := st.resend(ctx, f, u, req); rerr != nil {
			f.log.Warn("commit failed, and its uploaded blocks cannot be sent again", "id", st.id.String(), "err", err, "resend", rerr)
		} else {
			f.log.Info("commit failed; sent its uploaded blocks again", "id", st.id.String(), "err", err, "blocks", len(req.Blocks))
			resp, err = st.commitAt(ctx, f, req)
		}
	}
	done()
	if err != nil {
		return fmt.Errorf("commit %v: %w", st.id, err)
	}
	if len(resp.Hashes) != len(idxs) || slices.ContainsFunc(resp.Hashes, func(h []byte) bool { return len(h) != 32 }) {
		return fmt.Errorf("commit %v: %d hashes for %d blocks sent: %w", st.id, len(resp.Hashes), len(idxs), fserr.ErrIO)
	}
	for i, idx := range idxs {
		st.staged[idx] = blockRef{hash: [32]byte(resp.Hashes[i]), len: uint32(len(bufs[i]))}
		delete(st.dirty, idx)
		st.dirtyBytes -= BlockSize
		freeBlockBuf(bufs[i])
	}
	st.committed(resp.Meta)
	return nil
}

// commitAt sends req to the file's primary as a change this client
// adopts (own.go).
func (st *fileState) commitAt(ctx context.Context, f *FS, req *wire.CommitRequest) (*wire.CommitResponse, error) {
	o := f.leases.beginOwn(st.id)
	resp, err := callVia(ctx, f, st.id, wire.StorageClient.Commit, req, callOpts{prep: func(c Conn) { o.prep(ctx, c, req.Caller) }})
	o.end(err == nil, func(_ oid.ID, c *cached) bool { return adoptMeta(c, resp.Meta) })
	return resp, err
}

// addUnsynced records what a create left to wait for: its replication,
// and its own record when the primary answered before it was durable.
func (st *fileState) addUnsynced(pending []*wire.Unsynced, lazy bool) {
	if len(pending) == 0 && !lazy {
		return
	}
	st.mu.Lock()
	st.unsynced = append(st.unsynced, pending...)
	st.lazy = st.lazy || lazy
	st.mu.Unlock()
}

// syncLazy makes the changes of the file answered before they were
// durable (fileState.lazy) durable at its primary, when no commit does;
// the caller holds st.mu.
func (st *fileState) syncLazy(ctx context.Context, f *FS, u User) error {
	if !st.lazy {
		return nil
	}
	if err := f.barrier(ctx, u, st.id); err != nil {
		return fmt.Errorf("close of %v: %w", st.id, err)
	}
	st.lazy = false
	return nil
}

// syncCreate waits for the replication of this client's create of the
// file (fileState.unsynced) without a commit to go with it; the caller
// holds st.mu.
func (st *fileState) syncCreate(ctx context.Context, f *FS, u User, cues cue.Set) error {
	if len(st.unsynced) == 0 {
		return nil
	}
	if err := syncChanges(ctx, f, u, cues, st.unsynced, 0); err != nil {
		return fmt.Errorf("close of %v: the create: %w", st.id, err)
	}
	st.unsynced = nil
	return nil
}

// syncChanges waits, at their slices' primaries in parallel, until
// changes are at the cues' SyncLevel replicas and their objects' leases
// revoked. A commit of file (0: none) covers the changes of its slice
// that concern only the file: its update waits for the slice's earlier
// changes and for revocations on the file.
func syncChanges(ctx context.Context, f *FS, u User, cues cue.Set, changes []*wire.Unsynced, file oid.ID) error {
	bySlice := map[oid.Slice][]*wire.Unsynced{}
	for _, c := range changes {
		sl := oid.Slice(c.Slice)
		if file != 0 && sl == file.Slice() {
			if !slices.ContainsFunc(c.Settle, func(id uint64) bool { return id != uint64(file) }) {
				continue
			}
			// Only the revocations to wait for (seq 0): sent now, the
			// create would travel to the backups ahead of the commit,
			// which then waits for its answer (commitQuiet).
			c = &wire.Unsynced{Slice: c.Slice, Epoch: c.Epoch, Settle: c.Settle}
		}
		bySlice[sl] = append(bySlice[sl], c)
	}
	if len(bySlice) == 0 {
		return nil
	}
	errs := make(chan error, len(bySlice))
	for sl, cs := range bySlice {
		go func() {
			_, err := call(ctx, f, oid.Make(sl, 0), wire.StorageClient.Sync,
				&wire.SyncRequest{Caller: u.caller(), Changes: cs, SyncLevel: syncLevel(cues)})
			errs <- err
		}()
	}
	var first error
	for range bySlice {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
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
	idxs, bufs := st.dirtyBlocks(false)
	var refs map[uint64]blockRef // the blocks as the answering server stored them
	// commitAt stores the blocks and commits at one server.
	commitAt := func(c wire.StorageClient, ctx context.Context, req *wire.CommitRequest, _ ...grpc.CallOption) (*wire.CommitResponse, error) {
		req = proto.CloneOf(req)
		refs = map[uint64]blockRef{}
		put := func(ctx context.Context, r *wire.PutBlocksRequest) (*wire.PutBlocksResponse, error) {
			resp, err := c.PutBlocks(ctx, r)
			return resp, fserr.FromStatus(err)
		}
		err := putBlocks(ctx, put, req.Caller, st.id, idxs, bufs, func(idx uint64, ref blockRef, _ []byte) {
			refs[idx] = ref
			req.Blocks = append(req.Blocks, &wire.BlockRef{Index: idx, Hash: ref.hash[:], Len: ref.len})
		})
		if err != nil {
			return nil, err
		}
		resp, err := c.Commit(ctx, req)
		return resp, fserr.FromStatus(err)
	}
	resp, err := writeEventual(ctx, f, st.id, commitAt, st.commitRequest(u, cues))
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
	st.lazy = false // a commit's record is synced, and comes after
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
	if st.stagedCommit != nil {
		st.stagedCommit.Stop()
		st.stagedCommit = nil
	}
	st.pending = nil
	st.writer = nil
	st.view = proto.CloneOf(m)
	st.modified = false
	st.mtimeNs = 0
}

// Flush commits this file's buffered writes (close(2)).
func (h *Handle) Flush(ctx context.Context) error {
	if !h.Writable {
		if !h.st.hasUnsynced() {
			return nil
		}
		// open(O_CREAT|O_RDONLY): the create is all there is to wait for.
		ctx, cancel := h.fs.bound(ctx, h.cues)
		defer cancel()
		h.st.mu.Lock()
		defer h.st.mu.Unlock()
		if err := h.st.syncCreate(ctx, h.fs, h.user, h.cues); err != nil {
			return err
		}
		return h.st.syncLazy(ctx, h.fs, h.user)
	}
	ctx, cancel := h.fs.bound(ctx, h.cues)
	defer cancel()
	return h.st.flush(ctx, h.fs, h.user, h.cues)
}

func (st *fileState) hasUnsynced() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.unsynced) > 0 || st.lazy
}

// Fsync is Flush: a commit is durable at the promised SyncLevel.
func (h *Handle) Fsync(ctx context.Context) error { return h.Flush(ctx) }

// SyncDir is fsync(2) of a directory: its entries are durable at the
// promised SyncLevel when it returns. Every change of names is, when it
// returns, but for the replication of creates whose files are still open
// (closing them waits for it, CreateRequest.defer_sync): those of this
// client are waited for, whichever directory they are in.
func (f *FS) SyncDir(ctx context.Context, u User, cues cue.Set, dir oid.ID) error {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	f.mu.Lock()
	var open []*fileState
	for _, st := range f.files {
		open = append(open, st)
	}
	f.mu.Unlock()
	for _, st := range open {
		st.mu.Lock()
		err := st.syncCreate(ctx, f, u, cues)
		st.mu.Unlock()
		if err != nil {
			return err
		}
	}
	// Unlinks answered before they were durable (server.lazily).
	return f.barrier(ctx, u, dir)
}

// barrier makes what id's primary answered durable there, where it may
// have answered changes before they were (server.lazily: only a primary
// in this process with no backups does).
func (f *FS) barrier(ctx context.Context, u User, id oid.ID) error {
	if !f.primaryInProcess(id) {
		return nil
	}
	if _, err := callVia(ctx, f, id, wire.StorageClient.Sync, &wire.SyncRequest{Caller: u.caller()}, callOpts{}); err != nil {
		return fmt.Errorf("sync %v: %w", id, err)
	}
	return nil
}
