package cluster

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// syscallBound runs op as one system call would run under
// .MaxTime=bound: every step shares the bound, counted from now
// (client.WithStart). It returns op's error and how long it took.
func syscallBound(ctx context.Context, op func(ctx context.Context) error) (error, time.Duration) {
	began := time.Now()
	err := op(client.WithStart(ctx, began))
	return err, time.Since(began)
}

// TestCutOffSiteCreates is issue 16 item 8: a site cut off from the others
// (its packets lost, not refused) keeps creating under
// .EventualConsistency in a directory it is primary for, while it holds
// its slice locks (paper §8.3: the failures there are shorter than the
// locks). The sequence is the issue's: east lists p2 (made at west) and
// reads one file of it, makes ev with itself as primary, is cut off, reads
// another file of p2, then creates ev/new. What made the create fail was
// west's client: it had looked at ev and held a lease on it, and east's
// server waited to revoke it — a callback west could not receive — until
// the create's bound ran out. An eventual update now waits for lease
// holders for half of what is left of its time only, then goes on.
func TestCutOffSiteCreates(t *testing.T) {
	t.Parallel()
	const maxTime = time.Second
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: time.Minute,
		RTT: UniformRTT(100 * time.Millisecond)})
	ctx := opCtx(t)
	// Nodes run a server and a client, as `wheelfs node` does.
	west, east := c.Servers("west")[0].Client(), c.Servers("east")[0].Client()
	if _, err := west.Mkdir(ctx, Owner(), "/p2", 0o777); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"f1", "f2"} {
		if err := west.WriteFile(ctx, Owner(), "/p2/"+f, []byte("data of "+f), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	if got := listNames(t, east, "/p2"); !slices.Equal(got, []string{"f1", "f2"}) {
		t.Fatalf("east lists /p2 as %v", got)
	}
	if err := readIs(ctx, east, "/p2/f1", []byte("data of f1")); err != nil {
		t.Fatal(err)
	}
	// A longer bound than the mkdir: this is set-up, and a
	// first slice of the .EventualConsistency policy is acquired across
	// the wide area.
	if _, err := east.Mkdir(ctx, Owner(), "/.EventualConsistency/.MaxTime=5000/ev", 0o777); err != nil {
		t.Fatal(err)
	}
	ev := mustID(t, east, "/ev")
	if p, err := c.Primary(ctx, ev.Slice()); err != nil || p.Site != "east" {
		t.Fatalf("primary of /ev: %v, %v; want east's server", p, err)
	}
	// Both sites look at the new directory (the second look brings the
	// leases: the first opens the back channel to east's server).
	for range 2 {
		listNames(t, west, "/")
		listNames(t, west, "/ev")
		listNames(t, east, "/")
	}
	if west.LeaseLeft(ev) <= 0 {
		t.Fatal("west holds no lease on /ev; the test needs one")
	}

	c.DropSite("east")
	const prefix = "/.EventualConsistency/.MaxTime=1000"
	err, took := syscallBound(ctx, func(ctx context.Context) error {
		return readIs(ctx, east, prefix+"/p2/f2", []byte("data of f2"))
	})
	t.Logf("cut off: read of p2/f2 at east: %v after %v", err, took)
	if err != nil || took > maxTime+boundMargin {
		t.Fatalf("eventual read at the cut-off site: %v after %v, want success within %v", err, took, maxTime)
	}
	err, took = syscallBound(ctx, func(ctx context.Context) error {
		return east.WriteFile(ctx, Owner(), prefix+"/ev/new", []byte("x"), 0o666)
	})
	t.Logf("cut off: create + write + close of ev/new at east: %v after %v", err, took)
	if err != nil {
		t.Fatalf("eventual create at the cut-off site, in a directory it is primary for: %v after %v", err, took)
	}
	if took >= maxTime {
		t.Errorf("the create took %v, want well within .MaxTime=%v", took, maxTime)
	}
	// The writer's own client was called back: it reads its write.
	if err := readIs(ctx, east, prefix+"/ev/new", []byte("x")); err != nil {
		t.Errorf("east reads its own create back: %v", err)
	}

	c.HealSite("east")
	c.WaitFor(30*time.Second, "west reads ev/new after the heal", func() error {
		return readIs(ctx, west, "/ev/new", []byte("x"))
	})
}

// TestCutOffSiteAfterLocksLapse: once a cut-off site's slice locks have
// lapsed (another site took its slices over), its server refuses
// ordinary requests as not primary, but still answers from its copy under
// .EventualConsistency: reads, listings and writes to existing files go on
// at the cut-off site, and reconcile after the heal. New objects cannot be
// made there any more — an object ID comes from a slice's primary, and
// acquiring a slice needs the configuration majority — so a create fails
// within its bound (docs/ARCHITECTURE.md, "What a cut-off site can do").
func TestCutOffSiteAfterLocksLapse(t *testing.T) {
	t.Parallel()
	const maxTime = time.Second
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second,
		RTT: UniformRTT(50 * time.Millisecond)})
	ctx := opCtx(t)
	west, east := c.Servers("west")[0].Client(), c.Servers("east")[0].Client()
	if _, err := east.Mkdir(ctx, Owner(), "/.EventualConsistency/.MaxTime=5000/ev", 0o777); err != nil {
		t.Fatal(err)
	}
	if err := east.WriteFile(ctx, Owner(), "/ev/old", []byte("v1"), 0o666); err != nil {
		t.Fatal(err)
	}
	ev, old := mustID(t, east, "/ev"), mustID(t, east, "/ev/old")
	for _, id := range []oid.ID{ev, old} {
		if p, err := c.Primary(ctx, id.Slice()); err != nil || p.Site != "east" {
			t.Fatalf("primary of %v: %v, %v; want east's server", id, p, err)
		}
	}
	c.WaitFor(20*time.Second, "three replicas of /ev/old", func() error { return replicasOf(c, east, "/ev/old", 3) })

	c.DropSite("east")
	// East's server cannot renew; when another server holds the lock,
	// east's own view of it has lapsed too (it counts from before its
	// last renewal was sent).
	c.WaitFor(30*time.Second, "another site takes east's slices over", func() error {
		for _, id := range []oid.ID{ev, old} {
			p, err := c.Primary(ctx, id.Slice())
			if err != nil {
				return err
			}
			if p.Site == "east" {
				return fmt.Errorf("slice %d still held by %s", id.Slice(), p)
			}
		}
		return nil
	})
	const prefix = "/.EventualConsistency/.MaxTime=1000"
	within := func(what string, op func(ctx context.Context) error) {
		t.Helper()
		err, took := syscallBound(ctx, op)
		t.Logf("locks lapsed: %s at east: %v after %v", what, err, took)
		if err != nil || took > maxTime+boundMargin {
			t.Errorf("%s at the cut-off site after its locks lapsed: %v after %v, want success within %v", what, err, took, maxTime)
		}
	}
	within("read", func(ctx context.Context) error { return readIs(ctx, east, prefix+"/ev/old", []byte("v1")) })
	within("listing", func(ctx context.Context) error {
		r, err := east.Resolve(ctx, Owner(), prefix+"/ev")
		if err != nil {
			return err
		}
		entries, _, err := east.ReadDir(ctx, Owner(), r.Cues, ev)
		if err != nil {
			return err
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"old", "old.sync"}) {
			return fmt.Errorf("entries %v, want old and old.sync", names)
		}
		return nil
	})
	within("write to an existing file", func(ctx context.Context) error {
		return east.WriteFile(ctx, Owner(), prefix+"/ev/old", []byte("v2"), 0o666)
	})
	err, took := syscallBound(ctx, func(ctx context.Context) error {
		return east.WriteFile(ctx, Owner(), prefix+"/ev/new", []byte("x"), 0o666)
	})
	t.Logf("locks lapsed: create at east: %v after %v", err, took)
	if fserr.Errno(err) != syscall.ETIMEDOUT || took > maxTime+boundMargin {
		t.Errorf("create at the cut-off site after its locks lapsed: %v after %v, want ETIMEDOUT within %v", err, took, maxTime)
	}

	c.HealSite("east")
	// A context of its own: the test's has run since the cluster started
	// and, under load, would end before this wait does (every attempt then
	// fails before it calls anyone, hiding why the read did not succeed).
	healed := opCtx(t)
	c.WaitFor(60*time.Second, "west reads east's write after the heal", func() error {
		return readIs(healed, west, "/ev/old", []byte("v2"))
	})
}

// TestBoundPerSystemCall: at a cut-off site a plain stat and read of a
// file whose primary is away is several FUSE requests (lookup, getattr,
// open, read), each with the whole call bound. Once one has run out, the
// next to the same silent primary only gets a one-second probe, so the
// system call takes about one bound, not one per request (it took 90–180 s with a
// 30 s bound on the testbed). A primary that is reachable but slow (a
// lease to wait out) is not taken for silent: TestWriteWaitsOutCutOffLeaseHolder.
func TestBoundPerSystemCall(t *testing.T) {
	t.Parallel()
	const bound = 3 * time.Second
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ClientTimeout: bound,
		RTT: UniformRTT(20 * time.Millisecond)})
	ctx := opCtx(t)
	west, east := c.Servers("west")[0].Client(), c.Servers("east")[0].Client()
	if err := west.WriteFile(ctx, Owner(), "/f", []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := c.PrimaryOf(ctx, west, "/f"); err != nil || p.Site == "east" {
		t.Fatalf("primary of /f: %v, %v; want one away from east", p, err)
	}
	// IDs from west: east has nothing of /f under a lease.
	root, f := mustID(t, west, "/"), mustID(t, west, "/f")
	c.DropSite("east")
	began := time.Now()
	var errs []error
	for _, req := range []func() error{
		func() error { _, err := east.Lookup(ctx, Owner(), client.NoCues, root, "f"); return err },
		func() error { _, err := east.GetAttr(ctx, Owner(), client.NoCues, f); return err },
		func() error { _, _, err := east.Open(ctx, Owner(), client.NoCues, f, 0); return err },
	} {
		errs = append(errs, req())
	}
	took := time.Since(began)
	t.Logf("lookup, getattr, open at the cut-off site: %v in %v", errs, took)
	for _, err := range errs {
		if fserr.Errno(err) != syscall.ETIMEDOUT {
			t.Errorf("a request at the cut-off site: %v, want ETIMEDOUT", err)
		}
	}
	// One bound, then a one-second probe for each later request (three
	// bounds, 9 s, before).
	if took > bound+2*time.Second+boundMargin {
		t.Errorf("three requests took %v, want one bound (%v) and two probes of 1 s", took, bound)
	}
	c.HealSite("east")
	c.WaitFor(30*time.Second, "east reads /f after the heal", func() error { return readIs(ctx, east, "/f", []byte("data")) })
}
