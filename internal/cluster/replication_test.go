package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// info returns the placement of path as `wheelfs info` shows it.
func info(ctx context.Context, fs *client.FS, path string) (*client.Info, error) {
	r, err := fs.Resolve(ctx, Owner(), path)
	if err != nil {
		return nil, err
	}
	if r.Meta == nil {
		return nil, fmt.Errorf("%s does not exist", path)
	}
	return fs.Info(ctx, Owner(), r.Cues, oid.ID(r.Meta.Id))
}

func replicaSites(in *client.Info) map[string]int {
	out := map[string]int{}
	for _, r := range in.Replicas {
		out[r.Site]++
	}
	return out
}

// slicesHealthy reports the first slice that does not meet its policy.
func slicesHealthy(ctx context.Context, c *Cluster) error {
	t, err := c.Conf.Table(ctx)
	if err != nil {
		return err
	}
	for id, sl := range t.Slices {
		h := configsvc.Check(t, sl)
		if !h.OK() || sl.Holder == "" || len(sl.Replicas) == 0 || sl.Holder != sl.Replicas[0] {
			return fmt.Errorf("slice %d: holder %q replicas %v policy %+v health %+v", id, sl.Holder, sl.Replicas, sl.Policy, h)
		}
	}
	return nil
}

func TestPlacementCues(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 3})
	ctx := opCtx(t)
	west := c.Client("west")
	check := func(path string, want func(*client.Info) error) {
		t.Helper()
		c.WaitFor(20*time.Second, "placement of "+path, func() error {
			in, err := info(ctx, west, path)
			if err != nil {
				return err
			}
			return want(in)
		})
	}
	// Write-local: a client at east creates in a directory whose primary
	// is elsewhere; the file's primary is east's own server.
	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Client("east").WriteFile(ctx, Owner(), "/d/local", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("/d/local", func(in *client.Info) error {
		if in.Primary.Site != "east" || len(in.Replicas) != 3 || len(replicaSites(in)) != 3 {
			return fmt.Errorf("want primary at east and 3 replicas at 3 sites: %+v", in)
		}
		return nil
	})
	// .Site=eu from a west client.
	if err := west.WriteFile(ctx, Owner(), "/.Site=eu/d/ineu", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("/d/ineu", func(in *client.Info) error {
		if in.Primary.Site != "eu" {
			return fmt.Errorf("primary at %s, want eu: %+v", in.Primary.Site, in)
		}
		return nil
	})
	// .RepSites=2 with .RepLevel=3: two copies at the primary's site, one elsewhere.
	if err := west.WriteFile(ctx, Owner(), "/.RepSites=2/.RepLevel=3/d/two", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("/d/two", func(in *client.Info) error {
		s := replicaSites(in)
		if len(in.Replicas) != 3 || len(s) != 2 || s[in.Primary.Site] != 2 {
			return fmt.Errorf("want 3 replicas, 2 at the primary's site and 1 elsewhere: %v %+v", s, in)
		}
		return nil
	})
	// .RepLevel=7 over 9 servers (no cap of four).
	if err := west.WriteFile(ctx, Owner(), "/.RepLevel=7/d/seven", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("/d/seven", func(in *client.Info) error {
		if len(in.Replicas) != 7 || len(replicaSites(in)) != 3 {
			return fmt.Errorf("want 7 replicas over 3 sites: %+v", in)
		}
		return nil
	})
	// .KeepTogether: a subtree stays on its parent's replica set (the
	// parent's slice), whoever creates in it.
	if _, err := west.Mkdir(ctx, Owner(), "/d/kt", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client("eu").Mkdir(ctx, Owner(), "/.KeepTogether/d/kt/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Client("east").WriteFile(ctx, Owner(), "/.KeepTogether/d/kt/sub/f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	parent, err := info(ctx, west, "/d/kt")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/d/kt/sub", "/d/kt/sub/f"} {
		in, err := info(ctx, west, p)
		if err != nil {
			t.Fatal(err)
		}
		if in.Slice != parent.Slice {
			t.Errorf("%s in slice %d, its parent in %d: not kept together", p, in.Slice, parent.Slice)
		}
	}
	c.WaitFor(20*time.Second, "every slice meets its policy", func() error { return slicesHealthy(ctx, c) })
}

// history records acknowledged and attempted versions of each file and
// the reads, and checks them (single-writer registers).
type history struct {
	mu    sync.Mutex
	ops   []histOp
	start time.Time
}

type histOp struct {
	path       string
	write      bool
	version    int // written, or read (-1: empty file)
	begin, end time.Time
	ok         bool
	err        error // a read's failure
}

func (h *history) add(op histOp) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// check verifies every successful read and final read against the
// writes: a read returns a version at least the newest acknowledged
// before it began, and at most the newest attempted before it ended.
// Acknowledged writes are never lost or rolled back.
func (h *history) check(t *testing.T) (reads, writes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	byPath := map[string][]histOp{}
	for _, op := range h.ops {
		byPath[op.path] = append(byPath[op.path], op)
	}
	failed, missing := 0, 0
	for path, ops := range byPath {
		for _, r := range ops {
			if !r.write && !r.ok {
				// A fault may fail a read, but the name a writer only
				// replaces by a rename over it never goes missing.
				if failed++; fserr.Errno(r.err) == syscall.ENOENT {
					if missing++; missing <= 5 {
						t.Errorf("%s: read at [%v,%v]: %v", path, r.begin.Sub(h.start), r.end.Sub(h.start), r.err)
					}
				}
			}
			if r.write || !r.ok {
				continue
			}
			reads++
			low, high := -1, -1
			for _, w := range ops {
				if !w.write {
					continue
				}
				if w.ok && w.end.Before(r.begin) {
					low = max(low, w.version)
				}
				if w.begin.Before(r.end) {
					high = max(high, w.version)
				}
			}
			if r.version < low || r.version > high {
				t.Errorf("%s: read at [%v,%v] saw version %d, allowed [%d,%d]", path,
					r.begin.Sub(h.start), r.end.Sub(h.start), r.version, low, high)
			}
		}
		for _, w := range ops {
			if w.write && w.ok {
				writes++
			}
		}
	}
	if failed > 0 {
		t.Logf("%d reads failed, %d of them with ENOENT", failed, missing)
	}
	return reads, writes
}

// replaceFile writes a new version of path the way careful applications
// do: into a temporary file, then renamed over path (close-to-open makes
// the new version whole or absent for every reader).
func replaceFile(ctx context.Context, fs *client.FS, path string, data []byte) error {
	tmp := path + ".tmp"
	if err := fs.WriteFile(ctx, Owner(), tmp, data, 0o644); err != nil {
		return err
	}
	r, err := fs.Resolve(ctx, Owner(), tmp)
	if err != nil {
		return err
	}
	return fs.Rename(ctx, Owner(), client.NoCues, r.Parent, r.Name, r.Parent, path[strings.LastIndex(path, "/")+1:], 0)
}

func content(path string, v int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%s v%06d\n", path, v)), 1+v%50)
}

func versionOf(path string, data []byte) (int, error) {
	if len(data) == 0 {
		return -1, nil
	}
	var v int
	if _, err := fmt.Sscanf(string(data), path+" v%06d\n", &v); err != nil {
		return 0, fmt.Errorf("%s: unrecognised contents %.40q", path, data)
	}
	if !bytes.Equal(data, content(path, v)) {
		return 0, fmt.Errorf("%s: torn contents for version %d", path, v)
	}
	return v, nil
}

// workload runs writers (each owning a few files at its site) and
// readers at other sites until stop is closed.
func workload(ctx context.Context, c *Cluster, h *history, stop <-chan struct{}, wg *sync.WaitGroup) {
	sites := c.Sites()
	for i, site := range sites {
		fs := c.Client(site)
		reader := c.Client(sites[(i+1)%len(sites)])
		paths := []string{fmt.Sprintf("/w/%s-a", site), fmt.Sprintf("/w/%s-b", site)}
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			for v := 1; ; v++ {
				select {
				case <-stop:
					return
				default:
				}
				p := paths[v%len(paths)]
				op := histOp{path: p, write: true, version: v, begin: time.Now()}
				err := replaceFile(ctx, fs, p, content(p, v))
				op.end, op.ok = time.Now(), err == nil
				h.add(op)
				time.Sleep(5 * time.Millisecond) // leave the two cores to the servers
			}
		}()
		go func() { // reader at another site
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				p := paths[n%len(paths)]
				op := histOp{path: p, begin: time.Now()}
				data, err := reader.ReadFile(ctx, Owner(), p)
				op.end, op.err = time.Now(), err
				if err == nil {
					v, verr := versionOf(p, data)
					if verr != nil {
						h.add(histOp{path: p, version: -99, begin: op.begin, end: op.end, ok: true})
						continue
					}
					op.version, op.ok = v, true
				}
				h.add(op)
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
}

// TestFaultsUnderWrites runs fault schedules against a concurrent write
// workload with SyncLevel = RepLevel = 3 and checks the recorded history:
// no acknowledged write is lost or rolled back, every slice returns to
// its policy, and a stale primary is refused by the backups.
func TestFaultsUnderWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("fault schedules take a minute")
	}
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 2, LockTTL: 2 * time.Second,
		ClientTimeout: 40 * time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if _, err := c.Client("west").Mkdir(ctx, Owner(), "/w", 0o755); err != nil {
		t.Fatal(err)
	}
	h := &history{start: time.Now()}
	for _, site := range c.Sites() {
		for _, s := range []string{"a", "b"} {
			p := fmt.Sprintf("/w/%s-%s", site, s)
			op := histOp{path: p, write: true, begin: time.Now()}
			if err := replaceFile(ctx, c.Client(site), p, content(p, 0)); err != nil {
				t.Fatal(err)
			}
			op.end, op.ok = time.Now(), true
			h.add(op)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	workload(ctx, c, h, stop, &wg)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	primaryOf := func(path string) *Node {
		var n *Node
		c.WaitFor(30*time.Second, "the primary of "+path, func() error {
			var err error
			n, err = c.PrimaryOf(ctx, c.Client("eu"), path)
			if err == nil && !n.Up() {
				err = errors.New("primary is down")
			}
			return err
		})
		return n
	}
	progress := func(what string) { // writes are acknowledged again, at every site
		for _, site := range c.Sites() {
			c.WaitFor(60*time.Second, what+" at "+site, func() error {
				return c.Client(site).WriteFile(ctx, Owner(), "/w/probe-"+site, []byte(what), 0o644)
			})
		}
	}
	healthy := func() {
		c.WaitFor(60*time.Second, "every slice meets its policy", func() error { return slicesHealthy(ctx, c) })
	}
	schedules := 0
	run := func(name string, f func()) {
		t.Logf("schedule %d: %s", schedules+1, name)
		began := time.Now()
		f()
		progress("writes after " + name)
		healthy()
		schedules++
		t.Logf("schedule %s done in %v", name, time.Since(began).Round(time.Millisecond))
	}

	// Two rounds of the four kinds of fault, each round aimed at other sites.
	sites := c.Sites()
	for round := range 2 {
		a, b, e := sites[round%3], sites[(round+1)%3], sites[(round+2)%3]
		run(fmt.Sprintf("crash the primary of %s's files, restart it", a), func() {
			p := primaryOf("/w/" + a + "-a")
			c.Crash(p)
			c.WaitFor(30*time.Second, "a backup takes over", func() error {
				n, err := c.PrimaryOf(ctx, c.Client(otherSite(c, a)), "/w/"+a+"-a")
				if err != nil || n == p {
					return fmt.Errorf("primary %v (%v)", n, err)
				}
				return nil
			})
			c.Restart(p)
		})
		run(fmt.Sprintf("crash a backup of %s's files, restart it", b), func() {
			// The workload replaces the file by a rename: the object the
			// name resolved to may be gone when its info is asked for.
			var in *client.Info
			c.WaitFor(30*time.Second, "the replicas of /w/"+b+"-a", func() error {
				var err error
				in, err = info(ctx, c.Client(otherSite(c, b)), "/w/"+b+"-a")
				return err
			})
			b := c.Node(in.Replicas[len(in.Replicas)-1].Server)
			c.Crash(b)
			progress("writes with a backup down")
			c.Restart(b)
		})
		run(fmt.Sprintf("partition the site of %s's primary, heal", e), func() {
			p := primaryOf("/w/" + e + "-a")
			c.PartitionSite(p.Site)
			c.WaitFor(30*time.Second, "another site takes over", func() error {
				n, err := c.Primary(ctx, func() oid.Slice {
					in, _ := info(ctx, c.Client(otherSite(c, p.Site)), "/w/"+e+"-a")
					if in == nil {
						return 0
					}
					return oid.Slice(in.Slice)
				}())
				if err != nil || n.Site == p.Site {
					return fmt.Errorf("primary %v (%v)", n, err)
				}
				return nil
			})
			c.HealSite(p.Site)
		})
		run(fmt.Sprintf("pause the primary of %s's files past its lock, resume", a), func() {
			p := primaryOf("/w/" + a + "-b")
			r, err := c.Client(otherSite(c, a)).Resolve(ctx, Owner(), "/w/"+a+"-b")
			if err != nil {
				t.Fatal(err)
			}
			sl := oid.ID(r.Meta.Id).Slice()
			tab, err := c.Conf.Table(ctx)
			if err != nil {
				t.Fatal(err)
			}
			oldEpoch := tab.Slices[sl].Epoch
			c.Pause(p)
			var next *Node
			c.WaitFor(30*time.Second, "a backup takes over from the paused primary", func() error {
				n, err := c.Primary(ctx, sl)
				if err != nil || n == p {
					return fmt.Errorf("primary %v (%v)", n, err)
				}
				next = n
				return nil
			})
			c.Resume(p)
			// The old primary's epoch is refused by every replica the new
			// primary has brought up to date.
			c.WaitFor(30*time.Second, "backups refuse the stale epoch", func() error {
				tab, err := c.Conf.Table(ctx)
				if err != nil {
					return err
				}
				for _, id := range tab.Slices[sl].Replicas[1:] {
					peer, err := next.Host().Router.Peer(ctx, id)
					if err != nil {
						return err
					}
					resp, err := peer.Replicate(ctx, &wire.ReplicateRequest{Slice: uint32(sl), Epoch: oldEpoch,
						Batches: []*wire.Batch{{Seq: 1 << 40}}})
					if err != nil {
						return err
					}
					if resp.Status != wire.ReplStatus_REPL_STALE_EPOCH {
						return fmt.Errorf("backup %s answered %v to epoch %d", id, resp.Status, oldEpoch)
					}
				}
				return nil
			})
			// And the resumed server no longer answers as primary.
			if _, err := p.Host().Server.GetAttr(ctx, &wire.GetAttrRequest{Id: r.Meta.Id}); err == nil {
				t.Errorf("the resumed former primary still serves slice %d", sl)
			}
		})
	}
	close(stop)
	wg.Wait()
	// Final reads: every file holds its newest acknowledged version or a
	// later attempted one.
	for _, site := range c.Sites() {
		for _, s := range []string{"a", "b"} {
			p := fmt.Sprintf("/w/%s-%s", site, s)
			op := histOp{path: p, begin: time.Now()}
			data, err := c.Client(otherSite(c, site)).ReadFile(ctx, Owner(), p)
			if err != nil {
				// Seen twice under a CPU hog (a name absent): say who
				// answers what before failing.
				diagnoseAbsent(ctx, t, c, p)
				t.Fatalf("final read %s: %v", p, err)
			}
			op.end = time.Now()
			if op.version, err = versionOf(p, data); err != nil {
				t.Fatal(err)
			}
			op.ok = true
			h.add(op)
		}
	}
	reads, writes := h.check(t)
	t.Logf("%d fault schedules; history of %d acknowledged writes and %d reads checked", schedules, writes, reads)
	if writes < 20 || reads < 20 {
		t.Errorf("too little work to judge: %d writes, %d reads", writes, reads)
	}
}

// diagnoseAbsent logs what every site's client resolves path to, and
// what the primary of its directory answers, in process, for its name.
func diagnoseAbsent(ctx context.Context, t *testing.T, c *Cluster, path string) {
	dir, name := path[:strings.LastIndex(path, "/")], path[strings.LastIndex(path, "/")+1:]
	for _, site := range c.Sites() {
		r, err := c.Client(site).Resolve(ctx, Owner(), path)
		if err != nil {
			t.Logf("%s: resolve %s: %v", site, path, err)
			continue
		}
		t.Logf("%s: resolve %s: object %v, nlink %d, version %d", site, path, oid.ID(r.Meta.Id), r.Meta.Nlink, r.Meta.Version)
	}
	for _, site := range c.Sites() {
		d, err := c.Client(site).Resolve(ctx, Owner(), dir)
		if err != nil {
			t.Logf("%s: resolve %s: %v", site, dir, err)
			continue
		}
		n, err := c.PrimaryOf(ctx, c.Client(site), dir)
		if err != nil {
			t.Logf("%s: primary of %s: %v", site, dir, err)
			continue
		}
		resp, err := n.Host().Server.Lookup(ctx, &wire.LookupRequest{Caller: &wire.Caller{}, Dir: d.Meta.Id, Name: name, AbsentOk: true})
		t.Logf("%s: %s (version %d) at its primary %s: entry %v, absent %v, err %v", site, dir, d.Meta.Version, n,
			resp.GetEntry(), resp.GetAbsent(), err)
	}
}

func otherSite(c *Cluster, site string) string {
	sites := c.Sites()
	sort.Strings(sites)
	for _, s := range sites {
		if s != site {
			return s
		}
	}
	return site
}

// TestTakeoverCollectsNewerVersions: with SyncLevel < RepLevel one backup
// can be ahead of another. The backup that takes over from a dead primary
// must first collect the newer version from the other.
func TestTakeoverCollectsNewerVersions(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	west := c.Client("west")
	if err := west.WriteFile(ctx, Owner(), "/f", []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	var in *client.Info
	c.WaitFor(20*time.Second, "three replicas", func() (err error) {
		in, err = info(ctx, west, "/f")
		if err == nil && len(in.Replicas) != 3 {
			err = fmt.Errorf("replicas %v", in.Replicas)
		}
		return err
	})
	primary, first, second := c.Node(in.Replicas[0].Server), c.Node(in.Replicas[1].Server), c.Node(in.Replicas[2].Server)
	if primary.Site != "west" {
		t.Fatalf("primary at %s, want west (write-local)", primary.Site)
	}
	// The first backup (the successor) misses the next version.
	c.PartitionLink(primary.Site, first.Site)
	if err := west.WriteFile(ctx, Owner(), "/.SyncLevel=2/f", []byte("v2, acknowledged by the primary and one backup"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Crash(primary)
	c.HealLink(primary.Site, first.Site)
	c.WaitFor(30*time.Second, first.Name+" takes over", func() error {
		n, err := c.Primary(ctx, oid.Slice(in.Slice))
		if err != nil || n != first {
			return fmt.Errorf("primary %v (%v)", n, err)
		}
		return nil
	})
	for _, site := range []string{"east", "eu"} {
		if err := readIs(ctx, c.Client(site), "/f", []byte("v2, acknowledged by the primary and one backup")); err != nil {
			t.Errorf("read at %s after takeover by %s (second backup %s): %v", site, first, second, err)
		}
	}
}

// TestRestartAllThenWriteThenKill: every node restarts at once (SIGTERM,
// same data); the first one back takes its slices over while its peers
// are still down. A write it accepts then must reach the backups before
// it is acknowledged (SyncLevel = RepLevel = 3), so that kill -9 of that
// primary loses nothing. Before the fix the replica list shrank to the
// primary alone and the write was acknowledged with no copy elsewhere.
func TestRestartAllThenWriteThenKill(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second})
	ctx := opCtx(t)
	if err := c.Client("west").WriteFile(ctx, Owner(), "/before", []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(20*time.Second, "three replicas", func() error {
		in, err := info(ctx, c.Client("west"), "/before")
		if err == nil && len(in.Replicas) != 3 {
			err = fmt.Errorf("replicas %v", in.Replicas)
		}
		return err
	})
	nodes := []*Node{c.Servers("west")[0], c.Servers("east")[0], c.Servers("eu")[0]}
	c.StopAll(nodes...)

	west := nodes[0]
	c.Restart(west)
	data := bytes.Repeat([]byte("acknowledged "), 64<<10/13)
	done := make(chan error, 1)
	go func() {
		fs := west.Client()
		_, err := fs.Mkdir(ctx, Owner(), "/fo", 0o755)
		if err == nil {
			err = fs.WriteFile(ctx, Owner(), "/fo/f", data, 0o644)
		}
		done <- err
	}()
	// Alone, west has no backup to acknowledge the write: it must wait.
	select {
	case err := <-done:
		t.Fatalf("write acknowledged by west alone while its backups were down (err %v)", err)
	case <-time.After(3 * c.Options().LockTTL):
	}
	c.Restart(nodes[1])
	c.Restart(nodes[2])
	if err := <-done; err != nil {
		t.Fatalf("write after the restart: %v", err)
	}
	in, err := info(ctx, west.Client(), "/fo/f")
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Replicas) != 3 {
		t.Fatalf("replicas of /fo/f after the write: %v", in.Replicas)
	}
	primary := c.Node(in.Replicas[0].Server)
	c.Crash(primary)
	reader := c.Client(otherSite(c, primary.Site))
	c.WaitFor(time.Minute, "the acknowledged file readable after kill -9 of its primary", func() error {
		return readIs(ctx, reader, "/fo/f", data)
	})
}

// TestSameBytesRewrittenWhileBackupCutOff: blocks are content-addressed.
// Two files hold the same bytes and are both rewritten while their backup
// is cut off, so the request that catches the backup up frees the shared
// block (the first file's rewrite) and sets it again (the second file's
// write), and the primary, having freed it too, cannot send it. The
// backup must keep the copy it has: it used to refuse that request at
// every retry, and the slice's stream never moved again. After the heal
// the backup catches up and, once the primary is gone, serves both files.
func TestSameBytesRewrittenWhileBackupCutOff(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east"}, LockTTL: 2 * time.Second})
	ctx := opCtx(t)
	west := c.Client("west")
	if _, err := west.Mkdir(ctx, Owner(), "/.Site=west/d", 0o777); err != nil {
		t.Fatal(err)
	}
	const same, rewritten = "the same bytes", "the"
	first := createOpen(t, west, Owner(), "/.Site=west/.SyncLevel=1/d/first", 0o644)
	if _, err := first.Write(ctx, []byte(same), 0); err != nil {
		t.Fatal(err)
	}
	if err := first.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(30*time.Second, "east holds the first file", func() error { return converged(ctx, t, c) })

	c.PartitionLink("west", "east")
	truncate := func(h opened) {
		t.Helper()
		_, err := west.ChangeAttr(ctx, Owner(), h.cues, h.ID(), client.AttrChange{Valid: client.SetSize, Size: uint64(len(rewritten)), Handle: h.Handle})
		if err != nil {
			t.Fatalf("truncate with east cut off: %v", err)
		}
	}
	truncate(first)
	second := createOpen(t, west, Owner(), "/.Site=west/.SyncLevel=1/d/second", 0o644)
	if _, err := second.Write(ctx, []byte(same), 0); err != nil {
		t.Fatal(err)
	}
	if err := second.Flush(ctx); err != nil {
		t.Fatalf("write with east cut off: %v", err)
	}
	truncate(second)
	first.Release(ctx)
	second.Release(ctx)
	c.HealLink("west", "east")

	c.WaitFor(30*time.Second, "east catches up", func() error { return converged(ctx, t, c) })
	primary, err := c.Primary(ctx, first.ID().Slice())
	if err != nil || primary.Site != "west" {
		t.Fatalf("primary %v (%v): want west", primary, err)
	}
	c.Crash(primary)
	east := c.Client("east")
	for _, p := range []string{"/d/first", "/d/second"} {
		c.WaitFor(30*time.Second, "east serves "+p, func() error { return readIs(ctx, east, p, []byte(rewritten)) })
	}
}
