package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/server"
)

// listNames lists path's entry names.
func listNames(t *testing.T, fs *client.FS, path string) []string {
	t.Helper()
	ctx := opCtx(t)
	r, err := fs.Resolve(ctx, Owner(), path)
	if err != nil || r.Meta == nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	return listDir(t, fs, r.Cues, oid.ID(r.Meta.Id))
}

// listDir lists directory dir by id, sorted.
func listDir(t *testing.T, fs *client.FS, cues cue.Set, dir oid.ID) []string {
	t.Helper()
	entries, _, err := fs.ReadDir(opCtx(t), Owner(), cues, dir)
	if err != nil {
		t.Fatalf("readdir %v: %v", dir, err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	return names
}

// TestLeasesServeFromCacheAndRevoke checks close-to-open with leases (paper
// §5.4): a second read of an unchanged file needs no round trip, and a
// change made at another site is seen by an open issued as soon as the
// writer's close returned — for file contents and directory listings.
func TestLeasesServeFromCacheAndRevoke(t *testing.T) {
	t.Parallel()
	const rtt = 100 * time.Millisecond
	_, ctx, west, east := leasedSites(t, rtt)
	if err := west.WriteFile(ctx, Owner(), "/d/f", []byte("version one"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The first contact with a server opens the back channel (and gets no
	// lease); the second read takes leases.
	for range 2 {
		if err := readIs(ctx, east, "/d/f", []byte("version one")); err != nil {
			t.Fatal(err)
		}
	}
	// Lookups, open, block list and blocks are all cached now.
	began := time.Now()
	if err := readIs(ctx, east, "/d/f", []byte("version one")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > rtt/2 {
		t.Errorf("a cached read took %v; with leases it needs no round trip (RTT %v)", d, rtt)
	}
	for round := range 5 {
		want := fmt.Appendf(nil, "version %d from the west", round+2)
		if err := west.WriteFile(ctx, Owner(), "/d/f", want, 0o644); err != nil {
			t.Fatal(err)
		}
		// No waiting: the write returned, so east's lease was revoked.
		if err := readIs(ctx, east, "/d/f", want); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	before := listNames(t, east, "/d")
	began = time.Now()
	if again := listNames(t, east, "/d"); !slices.Equal(before, again) {
		t.Fatalf("listing changed by itself: %v then %v", before, again)
	}
	if d := time.Since(began); d > rtt/2 {
		t.Errorf("a cached listing took %v (RTT %v)", d, rtt)
	}
	if err := west.WriteFile(ctx, Owner(), "/d/g", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := listNames(t, east, "/d"); !slices.Equal(got, []string{"f", "g"}) {
		t.Fatalf("east lists %v right after the create, want [f g]", got)
	}
	if err := west.Rename(ctx, Owner(), client.NoCues, mustID(t, west, "/d"), "g", mustID(t, west, "/d"), "h", 0); err != nil {
		t.Fatal(err)
	}
	if got := listNames(t, east, "/d"); !slices.Equal(got, []string{"f", "h"}) {
		t.Fatalf("east lists %v right after the rename, want [f h]", got)
	}
	if r, err := east.Resolve(ctx, Owner(), "/d/g"); err != nil || r.Meta != nil {
		t.Fatalf("east still finds the renamed name: %v %v", r, err)
	}
	if err := west.Remove(ctx, Owner(), client.NoCues, mustID(t, west, "/d"), "h", false); err != nil {
		t.Fatal(err)
	}
	if got := listNames(t, east, "/d"); !slices.Equal(got, []string{"f"}) {
		t.Fatalf("east lists %v right after the unlink, want [f]", got)
	}
}

func mustID(t *testing.T, fs *client.FS, path string) oid.ID {
	t.Helper()
	r, err := fs.Resolve(opCtx(t), Owner(), path)
	if err != nil || r.Meta == nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	return oid.ID(r.Meta.Id)
}

// TestLeaseHolderUnreachable checks that a primary waits out the lease of a
// holder it cannot call back before it applies an update — and no longer.
func TestLeaseHolderUnreachable(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	c := Start(t, Options{LockTTL: 10 * time.Second, Adjust: func(n *Node, cfg *deploy.Config) {
		cfg.Server.LeaseTTL = lease
	}})
	ctx := opCtx(t)
	west, east := c.Client("west"), c.Client("east")
	if err := west.WriteFile(ctx, Owner(), "/f", []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := readIs(ctx, east, "/f", []byte("old")); err != nil {
			t.Fatal(err)
		}
	}
	id := mustID(t, east, "/f")
	left := east.LeaseLeft(id)
	if left <= 0 {
		t.Fatal("east holds no lease on /f after reading it")
	}
	c.PartitionLink("west", "east")
	began := time.Now()
	// .SyncLevel=1: east is also a backup, and cut off.
	if err := west.WriteFile(ctx, Owner(), "/.SyncLevel=1/f", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	if took < left-500*time.Millisecond {
		t.Errorf("the update took %v, but east's lease had %v left and east could not be called back", took, left)
	}
	if took > lease+2*time.Second {
		t.Errorf("the update took %v, longer than the lease (%v) allows", took, lease)
	}
	c.HealLink("west", "east")
	c.WaitFor(20*time.Second, "east reads the new version", func() error {
		return readIs(ctx, east, "/f", []byte("new"))
	})
}

// TestMaxTimeWithoutEventual checks that an unreachable primary is an
// ETIMEDOUT error after .MaxTime, and that .EventualConsistency reads a
// backup's copy instead within the same bound.
func TestMaxTimeWithoutEventual(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{LockTTL: 30 * time.Second, RTT: UniformRTT(20 * time.Millisecond)})
	ctx := opCtx(t)
	west, east := c.Client("west"), c.Client("east")
	data := bytes.Repeat([]byte("cached page "), 1000)
	if err := west.WriteFile(ctx, Owner(), "/page", data, 0o644); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(20*time.Second, "three replicas of /page", func() error { return replicasOf(c, west, "/page", 3) })
	c.PartitionSite("west")
	defer c.HealSite("west")
	const limit = time.Second
	const margin = 300 * time.Millisecond
	began := time.Now()
	_, err := east.ReadFile(ctx, Owner(), "/.MaxTime=1000/page")
	took := time.Since(began)
	if !errors.Is(err, fserr.ErrTimeout) || fserr.Errno(err) != syscall.ETIMEDOUT {
		t.Errorf("close-to-open read with the primary cut off: %v (errno %v), want ETIMEDOUT", err, fserr.Errno(err))
	}
	if took > limit+margin {
		t.Errorf("failing took %v, more than .MaxTime=%v + %v", took, limit, margin)
	}
	began = time.Now()
	got, err := east.ReadFile(ctx, Owner(), "/.EventualConsistency/.MaxTime=1000/page")
	took = time.Since(began)
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("eventual read from a backup: %d bytes, %v", len(got), err)
	}
	if took > limit+margin {
		t.Errorf("the eventual read took %v, more than %v + %v", took, limit, margin)
	}
}

func replicasOf(c *Cluster, fs *client.FS, path string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := fs.Resolve(ctx, Owner(), path)
	if err != nil || r.Meta == nil {
		return fmt.Errorf("resolve %s: %v", path, err)
	}
	info, err := fs.Info(ctx, Owner(), client.NoCues, oid.ID(r.Meta.Id))
	if err != nil {
		return err
	}
	if len(info.Replicas) < n {
		return fmt.Errorf("%d replicas", len(info.Replicas))
	}
	// A write acknowledged by every replica: they all have the file.
	return fs.WriteFile(ctx, Owner(), path+".sync", []byte("x"), 0o644)
}

// TestWriteWaitsOutCutOffLeaseHolder is issue 16 item 13: right after a
// site was cut off, a create at a healthy site in a directory the cut-off
// site had leased waited out that lease inside its own call — a minute's
// lease in a 30-second call, so it failed. With the default lease (a third
// of the default call bound) and the default bound, the create waits
// until the lease ends and succeeds within the bound. A .MaxTime call
// shorter than the lease fails within its bound, and the lease it could
// not revoke still counts for the next write.
func TestWriteWaitsOutCutOffLeaseHolder(t *testing.T) {
	t.Parallel()
	const rtt = 50 * time.Millisecond
	// A lock longer than the lease, which it would otherwise cap.
	c := Start(t, Options{LockTTL: time.Minute, RTT: UniformRTT(rtt)})
	lease := server.DefaultLeaseTTL
	if d := c.Options().ClientTimeout; d != client.DefaultTimeout || 3*lease > d {
		t.Fatalf("the test needs the default bound %v and lease %v", d, lease)
	}
	ctx := opCtx(t)
	west, east, eu := c.Client("west"), c.Client("east"), c.Client("eu")
	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o777); err != nil {
		t.Fatal(err)
	}
	d := mustID(t, west, "/d")
	for range 2 { // the second listing brings the lease
		listNames(t, east, "/d")
	}
	left := east.LeaseLeft(d)
	if left < lease/2 {
		t.Fatalf("east's lease on /d has %v left (lease %v)", left, lease)
	}
	leasedAt := time.Now()
	c.DropSite("east")

	// The writes ask for two copies (.SyncLevel=2): east also keeps one
	// and is away, and waiting for a replacement (issue 16 item 12) is not
	// what this test measures.
	//
	// A bound shorter than what is left of the lease: ETIMEDOUT in time.
	const maxTime = time.Second
	began := time.Now()
	err := eu.WriteFile(ctx, Owner(), "/.SyncLevel=2/.MaxTime=1000/d/short", []byte("x"), 0o644)
	took := time.Since(began)
	if fserr.Errno(err) != syscall.ETIMEDOUT || took > maxTime+boundMargin {
		t.Errorf("create with .MaxTime=%v while a cut-off client's lease has %v left: %v after %v, want ETIMEDOUT within the bound",
			maxTime, left-time.Since(leasedAt), err, took)
	}
	// The default bound: the primary waits the lease out and the create
	// succeeds — not sooner (the failed call above did not forget the
	// lease), and not much later.
	remaining := left - time.Since(leasedAt)
	began = time.Now()
	if err := eu.WriteFile(ctx, Owner(), "/.SyncLevel=2/d/new", []byte("made at eu"), 0o644); err != nil {
		t.Fatalf("create at a healthy site in a directory a cut-off site leased: %v after %v", err, time.Since(began))
	}
	took = time.Since(began)
	t.Logf("create waited %v (%v of east's %v lease left, call bound %v)", took, remaining.Round(time.Millisecond), lease, c.Options().ClientTimeout)
	if took < remaining-500*time.Millisecond {
		t.Errorf("the create took %v, but east's lease had %v left and east could not be called back", took, remaining)
	}
	if took > lease+3*time.Second {
		t.Errorf("the create took %v, longer than the lease (%v) explains", took, lease)
	}
	c.HealSite("east")
	c.WaitFor(30*time.Second, "east lists the new file", func() error {
		r, err := east.Resolve(ctx, Owner(), "/d/new")
		if err == nil && r.Meta == nil {
			err = errors.New("not there")
		}
		return err
	})
}
