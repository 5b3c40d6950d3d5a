package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"go.etcd.io/bbolt"
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
// snapshot and sets t up to read through both.
func (s *Store) beginRead(t *Tx) error {
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
		if ckSeq(btx) <= snap.seq {
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
		if next, err = s.createWAL(s.walGen + 1); err != nil {
			return nil, err
		}
	}
	s.walGen++
	s.commitMu.Lock()
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
	if err := s.db.Update(func(btx *bbolt.Tx) error {
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
					err = decodeOps(payload, apply)
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
