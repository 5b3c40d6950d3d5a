package cluster

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/poll"
	"github.com/wheelfs/wheelfs/internal/store"
)

// diskUsage is the space the files under dir take on disk (allocated
// blocks, as du reports them).
func diskUsage(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed while walking
		}
		info, err := e.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSpaceComesBack writes a large file, reads it back (filling the
// client's on-disk block cache), removes it, and checks that the servers'
// stores and the client's cache shrink back to about where they started,
// the stores through background compaction.
func TestSpaceComesBack(t *testing.T) {
	const size = 48 << 20
	c := Start(t, Options{Sites: []string{"west", "east"}, ConfigMembers: 1,
		Adjust: func(n *Node, cfg *deploy.Config) {
			cfg.Store = store.Options{SegmentSize: 4 << 20, CompactInterval: 100 * time.Millisecond}
			cfg.Client.CacheDir = filepath.Join(n.Dir, "cache")
			cfg.Client.DiskCacheBytes = 1 << 30
		}})
	ctx := opCtx(t)
	west := c.Client("west")
	cacheDir := filepath.Join(c.ClientNode("west").Dir, "cache")
	storeDirs := func() (total int64, each []int64) {
		for _, site := range c.Sites() {
			for _, n := range c.Servers(site) {
				u := diskUsage(t, filepath.Join(n.Dir, "store"))
				each = append(each, u)
				total += u
			}
		}
		return total, each
	}
	if err := west.WriteFile(ctx, Owner(), "/warmup", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	base, baseEach := storeDirs()
	baseCache := diskUsage(t, cacheDir)

	data := make([]byte, size)
	rand.Read(data)
	if err := west.WriteFile(ctx, Owner(), "/big", data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := west.ReadFile(ctx, Owner(), "/big")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	// The disk tier writes in the background; wait until it holds most of
	// the file (it may skip blocks when its queue is full).
	poll.Until(t, 30*time.Second, "client cache filled", func() error {
		if n := diskUsage(t, cacheDir); n < baseCache+size/4 {
			return fmt.Errorf("cache holds %d bytes", n)
		}
		return nil
	})
	written, writtenEach := storeDirs()
	withFileCache := diskUsage(t, cacheDir)
	if written < base+size {
		t.Fatalf("stores grew from %d to only %d bytes for a %d-byte file", base, written, size)
	}

	if err := west.Remove(ctx, Owner(), client.NoCues, oid.Root, "big", false); err != nil {
		t.Fatal(err)
	}
	// Left over at most: per store an active segment's worth of dead
	// bytes below the compaction bound, and log and meta-data growth.
	const slack = 6 << 20
	poll.Until(t, 60*time.Second, "stores shrink back", func() error {
		if now, each := storeDirs(); now > base+int64(len(baseEach))*slack {
			return fmt.Errorf("stores hold %d bytes %v; %d before the write %v", now, each, base, baseEach)
		}
		return nil
	})
	// The cache's writer may still be draining its queue (blocks of the
	// removed file are dropped, not written); its shard directories stay.
	poll.Until(t, 30*time.Second, "client cache shrinks back", func() error {
		if n := diskUsage(t, cacheDir); n > baseCache+256*4096 {
			_, _, _, ds := west.CacheStats()
			return fmt.Errorf("client cache holds %d bytes (%+v); %d before the write", n, ds, baseCache)
		}
		return nil
	})
	after, afterEach := storeDirs()
	afterCache := diskUsage(t, cacheDir)
	t.Logf("server stores (bytes on disk): before %d %v, with the %d-byte file %d %v, after removing it %d %v",
		base, baseEach, size, written, writtenEach, after, afterEach)
	t.Logf("client block cache (bytes on disk): before %d, with the file read %d, after removing it %d",
		baseCache, withFileCache, afterCache)
	_, _, _, ds := west.CacheStats()
	t.Logf("client disk cache: %+v", ds)
	for _, site := range c.Sites() {
		for _, n := range c.Servers(site) {
			if u, err := n.Host().Store.Usage(); err == nil {
				t.Logf("%s: %+v", n, u)
			}
		}
	}
}
