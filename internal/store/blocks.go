package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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
	l, indexed, err := s.indexed(h)
	if err != nil {
		return h, err
	}
	if indexed {
		// Remember it as pending too, so a concurrent free of the last
		// reference cannot make a later SetBlock fail.
		s.pendMu.Lock()
		if seg := s.segment(l.seg); seg != nil && !seg.compacting {
			s.pending[h] = pendingBlock{loc: l, at: now}
			s.pendMu.Unlock()
			return h, nil
		}
		s.pendMu.Unlock()
		// Its segment is being compacted: write a fresh copy.
	}
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	if s.refreshPending(h, now) { // a concurrent PutBlock of the same data won
		return h, nil
	}
	l, err = s.appendLocked(data)
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
	seg := s.active
	off := seg.size.Load()
	if off > 0 && off+int64(len(data)) > s.segSize {
		if err := s.newSegmentLocked(seg.id + 1); err != nil {
			return loc{}, err
		}
		seg, off = s.active, 0
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
	out := make([][]byte, len(hs))
	locs := make([]loc, len(hs))
	for i, h := range hs {
		l, ok, err := s.lookup(h)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("store: block %s: %w", short(h[:]), fserr.ErrNotExist)
		}
		locs[i] = l
	}
	for i := 0; i < len(hs); {
		j := i + 1
		for j < len(hs) && locs[j].seg == locs[i].seg && int64(locs[j].off) == locs[j-1].end() {
			j++
		}
		if err := s.readRun(hs[i:j], locs[i:j], out[i:j]); err != nil {
			return nil, err
		}
		i = j
	}
	return out, nil
}

// readRun reads blocks stored back to back in one segment.
func (s *Store) readRun(hs [][32]byte, locs []loc, out [][]byte) error {
	first, last := locs[0], locs[len(locs)-1]
	seg := s.segment(first.seg)
	if seg != nil {
		buf := make([]byte, last.end()-int64(first.off))
		live, err := seg.readAt(buf, int64(first.off))
		if live && err == nil {
			for k, l := range locs {
				b := buf[int64(l.off)-int64(first.off) : l.end()-int64(first.off) : l.end()-int64(first.off)]
				if blockCRC(b) != l.crc {
					s.log.Error("store: block checksum mismatch", "hash", fmt.Sprintf("%x", hs[k]), "segment", segName(l.seg), "offset", l.off)
					return fmt.Errorf("store: block %s in %s at %d: checksum mismatch: %w", short(hs[k][:]), segName(l.seg), l.off, fserr.ErrIO)
				}
				out[k] = b
			}
			return nil
		}
		if live {
			return ioErr(fmt.Sprintf("read %d blocks from %s at %d", len(locs), segName(first.seg), first.off), err)
		}
	}
	for k, h := range hs { // the segment was compacted away: one by one
		b, err := s.ReadBlock(h)
		if err != nil {
			return err
		}
		out[k] = b
	}
	return nil
}

// Compact rewrites the live blocks of every segment whose bytes are more
// than half dead into the active segment (rolling the active segment first
// if it is at least a quarter full and more than half dead), makes
// the copies durable, repoints the index in one Update and deletes the old
// segment files. It runs safely alongside readers and writers.
func (s *Store) Compact(ctx context.Context) error {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	if s.isClosed() {
		return ErrClosed
	}

	// Candidates. A sizeable, mostly dead active segment is rolled first so
	// that it can be compacted too.
	s.appendMu.Lock()
	if act := s.active; act.size.Load() >= s.segSize/4 {
		s.segMu.RLock()
		live := s.live[act.id]
		s.segMu.RUnlock()
		if live*2 < act.size.Load() {
			if err := s.newSegmentLocked(act.id + 1); err != nil {
				s.appendMu.Unlock()
				return err
			}
		}
	}
	activeID := s.active.id
	s.appendMu.Unlock()
	cands := map[uint32]*segment{}
	s.segMu.RLock()
	for id, seg := range s.segs {
		if id >= activeID {
			continue
		}
		if size := seg.size.Load(); s.live[id]*2 < size || size == 0 {
			cands[id] = seg
		}
	}
	s.segMu.RUnlock()
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

	// From now on no new pending reference into a candidate can appear, so
	// the pending blocks there plus the indexed ones are all that can ever
	// be referenced from it.
	type move struct {
		h    [32]byte
		from loc
	}
	var moves []move
	seen := map[[32]byte]bool{}
	s.pendMu.Lock()
	for _, seg := range cands {
		seg.compacting = true
	}
	for h, p := range s.pending {
		if cands[p.loc.seg] != nil {
			moves = append(moves, move{h, p.loc})
			seen[h] = true
		}
	}
	s.pendMu.Unlock()
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

	// Copy.
	reloc := make(map[[32]byte]loc, len(moves))
	bad := map[uint32]bool{}
	touched := map[uint32]int64{}
	buf := make([]byte, MaxBlockSize)
	var moved int64
	for _, m := range moves {
		if err := ctx.Err(); err != nil {
			unmark(all)
			return err
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
		nl, err := s.appendLocked(b)
		s.appendMu.Unlock()
		if err != nil {
			unmark(all)
			return err
		}
		reloc[m.h] = nl
		touched[nl.seg] = max(touched[nl.seg], nl.end())
		moved += int64(nl.n)
	}
	unmark(func(id uint32) bool { return bad[id] })
	for id, end := range touched {
		if seg := s.segment(id); seg != nil {
			if err := s.syncSegment(seg, end); err != nil {
				unmark(all)
				return err
			}
		}
	}
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
		unmark(all)
		return fmt.Errorf("store: compact: %w", err)
	}

	// Delete the emptied segments.
	var freed int64
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
	}
	if err := s.syncDir(filepath.Join(s.dir, blocksDir)); err != nil {
		return err
	}
	s.log.Info("store: compacted", "segments", len(cands)-len(bad), "moved_bytes", moved, "freed_bytes", freed)
	return nil
}
