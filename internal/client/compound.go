package client

import (
	"context"
	"maps"
	"sync/atomic"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Compound requests (issue 11): the answer that fixes which version of a
// file to read (a lookup, an open) brings its first block references and
// a small file's contents, and a small write travels inside its commit.

const (
	// smallFile is the size up to which an open is answered from the
	// lease only when the file's blocks are cached; otherwise the open
	// asks the primary, whose answer brings the contents (one round trip
	// instead of an open, a GetBlocks and a ReadBlocks).
	smallFile = 256 << 10
	// commitInline is how many written bytes a commit carries itself
	// instead of a PutBlocks before it.
	commitInline = 256 << 10
	// plusPages is how many pages (of 1024 entries) of a listing ask for
	// the entries' meta-data (readdir-plus); a larger directory's
	// further entries are looked up one by one.
	plusPages = 4
)

// adoptData keeps what a compound answer brought for file id: the
// blocks' contents go into the cache; the references of its first
// blocks are returned (ok false: none came).
func (f *FS) adoptData(id oid.ID, fd *wire.FileData) (map[uint64]blockRef, bool) {
	if fd == nil {
		return nil, false
	}
	hashes := make(map[uint64]blockRef, len(fd.Blocks))
	local := len(fd.Data) > 0 && f.primaryInProcess(id)
	for i, b := range fd.Blocks {
		if len(b.Hash) != 32 {
			return nil, false
		}
		r := blockRef{hash: [32]byte(b.Hash), len: b.Len}
		hashes[b.Index] = r
		if len(fd.Data) == len(fd.Blocks) {
			f.cacheBlock(id, local, r.hash, fd.Data[i])
		}
	}
	return hashes, true
}

// keepData is adoptData for a file that is not open here: its block
// references wait for the next open of that version.
func (f *FS) keepData(id oid.ID, fd *wire.FileData) {
	if hashes, ok := f.adoptData(id, fd); ok {
		f.leases.keepRefs(id, fd.Version, hashes, map[uint64]bool{0: true})
	}
}

// adopt takes the first block references of version when st describes
// that version and does not know them yet.
func (st *fileState) adopt(version uint64, hashes map[uint64]blockRef) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.modified || st.version != version || st.loaded[0] {
		return
	}
	for idx, r := range hashes {
		st.hashes[idx] = r
	}
	st.loaded[0] = true
}

// dataCached reports whether a read of file m (at its version) would be
// served here: its block references known and, for a small file, its
// blocks in the memory cache. An open that finds them needs no answer
// from the primary (only a registration in the background).
func (f *FS) dataCached(id oid.ID, m *wire.Meta) bool {
	if m.Type != wire.Type_TYPE_FILE || m.Size == 0 {
		return true
	}
	var hashes map[uint64]blockRef
	if st := f.openState(id); st != nil {
		st.mu.Lock()
		if st.version == m.Version && st.loaded[0] {
			hashes = maps.Clone(st.hashes)
		}
		st.mu.Unlock()
	}
	if hashes == nil {
		var ok bool
		if hashes, ok = f.leases.peekRefs(id, m.Version); !ok {
			return false
		}
	}
	if m.Size > smallFile {
		return true
	}
	for _, r := range hashes {
		if !f.cache.Contains(r.hash) {
			return false
		}
	}
	return true
}

// Bounds of a .WholeFile subtree prefetch: the directories one listing
// starts fetching in all (at any depth), and how many at once.
const (
	treePrefetchDirs     = 1024
	treePrefetchParallel = 16
)

// treePrefetch is the budget one .WholeFile listing shares with the
// prefetches of its subtree.
type treePrefetch struct {
	left   atomic.Int64
	sem    chan struct{}
	active atomic.Int64 // goroutines running; the last one cancels
	cancel context.CancelFunc
}

type treeKey struct{}

// prefetchTree fetches, in the background and in parallel, the listings
// (with readdir-plus meta-data) of the subdirectories among entries, and
// theirs in turn: .WholeFile on a directory brings a whole subtree's
// meta-data in as many rounds as it is deep, not one per directory.
func (f *FS) prefetchTree(ctx context.Context, u User, cues cue.Set, entries []*wire.Entry) {
	tp, _ := ctx.Value(treeKey{}).(*treePrefetch)
	if tp == nil {
		tp = &treePrefetch{sem: make(chan struct{}, treePrefetchParallel)}
		tp.left.Store(treePrefetchDirs)
		// The prefetch outlives the listing that started it.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.Timeout)
		tp.cancel = cancel
		ctx = context.WithValue(pctx, treeKey{}, tp)
	}
	started := false
	defer func() {
		// A prefetch's own goroutine counts as active: this is the
		// listing that started it, and it had nothing to fetch.
		if !started && tp.active.Load() == 0 {
			tp.cancel()
		}
	}()
	for _, e := range entries {
		if e.Type != wire.Type_TYPE_DIR {
			continue
		}
		id := oid.ID(e.Id)
		if f.leases.lookup(id, false, func(c *cached) bool { return c.listed }) {
			continue
		}
		if tp.left.Add(-1) < 0 {
			return
		}
		done := f.startListing(id)
		if done == nil {
			continue // already being fetched
		}
		tp.active.Add(1)
		started = true
		go func() {
			defer func() {
				if tp.active.Add(-1) == 0 {
					tp.cancel()
				}
			}()
			defer f.endListing(id, done)
			select {
			case tp.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-tp.sem }()
			if _, _, _, err := f.fetchDir(ctx, u, cues, id); err != nil {
				f.log.Debug("subtree prefetch failed", "dir", id.String(), "err", err)
			}
		}()
	}
}

// startListing marks dir's listing as being prefetched and returns the
// channel to close when done (nil: it already is).
func (f *FS) startListing(dir oid.ID) chan struct{} {
	f.listMu.Lock()
	defer f.listMu.Unlock()
	if f.listing[dir] != nil {
		return nil
	}
	ch := make(chan struct{})
	f.listing[dir] = ch
	return ch
}

func (f *FS) endListing(dir oid.ID, done chan struct{}) {
	f.listMu.Lock()
	delete(f.listing, dir)
	f.listMu.Unlock()
	close(done)
}

// waitListing waits for a prefetch of dir's listing, if one runs, and
// reports whether it waited.
func (f *FS) waitListing(ctx context.Context, dir oid.ID) bool {
	f.listMu.Lock()
	ch := f.listing[dir]
	f.listMu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
	return true
}
