package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

// PutBlock stores data (at most MaxBlockSize bytes) and returns its SHA-256.
// If the block is already indexed or pending nothing is written; otherwise
// it is appended to the active segment without syncing and stays pending
// (referenceable by Tx.SetBlock) for PendingTTL. The Update that references
// it makes it durable.
func (s *Store) PutBlock(data []byte) ([32]byte, error) {
	if len(data) > MaxBlockSize {
		return [32]byte{}, fmt.Errorf("store: block of %d bytes exceeds %d: %w", len(data), MaxBlockSize, fserr.ErrInvalid)
	}
	return s.putHashed(sha256.Sum256(data), data)
}

// PutBlocks stores several blocks like PutBlock, hashing them on all cores
// first and then appending them in order, so that a file's blocks stay
// neighbours in the segment (and are read back with one pread).
func (s *Store) PutBlocks(datas [][]byte) ([][32]byte, error) {
	hs := make([][32]byte, len(datas))
	for _, d := range datas {
		if len(d) > MaxBlockSize {
			return nil, fmt.Errorf("store: block of %d bytes exceeds %d: %w", len(d), MaxBlockSize, fserr.ErrInvalid)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(datas))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := w; i < len(datas); i += workers {
				hs[i] = sha256.Sum256(datas[i])
			}
		})
	}
	wg.Wait()
	for i, d := range datas {
		if _, err := s.putHashed(hs[i], d); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// putHashed stores data whose SHA-256 is h.
func (s *Store) putHashed(h [32]byte, data []byte) ([32]byte, error) {
	now := s.now()
	if s.refreshPending(h, now) {
		return h, nil
	}
	if s.isClosed() {
		return h, ErrClosed
	}
	// Already indexed: remember it as pending too, so a concurrent free
	// of the last reference cannot make a later SetBlock fail. In a
	// segment being compacted, write a fresh copy.
	if ok, err := s.retainIndexed(h, now); err != nil || ok {
		return h, err
	}
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	if s.refreshPending(h, now) { // a concurrent PutBlock of the same data won
		return h, nil
	}
	l, err := s.appendLocked(data)
	if err != nil {
		return h, err
	}
	s.pendMu.Lock()
	s.pending[h] = pendingBlock{loc: l, at: now}
	s.pendMu.Unlock()
	return h, nil
}

// refreshPending reports whether h is pending, renewing its lease.
func (s *Store) refreshPending(h [32]byte, now int64) bool {
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	if p, ok := s.pending[h]; ok {
		p.at = now
		s.pending[h] = p
		return true
	}
	s.sweepLocked(now)
	return false
}

// sweepLocked forgets pending blocks older than the TTL (pendMu held).
func (s *Store) sweepLocked(now int64) {
	ttl := int64(s.pendingTTL)
	if now-s.lastSweep < min(ttl/10, int64(time.Minute)) {
		return
	}
	s.lastSweep = now
	for h, p := range s.pending {
		if now-p.at > ttl {
			delete(s.pending, h)
		}
	}
}

// indexed looks h up in the committed block index.
func (s *Store) indexed(h [32]byte) (l loc, ok bool, err error) {
	err = s.View(func(t *Tx) error {
		l, _, ok = t.blockLoc(h[:])
		return nil
	})
	return l, ok, err
}

// lookup finds a block's bytes: pending or indexed.
func (s *Store) lookup(h [32]byte) (loc, bool, error) {
	s.pendMu.Lock()
	p, ok := s.pending[h]
	s.pendMu.Unlock()
	if ok {
		return p.loc, true, nil
	}
	return s.indexed(h)
}

// appendLocked appends data to the active segment, rolling it when full
// (appendMu held). Nothing is synced.
func (s *Store) appendLocked(data []byte) (loc, error) {
	return s.appendTo(&s.active, data)
}

// appendTo appends data to *segp (the active segment or the compaction
// target), replacing it with a new segment when full or not yet created
// (appendMu held). Nothing is synced.
func (s *Store) appendTo(segp **segment, data []byte) (loc, error) {
	seg := *segp
	var off int64
	if seg != nil {
		off = seg.size.Load()
	}
	if seg == nil || off > 0 && off+int64(len(data)) > s.segSize || seg.broken.Load() != nil {
		nseg, err := s.newSegmentLocked()
		if err != nil {
			return loc{}, err
		}
		*segp = nseg
		seg, off = nseg, 0
	}
	if n, err := seg.f.WriteAt(data, off); err != nil {
		if terr := seg.f.Truncate(off); terr != nil {
			seg.size.Store(off + int64(n)) // skip the garbage
		}
		if errors.Is(err, os.ErrClosed) {
			return loc{}, ErrClosed
		}
		return loc{}, ioErr("append to segment "+segName(seg.id), err)
	}
	end := off + int64(len(data))
	seg.size.Store(end)
	if !s.noSync && end-seg.kicked >= writebackChunk {
		startWriteback(seg.f, seg.kicked, end-seg.kicked)
		seg.kicked = end
	}
	return loc{seg: seg.id, off: uint64(off), n: uint32(len(data)), crc: blockCRC(data)}, nil
}

// Retain reports whether the block is stored (indexed or pending) and,
// if so, keeps it referenceable by Tx.SetBlock for PendingTTL, as if it
// had been put again, even if an update frees its last reference
// meanwhile. A replicated request may free a block in one batch and
// reference it again in a later one, without carrying it (the primary has
// freed it too by then). A block in a segment being compacted is
// reported missing: its copy may move.
func (s *Store) Retain(h [32]byte) bool {
	now := s.now()
	if s.refreshPending(h, now) {
		return true
	}
	ok, _ := s.retainIndexed(h, now)
	return ok
}

// retainIndexed makes indexed block h pending (as of now) and reports
// whether it could: false when it is not indexed or its segment is being
// compacted.
func (s *Store) retainIndexed(h [32]byte, now int64) (bool, error) {
	l, indexed, err := s.indexed(h)
	if err != nil || !indexed {
		return false, err
	}
	s.pendMu.Lock()
	defer s.pendMu.Unlock()
	if seg := s.segment(l.seg); seg != nil && !seg.compacting {
		s.pending[h] = pendingBlock{loc: l, at: now}
		return true, nil
	}
	return false, nil
}

// HasBlock reports whether the block is stored (indexed or pending).
func (s *Store) HasBlock(h [32]byte) bool {
	_, ok, _ := s.lookup(h)
	return ok
}

// ReadBlock returns the block with hash h, verifying the hash (a mismatch,
// i.e. bit rot, is fserr.ErrIO). No global lock is held during the read.
func (s *Store) ReadBlock(h [32]byte) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		l, ok, err := s.lookup(h)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("store: block %s: %w", short(h[:]), fserr.ErrNotExist)
		}
		if seg := s.segment(l.seg); seg != nil {
			buf := make([]byte, l.n)
			live, err := seg.readAt(buf, int64(l.off))
			if live {
				if err != nil {
					return nil, ioErr(fmt.Sprintf("read block %s from %s at %d", short(h[:]), segName(l.seg), l.off), err)
				}
				if blockCRC(buf) != l.crc {
					s.log.Error("store: block checksum mismatch", "hash", fmt.Sprintf("%x", h), "segment", segName(l.seg), "offset", l.off)
					return nil, fmt.Errorf("store: block %s in %s at %d: checksum mismatch: %w", short(h[:]), segName(l.seg), l.off, fserr.ErrIO)
				}
				return buf, nil
			}
		}
		// The segment was compacted away after the lookup: look again.
		if attempt >= 3 {
			if s.isClosed() {
				return nil, ErrClosed
			}
			return nil, fmt.Errorf("store: block %s: segment %s missing: %w", short(h[:]), segName(l.seg), fserr.ErrIO)
		}
	}
}

// ReadBlocks reads several blocks. Neighbours in a segment (a file's
// blocks are appended together) are read with one system call, and every
// block is checked against its CRC. A block that moved meanwhile (Compact)
// is read on its own.
func (s *Store) ReadBlocks(hs [][32]byte) ([][]byte, error) {
	locs, _, err := s.locate(hs)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(hs))
	err = s.eachRun(locs, func(i, j int) error {
		first := int64(locs[i].off)
		buf := make([]byte, locs[j-1].end()-first)
		if err := s.readRun(hs[i:j], locs[i:j], buf); err != nil {
			return err
		}
		for k, l := range locs[i:j] {
			lo, hi := int64(l.off)-first, l.end()-first
			out[i+k] = buf[lo:hi:hi]
		}
		return nil
	})
	return out, err
}

// ReadBlocksInto is ReadBlocks into the caller's buffer: the blocks go
// back to back into buf, which must be exactly as long as they are
// together. A FUSE read of a file whose server is in the same process
// lands in the kernel's reply this way, with no allocation and no copy.
func (s *Store) ReadBlocksInto(hs [][32]byte, buf []byte) error {
	locs, total, err := s.locate(hs)
	if err != nil {
		return err
	}
	if total != int64(len(buf)) {
		return fmt.Errorf("store: %d blocks of %d bytes into a buffer of %d: %w", len(hs), total, len(buf), fserr.ErrInvalid)
	}
	var at int64
	return s.eachRun(locs, func(i, j int) error {
		n := locs[j-1].end() - int64(locs[i].off)
		if err := s.readRun(hs[i:j], locs[i:j], buf[at:at+n]); err != nil {
			return err
		}
		at += n
		return nil
	})
}

// locate looks every block up, and totals their lengths.
func (s *Store) locate(hs [][32]byte) ([]loc, int64, error) {
	locs := make([]loc, len(hs))
	var total int64
	for i, h := range hs {
		l, ok, err := s.lookup(h)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			return nil, 0, fmt.Errorf("store: block %s: %w", short(h[:]), fserr.ErrNotExist)
		}
		locs[i] = l
		total += int64(l.n)
	}
	return locs, total, nil
}

// eachRun calls read for each run locs[i:j] of blocks stored back to back
// in one segment, in order.
func (s *Store) eachRun(locs []loc, read func(i, j int) error) error {
	for i := 0; i < len(locs); {
		j := i + 1
		for j < len(locs) && locs[j].seg == locs[i].seg && int64(locs[j].off) == locs[j-1].end() {
			j++
		}
		if err := read(i, j); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// readRun reads blocks stored back to back in one segment into buf (as
// long as they are together), checking each block's CRC.
func (s *Store) readRun(hs [][32]byte, locs []loc, buf []byte) error {
	first := locs[0]
	if seg := s.segment(first.seg); seg != nil {
		live, err := seg.readAt(buf, int64(first.off))
		if live && err == nil {
			for k, l := range locs {
				b := buf[int64(l.off)-int64(first.off) : l.end()-int64(first.off)]
				if blockCRC(b) != l.crc {
					s.log.Error("store: block checksum mismatch", "hash", fmt.Sprintf("%x", hs[k]), "segment", segName(l.seg), "offset", l.off)
					return fmt.Errorf("store: block %s in %s at %d: checksum mismatch: %w", short(hs[k][:]), segName(l.seg), l.off, fserr.ErrIO)
				}
			}
			return nil
		}
		if live {
			return ioErr(fmt.Sprintf("read %d blocks from %s at %d", len(locs), segName(first.seg), first.off), err)
		}
	}
	at := 0
	for _, h := range hs { // the segment was compacted away: one by one
		b, err := s.ReadBlock(h)
		if err != nil {
			return err
		}
		if at+len(b) > len(buf) {
			return fmt.Errorf("store: block %s changed length while moved: %w", short(h[:]), fserr.ErrIO)
		}
		at += copy(buf[at:], b)
	}
	return nil
}

// activeMinDead is how many dead bytes the active segment must hold (as
// well as being more than CompactDeadFraction dead) before Compact seals
// it so that it can be compacted: small enough that an idle store gives
// its space back, large enough that a busy one is not sealed every pass.
// A segment size below 32 MiB lowers it to a quarter segment.
const activeMinDead = 8 << 20

// movePerPass bounds, in segments' worth of live bytes, what one Compact
// pass copies; the deadest candidates go first and the rest wait for the
// next pass, so that a pass, and its one index Update, stay bounded.
const movePerPass = 4

// compactMargin is free space a Compact pass leaves untouched when it
// chooses what to copy.
const compactMargin = 1 << 20

// undoCopies truncates the compaction target(s) back to their sizes before
// a pass that failed (copied: segment → size): nothing references the
// copies yet, and left behind they would keep a full disk full.
func (s *Store) undoCopies(copied map[uint32]int64) {
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	for id, size := range copied {
		seg := s.segment(id)
		if seg == nil || seg.size.Load() <= size {
			continue
		}
		seg.mu.RLock()
		if !seg.dead {
			if err := seg.f.Truncate(size); err != nil {
				s.log.Error("store: compact: cannot drop the copies of a failed pass", "segment", segName(id), "err", err)
			} else {
				seg.size.Store(size)
				seg.synced.Store(min(seg.synced.Load(), size))
				seg.kicked = min(seg.kicked, size)
			}
		}
		seg.mu.RUnlock()
	}
}

// reclaimer runs Compact every compactEvery until ctx ends (Close).
func (s *Store) reclaimer(ctx context.Context) {
	defer close(s.compactDone)
	if s.compactEvery < 0 {
		return
	}
	tk := time.NewTicker(s.compactEvery)
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		switch err := s.Compact(ctx); {
		case err == nil || ctx.Err() != nil || errors.Is(err, ErrClosed):
		case noSpace(err):
			s.log.Warn("store: background compaction stopped for lack of space; retrying later", "err", err)
		default:
			s.log.Error("store: background compaction failed", "err", err)
		}
	}
}

// hook calls the test hook for a stage of Compact.
func (s *Store) hook(stage string) {
	if s.compactHook != nil {
		s.compactHook(stage)
	}
}

// pendingBytesLocked sums the pending blocks per segment (pendMu held).
func (s *Store) pendingBytesLocked() map[uint32]int64 {
	pend := make(map[uint32]int64)
	for _, p := range s.pending {
		pend[p.loc.seg] += int64(p.loc.n)
	}
	return pend
}

// deadLocked is how many bytes of seg are neither indexed nor pending
// (segMu held). A block both indexed and pending counts twice, which only
// underestimates.
func (s *Store) deadLocked(seg *segment, pend map[uint32]int64) int64 {
	return max(0, seg.size.Load()-s.live[seg.id]-pend[seg.id])
}

// Compact reclaims dead block space: the bytes of freed blocks and of
// pending blocks that were never referenced. A segment other than the
// active one and the compaction target is a candidate when more than
// CompactDeadFraction of its bytes are dead (or it is empty); the active
// segment is sealed first (a new one started) when it is that dead and
// holds at least activeMinDead dead bytes, so it becomes a candidate too.
// The deadest candidates go first, up to movePerPass segments of live
// bytes per call. Background reclamation calls Compact every
// CompactInterval; it may also be called directly.
//
// The live and pending blocks of the candidates are copied into the
// compaction target, a segment of their own (so the update path's
// fdatasyncs of the active segment never wait for them), in their old
// order; the copies are fdatasynced; one Update repoints the index; only
// then are the old files deleted. The copy holds no lock the update path
// needs for longer than one block's append (appendMu, as PutBlock takes
// it). A crash at any point loses no live block and leaves no reference to
// a deleted segment:
//   - before the Update is durable, the index names only the old segments,
//     which are intact; the copies are unreferenced dead bytes (dropped on
//     Open if the target was the last segment created, else reclaimed by a
//     later pass);
//   - once it is durable, the index names only the synced copies; the old
//     segments hold nothing live and are deleted now or, after a crash, by
//     the next pass (an all-dead segment is a candidate);
//   - replaying a log record that carried a moved block inline leaves the
//     block alone, since the replayed index places it elsewhere.
//
// It runs safely alongside readers and writers: a reader whose segment is
// deleted under it looks the block up again, and a PutBlock of content
// indexed in a segment being compacted writes a fresh copy.
func (s *Store) Compact(ctx context.Context) error {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	if s.isClosed() {
		return ErrClosed
	}
	start := time.Now()

	// Seal a sizeable, mostly dead active segment so it can be compacted.
	s.appendMu.Lock()
	act := s.active
	s.pendMu.Lock()
	pend := s.pendingBytesLocked()
	s.segMu.RLock()
	actDead := s.deadLocked(act, pend)
	s.segMu.RUnlock()
	s.pendMu.Unlock()
	if actDead >= min(s.segSize/4, activeMinDead) && float64(actDead) > s.deadFrac*float64(act.size.Load()) {
		seg, err := s.newSegmentLocked()
		if err != nil {
			s.appendMu.Unlock()
			return err
		}
		s.active = seg
	}

	// Candidates. From the moment they are marked, no new pending reference
	// into them can appear, so the pending blocks there plus the indexed
	// ones are all that can ever be referenced from them.
	type move struct {
		h    [32]byte
		from loc
	}
	var moves []move
	seen := map[[32]byte]bool{}
	cands := map[uint32]*segment{}
	s.pendMu.Lock()
	pend = s.pendingBytesLocked()
	s.segMu.RLock()
	type cand struct {
		seg        *segment
		size, dead int64
	}
	var cs []cand
	for _, seg := range s.segs {
		if seg == s.active || seg == s.target {
			continue
		}
		// A broken segment (breakSegment) is moved out whole: its copies
		// are synced in a healthy file.
		size, dead := seg.size.Load(), s.deadLocked(seg, pend)
		if size == 0 || float64(dead) > s.deadFrac*float64(size) || seg.broken.Load() != nil {
			cs = append(cs, cand{seg, size, dead})
		}
	}
	s.segMu.RUnlock()
	slices.SortFunc(cs, func(a, b cand) int { // deadest first
		return cmp.Compare(float64(b.dead)/float64(max(b.size, 1)), float64(a.dead)/float64(max(a.size, 1)))
	})
	// The copies need free space before the old files go: on a full
	// disk only what fits is moved (segments with nothing live cost
	// nothing and free the most).
	room := int64(math.MaxInt64)
	if sp, err := s.Space(); err == nil {
		room = sp.Free - compactMargin
	}
	var budget int64
	for _, c := range cs {
		live := c.size - c.dead
		if len(cands) > 0 && budget+live > movePerPass*s.segSize {
			break
		}
		if live > 0 && budget+live > room {
			continue
		}
		budget += live
		cands[c.seg.id] = c.seg
		c.seg.compacting = true
	}
	for h, p := range s.pending {
		if cands[p.loc.seg] != nil {
			moves = append(moves, move{h, p.loc})
			seen[h] = true
		}
	}
	s.pendMu.Unlock()
	s.appendMu.Unlock()
	if len(cands) == 0 {
		return nil
	}
	unmark := func(pred func(uint32) bool) {
		s.pendMu.Lock()
		for id, seg := range cands {
			if pred(id) {
				seg.compacting = false
			}
		}
		s.pendMu.Unlock()
	}
	all := func(uint32) bool { return true }

	if err := s.View(func(t *Tx) error {
		t.scan(bBlockidx, nil, 0, func(k, v []byte) bool {
			l, _, ok := getIdx(v)
			if !ok || len(k) != 32 || cands[l.seg] == nil {
				return true
			}
			h := [32]byte(k)
			if !seen[h] {
				seen[h] = true
				moves = append(moves, move{h, l})
			}
			return true
		})
		return nil
	}); err != nil {
		unmark(all)
		return fmt.Errorf("store: compact: scan index: %w", err)
	}
	// In their old order: a file's blocks stay neighbours.
	slices.SortFunc(moves, func(a, b move) int {
		return cmp.Or(cmp.Compare(a.from.seg, b.from.seg), cmp.Compare(a.from.off, b.from.off))
	})

	// Copy.
	reloc := make(map[[32]byte]loc, len(moves))
	copied := map[uint32]int64{} // segment → its size before this pass's copies
	fail := func(err error) error {
		unmark(all)
		s.undoCopies(copied)
		return err
	}
	bad := map[uint32]bool{}
	touched := map[uint32]int64{}
	buf := make([]byte, MaxBlockSize)
	var moved int64
	for i, m := range moves {
		if err := ctx.Err(); err != nil {
			return fail(err)
		}
		if i == len(moves)/2 {
			s.hook("copying")
		}
		if bad[m.from.seg] {
			continue
		}
		b := buf[:m.from.n]
		_, err := cands[m.from.seg].readAt(b, int64(m.from.off))
		if err == nil && sha256.Sum256(b) != m.h {
			err = errors.New("checksum mismatch")
		}
		if err != nil {
			s.log.Error("store: compact: unreadable block; keeping its segment", "segment", segName(m.from.seg),
				"offset", m.from.off, "hash", fmt.Sprintf("%x", m.h), "err", err)
			bad[m.from.seg] = true
			continue
		}
		s.appendMu.Lock()
		nl, err := s.appendTo(&s.target, b)
		s.appendMu.Unlock()
		if err != nil {
			return fail(err)
		}
		if _, ok := copied[nl.seg]; !ok {
			copied[nl.seg] = int64(nl.off)
		}
		reloc[m.h] = nl
		touched[nl.seg] = max(touched[nl.seg], nl.end())
		moved += int64(nl.n)
	}
	unmark(func(id uint32) bool { return bad[id] })
	for id, end := range touched {
		if seg := s.segment(id); seg != nil {
			if err := s.syncSegment(seg, end); err != nil {
				return fail(err)
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	s.hook("copied")
	gone := func(id uint32) bool { return cands[id] != nil && !bad[id] }

	// Repoint the index and the pending blocks.
	err := s.Update(ctx, func(t *Tx) error {
		var v [idxValLen]byte
		for h, nl := range reloc {
			l, refs, ok := t.blockLoc(h[:])
			if !ok || !gone(l.seg) {
				continue
			}
			putIdx(v[:], nl, refs)
			t.put(bBlockidx, h[:], v[:])
			t.fn.addLive(l.seg, -int64(l.n))
			t.fn.addLive(nl.seg, int64(nl.n))
		}
		s.pendMu.Lock()
		for h, p := range s.pending {
			if gone(p.loc.seg) {
				if nl, ok := reloc[h]; ok {
					p.loc = nl
					s.pending[h] = p
				} else {
					delete(s.pending, h)
				}
			}
		}
		s.pendMu.Unlock()
		return nil
	})
	if err != nil {
		return fail(fmt.Errorf("store: compact: %w", err))
	}
	s.hook("repointed")

	// Delete the emptied segments, once what emptied them is durable
	// (a lazy unlink's record, which no record of this pass follows when
	// there was nothing to move).
	if err := s.Flush(); err != nil {
		return fail(err)
	}
	var freed int64
	deleted := 0
	for id, seg := range cands {
		if !gone(id) {
			continue
		}
		s.segMu.Lock()
		if live := s.live[id]; live != 0 {
			s.segMu.Unlock()
			s.log.Error("store: compact: segment still has live blocks; keeping it", "segment", segName(id), "live", live)
			unmark(func(x uint32) bool { return x == id })
			continue
		}
		delete(s.segs, id)
		delete(s.live, id)
		s.segMu.Unlock()
		freed += seg.size.Load()
		seg.mu.Lock() // wait for readers
		seg.dead = true
		seg.f.Close()
		seg.mu.Unlock()
		if err := os.Remove(s.segPath(id)); err != nil {
			s.log.Error("store: compact: remove segment", "segment", segName(id), "err", err)
		}
		if deleted++; deleted == 1 {
			s.hook("removing")
		}
	}
	if err := s.syncDir(filepath.Join(s.dir, blocksDir)); err != nil {
		return err
	}
	if deleted > 0 {
		s.compactions.Add(1)
		s.reclaimed.Add(freed - moved)
	}
	var segBytes, live int64
	s.segMu.RLock()
	for id, seg := range s.segs {
		segBytes += seg.size.Load()
		live += s.live[id]
	}
	s.segMu.RUnlock()
	s.log.Info("store: reclaimed dead block space", "segments", deleted, "moved_bytes", moved,
		"freed_bytes", freed, "reclaimed_bytes", freed-moved, "segment_bytes", segBytes, "live_bytes", live,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}
