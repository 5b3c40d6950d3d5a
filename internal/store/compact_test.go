package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/poll"
)

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// segFiles lists the segment files in dir's blocks directory and their
// total size.
func segFiles(t testing.TB, dir string) (names []string, total int64) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, blocksDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, e.Name())
		total += info.Size()
	}
	return names, total
}

// TestBackgroundReclaim: with a short CompactInterval the store gives the
// space of a deleted file back by itself, keeps what is still referenced
// (a block shared with another file, and a block only pending), and logs
// what it reclaimed.
func TestBackgroundReclaim(t *testing.T) {
	dir := t.TempDir()
	var logs lockedBuffer
	o := Options{SegmentSize: 1 << 20, NoSync: true, CompactInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	s := openT(t, dir, o)
	big, other := oid.Make(3, 10), oid.Make(3, 11)
	var shared []byte
	var hs [32]byte
	for i := range uint64(128) { // 8 MiB over 8 segments
		d := randBlock(t, 64<<10)
		h, err := s.PutBlock(d)
		if err != nil {
			t.Fatal(err)
		}
		update(t, s, func(tx *Tx) error { return tx.SetBlock(big, i, h) })
		if i == 70 {
			shared, hs = d, h
			update(t, s, func(tx *Tx) error { return tx.SetBlock(other, 0, h) })
		}
	}
	pendData := randBlock(t, 4096)
	hp, err := s.PutBlock(pendData)
	if err != nil {
		t.Fatal(err)
	}
	_, full := segFiles(t, dir)
	update(t, s, func(tx *Tx) error { return tx.TruncateBlocks(big, 0) })

	poll.Until(t, 10*time.Second, "segment files shrink", func() error {
		if _, n := segFiles(t, dir); n > 1<<20 {
			return fmt.Errorf("%d bytes of segment files (%d before the delete)", n, full)
		}
		return nil
	})
	_, after := segFiles(t, dir)
	u, _ := s.Usage()
	t.Logf("segment files: %d bytes with the file, %d after deleting it; %+v", full, after, u)
	if u.Compactions == 0 || u.ReclaimedBytes < 6<<20 {
		t.Errorf("usage after reclaim: %+v", u)
	}
	if got, err := s.ReadBlock(hs); err != nil || !bytes.Equal(got, shared) {
		t.Fatalf("shared block after reclaim: %v", err)
	}
	update(t, s, func(tx *Tx) error { return tx.SetBlock(other, 1, hp) })
	if got, err := s.ReadBlock(hp); err != nil || !bytes.Equal(got, pendData) {
		t.Fatalf("pending block after reclaim: %v", err)
	}
	if !strings.Contains(logs.String(), "store: reclaimed dead block space") {
		t.Errorf("no log line for the reclaim:\n%s", logs.String())
	}
	if err := s.Close(); err != nil { // stops the reclaimer
		t.Fatal(err)
	}
}

// TestBackgroundReclaimOff: a negative CompactInterval leaves dead space
// alone.
func TestBackgroundReclaimOff(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentSize: 256 << 10, NoSync: true, CompactInterval: -1})
	for i := range uint64(16) {
		h, _ := s.PutBlock(randBlock(t, 64<<10))
		update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, i, h) })
	}
	update(t, s, func(tx *Tx) error { return tx.TruncateBlocks(fileID, 0) })
	// The reclaimer goroutine is gone: nothing can compact behind our back.
	select {
	case <-s.compactDone:
	case <-time.After(10 * time.Second):
		t.Fatal("reclaimer still running with CompactInterval < 0")
	}
	if u, _ := s.Usage(); u.SegmentBytes < 16*64<<10 || u.Compactions != 0 {
		t.Fatalf("usage: %+v", u)
	}
}

// compactCrashData is block i of the crash test, reproducible by both
// processes.
func compactCrashData(i int) []byte {
	return bytes.Repeat(fmt.Appendf(nil, "compact crash %06d|", i), 16<<10/20)[:16<<10]
}

const compactCrashBlocks = 96

// compactCrashKept reports whether block i stays referenced.
func compactCrashKept(i int) bool { return i%4 == 0 }

// TestCompactCrash kills a process at each stage of Compact (half the
// copies written; copies synced; index repointed; first old segment
// deleted) and checks, after reopening, that every referenced block reads
// back intact, that the index names no missing segment, that the live
// accounting matches the index, and that a new pass reclaims the rest.
func TestCompactCrash(t *testing.T) {
	if env := os.Getenv("WHEELFS_STORE_COMPACT_CRASH"); env != "" {
		dir, stage, _ := strings.Cut(env, ":")
		compactCrashChild(dir, stage)
		return
	}
	for _, stage := range []string{"copying", "copied", "repointed", "removing"} {
		t.Run(stage, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestCompactCrash$")
			cmd.Env = append(os.Environ(), "WHEELFS_STORE_COMPACT_CRASH="+dir+":"+stage)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child was not killed at %q: %v\n%s", stage, err, out)
			}
			if !bytes.Contains(out, []byte("crashing at "+stage)) {
				t.Fatalf("child output:\n%s", out)
			}
			namesBefore, _ := segFiles(t, dir)

			var logs lockedBuffer
			o := Options{SegmentSize: 256 << 10, CompactInterval: -1,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
			s := openT(t, dir, o)
			check := func() {
				t.Helper()
				for i := range compactCrashBlocks {
					if !compactCrashKept(i) {
						continue
					}
					var h [32]byte
					var ok bool
					view(t, s, func(tx *Tx) error { h, ok, _ = tx.Block(fileID, uint64(i)); return nil })
					if !ok {
						t.Fatalf("block %d lost from the block map", i)
					}
					if got, err := s.ReadBlock(h); err != nil || !bytes.Equal(got, compactCrashData(i)) {
						t.Fatalf("block %d after the crash at %s: %v", i, stage, err)
					}
				}
				perSeg := map[uint32]int64{}
				view(t, s, func(tx *Tx) error {
					tx.scan(bBlockidx, nil, 0, func(k, v []byte) bool {
						l, _, _ := getIdx(v)
						perSeg[l.seg] += int64(l.n)
						return true
					})
					return nil
				})
				s.segMu.RLock()
				defer s.segMu.RUnlock()
				for id, n := range perSeg {
					if s.segs[id] == nil {
						t.Errorf("index references deleted segment %d", id)
					}
					if s.live[id] != n {
						t.Errorf("segment %d: live accounting %d, index %d", id, s.live[id], n)
					}
				}
			}
			check()
			if strings.Contains(logs.String(), "level=ERROR") {
				t.Errorf("errors on reopen:\n%s", logs.String())
			}
			if err := s.Compact(context.Background()); err != nil {
				t.Fatal(err)
			}
			check()
			u, _ := s.Usage()
			namesAfter, _ := segFiles(t, dir)
			t.Logf("segments at the crash %v; after reopening and compacting %v; %+v", namesBefore, namesAfter, u)
			// Everything dead is gone: 24 kept blocks of 16 KiB, and at most
			// the empty active segment besides.
			if u.LiveBytes != compactCrashBlocks/4*16<<10 || u.SegmentBytes != u.LiveBytes {
				t.Errorf("after the second pass: %+v", u)
			}
			for _, n := range namesAfter {
				if slices.Contains([]string{segName(1), segName(2), segName(3), segName(4)}, n) {
					t.Errorf("old segment %s survived", n)
				}
			}
		})
	}
}

// compactCrashChild fills 96 blocks of 16 KiB (six segments), frees three
// in four, and SIGKILLs itself at the given stage of Compact. The records
// stay in the log (no checkpoint), most with their blocks inline.
func compactCrashChild(dir, stage string) {
	s, err := Open(dir, Options{SegmentSize: 256 << 10, CompactInterval: -1})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	for i := range compactCrashBlocks {
		h, err := s.PutBlock(compactCrashData(i))
		if err == nil {
			err = s.Update(ctx, func(tx *Tx) error { return tx.SetBlock(fileID, uint64(i), h) })
		}
		if err != nil {
			fmt.Println("write:", err)
			os.Exit(1)
		}
	}
	if err := s.Update(ctx, func(tx *Tx) error {
		for i := range compactCrashBlocks {
			if !compactCrashKept(i) {
				if err := tx.ClearBlock(fileID, uint64(i)); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		fmt.Println("free:", err)
		os.Exit(1)
	}
	s.compactHook = func(st string) {
		if st == stage {
			fmt.Println("crashing at", st)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
	err = s.Compact(ctx)
	fmt.Println("compact returned without reaching the stage:", err)
	os.Exit(1)
}

// TestCompactKeepsCommitsFlowing: while a pass copies, durable updates go
// on, both small ones (blocks logged inline) and large ones (the active
// segment fdatasynced). The pass is held in the middle of its copy until
// writers have committed; the latencies before and during compaction are
// logged.
func TestCompactKeepsCommitsFlowing(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentSize: 8 << 20, CompactInterval: -1})
	ctx := context.Background()
	// 48 MiB, two thirds freed: 16 MiB to copy, 32 MiB to reclaim.
	const n = 768
	for i := uint64(0); i < n; i += 16 {
		datas := make([][]byte, 16)
		for j := range datas {
			datas[j] = randBlock(t, 64<<10)
		}
		hs, err := s.PutBlocks(datas)
		if err != nil {
			t.Fatal(err)
		}
		update(t, s, func(tx *Tx) error {
			for j, h := range hs {
				if err := tx.SetBlock(fileID, i+uint64(j), h); err != nil {
					return err
				}
			}
			return nil
		})
	}
	update(t, s, func(tx *Tx) error {
		for i := range uint64(n) {
			if i%3 != 0 {
				if err := tx.ClearBlock(fileID, i); err != nil {
					return err
				}
			}
		}
		return nil
	})

	type sample struct {
		at  time.Time
		lat time.Duration
	}
	var mu sync.Mutex
	lats := map[string][]sample{}
	progress := make(chan struct{}, 1024)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	writer := func(kind string, file oid.ID, blocks, size int) {
		defer wg.Done()
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			datas := make([][]byte, blocks)
			for j := range datas {
				datas[j] = randBlock(t, size)
			}
			start := time.Now()
			hs, err := s.PutBlocks(datas)
			if err == nil {
				err = s.Update(ctx, func(tx *Tx) error {
					for j, h := range hs {
						if err := tx.SetBlock(file, i*uint64(blocks)+uint64(j), h); err != nil {
							return err
						}
					}
					return nil
				})
			}
			if err != nil {
				t.Errorf("%s writer: %v", kind, err)
				return
			}
			mu.Lock()
			lats[kind] = append(lats[kind], sample{start, time.Since(start)})
			mu.Unlock()
			select {
			case progress <- struct{}{}:
			default:
			}
		}
	}
	wg.Add(2)
	go writer("small (4 KiB, inline)", oid.Make(3, 20), 1, 4<<10)
	go writer("large (8×64 KiB, segment sync)", oid.Make(3, 21), 8, 64<<10)
	waitCommits := func(k int) {
		t.Helper()
		for range k {
			select {
			case <-progress:
			case <-time.After(30 * time.Second):
				t.Fatal("updates stalled")
			}
		}
	}
	waitCommits(40) // baseline
	held := false
	s.compactHook = func(stage string) {
		if stage == "copying" {
			for len(progress) > 0 { // count only commits made from now on
				<-progress
			}
			waitCommits(10)
			held = true
		}
	}
	before, _ := s.Usage()
	cStart := time.Now()
	if err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	cEnd := time.Now()
	waitCommits(40) // after
	close(stop)
	wg.Wait()
	after, _ := s.Usage()
	if !held {
		t.Fatal("the copy stage was never reached")
	}
	if after.ReclaimedBytes < 24<<20 {
		t.Errorf("reclaimed %d bytes; usage before %+v after %+v", after.ReclaimedBytes, before, after)
	}
	t.Logf("compaction took %v: segment bytes %d → %d, reclaimed %d", cEnd.Sub(cStart).Round(time.Millisecond),
		before.SegmentBytes, after.SegmentBytes, after.ReclaimedBytes)
	mu.Lock()
	defer mu.Unlock()
	for kind, ss := range lats {
		var base, during []time.Duration
		for _, x := range ss {
			switch end := x.at.Add(x.lat); {
			case end.Before(cStart) || x.at.After(cEnd):
				base = append(base, x.lat)
			case !x.at.Before(cStart) && end.Before(cEnd):
				during = append(during, x.lat)
			}
		}
		t.Logf("%s: outside compaction %s; during %s", kind, latSummary(base), latSummary(during))
	}
}

func latSummary(d []time.Duration) string {
	if len(d) == 0 {
		return "no commits"
	}
	slices.Sort(d)
	q := func(p float64) time.Duration {
		return d[min(len(d)-1, int(p*float64(len(d))))].Round(10 * time.Microsecond)
	}
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", len(d), q(0.5), q(0.99), d[len(d)-1].Round(10*time.Microsecond))
}
