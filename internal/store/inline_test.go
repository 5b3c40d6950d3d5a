package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// smallFile is a one-block file written the way a small file's close is.
type smallFile struct {
	id   oid.ID
	data []byte
	h    [32]byte
}

func newSmallFile(rng *rand.Rand, n uint64, size int) smallFile {
	d := make([]byte, size)
	for i := range d {
		d[i] = byte(rng.Uint32())
	}
	return smallFile{id: oid.Make(11, n), data: d, h: sha256Sum(d)}
}

// write stores f: PutBlock, then one Update with its meta-data and block.
func (f smallFile) write(s *Store) error {
	if _, err := s.PutBlock(f.data); err != nil {
		return err
	}
	return s.Update(context.Background(), func(tx *Tx) error {
		if err := tx.PutMeta(&wire.Meta{Id: uint64(f.id), Type: wire.Type_TYPE_FILE, Size: uint64(len(f.data))}); err != nil {
			return err
		}
		return tx.SetBlock(f.id, 0, f.h)
	})
}

// checkFiles verifies that every file is present with its content.
func checkFiles(t *testing.T, s *Store, files []smallFile, where string) {
	t.Helper()
	view(t, s, func(tx *Tx) error {
		for _, f := range files {
			if _, err := tx.Meta(f.id); err != nil {
				t.Fatalf("%s: file %v: meta: %v", where, f.id, err)
			}
			if h, ok, err := tx.Block(f.id, 0); !ok || err != nil || h != f.h {
				t.Fatalf("%s: file %v: block map %v %v", where, f.id, ok, err)
			}
		}
		return nil
	})
	for _, f := range files {
		if got, err := s.ReadBlock(f.h); err != nil || !bytes.Equal(got, f.data) {
			t.Fatalf("%s: file %v: ReadBlock: %v", where, f.id, err)
		}
	}
}

// loseUnsynced simulates what a power failure does to the segment files of
// a crash copy: everything past the durable size (synced, from crashCopy)
// is cut off, or, with zero, reads back as zeros. It returns the bytes
// lost.
func loseUnsynced(t *testing.T, dir string, synced map[uint32]int64, zero bool) int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, blocksDir))
	if err != nil {
		t.Fatal(err)
	}
	var lost int64
	for _, e := range ents {
		n, err := strconv.ParseUint(strings.TrimPrefix(e.Name(), segPrefix), 10, 32)
		if err != nil {
			continue
		}
		path := filepath.Join(dir, blocksDir, e.Name())
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		keep := min(synced[uint32(n)], st.Size())
		if keep == st.Size() {
			continue
		}
		lost += st.Size() - keep
		if !zero {
			if err := os.Truncate(path, keep); err != nil {
				t.Fatal(err)
			}
			continue
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(make([]byte, st.Size()-keep), keep); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return lost
}

var lossModes = []struct {
	name string
	zero bool
}{{"truncated", false}, {"zeroed", true}}

// TestInlineSmallBlocksCrash: small-file updates log their blocks inline
// (their segment is not fdatasynced); a power failure loses the segments'
// unsynced tails; every acknowledged block is back after reopening. Large
// batches in between take the segment-sync path.
func TestInlineSmallBlocksCrash(t *testing.T) {
	for _, mode := range lossModes {
		t.Run(mode.name, func(t *testing.T) {
			dir := t.TempDir()
			o := Options{SegmentSize: 256 << 10, ckEvery: time.Hour}
			s := openT(t, dir, o)
			rng := rand.New(rand.NewPCG(5, 6))
			var files []smallFile
			n := uint64(0)
			for i := range 300 {
				n++
				f := newSmallFile(rng, n, 1+rng.IntN(8<<10))
				if err := f.write(s); err != nil {
					t.Fatal(err)
				}
				files = append(files, f)
				if i%100 == 50 { // one batch over inlineMax: synced segment
					big := make([]smallFile, 5)
					for j := range big {
						n++
						big[j] = newSmallFile(rng, n, 64<<10)
						if _, err := s.PutBlock(big[j].data); err != nil {
							t.Fatal(err)
						}
					}
					before := s.inlined.Load()
					update(t, s, func(tx *Tx) error {
						for _, f := range big {
							if err := tx.PutMeta(&wire.Meta{Id: uint64(f.id)}); err != nil {
								return err
							}
							if err := tx.SetBlock(f.id, 0, f.h); err != nil {
								return err
							}
						}
						return nil
					})
					if s.inlined.Load() != before {
						t.Fatal("a batch over inlineMax was logged inline")
					}
					files = append(files, big...)
				}
			}
			if got := s.inlined.Load(); got < 290 {
				t.Fatalf("%d records carried blocks, want ~300", got)
			}
			crash := t.TempDir()
			synced := crashCopy(t, s, crash)
			if lost := loseUnsynced(t, crash, synced, mode.zero); lost == 0 {
				t.Fatal("nothing unsynced to lose")
			}
			s2 := openT(t, crash, o)
			if s2.restored == 0 {
				t.Fatal("no block restored from the log")
			}
			t.Logf("%d blocks restored", s2.restored)
			checkFiles(t, s2, files, "after crash")

			// The recovered store keeps working and restarts cleanly.
			for range 20 {
				n++
				f := newSmallFile(rng, n, 1+rng.IntN(8<<10))
				if err := f.write(s2); err != nil {
					t.Fatal(err)
				}
				files = append(files, f)
			}
			if err := s2.Close(); err != nil {
				t.Fatal(err)
			}
			s3 := openT(t, crash, o)
			checkFiles(t, s3, files, "after restart")
			if s3.restored != 0 {
				t.Fatalf("%d blocks restored after a clean close", s3.restored)
			}
		})
	}
}

// TestInlineCheckpoint: a checkpoint makes the segments holding blocks
// that its log files carried inline durable before deleting those files.
func TestInlineCheckpoint(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 64 << 10, ckEvery: time.Hour}
	s := openT(t, dir, o)
	rng := rand.New(rand.NewPCG(7, 8))
	var files []smallFile
	for i := range 100 {
		f := newSmallFile(rng, uint64(i+1), 512+rng.IntN(4<<10))
		if err := f.write(s); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	unsynced := 0
	s.segMu.RLock()
	for _, seg := range s.segs {
		if seg.synced.Load() < seg.size.Load() {
			unsynced++
		}
	}
	s.segMu.RUnlock()
	if unsynced < 2 {
		t.Fatalf("%d segments with an unsynced tail, want several", unsynced)
	}
	if err := s.checkpoint(false); err != nil {
		t.Fatal(err)
	}
	s.segMu.RLock()
	for id, seg := range s.segs {
		if seg.synced.Load() < seg.size.Load() {
			t.Errorf("segment %d unsynced after the checkpoint: %d of %d", id, seg.synced.Load(), seg.size.Load())
		}
	}
	s.segMu.RUnlock()
	for i := range 30 {
		f := newSmallFile(rng, uint64(i+1000), 512+rng.IntN(4<<10))
		if err := f.write(s); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	crash := t.TempDir()
	synced := crashCopy(t, s, crash)
	if lost := loseUnsynced(t, crash, synced, false); lost == 0 {
		t.Fatal("nothing unsynced to lose")
	}
	s2 := openT(t, crash, o)
	checkFiles(t, s2, files, "after crash")
}

// TestInlineCrashConcurrent: concurrent small-file writers (batched by
// group commit) with background checkpoints; crash copies taken mid-stream
// lose their unsynced segment data and still hold every file acknowledged
// before the copy.
func TestInlineCrashConcurrent(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 128 << 10, ckOps: 400, ckEvery: 15 * time.Millisecond}
	s := openT(t, dir, o)
	var (
		mu    sync.Mutex
		acked []smallFile
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := uint64(1); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f := newSmallFile(rng, uint64(w)<<32|i, 1+rng.IntN(6<<10))
				if err := f.write(s); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked = append(acked, f)
				mu.Unlock()
			}
		})
	}
	type crashCase struct {
		dir  string
		min  []smallFile
		zero bool
	}
	var cases []crashCase
	for i := range 4 {
		time.Sleep(40 * time.Millisecond)
		mu.Lock()
		min := acked[:len(acked):len(acked)]
		mu.Unlock()
		c := t.TempDir()
		synced := crashCopy(t, s, c)
		loseUnsynced(t, c, synced, i%2 == 1)
		cases = append(cases, crashCase{c, min, i%2 == 1})
	}
	close(stop)
	wg.Wait()
	t.Logf("%d files, %d batches, %d inline, %d checkpoints", len(acked), s.batches.Load(), s.inlined.Load(), s.checkpoints.Load())
	if s.inlined.Load() == 0 || s.checkpoints.Load() == 0 {
		t.Fatal("no inline records or no checkpoints")
	}
	for _, c := range cases {
		s2 := openT(t, c.dir, o)
		t.Logf("copy with %d files (zeroed %v): %d blocks restored", len(c.min), c.zero, s2.restored)
		checkFiles(t, s2, c.min, "crash copy")
		if err := s2.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInlineCompactCrash: blocks logged inline are moved by Compact and
// their old segments deleted; after a crash that loses unsynced segment
// data, replay follows the index to the moved copies and does not bring
// the deleted segments (stale locations) back.
func TestInlineCompactCrash(t *testing.T) {
	for _, mode := range lossModes {
		t.Run(mode.name, func(t *testing.T) {
			dir := t.TempDir()
			o := Options{SegmentSize: 64 << 10, ckEvery: time.Hour}
			s := openT(t, dir, o)
			rng := rand.New(rand.NewPCG(10, 11))
			var live, gone []smallFile
			for i := range 160 {
				f := newSmallFile(rng, uint64(i+1), 1<<10+rng.IntN(3<<10))
				if err := f.write(s); err != nil {
					t.Fatal(err)
				}
				if i%4 == 0 {
					live = append(live, f)
				} else {
					gone = append(gone, f)
				}
			}
			update(t, s, func(tx *Tx) error {
				for _, f := range gone {
					if err := tx.ClearBlock(f.id, 0); err != nil {
						return err
					}
					if err := tx.DeleteObject(f.id); err != nil {
						return err
					}
				}
				return nil
			})
			before := map[uint32]bool{}
			s.segMu.RLock()
			for id, seg := range s.segs {
				before[id] = true
				if id != s.active.id && seg.synced.Load() >= seg.size.Load() {
					t.Errorf("segment %d was synced: the blocks were meant to be logged inline", id)
				}
			}
			s.segMu.RUnlock()
			if err := s.Compact(context.Background()); err != nil {
				t.Fatal(err)
			}
			var deleted []uint32
			for id := range before {
				if s.segment(id) == nil {
					deleted = append(deleted, id)
				}
			}
			if len(deleted) < 2 {
				t.Fatalf("Compact deleted %d segments", len(deleted))
			}
			// More inline blocks after the compaction, in the same log.
			for i := range 40 {
				f := newSmallFile(rng, uint64(i+1000), 1<<10+rng.IntN(3<<10))
				if err := f.write(s); err != nil {
					t.Fatal(err)
				}
				live = append(live, f)
			}
			crash := t.TempDir()
			synced := crashCopy(t, s, crash)
			if lost := loseUnsynced(t, crash, synced, mode.zero); lost == 0 {
				t.Fatal("nothing unsynced to lose")
			}
			s2 := openT(t, crash, o)
			checkFiles(t, s2, live, "after crash")
			for _, id := range deleted {
				if _, err := os.Stat(filepath.Join(crash, blocksDir, segName(id))); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("compacted segment %d resurrected: %v", id, err)
				}
			}
			view(t, s2, func(tx *Tx) error {
				for _, f := range gone {
					if _, _, ok := tx.blockLoc(f.h[:]); ok {
						t.Errorf("freed block %s indexed after recovery", short(f.h[:]))
					}
				}
				return nil
			})
			u, _ := s2.Usage()
			var want int64
			for _, f := range live {
				want += int64(len(f.data))
			}
			if u.LiveBytes != want {
				t.Errorf("live bytes %d, want %d", u.LiveBytes, want)
			}
			if err := s2.Close(); err != nil {
				t.Fatal(err)
			}
			checkFiles(t, openT(t, crash, o), live, "after restart")
		})
	}
}

// TestInlineRecordEncoding: inline blocks survive encoding and decoding
// next to ordinary ops, and a truncated block op is rejected.
func TestInlineRecordEncoding(t *testing.T) {
	data := []byte(strings.Repeat("inline", 100))
	b := inlineBlock{h: sha256Sum(data), l: loc{seg: 7, off: 1 << 40, n: uint32(len(data)), crc: blockCRC(data)}, data: data}
	ops := []op{{b: bSys, key: []byte("k"), val: []byte("v")}, {b: bEntries, del: true, key: []byte("gone")}}
	rec := encodeRecord(3, ops, b, b)
	seq, payload, n, err := nextRecord(rec)
	if err != nil || n != len(rec) || seq != 3 {
		t.Fatalf("nextRecord = %d %d %v", seq, n, err)
	}
	var gotOps []string
	var gotBlocks []inlineBlock
	err = decodeOps(payload, func(b int, del bool, k, v []byte) {
		gotOps = append(gotOps, fmt.Sprint(b, del, string(k), string(v)))
	}, func(b inlineBlock) { gotBlocks = append(gotBlocks, b) })
	if err != nil || len(gotOps) != 2 || len(gotBlocks) != 2 {
		t.Fatalf("decode: %v %v %d", err, gotOps, len(gotBlocks))
	}
	for _, g := range gotBlocks {
		if g.h != b.h || g.l != b.l || !bytes.Equal(g.data, data) {
			t.Fatalf("decoded block %+v", g.l)
		}
	}
	nop := func(int, bool, []byte, []byte) {}
	if err := decodeOps(payload[:len(payload)-1], nop, nil); err == nil {
		t.Fatal("truncated block op accepted")
	}
}
