package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// opCtx bounds a test's operations generously; the client's own deadline
// (Options.ClientTimeout) is what the tests check.
func opCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// leasedSites starts a cluster whose sites are rtt apart, with locks of
// 10 s (leases never outlast the primary's lock: 10 s lets them last
// seconds, as cached steps need under the race detector), and makes /d
// at west.
func leasedSites(t *testing.T, rtt time.Duration) (c *Cluster, ctx context.Context, west, east *client.FS) {
	t.Helper()
	c = Start(t, Options{RTT: UniformRTT(rtt), LockTTL: 10 * time.Second})
	ctx = opCtx(t)
	west, east = c.Client("west"), c.Client("east")
	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	return c, ctx, west, east
}

func readIs(ctx context.Context, fs *client.FS, path string, want []byte) error {
	got, err := fs.ReadFile(ctx, Owner(), path)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%s holds %q, want %q", path, got, want)
	}
	return nil
}

func TestWriteHereReadThere(t *testing.T) {
	t.Parallel()
	began := time.Now()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 2, ConfigMembers: 3})
	t.Logf("3 sites × 2 servers + 3 clients + 3 config members started in %v", time.Since(began))
	if got := len(c.Servers("")); got != 6 {
		t.Fatalf("%d servers, want 6", got)
	}
	for i := range c.ConfigMembers() {
		if want := c.Sites()[i%3]; c.ConfigMemberSite(i) != want {
			t.Errorf("member %d at %s, want %s", i, c.ConfigMemberSite(i), want)
		}
	}
	ctx := opCtx(t)
	if _, err := c.Client("east").Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	data := []byte("hello from the west")
	if err := c.Client("west").WriteFile(ctx, Owner(), "/d/greeting", data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, site := range c.Sites() {
		if err := readIs(ctx, c.Client(site), "/d/greeting", data); err != nil {
			t.Errorf("read at %s: %v", site, err)
		}
	}
	// Write-local: the client at west creates at a west server; the
	// directory /d and the root are at west-0, which is at the client's site.
	p, err := c.PrimaryOf(ctx, c.Client("eu"), "/d/greeting")
	if err != nil {
		t.Fatal(err)
	}
	if p.Site != "west" || c.Node(p.ID()) != p {
		t.Errorf("primary of /d/greeting is %v, want a west server", p)
	}
}

func TestRTTAndBandwidth(t *testing.T) {
	t.Parallel()
	const rtt = 100 * time.Millisecond
	c := Start(t, Options{Sites: []string{"west", "east"}, ConfigMembers: 1,
		RTT: MatrixRTT(map[[2]string]time.Duration{{"east", "west"}: rtt}), Bandwidth: map[string]int64{"east": 1 << 20}})
	ctx := opCtx(t)
	data := []byte("x")
	if err := c.Client("west").WriteFile(ctx, Owner(), "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, site := range c.Sites() {
		if err := readIs(ctx, c.Client(site), "/f", data); err != nil {
			t.Fatal(err)
		}
	}
	// fastest of a few calls to the root's primary, after one that sets
	// up connections (statfs: reads of /f are answered from leases).
	fastest := func(site string) time.Duration {
		best := time.Hour
		for i := range 4 {
			start := time.Now()
			if _, err := c.Client(site).StatFS(ctx, Owner(), client.NoCues); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); i > 0 {
				best = min(best, d)
			}
		}
		return best
	}
	local, remote := fastest("west"), fastest("east")
	t.Logf("statfs at the root's primary (west): from west %v, from east %v (RTT %v)", local, remote, rtt)
	if remote < rtt {
		t.Errorf("a call across a %v link took %v", rtt, remote)
	}
	if local > rtt/2 {
		t.Errorf("a call within a site took %v, want well under the %v RTT", local, rtt)
	}
	// east's uplink carries 1 MiB/s: a 1 MiB write from east takes about
	// a second (a local one far less).
	big := bytes.Repeat([]byte("b"), 1<<20)
	start := time.Now()
	if err := c.Client("east").WriteFile(ctx, Owner(), "/big", big, 0o644); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 800*time.Millisecond {
		t.Errorf("1 MiB through a 1 MiB/s uplink took %v", d)
	} else {
		t.Logf("1 MiB from east at 1 MiB/s: %v", d)
	}
}

func TestPartitionSite(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ConfigMembers: 3, ClientTimeout: timeout})
	ctx := opCtx(t)
	data := []byte("v1")
	// The first write waits for the root's backups to be recruited (a
	// write is never acknowledged with fewer copies than promised), which
	// on busy cores can outlast the short bound this test uses.
	c.WaitFor(30*time.Second, "the first write at SyncLevel 3", func() error {
		return c.Client("west").WriteFile(ctx, Owner(), "/f", data, 0o644)
	})
	if err := readIs(ctx, c.Client("east"), "/f", data); err != nil {
		t.Fatal(err)
	}

	// east (a client, a server, a config member) is cut off; the root's
	// primary is at west.
	c.PartitionSite("east")
	start := time.Now()
	err := readIs(ctx, c.Client("east"), "/f", data)
	took := time.Since(start)
	if err == nil {
		t.Fatal("read from a partitioned site succeeded")
	}
	if took > timeout+time.Second {
		t.Errorf("failed read took %v, deadline %v", took, timeout)
	}
	t.Logf("read from the partitioned site failed after %v: %v", took, err)
	// The rest of the deployment goes on without east and its member for
	// writes that need two of the three replicas. A write that needs all
	// three (the default SyncLevel) cannot be acknowledged while east,
	// for which there is no replacement, is away: it fails within its
	// bound rather than promise a copy that does not exist.
	if err := c.Client("eu").WriteFile(ctx, Owner(), "/.SyncLevel=2/g", data, 0o644); err != nil {
		t.Fatalf("write at eu during east's partition: %v", err)
	}
	for range 3 {
		start := time.Now()
		err := c.Client("eu").WriteFile(ctx, Owner(), "/g", data, 0o644)
		if took := time.Since(start); err == nil || took > timeout+time.Second {
			t.Fatalf("write at SyncLevel 3 without east: %v after %v, want a timeout within %v", err, took, timeout)
		}
	}

	c.HealSite("east")
	c.WaitFor(30*time.Second, "writes at SyncLevel 3 again after healing", func() error {
		return c.Client("eu").WriteFile(ctx, Owner(), "/g", data, 0o644)
	})
	c.WaitFor(30*time.Second, "east reads again after healing", func() error {
		return readIs(ctx, c.Client("east"), "/g", data)
	})

	// A single link: west–east cut, eu still reaches both.
	c.PartitionLink("west", "east")
	if err := readIs(ctx, c.Client("east"), "/f", data); err == nil {
		t.Error("read across a cut link succeeded")
	}
	if err := readIs(ctx, c.Client("eu"), "/f", data); err != nil {
		t.Errorf("read from eu with the west–east link cut: %v", err)
	}
	c.HealLink("west", "east")
	c.WaitFor(30*time.Second, "east reads again after the link heals", func() error {
		return readIs(ctx, c.Client("east"), "/f", data)
	})
}

// A primary cut off from the configuration majority loses its slice locks
// once they expire.
func TestPartitionedPrimaryLosesLocks(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ConfigMembers: 3, LockTTL: 2 * time.Second})
	ctx := opCtx(t)
	p, err := c.Primary(ctx, oid.RootSlice)
	if err != nil {
		t.Fatal(err)
	}
	c.PartitionSite(p.Site)
	cut := time.Now()
	// The lock expires, and a backup at another site may take it at once:
	// what counts is that the cut-off server no longer holds it.
	c.WaitFor(20*time.Second, "the root slice's lock leaves the cut-off primary", func() error {
		tb, err := c.Conf.Table(ctx)
		if err != nil {
			return err
		}
		if h := tb.Slices[oid.RootSlice].Holder; h == p.ID() {
			return fmt.Errorf("still held by %s", h)
		}
		return nil
	})
	t.Logf("the root lock expired %v after the partition", time.Since(cut))
	// The server cannot reach the configuration service to learn this;
	// stopping to act as primary when its lease runs out by its own clock
	// is the server's business.
	t.Logf("partitioned server %s still considers itself primary of %v", p, p.Host().Server.Slices())
}

func TestCrashRestart(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Sites: []string{"west", "east"}, ConfigMembers: 1, ClientTimeout: 2 * time.Second})
	ctx := opCtx(t)
	data := []byte("durable")
	if err := c.Client("east").WriteFile(ctx, Owner(), "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := c.PrimaryOf(ctx, c.Client("east"), "/f")
	if err != nil {
		t.Fatal(err)
	}
	id := p.ID()
	c.Crash(p)
	if p.Up() || p.Client() != nil {
		t.Fatal("crashed node still up")
	}
	if err := readIs(ctx, c.Client("east"), "/f", data); err == nil {
		t.Error("read with the primary crashed succeeded")
	}
	c.Restart(p)
	if p.ID() != id {
		t.Errorf("restarted node has ID %s, was %s", p.ID(), id)
	}
	c.WaitFor(30*time.Second, "the data is back after the restart", func() error {
		return readIs(ctx, c.Client("east"), "/f", data)
	})
}

func TestPause(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	c := Start(t, Options{Sites: []string{"west", "east"}, ConfigMembers: 1, ClientTimeout: timeout})
	ctx := opCtx(t)
	data := []byte("x")
	if err := c.Client("east").WriteFile(ctx, Owner(), "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := c.PrimaryOf(ctx, c.Client("east"), "/f")
	if err != nil {
		t.Fatal(err)
	}
	c.Pause(p)
	start := time.Now()
	err = readIs(ctx, c.Client("east"), "/f", data)
	if err == nil {
		t.Fatal("read from a paused primary succeeded")
	}
	if took := time.Since(start); took < timeout/2 || took > timeout+time.Second {
		t.Errorf("read from a paused primary failed after %v (%v), deadline %v", took, err, timeout)
	}
	c.Resume(p)
	c.WaitFor(30*time.Second, "reads after Resume", func() error {
		return readIs(ctx, c.Client("east"), "/f", data)
	})
}

func TestConfigMemberCrash(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ConfigMembers: 3})
	ctx := opCtx(t)
	lead := -1
	c.WaitFor(10*time.Second, "a configuration leader", func() error {
		if lead = c.ConfigLeader(); lead < 0 {
			return errors.New("no leader")
		}
		return nil
	})
	c.CrashConfigMember(lead)
	// Writes, reads and a server restart (registration, lock acquisition)
	// go on with 2 of 3 members.
	for i, site := range c.Sites() {
		path := fmt.Sprintf("/f%d", i)
		c.WaitFor(30*time.Second, "write with a member down", func() error {
			return c.Client(site).WriteFile(ctx, Owner(), path, []byte(site), 0o644)
		})
		if err := readIs(ctx, c.Client(c.Sites()[(i+1)%3]), path, []byte(site)); err != nil {
			t.Error(err)
		}
	}
	p, err := c.Primary(ctx, oid.RootSlice)
	if err != nil {
		t.Fatal(err)
	}
	c.Crash(p)
	c.Restart(p)
	c.WaitFor(30*time.Second, "read after a server restart with a member down", func() error {
		return readIs(ctx, c.Client("eu"), "/f0", []byte("west"))
	})
	c.RestartConfigMember(lead)
	c.CrashConfigMember((lead + 1) % 3)
	c.WaitFor(30*time.Second, "write after another member crashed", func() error {
		return c.Client("east").WriteFile(ctx, Owner(), "/after", []byte("ok"), 0o644)
	})
	if _, err := c.Conf.Table(ctx); err != nil {
		t.Errorf("table with a member down: %v", err)
	}
}

// Five members survive two crashes, not three.
func TestFiveMembers(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ConfigMembers: 5})
	ctx := opCtx(t)
	if c.ConfigMemberSite(3) != "west" || c.ConfigMemberSite(4) != "east" {
		t.Errorf("members 3, 4 at %s, %s; want west, east", c.ConfigMemberSite(3), c.ConfigMemberSite(4))
	}
	var lead int
	c.WaitFor(10*time.Second, "a configuration leader", func() error {
		if lead = c.ConfigLeader(); lead < 0 {
			return errors.New("no leader")
		}
		return nil
	})
	down := []int{lead, (lead + 1) % 5}
	for _, i := range down {
		c.CrashConfigMember(i)
	}
	p := c.Node("east-0")
	c.Crash(p)
	c.Restart(p) // registers with 3 of 5 members
	c.WaitFor(30*time.Second, "write with two of five members down", func() error {
		return c.Client("east").WriteFile(ctx, Owner(), "/f", []byte("ok"), 0o644)
	})
	third := (lead + 2) % 5
	c.CrashConfigMember(third)
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := c.Conf.Table(tctx); err == nil {
		t.Error("the slice table is readable with three of five members down")
	}
	c.RestartConfigMember(third)
	c.WaitFor(30*time.Second, "the table after a member came back", func() error {
		_, err := c.Conf.Table(ctx)
		return err
	})
}
