package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// lsLR walks the tree under dir as `ls -laR` does on a mount: it lists
// each directory, and for every entry looks it up (lstat), asks for its
// SELinux label (lgetxattr security.selinux, absent here) and lists its
// attributes (listxattr, for ACLs). It returns the number of entries.
func lsLR(ctx context.Context, fs *client.FS, dir oid.ID) (int, error) {
	return lsLRCues(ctx, fs, client.NoCues, dir)
}

// lsLRCues is lsLR in a view of dir with cues (.WholeFile).
func lsLRCues(ctx context.Context, fs *client.FS, cues cue.Set, dir oid.ID) (int, error) {
	entries, _, err := fs.ReadDir(ctx, Owner(), cues, dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		a, err := fs.Lookup(ctx, Owner(), cues, dir, e.Name)
		if err != nil {
			return n, err
		}
		id := oid.ID(a.Id)
		if _, err := fs.GetXattr(ctx, Owner(), cues, id, "security.selinux"); !errors.Is(err, fserr.ErrNoAttr) {
			return n, fmt.Errorf("getxattr security.selinux of %s: %v, want ENODATA", e.Name, err)
		}
		if _, err := fs.ListXattr(ctx, Owner(), cues, id); err != nil {
			return n, err
		}
		n++
		if a.Type == client.TypeDir {
			m, err := lsLRCues(ctx, fs, cues, id)
			n += m
			if err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// makeTree creates /tree with dirs directories of files files each.
func makeTree(ctx context.Context, fs *client.FS, dirs, files int) error {
	if _, err := fs.Mkdir(ctx, Owner(), "/tree", 0o755); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, dirs)
	for d := range dirs {
		wg.Go(func() {
			dir := fmt.Sprintf("/tree/d%02d", d)
			if _, err := fs.Mkdir(ctx, Owner(), dir, 0o755); err != nil {
				errs <- err
				return
			}
			for f := range files {
				if err := fs.WriteFile(ctx, Owner(), fmt.Sprintf("%s/f%02d", dir, f), []byte("x"), 0o644); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// warmTree reads the whole tree at once, one goroutine per directory,
// so that fs holds leases on all of it: twice, since the first request
// to each server opens its back channel and gets no lease.
func warmTree(ctx context.Context, fs *client.FS, tree oid.ID) error {
	for range 2 {
		entries, _, err := fs.ReadDir(ctx, Owner(), client.NoCues, tree)
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(entries))
		for _, e := range entries {
			wg.Go(func() {
				if _, err := lsLR(ctx, fs, oid.ID(e.Id)); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// TestWarmWalkNoRoundTrips checks that a warm `ls -laR` of a tree whose
// primary is 100 ms away sends no request at all.
func TestWarmWalkNoRoundTrips(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{RTT: UniformRTT(100 * time.Millisecond), LockTTL: 10 * time.Second})
	ctx := opCtx(t)
	if err := makeTree(ctx, c.Client("west"), 3, 4); err != nil {
		t.Fatal(err)
	}
	east := c.Client("east")
	tree := mustID(t, east, "/tree")
	if err := warmTree(ctx, east, tree); err != nil {
		t.Fatal(err)
	}
	var n int
	var err error
	sent := calls(east, func() { n, err = lsLR(ctx, east, tree) })
	if err != nil || n != 3+3*4 {
		t.Fatalf("walked %d entries (%v), want %d", n, err, 3+3*4)
	}
	if sent.Total() != 0 {
		t.Errorf("a warm walk sent %v; want none", sent.Calls)
	}
}

// BenchmarkWarmWalk measures a warm `ls -laR` (lsLR) of 400 files in 20
// directories by a client 100 ms from their primary: the time and the
// requests sent per walk (issue 11).
//
//	go test ./internal/cluster/ -run '^$' -bench WarmWalk -benchtime 3x -v
func BenchmarkWarmWalk(b *testing.B) {
	// Leases (and the slice locks that bound them) outlast a walk even
	// when every getxattr is a round trip, so that only xattrs differ.
	const long = 5 * time.Minute
	c := Start(b, Options{RTT: UniformRTT(benchRTT), LockTTL: long, Adjust: func(n *Node, cfg *deploy.Config) {
		cfg.Server.LeaseTTL = long
	}})
	ctx := context.Background()
	if err := makeTree(ctx, c.Client("west"), 20, 20); err != nil {
		b.Fatal(err)
	}
	east := c.Client("east")
	r, err := east.Resolve(ctx, Owner(), "/tree")
	if err != nil || r.Meta == nil {
		b.Fatalf("resolve /tree: %v", err)
	}
	tree := oid.ID(r.Meta.Id)
	if err := warmTree(ctx, east, tree); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var total client.Stats
	began := time.Now()
	for i := 0; i < b.N; i++ {
		before := east.Stats()
		if n, err := lsLR(ctx, east, tree); err != nil || n != 420 {
			b.Fatalf("walked %d entries: %v", n, err)
		}
		total = east.Stats().Sub(before)
		b.Logf("walk %d: %v requests %v", i, total.Total(), total.Calls)
	}
	per := time.Since(began) / time.Duration(b.N)
	b.ReportMetric(float64(per.Microseconds())/1000, "ms/walk")
	b.ReportMetric(float64(total.Total()), "requests/walk")
}
