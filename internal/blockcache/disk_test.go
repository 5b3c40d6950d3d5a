package blockcache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/poll"
)

var quiet = slog.New(slog.DiscardHandler)

// block returns distinct content for i and its hash.
func block(i, size int) (Hash, []byte) {
	b := make([]byte, size)
	for j := range b {
		b[j] = byte(i*31 + j*7)
	}
	b[0], b[1] = byte(i), byte(i>>8)
	return sha256.Sum256(b), b
}

func openDisk(t *testing.T, dir string, limit int64) *Disk {
	t.Helper()
	d, err := OpenDisk(dir, limit, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestDiskSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(1<<20, dir, 1<<20, quiet)
	if err != nil {
		t.Fatal(err)
	}
	var hs []Hash
	for i := range 5 {
		h, b := block(i, 1000)
		c.Add(h, b)
		hs = append(hs, h)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c, err = Open(1<<20, dir, 1<<20, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, h := range hs {
		got, ok := c.Get(h)
		_, want := block(i, 1000)
		if !ok || !bytes.Equal(got, want) {
			t.Fatalf("block %d after reopen: ok=%v", i, ok)
		}
	}
	if s := c.DiskStats(); s.Hits != 5 || s.Files != 5 || s.Used != 5000 {
		t.Fatalf("disk stats %+v, want 5 hits, 5 files, 5000 bytes", s)
	}
	// Promoted into memory: a second Get does not touch the disk.
	c.Get(hs[0])
	if s := c.DiskStats(); s.Hits != 5 {
		t.Fatalf("second Get went to disk: %+v", s)
	}
	// Files and shards are private to the user.
	for _, p := range []string{dir, filepath.Dir(c.disk.path(hs[0])), c.disk.path(hs[0])} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s has mode %v", p, fi.Mode())
		}
	}
}

func TestDiskBoundRespected(t *testing.T) {
	dir := t.TempDir()
	const size, limit = 4096, 10 * 4096
	d := openDisk(t, dir, limit)
	for i := range 200 {
		h, b := block(i, size)
		d.Put(h, b)
		if i%16 == 0 {
			d.Flush()
		}
	}
	d.Flush()
	s := d.Stats()
	if s.Used > limit || s.Files > 10 {
		t.Fatalf("over the bound: %+v", s)
	}
	if s.Written+s.Skipped != 200 || s.Evicted != s.Written-uint64(s.Files) {
		t.Fatalf("inconsistent counters: %+v", s)
	}
	var onDisk int64
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			fi, _ := e.Info()
			onDisk += fi.Size()
		}
		return nil
	})
	if onDisk != s.Used {
		t.Fatalf("%d bytes on disk, index says %d", onDisk, s.Used)
	}
	// The most recent block survived; the first was evicted.
	if h, _ := block(199, size); !has(d, h) {
		t.Fatal("newest block evicted")
	}
	if h, _ := block(0, size); has(d, h) {
		t.Fatal("oldest block kept")
	}
}

func has(d *Disk, h Hash) bool { _, ok := d.Get(h); return ok }

// TestDiskReopenEvictsByMtime checks that the LRU order rebuilt at open
// follows the files' modification times.
func TestDiskReopenEvictsByMtime(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDisk(dir, 1<<20, quiet)
	if err != nil {
		t.Fatal(err)
	}
	var hs []Hash
	for i := range 4 {
		h, b := block(i, 1000)
		d.Put(h, b)
		hs = append(hs, h)
	}
	d.Close()
	base := time.Now().Add(-time.Hour)
	// Block 2 is the oldest, then 0, 3, 1.
	for rank, i := range []int{2, 0, 3, 1} {
		mt := base.Add(time.Duration(rank) * time.Minute)
		if err := os.Chtimes(d.path(hs[i]), mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	d = openDisk(t, dir, 2000)
	for i, want := range []bool{false, true, false, true} {
		if has(d, hs[i]) != want {
			t.Fatalf("block %d kept=%v, want %v", i, !want, want)
		}
	}
	if _, err := os.Stat(d.path(hs[2])); !os.IsNotExist(err) {
		t.Fatalf("evicted file still there: %v", err)
	}
}

func TestDiskCorruptionDropped(t *testing.T) {
	dir := t.TempDir()
	d := openDisk(t, dir, 1<<20)
	h, b := block(1, 1000)
	d.Put(h, b)
	d.Flush()
	p := d.path(h)
	bad := bytes.Clone(b)
	bad[500] ^= 1
	if err := os.WriteFile(p, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, ok := d.Get(h); ok {
		t.Fatalf("corrupt block returned (%d bytes)", len(got))
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("corrupt file not removed: %v", err)
	}
	if s := d.Stats(); s.Corrupt != 1 || s.Files != 0 || s.Used != 0 {
		t.Fatalf("stats after corruption: %+v", s)
	}
	// It can be cached again.
	d.Put(h, b)
	d.Flush()
	if !has(d, h) {
		t.Fatal("block not cached again after corruption")
	}
	// A file truncated behind the cache's back (a crash after rename
	// without fsync) is found at reopen and fails verification.
	d.Close()
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	d = openDisk(t, dir, 1<<20)
	if has(d, h) {
		t.Fatal("truncated block returned")
	}
}

func TestDiskRemovesTempLeftovers(t *testing.T) {
	dir := t.TempDir()
	h, b := block(7, 100)
	name := hex.EncodeToString(h[:])
	shard := filepath.Join(dir, name[:2])
	if err := os.MkdirAll(shard, 0o700); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(shard, name+".12345"+tmpSuffix)
	if err := os.WriteFile(tmp, b[:50], 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "README")
	if err := os.WriteFile(foreign, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := openDisk(t, dir, 1<<20)
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("temporary file kept: %v", err)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Fatalf("a file that is not the cache's was touched: %v", err)
	}
	if s := d.Stats(); s.Files != 0 {
		t.Fatalf("leftover indexed: %+v", s)
	}
}

// TestCacheConcurrent runs Gets and Adds from many goroutines over a
// small memory tier and a small disk tier (run it with -race); every hit
// must return the block's own bytes.
func TestCacheConcurrent(t *testing.T) {
	c, err := Open(8*1024, t.TempDir(), 16*1024, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 64
	blocks := make([][]byte, n)
	hashes := make([]Hash, n)
	for i := range n {
		hashes[i], blocks[i] = block(i, 1024)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for k := range 500 {
				i := (g*7 + k*13) % n
				if k%3 == 0 {
					c.Add(hashes[i], blocks[i])
					continue
				}
				if b, ok := c.Get(hashes[i]); ok && !bytes.Equal(b, blocks[i]) {
					t.Errorf("block %d: wrong bytes", i)
					return
				}
			}
		})
	}
	wg.Wait()
	c.Flush()
	if s := c.DiskStats(); s.Used > 16*1024 || s.Written == 0 {
		t.Fatalf("disk stats %+v", s)
	}
	if _, _, used := c.Stats(); used > 8*1024 {
		t.Fatalf("memory used %d", used)
	}
}

// dirBytes sums the sizes of the cached block files under dir.
func dirBytes(t *testing.T, dir string) (n int64) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		info, err := e.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestForgetOwner: the blocks cached for a deleted file leave both tiers
// and the directory, including one still queued when its file went; other
// files' blocks stay.
func TestForgetOwner(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(1<<20, dir, 1<<20, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var gone, kept []Hash
	for i := range 8 {
		h, b := block(i, 4096)
		owner := uint64(7)
		if i%2 == 1 {
			owner = 8
			kept = append(kept, h)
		} else {
			gone = append(gone, h)
		}
		c.AddOwned(owner, h, b)
	}
	c.Flush()
	if n := dirBytes(t, dir); n != 8*4096 {
		t.Fatalf("%d bytes cached, want %d", n, 8*4096)
	}
	// One more block of file 7, forgotten while (possibly) still queued.
	h, b := block(100, 4096)
	c.AddOwned(7, h, b)
	c.ForgetOwner(7)
	c.Flush()
	gone = append(gone, h)
	for _, h := range gone {
		if _, ok := c.Get(h); ok {
			t.Fatalf("block of the deleted file still cached")
		}
	}
	for _, h := range kept {
		if _, ok := c.Get(h); !ok {
			t.Fatalf("block of another file dropped")
		}
	}
	if n := dirBytes(t, dir); n != 4*4096 {
		t.Fatalf("%d bytes left on disk, want %d", n, 4*4096)
	}
	if st := c.DiskStats(); st.Forgotten != 5 || st.Used != 4*4096 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestDiskMaxAge: blocks unused for longer than the age limit are dropped
// by the sweeper; one read meanwhile keeps its block.
func TestDiskMaxAge(t *testing.T) {
	dir := t.TempDir()
	const age = 2 * time.Second
	d, err := OpenDiskAge(dir, 1<<20, age, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var hs []Hash
	for i := range 4 {
		h, b := block(i, 1000)
		d.Put(h, b)
		hs = append(hs, h)
	}
	d.Flush()
	// Block 0 is read on every poll (at most 500 ms apart): it stays.
	poll.Until(t, 20*time.Second, "unused blocks expire", func() error {
		if !has(d, hs[0]) {
			t.Fatal("block in use expired")
		}
		if st := d.Stats(); st.Files > 1 {
			return fmt.Errorf("%d files left", st.Files)
		}
		return nil
	})
	if n := dirBytes(t, dir); n != 1000 {
		t.Fatalf("%d bytes left on disk, want 1000", n)
	}
}

// TestDiskLimitWithinFreeSpace: the bound in force never exceeds half of
// the space available to the cache.
func TestDiskLimitWithinFreeSpace(t *testing.T) {
	dir := t.TempDir()
	free, ok := freeBytes(dir)
	if !ok {
		t.Skip("free space unknown on this platform")
	}
	d := openDisk(t, dir, 1<<62)
	if got := d.Stats().Limit; got > free/2+free/100 || got <= 0 {
		t.Fatalf("limit %d with %d bytes free", got, free)
	}
	d2 := openDisk(t, t.TempDir(), 1<<20)
	if got := d2.Stats().Limit; got != 1<<20 {
		t.Fatalf("a small configured limit changed: %d", got)
	}
}
