package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// crashClose stops s as a crash would: no checkpoint, log left as is.
func crashClose(s *Store) {
	s.stop()
	s.closeOnce.Do(func() { s.closeErr = s.closeFiles() })
}

// TestMemtable checks versioned gets and iteration against a model.
func TestMemtable(t *testing.T) {
	type ver struct {
		seq uint64
		val string
		del bool
	}
	m := newMemtable()
	hist := map[string][]ver{}
	rng := rand.New(rand.NewPCG(1, 2))
	visible := func(k string, at uint64) (ver, bool) {
		h := hist[k]
		for i := len(h) - 1; i >= 0; i-- {
			if h[i].seq <= at {
				return h[i], true
			}
		}
		return ver{}, false
	}
	for seq := uint64(1); seq <= 3000; seq++ {
		for range 1 + rng.IntN(3) {
			k := fmt.Sprintf("k%03d", rng.IntN(300))
			v := ver{seq: seq, val: fmt.Sprint(seq, "-", rng.Int()), del: rng.IntN(4) == 0}
			m.put(bSys, []byte(k), []byte(v.val), seq, v.del)
			if h := hist[k]; len(h) > 0 && h[len(h)-1].seq == seq {
				h[len(h)-1] = v // same key twice in one record
			} else {
				hist[k] = append(h, v)
			}
		}
		if seq%150 != 0 {
			continue
		}
		keys := slices.Sorted(maps.Keys(hist))
		for range 5 {
			at := rng.Uint64N(seq + 1)
			for _, k := range keys {
				want, ok := visible(k, at)
				n := m.lists[bSys].get([]byte(k), at)
				if (n != nil) != ok || (ok && (string(n.val) != want.val || n.del != want.del)) {
					t.Fatalf("get(%s@%d) = %+v, want %+v %v", k, at, n, want, ok)
				}
			}
			from := fmt.Sprintf("k%03d", rng.IntN(300))
			var wantKeys, gotKeys []string
			for _, k := range keys {
				if _, ok := visible(k, at); ok && k >= from {
					wantKeys = append(wantKeys, k)
				}
			}
			for it := m.lists[bSys].iter([]byte(from), at); it.n != nil; it.next() {
				want, _ := visible(string(it.n.key), at)
				if string(it.n.val) != want.val || it.n.del != want.del {
					t.Fatalf("iter %s@%d = %q/%v, want %+v", it.n.key, at, it.n.val, it.n.del, want)
				}
				gotKeys = append(gotKeys, string(it.n.key))
			}
			if !slices.Equal(gotKeys, wantKeys) {
				t.Fatalf("iter from %s@%d: %v, want %v", from, at, gotKeys, wantKeys)
			}
		}
	}
}

// overlayModel is the expected content of dirID's entries and the sys
// records under "p/".
type overlayModel struct {
	entries map[string]uint64
	sys     map[string]string
}

func (m overlayModel) clone() overlayModel {
	return overlayModel{maps.Clone(m.entries), maps.Clone(m.sys)}
}

// check compares every read path of tx with the model.
func (m overlayModel) check(t *testing.T, tx *Tx, rng *rand.Rand, where string) {
	t.Helper()
	names := slices.Sorted(maps.Keys(m.entries))
	all, err := tx.Entries(dirID, "", 0)
	if err != nil || !slices.Equal(entryNames(all), names) {
		t.Fatalf("%s: Entries = %v, %v; want %v", where, entryNames(all), err, names)
	}
	for _, e := range all {
		if e.Id != m.entries[e.Name] {
			t.Fatalf("%s: entry %s id %d, want %d", where, e.Name, e.Id, m.entries[e.Name])
		}
	}
	limit := 1 + rng.IntN(4)
	var paged []string
	for after := ""; ; {
		page, err := tx.Entries(dirID, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, entryNames(page)...)
		after = page[len(page)-1].Name
	}
	if !slices.Equal(paged, names) {
		t.Fatalf("%s: paged Entries = %v, want %v", where, paged, names)
	}
	for i := range 40 {
		name := fmt.Sprintf("n%02d", i)
		e, err := tx.Entry(dirID, name)
		if id, ok := m.entries[name]; ok != (err == nil) || (ok && e.Id != id) {
			t.Fatalf("%s: Entry(%s) = %v, %v; model %d %v", where, name, e, err, id, ok)
		}
	}
	if has, _ := tx.HasEntries(dirID); has != (len(names) > 0) {
		t.Fatalf("%s: HasEntries = %v with %d entries", where, has, len(names))
	}
	keys, _ := tx.SysKeys("p/")
	if want := slices.Sorted(maps.Keys(m.sys)); !slices.Equal(keys, want) {
		t.Fatalf("%s: SysKeys = %v, want %v", where, keys, want)
	}
	for k, v := range m.sys {
		if got, err := tx.Sys(k); err != nil || string(got) != v {
			t.Fatalf("%s: Sys(%s) = %q, %v; want %q", where, k, got, err, v)
		}
	}
}

// TestOverlayModel runs random updates (some failing, some batched) while
// freezing and flushing overlay layers at random, so that reads merge
// buffered writes, two layers and bbolt in every combination.
func TestOverlayModel(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{NoSync: true, ckEvery: time.Hour})
	rng := rand.New(rand.NewPCG(3, 4))
	model := overlayModel{map[string]uint64{}, map[string]string{}}
	errBoom := errors.New("boom")
	var stamp uint64

	// fn returns an update function that applies random changes to model
	// too, if it succeeds.
	fn := func() func(*Tx) error {
		fail := rng.IntN(8) == 0
		nops := 1 + rng.IntN(6)
		seed := rng.Uint64()
		return func(tx *Tx) error {
			r := rand.New(rand.NewPCG(seed, 0))
			local := model.clone()
			for range nops {
				name := fmt.Sprintf("n%02d", r.IntN(40))
				key := fmt.Sprintf("p/%02d", r.IntN(20))
				switch r.IntN(4) {
				case 0:
					stamp++
					if err := tx.PutEntry(dirID, &wire.Entry{Name: name, Id: stamp}); err != nil {
						return err
					}
					local.entries[name] = stamp
				case 1:
					err := tx.DeleteEntry(dirID, name)
					if _, ok := local.entries[name]; ok != (err == nil) {
						t.Errorf("DeleteEntry(%s) = %v, model has it: %v", name, err, ok)
					}
					delete(local.entries, name)
				case 2:
					stamp++
					v := strconv.FormatUint(stamp, 10)
					if err := tx.PutSys(key, []byte(v)); err != nil {
						return err
					}
					local.sys[key] = v
				case 3:
					if err := tx.DeleteSys(key); err != nil {
						return err
					}
					delete(local.sys, key)
				}
			}
			local.check(t, tx, r, "in update")
			if fail {
				return errBoom
			}
			model = local
			return nil
		}
	}
	do := func(f func(*Tx) error) {
		if err := s.Update(context.Background(), f); err != nil && !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
	}

	for step := range 1500 {
		switch r := rng.IntN(100); {
		case r < 6:
			s.ckMu.Lock()
			if s.snap.Load().layers[1] == nil {
				if _, err := s.freeze(false); err != nil {
					t.Fatal(err)
				}
			}
			s.ckMu.Unlock()
		case r < 12:
			s.ckMu.Lock()
			if f := s.snap.Load().layers[1]; f != nil {
				if err := s.flush(f); err != nil {
					t.Fatal(err)
				}
			}
			s.ckMu.Unlock()
		case r < 20: // a batch of several functions
			release := holdCommitter(t, s)
			n := 2 + rng.IntN(4)
			var wg sync.WaitGroup
			for i := range n {
				f := fn()
				wg.Go(func() { do(f) })
				waitQueued(t, s, i+1)
			}
			release()
			wg.Wait()
		default:
			do(fn())
		}
		view(t, s, func(tx *Tx) error {
			model.check(t, tx, rng, fmt.Sprint("view after step ", step))
			return nil
		})
	}
	if s.checkpoints.Load() < 10 {
		t.Errorf("only %d flushes", s.checkpoints.Load())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{NoSync: true})
	view(t, s, func(tx *Tx) error {
		model.check(t, tx, rng, "after reopen")
		return nil
	})
}

// workload is a set of writers whose updates keep invariants that any
// consistent snapshot satisfies: writer w's n-th update adds entry n-1 to
// its directory and block n-1 to its file, removes those keep updates
// older, and records n; shared blocks carry exact reference counts.
type workload struct {
	writers int
	blocks  [][]byte
	hashes  [][32]byte
	acked   []atomic.Uint64
}

const keep = 10

func newWorkload(writers int) *workload {
	w := &workload{writers: writers, acked: make([]atomic.Uint64, writers)}
	for i := range 8 {
		b := []byte(strings.Repeat(fmt.Sprint("shared block ", i, "|"), 100))
		w.blocks = append(w.blocks, b)
		w.hashes = append(w.hashes, sha256Sum(b))
	}
	return w
}

func wlDir(w int) oid.ID  { return oid.Make(8, uint64(w+1)) }
func wlFile(w int) oid.ID { return oid.Make(8, uint64(w+100)) }
func wlName(i uint64) string {
	return fmt.Sprintf("e%06d", i)
}

// run runs writer w until stop is closed or it has made max updates.
func (wl *workload) run(t *testing.T, s *Store, w int, max uint64, stop <-chan struct{}) {
	for i := wl.acked[w].Load(); i < max; i++ {
		select {
		case <-stop:
			return
		default:
		}
		bi := int(i) % len(wl.blocks)
		if _, err := s.PutBlock(wl.blocks[bi]); err != nil {
			t.Error(err)
			return
		}
		err := s.Update(context.Background(), func(tx *Tx) error {
			if err := tx.PutEntry(wlDir(w), &wire.Entry{Name: wlName(i), Id: i + 1}); err != nil {
				return err
			}
			if err := tx.SetBlock(wlFile(w), i, wl.hashes[bi]); err != nil {
				return err
			}
			if i >= keep {
				if err := tx.DeleteEntry(wlDir(w), wlName(i-keep)); err != nil {
					return err
				}
				if err := tx.ClearBlock(wlFile(w), i-keep); err != nil {
					return err
				}
			}
			if err := tx.SetXattr(wlFile(w), "user.n", []byte(fmt.Sprint(i+1))); err != nil {
				return err
			}
			return tx.PutSys(fmt.Sprint("count/", w), []byte(fmt.Sprint(i+1)))
		})
		if err != nil {
			t.Errorf("writer %d update %d: %v", w, i, err)
			return
		}
		wl.acked[w].Store(i + 1)
	}
}

// check verifies the invariants in tx and that writer w has at least
// min[w] updates. It returns the update counts.
func (wl *workload) check(t *testing.T, tx *Tx, min []uint64) []uint64 {
	t.Helper()
	counts := make([]uint64, wl.writers)
	refs := make([]uint32, len(wl.hashes))
	for w := range wl.writers {
		var n uint64
		if v, err := tx.Sys(fmt.Sprint("count/", w)); err == nil {
			n, _ = strconv.ParseUint(string(v), 10, 64)
		} else if !errors.Is(err, fserr.ErrNotExist) {
			t.Fatal(err)
		}
		counts[w] = n
		if n < min[w] {
			t.Fatalf("writer %d: %d updates visible, %d acknowledged before", w, n, min[w])
		}
		first := n - uint64(keep)
		if n < keep {
			first = 0
		}
		var want []string
		for i := first; i < n; i++ {
			want = append(want, wlName(i))
		}
		es, _ := tx.Entries(wlDir(w), "", 0)
		if got := entryNames(es); !slices.Equal(got, want) {
			t.Fatalf("writer %d at %d: entries %v, want %v", w, n, got, want)
		}
		var paged []string
		for after := ""; ; {
			page, _ := tx.Entries(wlDir(w), after, 3)
			if len(page) == 0 {
				break
			}
			paged = append(paged, entryNames(page)...)
			after = page[len(page)-1].Name
		}
		if !slices.Equal(paged, want) {
			t.Fatalf("writer %d at %d: paged entries %v", w, n, paged)
		}
		bs, err := tx.Blocks(wlFile(w), 0, 1<<40)
		if err != nil || uint64(len(bs)) != n-first {
			t.Fatalf("writer %d at %d: %d blocks, %v", w, n, len(bs), err)
		}
		for j, b := range bs {
			bi := int(b.Index) % len(wl.hashes)
			if b.Index != first+uint64(j) || b.Hash != wl.hashes[bi] {
				t.Fatalf("writer %d at %d: block %+v", w, n, b)
			}
			refs[bi]++
		}
		x, err := tx.Xattr(wlFile(w), "user.n")
		if n > 0 && (err != nil || string(x) != fmt.Sprint(n)) {
			t.Fatalf("writer %d at %d: xattr %q %v", w, n, x, err)
		}
	}
	for i, h := range wl.hashes {
		_, got, ok := tx.blockLoc(h[:])
		if got != refs[i] || ok != (refs[i] > 0) {
			t.Fatalf("block %d: %d refs (%v), want %d", i, got, ok, refs[i])
		}
	}
	return counts
}

func (wl *workload) ackedNow() []uint64 {
	out := make([]uint64, wl.writers)
	for w := range out {
		out[w] = wl.acked[w].Load()
	}
	return out
}

// TestCheckpointConcurrent: many updates and consistent views while small
// checkpoints run in the background.
func TestCheckpointConcurrent(t *testing.T) {
	dir := t.TempDir()
	o := Options{ckOps: 200, ckEvery: 5 * time.Millisecond}
	s := openT(t, dir, o)
	wl := newWorkload(4)
	const perWriter = 400
	var writers, readers sync.WaitGroup
	for w := range wl.writers {
		writers.Go(func() { wl.run(t, s, w, perWriter, nil) })
	}
	done := make(chan struct{})
	var views atomic.Int64
	for range 3 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				min := wl.ackedNow()
				if err := s.View(func(tx *Tx) error { wl.check(t, tx, min); return nil }); err != nil {
					t.Error(err)
					return
				}
				views.Add(1)
			}
		})
	}
	writers.Wait()
	close(done)
	readers.Wait()
	t.Logf("%d views, %d checkpoints, %d batches", views.Load(), s.checkpoints.Load(), s.batches.Load())
	if s.checkpoints.Load() < 5 {
		t.Errorf("only %d checkpoints", s.checkpoints.Load())
	}
	final := wl.ackedNow()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if gens, _ := s.walGens(); len(gens) != 0 {
		t.Errorf("log files left after Close: %v", gens)
	}
	s = openT(t, dir, o)
	view(t, s, func(tx *Tx) error {
		if got := wl.check(t, tx, final); !slices.Equal(got, final) {
			t.Errorf("after reopen: %v, want %v", got, final)
		}
		return nil
	})
}

// TestLogRecovery: a copy taken mid-stream and a stop without checkpoint
// both recover every acknowledged update, and no update partially.
func TestLogRecovery(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 64 << 10, ckOps: 300, ckEvery: 20 * time.Millisecond}
	s := openT(t, dir, o)
	wl := newWorkload(3)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range wl.writers {
		wg.Go(func() { wl.run(t, s, w, 1<<62, stop) })
	}
	var copies []string
	var mins [][]uint64
	for range 3 {
		time.Sleep(30 * time.Millisecond)
		mins = append(mins, wl.ackedNow())
		c := t.TempDir()
		crashCopy(t, s, c)
		copies = append(copies, c)
	}
	close(stop)
	wg.Wait()
	final := wl.ackedNow()
	crashClose(s)

	check := func(dir string, min []uint64) {
		t.Helper()
		s := openT(t, dir, o)
		view(t, s, func(tx *Tx) error {
			counts := wl.check(t, tx, min)
			t.Logf("%s: %v updates (acknowledged before: %v)", dir, counts, min)
			return nil
		})
		for _, h := range wl.hashes {
			if !s.HasBlock(h) {
				continue
			}
			if _, err := s.ReadBlock(h); err != nil {
				t.Fatalf("block after recovery: %v", err)
			}
		}
		// The recovered store keeps working and survives a clean restart.
		wl2 := &workload{writers: wl.writers, blocks: wl.blocks, hashes: wl.hashes, acked: make([]atomic.Uint64, wl.writers)}
		var counts []uint64
		view(t, s, func(tx *Tx) error { counts = wl.check(t, tx, min); return nil })
		for w := range wl.writers {
			wl2.acked[w].Store(counts[w])
			wl2.run(t, s, w, counts[w]+5, nil)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openT(t, dir, o)
		view(t, s, func(tx *Tx) error { wl.check(t, tx, wl2.ackedNow()); return nil })
	}
	check(dir, final)
	for i, c := range copies {
		check(c, mins[i])
	}
}

// lastLog returns the path and record end offset of the newest log file.
func lastLog(t *testing.T, s *Store) (string, []int) {
	t.Helper()
	gens, err := s.walGens()
	if err != nil || len(gens) == 0 {
		t.Fatalf("log files: %v %v", gens, err)
	}
	path := s.walPath(gens[len(gens)-1])
	buf, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int
	for off := 0; ; {
		_, _, n, err := nextRecord(buf[off:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return path, ends
		}
		off += n
		ends = append(ends, off)
	}
}

func TestTornLogTail(t *testing.T) {
	dir := t.TempDir()
	o := Options{ckEvery: time.Hour}
	s := openT(t, dir, o)
	put := func(s *Store, from, to int) {
		for i := from; i < to; i++ {
			update(t, s, func(tx *Tx) error { return tx.PutSys(fmt.Sprint("k", i), []byte(fmt.Sprint("v", i))) })
		}
	}
	present := func(s *Store, n int, absent ...int) {
		t.Helper()
		view(t, s, func(tx *Tx) error {
			for i := range n {
				if v, err := tx.Sys(fmt.Sprint("k", i)); err != nil || string(v) != fmt.Sprint("v", i) {
					t.Errorf("k%d = %q, %v", i, v, err)
				}
			}
			for _, i := range absent {
				if _, err := tx.Sys(fmt.Sprint("k", i)); err == nil {
					t.Errorf("k%d present", i)
				}
			}
			return nil
		})
	}
	put(s, 0, 20)
	crashClose(s)

	// A record whose write was cut short: a header and half a payload.
	path, ends := lastLog(t, s)
	if len(ends) != 20 {
		t.Fatalf("%d records, want 20", len(ends))
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := encodeRecord(21, []op{{b: bSys, key: []byte("k20"), val: []byte("v20")}})
	if _, err := f.WriteAt(torn[:len(torn)-2], int64(ends[19])); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s = openT(t, dir, o)
	present(s, 20, 20)
	if gens, _ := s.walGens(); len(gens) != 1 {
		t.Fatalf("log files after recovery: %v", gens)
	}
	if _, ends := lastLog(t, s); len(ends) != 0 {
		t.Fatalf("new log has %d records", len(ends))
	}

	// A corrupt last record (a flipped bit): it is dropped, the rest stays.
	put(s, 20, 30)
	crashClose(s)
	path, ends = lastLog(t, s)
	f, err = os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	f.ReadAt(b[:], int64(ends[9]-1))
	b[0] ^= 1
	f.WriteAt(b[:], int64(ends[9]-1))
	f.Close()
	s = openT(t, dir, o)
	present(s, 29, 29)
	put(s, 29, 31)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	present(openT(t, dir, o), 31)
}

// TestReplaySkipsCheckpointed: log files that survive their checkpoint (a
// crash before their deletion) are not applied again. Reference counts
// would go backwards if they were.
func TestReplaySkipsCheckpointed(t *testing.T) {
	dir := t.TempDir()
	o := Options{ckEvery: time.Hour}
	s := openT(t, dir, o)
	h, _ := s.PutBlock([]byte("shared"))
	update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, 0, h) })
	gens, _ := s.walGens()
	oldPath := s.walPath(gens[0])
	old, err := os.ReadFile(oldPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.checkpoint(false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(oldPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("checkpointed log not deleted: %v", err)
	}
	update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, 1, h) })
	if err := s.checkpoint(false); err != nil {
		t.Fatal(err)
	}
	update(t, s, func(tx *Tx) error { return tx.PutSys("after", nil) })
	crashClose(s)
	if err := os.WriteFile(oldPath, old, 0o644); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, o)
	if refs, ok := indexRefs(t, s, h); !ok || refs != 2 {
		t.Fatalf("refs = %d %v, want 2", refs, ok)
	}
	view(t, s, func(tx *Tx) error {
		if _, err := tx.Sys("after"); err != nil {
			t.Errorf("record after the checkpoint lost: %v", err)
		}
		return nil
	})
}
