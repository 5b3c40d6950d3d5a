package cluster

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// BenchmarkWideArea compares, at 100 ms between sites, a client at the
// data's site (home) with one at another site (remote) on what issue 11
// is about: `ls -laR` (lsLR) and `tar -c` (reading every file) of 400
// small files in 20 directories, cold (a new client core: no leases, no
// cached blocks) and warm (the same core again); `tar -x` of 400 small
// files into existing directories; and the 64 KiB close-to-open round
// (written at west, read at east, which holds leases on the directory
// and the file). It logs each figure with the requests the client sent.
//
//	go test ./internal/cluster/ -run '^$' -bench WideArea -benchtime 1x -v
func BenchmarkWideArea(b *testing.B) {
	const long = 10 * time.Minute
	c := Start(b, Options{RTT: UniformRTT(benchRTT), LockTTL: long, ClientTimeout: 4 * long, Adjust: func(n *Node, cfg *deploy.Config) {
		cfg.Server.LeaseTTL = long
	}})
	ctx := context.Background()
	west := c.Client("west")
	const dirs, files = 20, 20
	content := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, 512+(i*977)%(16<<10)) }
	for b.Loop() {
		run := fmt.Sprint(time.Now().UnixNano())
		for _, top := range []string{"/xh" + run, "/xr" + run} {
			if _, err := west.Mkdir(ctx, Owner(), top, 0o755); err != nil {
				b.Fatal(err)
			}
			for d := range dirs {
				if _, err := west.Mkdir(ctx, Owner(), fmt.Sprintf("%s/d%02d", top, d), 0o755); err != nil {
					b.Fatal(err)
				}
			}
		}
		report := func(what string, home, remote result) {
			b.Logf("%-34s home %9v %-44v remote %9v %v", what, home.took.Round(time.Millisecond), home.sent.Calls,
				remote.took.Round(time.Millisecond), remote.sent.Calls)
		}
		// tar -x: west into /xh, east into /xr (both trees' directories at west).
		tarX := func(fs *client.FS, top string) result {
			return measure(fs, func() error {
				for d := range dirs {
					for f := range files {
						if err := createFile(ctx, fs, fmt.Sprintf("%s/d%02d/f%02d", top, d, f), content(d*files+f)); err != nil {
							return err
						}
					}
				}
				return nil
			})
		}
		report("tar -x (400 files)", tarX(west, "/xh"+run), tarX(c.Client("east"), "/xr"+run))

		// ls -laR and tar -c of /xh by new client cores: cold, then warm.
		home, remote := freshClient(c, "west"), freshClient(c, "east")
		tree := mustResolve(b, west, "/xh"+run)
		walk := func(fs *client.FS) result {
			return measure(fs, func() error {
				n, err := lsLR(ctx, fs, tree)
				if err == nil && n != dirs+dirs*files {
					err = fmt.Errorf("walked %d entries", n)
				}
				return err
			})
		}
		tarC := func(fs *client.FS) result {
			return measure(fs, func() error { return readTree(ctx, fs, tree) })
		}
		report("ls -laR cold", walk(home), walk(remote))
		report("ls -laR warm", walk(home), walk(remote))
		report("tar -c after ls -laR", tarC(home), tarC(remote))
		report("tar -c warm", tarC(home), tarC(remote))
		home, remote = freshClient(c, "west"), freshClient(c, "east")
		report("tar -c cold", tarC(home), tarC(remote))

		// Close-to-open, 64 KiB: west rewrites, east (holding leases on the
		// directory and the file) reads.
		east := c.Client("east")
		path := "/xh" + run + "/c2o"
		data := bytes.Repeat([]byte("0"), 64<<10)
		if err := createFile(ctx, west, path, data); err != nil {
			b.Fatal(err)
		}
		for i := range 3 {
			if _, err := catFile(ctx, east, path); err != nil { // leases
				b.Fatal(err)
			}
			data = bytes.Repeat([]byte{byte('1' + i)}, 64<<10)
			var h *client.Handle
			open := measure(west, func() error {
				var err error
				h, _, err = west.Open(ctx, Owner(), client.NoCues, mustResolve(b, west, path), syscall.O_WRONLY|syscall.O_TRUNC)
				if err == nil {
					_, err = h.Write(ctx, data, 0)
				}
				return err
			})
			cls := measure(west, func() error { return h.Flush(ctx) })
			h.Release(ctx)
			read := measure(east, func() error {
				got, err := catFile(ctx, east, path)
				if err == nil && !bytes.Equal(got, data) {
					err = fmt.Errorf("east read %d bytes of the old version", len(got))
				}
				return err
			})
			report(fmt.Sprintf("close-to-open %d: open+write", i), open, result{})
			report(fmt.Sprintf("close-to-open %d: close", i), cls, result{})
			report(fmt.Sprintf("close-to-open %d: open+read", i), result{}, read)
		}
	}
}

// BenchmarkWideAreaWholeFile is BenchmarkWideArea's cold `ls -laR` and
// `tar -c` in a view of the tree with .WholeFile (400 small files in 20
// directories, 100 ms between sites; new client cores for each cold run).
//
//	go test ./internal/cluster/ -run '^$' -bench WideAreaWholeFile -benchtime 1x -v
func BenchmarkWideAreaWholeFile(b *testing.B) {
	const long = 10 * time.Minute
	c := Start(b, Options{RTT: UniformRTT(benchRTT), LockTTL: long, ClientTimeout: 4 * long, Adjust: func(n *Node, cfg *deploy.Config) {
		cfg.Server.LeaseTTL = long
	}})
	ctx := context.Background()
	west := c.Client("west")
	const dirs, files = 20, 20
	whole := client.NoCues
	whole.WholeFile = true
	for b.Loop() {
		top := fmt.Sprint("/w", time.Now().UnixNano())
		if _, err := west.Mkdir(ctx, Owner(), top, 0o755); err != nil {
			b.Fatal(err)
		}
		errs := make(chan error, dirs)
		for d := range dirs {
			go func() {
				dir := fmt.Sprintf("%s/d%02d", top, d)
				_, err := west.Mkdir(ctx, Owner(), dir, 0o755)
				for f := 0; f < files && err == nil; f++ {
					i := d*files + f
					err = west.WriteFile(ctx, Owner(), fmt.Sprintf("%s/f%02d", dir, f),
						bytes.Repeat([]byte{byte('a' + i%26)}, 512+(i*977)%(16<<10)), 0o644)
				}
				errs <- err
			}()
		}
		for range dirs {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		tree := mustResolve(b, west, top)
		walk := func(fs *client.FS) result {
			return measure(fs, func() error {
				n, err := lsLRCues(ctx, fs, whole, tree)
				if err == nil && n != dirs+dirs*files {
					err = fmt.Errorf("walked %d entries", n)
				}
				return err
			})
		}
		tarC := func(fs *client.FS) result {
			return measure(fs, func() error { return readTreeCues(ctx, fs, whole, tree) })
		}
		report := func(what string, home, remote result) {
			b.Logf("%-34s home %9v %-44v remote %9v %v", what, home.took.Round(time.Millisecond), home.sent.Calls,
				remote.took.Round(time.Millisecond), remote.sent.Calls)
		}
		home, remote := freshClient(c, "west"), freshClient(c, "east")
		report(".WholeFile ls -laR cold", walk(home), walk(remote))
		report(".WholeFile tar -c after it", tarC(home), tarC(remote))
		home, remote = freshClient(c, "west"), freshClient(c, "east")
		report(".WholeFile tar -c cold", tarC(home), tarC(remote))
	}
}

// result is one measured operation: its time and the requests it sent.
type result struct {
	took time.Duration
	sent client.Stats
}

// measure runs fn on fs and reports its time and requests (background
// ones included as far as they had been sent).
func measure(fs *client.FS, fn func() error) result {
	before := fs.Stats()
	start := time.Now()
	if err := fn(); err != nil {
		panic(err)
	}
	return result{took: time.Since(start), sent: fs.Stats().Sub(before)}
}

// freshClient returns a new client core at site's client host: no
// leases, an empty block cache (memory only). It stays up until the
// cluster stops: a closed one's leases would be waited out by every
// change to what it had listed.
func freshClient(c *Cluster, site string) *client.FS {
	cfg := client.NewConfig()
	cfg.Logger, cfg.Site = c.log, site
	fs := client.New(cfg, c.ClientNode(site).Host().Router)
	c.t.Cleanup(func() { fs.Close() })
	return fs
}

func mustResolve(b *testing.B, fs *client.FS, path string) oid.ID {
	r, err := fs.Resolve(context.Background(), Owner(), path)
	if err != nil || r.Meta == nil {
		b.Fatalf("resolve %s: %v", path, err)
	}
	return oid.ID(r.Meta.Id)
}

// readTree reads every file under dir as tar -c does (a listing, a
// lookup per entry, open, read, close), checking each one's length.
func readTree(ctx context.Context, fs *client.FS, dir oid.ID) error {
	return readTreeCues(ctx, fs, client.NoCues, dir)
}

// readTreeCues is readTree in a view of dir with cues (.WholeFile).
func readTreeCues(ctx context.Context, fs *client.FS, cues cue.Set, dir oid.ID) error {
	entries, _, err := fs.ReadDir(ctx, Owner(), cues, dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		a, err := fs.Lookup(ctx, Owner(), cues, dir, e.Name)
		if err != nil {
			return err
		}
		if a.Type == client.TypeDir {
			if err := readTreeCues(ctx, fs, cues, oid.ID(a.Id)); err != nil {
				return err
			}
			continue
		}
		h, _, err := fs.Open(ctx, Owner(), cues, oid.ID(a.Id), syscall.O_RDONLY)
		if err != nil {
			return err
		}
		buf := make([]byte, a.Size+1)
		n, err := h.Read(ctx, buf, 0)
		h.Release(ctx)
		if err != nil {
			return err
		}
		if uint64(n) != a.Size {
			return fmt.Errorf("%s: read %d of %d bytes", e.Name, n, a.Size)
		}
	}
	return nil
}
