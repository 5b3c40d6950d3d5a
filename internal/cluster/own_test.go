package cluster

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestOwnChangesKeepLeases checks that a client's own creates, removes
// and attribute changes keep its leases on what they changed
// (client/own.go, issue 15): the client knows the result without asking
// again, another site sees every change at once, and that site's
// changes reach the first client (it is still called back for them).
func TestOwnChangesKeepLeases(t *testing.T) {
	t.Parallel()
	const rtt = 100 * time.Millisecond
	_, ctx, west, east := leasedSites(t, rtt)
	for range 2 { // the first contact gets no lease
		listNames(t, west, "/d")
	}
	d := mustID(t, west, "/d")
	var want []string
	for i := range 5 {
		name := fmt.Sprintf("f%d", i)
		if err := west.WriteFile(ctx, Owner(), "/d/"+name, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
	}
	missing := func(fs *client.FS, path string) error { return resolvesMissing(ctx, fs, path) }
	// asked counts the requests that answer from the cache would avoid
	// (releases and registrations of opens go on in the background).
	asked := func(s client.Stats) uint64 {
		return s.Calls["Lookup"] + s.Calls["ReadDir"] + s.Calls["GetAttr"] + s.Calls["Sync"]
	}
	n := calls(west, func() {
		if got := listNames(t, west, "/d"); !slices.Equal(got, want) {
			t.Errorf("west lists %v after its creates, want %v", got, want)
		}
		for _, name := range want {
			if err := readIs(ctx, west, "/d/"+name, []byte(name)); err != nil {
				t.Error(err)
			}
		}
		if err := missing(west, "/d/nope"); err != nil {
			t.Error(err)
		}
	})
	if asked(n) != 0 {
		t.Errorf("listing, reading back and a missing name after its own creates sent %v; want no lookups", n.Calls)
	}

	if err := west.Remove(ctx, Owner(), client.NoCues, d, "f0", false); err != nil {
		t.Fatal(err)
	}
	want = want[1:]
	if _, err := west.SetAttr(ctx, Owner(), client.NoCues, d, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o750}); err != nil {
		t.Fatal(err)
	}
	n = calls(west, func() {
		if got := listNames(t, west, "/d"); !slices.Equal(got, want) {
			t.Errorf("west lists %v after its unlink, want %v", got, want)
		}
		if err := missing(west, "/d/f0"); err != nil {
			t.Error(err)
		}
		a, err := west.GetAttr(ctx, Owner(), client.NoCues, d)
		if err != nil || a.Mode&0o7777 != 0o750 {
			t.Errorf("west's /d after its chmod: %+v, %v; want mode 0750", a, err)
		}
	})
	if asked(n) != 0 {
		t.Errorf("after its own unlink and chmod west sent %v; want no lookups", n.Calls)
	}

	// Another site sees them at once, and its own changes reach west.
	for range 2 {
		if got := listNames(t, east, "/d"); !slices.Equal(got, want) {
			t.Fatalf("east lists %v, want %v", got, want)
		}
	}
	if err := west.WriteFile(ctx, Owner(), "/d/g", []byte("g"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, east, "/d/g", []byte("g")); err != nil {
		t.Errorf("east right after west's create: %v", err)
	}
	if err := east.WriteFile(ctx, Owner(), "/d/h", []byte("h"), 0o644); err != nil {
		t.Fatal(err)
	}
	want = append(want, "g", "h")
	if got := listNames(t, west, "/d"); !slices.Equal(got, want) {
		t.Errorf("west lists %v right after east's create, want %v", got, want)
	}
	if err := east.Remove(ctx, Owner(), client.NoCues, d, "g", false); err != nil {
		t.Fatal(err)
	}
	if err := missing(west, "/d/g"); err != nil {
		t.Errorf("west right after east's unlink: %v", err)
	}
	if err := west.Remove(ctx, Owner(), client.NoCues, d, "h", false); err != nil {
		t.Fatal(err)
	}
	if err := missing(east, "/d/h"); err != nil {
		t.Errorf("east right after west's unlink: %v", err)
	}
}

// TestConcurrentOwnChanges runs many creates and unlinks of one client
// in one directory at once, with listings among them: answers may come
// back out of order, and the client must never keep a listing the
// server does not have (it drops what it cannot apply exactly).
func TestConcurrentOwnChanges(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{RTT: UniformRTT(20 * time.Millisecond), LockTTL: 10 * time.Second})
	ctx := opCtx(t)
	west, east := c.Client("west"), c.Client("east")
	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		listNames(t, west, "/d")
	}
	d := mustID(t, west, "/d")
	const workers, each = 6, 12
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := west.ReadDir(ctx, Owner(), client.NoCues, d); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var writers sync.WaitGroup
	for w := range workers {
		writers.Go(func() {
			for i := range each {
				name := fmt.Sprintf("w%d-%d", w, i)
				if err := west.WriteFile(ctx, Owner(), "/d/"+name, nil, 0o644); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if err := west.Remove(ctx, Owner(), client.NoCues, d, name, false); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	var want []string
	for w := range workers {
		for i := range each {
			if i%3 != 0 {
				want = append(want, fmt.Sprintf("w%d-%d", w, i))
			}
		}
	}
	slices.Sort(want)
	if got := listNames(t, west, "/d"); !slices.Equal(got, want) {
		t.Errorf("west lists %d names, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
	if got := listNames(t, east, "/d"); !slices.Equal(got, want) {
		t.Errorf("east lists %d names, want %d", len(got), len(want))
	}
	for _, name := range want {
		if _, err := west.Resolve(ctx, Owner(), "/d/"+name); err != nil {
			t.Errorf("west resolves /d/%s: %v", name, err)
		}
	}
}

// TestOwnChangesRenewLease checks that a client's own creates and
// unlinks renew its lease on the directory, so that a long tar -x or
// rm -rf keeps it: with 2 s leases, ten creates at 100 ms from the
// directory's primary outlast the lease the listing brought several
// times over, and the listing is still answered from the cache.
func TestOwnChangesRenewLease(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{RTT: UniformRTT(100 * time.Millisecond), LockTTL: 10 * time.Second,
		Adjust: func(_ *Node, cfg *deploy.Config) { cfg.Server.LeaseTTL = 2 * time.Second }})
	ctx := opCtx(t)
	west, east := c.Client("west"), c.Client("east")
	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		listNames(t, east, "/d") // the first contact gets no lease
	}
	d := mustID(t, east, "/d")
	began := time.Now()
	var want []string
	for i := range 10 {
		name := fmt.Sprintf("f%d", i)
		if err := east.WriteFile(ctx, Owner(), "/d/"+name, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
	}
	if err := east.Remove(ctx, Owner(), client.NoCues, d, "f0", false); err != nil {
		t.Fatal(err)
	}
	want = want[1:]
	took := time.Since(began)
	// Listed by id: resolving "/d" looks "d" up in the root, whose own
	// lease (from the last path walk) may have run out meanwhile.
	n := calls(east, func() {
		if got := listDir(t, east, client.NoCues, d); !slices.Equal(got, want) {
			t.Errorf("east lists %v, want %v", got, want)
		}
	})
	if took < 4*time.Second {
		t.Logf("the changes took only %v: the lease may not have needed renewing", took)
	}
	if n.Calls["ReadDir"] != 0 || n.Calls["Lookup"] != 0 {
		t.Errorf("after %v of own changes with 2 s leases, the listing sent %v; want it from the renewed lease", took, n.Calls)
	}
}
