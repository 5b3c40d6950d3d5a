package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

// Checkpoint defaults: a checkpoint starts when the mutable layer holds this
// much, or ckEvery after the previous one if anything is pending.
const (
	defaultCkBytes = 64 << 20
	defaultCkOps   = 100_000
	defaultCkEvery = 2 * time.Second
)

// The checkpoint position lives in its own bucket so that it never shows up
// among the sys records.
var (
	walBucket = []byte("wal")
	ckKey     = []byte("checkpoint")
)

// snapshot is what readers need besides a bbolt read transaction: the
// overlay layers (mutable first; the frozen one, being checkpointed, or
// nil) and the sequence number of the last committed record. It is
// immutable; a new one is published for each change.
type snapshot struct {
	layers [2]*memtable
	seq    uint64
}

// ckSeq returns the sequence number of the last record applied to bbolt.
func ckSeq(btx *bbolt.Tx) uint64 {
	if v := btx.Bucket(walBucket).Get(ckKey); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func putCkSeq(btx *bbolt.Tx, seq uint64) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], seq)
	return btx.Bucket(walBucket).Put(ckKey, v[:])
}

// beginRead starts a read-only bbolt transaction that matches an overlay
// snapshot and sets t up to read through both. The committer passes
// committer: its snapshot holds the last record committed (it commits
// them all), and a checkpoint applies only records committed already, so
// bbolt cannot be newer and the check (a bucket read) is spared.
func (s *Store) beginRead(t *Tx, committer bool) error {
	for {
		snap := s.snap.Load()
		btx, err := s.db.Begin(false)
		if err != nil {
			if errors.Is(err, bbolt.ErrDatabaseNotOpen) {
				return ErrClosed
			}
			return fmt.Errorf("store: begin: %w", err)
		}
		// A checkpoint of a layer frozen after snap was taken may have
		// committed in between; bbolt would then show newer data than the
		// layers. Rare: take a fresh snapshot.
		if committer || ckSeq(btx) <= snap.seq {
			t.btx, t.layers, t.seq = btx, snap.layers, snap.seq
			return nil
		}
		_ = btx.Rollback()
	}
}

// checkpointer runs checkpoints when kicked (the mutable layer is large) or
// ckEvery after the previous one.
func (s *Store) checkpointer() {
	defer close(s.ckDone)
	tm := time.NewTimer(s.ckEvery)
	defer tm.Stop()
	for {
		select {
		case <-s.ckStop:
			return
		case <-s.ckKick:
		case <-tm.C:
		}
		if err := s.checkpoint(false); err != nil {
			s.log.Error("store: checkpoint failed", "err", err)
		} else {
			s.makeReserve()
		}
		tm.Reset(s.ckEvery)
		if s.overThreshold(1) { // filled up while the last one ran
			s.kickCheckpoint()
		}
	}
}

func (s *Store) kickCheckpoint() {
	select {
	case s.ckKick <- struct{}{}:
	default:
	}
}

// overThreshold reports whether the mutable layer holds factor times the
// checkpoint threshold.
func (s *Store) overThreshold(factor int64) bool {
	m := s.snap.Load().layers[0]
	return m.bytes.Load() >= factor*s.ckBytes || m.ops.Load() >= factor*s.ckOps
}

// checkpoint freezes the mutable layer, applies it to bbolt and drops it.
// A frozen layer left by a failed attempt is flushed first. With final
// (Close; the committer has stopped) no new log file is made and every
// layer is flushed.
func (s *Store) checkpoint(final bool) error {
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	for {
		frozen := s.snap.Load().layers[1]
		if frozen == nil {
			var err error
			if frozen, err = s.freeze(final); err != nil {
				return err
			}
			if frozen == nil { // everything is in bbolt
				if final {
					return s.removeLogs(s.walGen + 1)
				}
				return nil
			}
		}
		if err := s.flush(frozen); err != nil {
			return err
		}
		if !final { // a retried frozen layer is enough for now
			return nil
		}
	}
}

// freeze makes the mutable layer the frozen one, starting a new log file
// for the records after it (none if final). It returns nil if the mutable
// layer is empty. ckMu held.
func (s *Store) freeze(final bool) (*memtable, error) {
	if s.snap.Load().layers[0].ops.Load() == 0 {
		return nil, nil
	}
	var next *walFile
	if !final {
		var err error
		if next, err = s.newWAL(s.walGen + 1); err != nil {
			return nil, err
		}
	}
	s.commitMu.Lock()
	// Lazy records in the old file must be durable before any record of
	// the next one can be: recovery replays the files in order.
	if err := s.syncLazyLocked(); err != nil {
		s.commitMu.Unlock()
		if next != nil {
			next.f.Close()
		}
		return nil, err
	}
	s.walGen++
	snap := s.snap.Load()
	frozen := snap.layers[0]
	frozen.last = snap.seq
	old := s.wal
	s.wal = next
	s.snap.Store(&snapshot{layers: [2]*memtable{newMemtable(), frozen}, seq: snap.seq})
	s.commitMu.Unlock()
	if old != nil {
		old.f.Close() // every record in it is durable already
	}
	return frozen, nil
}

// flush applies the frozen layer to bbolt in one transaction, drops it and
// deletes the log files it covers (all before the current one). ckMu held.
func (s *Store) flush(frozen *memtable) error {
	// Once bbolt records the checkpoint, replay skips these records, and
	// their files go: the blocks they carried inline must be durable in the
	// segments first.
	if err := s.syncInline(frozen.inline); err != nil {
		return err
	}
	if err := s.withReserve(func() error {
		return s.db.Update(func(btx *bbolt.Tx) error {
			for b := range nBuckets {
				bk := btx.Bucket(bucketNames[b])
				for it := frozen.lists[b].all(); it.n != nil; it.next() {
					var err error
					if it.n.del {
						err = bk.Delete(it.n.key)
					} else {
						err = bk.Put(it.n.key, it.n.val)
					}
					if err != nil {
						return err
					}
				}
			}
			return putCkSeq(btx, frozen.last)
		})
	}); err != nil {
		return ioErr("checkpoint", err)
	}

	s.commitMu.Lock()
	snap := s.snap.Load()
	s.snap.Store(&snapshot{layers: [2]*memtable{snap.layers[0], nil}, seq: snap.seq})
	s.commitMu.Unlock()
	s.checkpoints.Add(1)

	return s.removeLogs(s.walGen)
}

// removeLogs deletes the log files of generations before gen.
func (s *Store) removeLogs(gen uint64) error {
	gens, err := s.walGens()
	if err != nil {
		return err
	}
	for _, g := range gens {
		if g < gen {
			if err := os.Remove(s.walPath(g)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return ioErr("remove log", err)
			}
		}
	}
	return s.syncDir(s.dir)
}

// recoverLog replays the log records after bbolt's checkpoint into bbolt
// in one transaction, stopping at the first torn or corrupt record (a torn
// tail is the normal result of a crash), then deletes the log files. It
// returns the last sequence number and log generation.
func (s *Store) recoverLog() (seq, gen uint64, err error) {
	gens, err := s.walGens()
	if err != nil {
		return 0, 0, err
	}
	if err := s.db.View(func(btx *bbolt.Tx) error { seq = ckSeq(btx); return nil }); err != nil {
		return 0, 0, fmt.Errorf("store: read checkpoint: %w", err)
	}
	if len(gens) == 0 {
		return seq, 0, nil
	}
	gen = gens[len(gens)-1]
	start := seq
	err = s.db.Update(func(btx *bbolt.Tx) error {
		var bks [nBuckets]*bbolt.Bucket
		for b := range bks {
			bks[b] = btx.Bucket(bucketNames[b])
		}
		var aerr error
		var inl []inlineBlock
		blk := func(b inlineBlock) { inl = append(inl, b) }
		apply := func(b int, del bool, k, v []byte) {
			switch {
			case aerr != nil:
			case del:
				aerr = bks[b].Delete(k)
			default:
				aerr = bks[b].Put(k, v)
			}
		}
	files:
		for i, g := range gens {
			buf, err := os.ReadFile(s.walPath(g))
			if err != nil {
				return fmt.Errorf("read %s: %w", walName(g), err)
			}
			for off := 0; ; {
				rs, payload, n, err := nextRecord(buf[off:])
				if err == nil && n > 0 && rs > seq && rs != seq+1 {
					err = fmt.Errorf("sequence gap: record %d after %d", rs, seq)
				}
				if err == nil && n > 0 && rs > seq {
					err = decodeOps(payload, apply, blk)
				}
				if err != nil {
					// Only the last file can end in a record whose write
					// never completed; anything else is damage.
					if i < len(gens)-1 {
						s.log.Error("store: corrupt log record; later records are lost", "file", walName(g),
							"offset", off, "err", err)
					} else {
						s.log.Warn("store: dropping torn log tail", "file", walName(g), "offset", off, "err", err)
					}
					break files
				}
				if n == 0 {
					break
				}
				if rs > seq {
					seq = rs
				}
				off += n
			}
		}
		if aerr != nil {
			return aerr
		}
		// Before the checkpoint moves past these records (and their files
		// are deleted), the blocks they carried must be in the segments.
		if err := s.restoreInline(bks[bBlockidx], inl); err != nil {
			return err
		}
		return putCkSeq(btx, seq)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("store: replay log: %w", err)
	}
	if seq > start {
		s.log.Info("store: replayed log", "records", seq-start)
	}
	return seq, gen, s.removeLogs(math.MaxUint64)
}

// restoreInline makes sure that every block that replayed records carried
// inline and that the index (as replayed) still places where the record
// says is there, intact: the crash may have lost segment data that only the
// log made durable. Every such block is written back (extending the file
// if needed; restored counts the ones that were missing or damaged); then
// every segment involved is fdatasynced. A block
// the index no longer has, or places elsewhere (Compact moved it, after
// syncing the copy), is left alone: its logged location is stale.
func (s *Store) restoreInline(idx *bbolt.Bucket, inl []inlineBlock) error {
	if len(inl) == 0 {
		return nil
	}
	files := map[uint32]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	created, restored := false, 0
	var buf []byte
	for _, b := range inl {
		l, _, ok := getIdx(idx.Get(b.h[:]))
		if !ok || l != b.l {
			continue
		}
		if blockCRC(b.data) != l.crc { // the record's CRC covers it: cannot happen
			return fmt.Errorf("store: logged block %s: checksum mismatch: %w", short(b.h[:]), fserr.ErrIO)
		}
		f := files[l.seg]
		if f == nil {
			path := s.segPath(l.seg)
			var err error
			if f, err = os.OpenFile(path, os.O_RDWR, 0); errors.Is(err, os.ErrNotExist) {
				s.log.Error("store: segment referenced by the log is missing; recreating it", "segment", segName(l.seg))
				f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
				created = true
			}
			if err != nil {
				return ioErr("open segment", err)
			}
			files[l.seg] = f
		}
		buf = slices.Grow(buf[:0], int(l.n))[:l.n]
		intact := false
		if n, _ := f.ReadAt(buf, int64(l.off)); n == len(buf) && blockCRC(buf) == l.crc {
			intact = true
		}
		// Written even when it reads back intact: after a failed
		// fdatasync (breakSegment) the page cache may show bytes that
		// never reached the disk, and the next fdatasync succeeds.
		if _, err := f.WriteAt(b.data, int64(l.off)); err != nil {
			return ioErr("restore block in segment "+segName(l.seg), err)
		}
		if !intact {
			restored++
		}
	}
	if !s.noSync {
		for id, f := range files {
			if err := fdatasync(f); err != nil {
				return ioErr("sync segment "+segName(id), err)
			}
		}
	}
	if created {
		if err := s.syncDir(filepath.Join(s.dir, blocksDir)); err != nil {
			return err
		}
	}
	s.restored += restored
	if restored > 0 {
		s.log.Warn("store: restored blocks from the log into their segments", "blocks", restored)
	}
	return nil
}
