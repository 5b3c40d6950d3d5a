package cluster

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// raceDir starts three sites and makes /d at west; files that eu creates
// in it live on eu's server (write-local), not on the directory's primary.
func raceDir(t *testing.T) (*Cluster, oid.ID) {
	t.Helper()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second})
	m, err := c.Client("west").Mkdir(opCtx(t), Owner(), "/d", 0o777)
	if err != nil {
		t.Fatal(err)
	}
	return c, oid.ID(m.Id)
}

// TestUnlinkRacingRename: unlink(x) and rename(x, y) race on a name whose
// object lives on another server than the directory. At most one of them
// may succeed, and the directory must not be left with an entry whose
// object is gone (listed by readdir, ENOENT on lookup). Found by
// TestLinearizableUnderFaults (the "spread" placement).
func TestUnlinkRacingRename(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c, dir := raceDir(t)
	ctx := opCtx(t)
	const rounds = 50
	both, dangling := 0, 0
	for i := range rounds {
		x, y := fmt.Sprintf("x%d", i), fmt.Sprintf("y%d", i)
		if _, err := c.Client("eu").Create(ctx, Owner(), client.NoCues, dir, x,
			client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var unlinkErr, renameErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			unlinkErr = c.Client("east").Remove(ctx, Owner(), client.NoCues, dir, x, false)
		}()
		go func() {
			defer wg.Done()
			renameErr = c.Client("west").Rename(ctx, Owner(), client.NoCues, dir, x, dir, y, 0)
		}()
		wg.Wait()
		if unlinkErr == nil && renameErr == nil {
			both++
		}
		ents, _, err := c.Client("east").ReadDir(ctx, Owner(), client.NoCues, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name != x && e.Name != y {
				continue
			}
			if _, err := c.Client("east").Lookup(ctx, Owner(), client.NoCues, dir, e.Name); err != nil {
				dangling++
				if dangling <= 3 {
					t.Errorf("round %d: %s is listed but its lookup fails: %v", i, e.Name, err)
				}
			}
		}
	}
	if both > 0 || dangling > 0 {
		t.Errorf("%d races: unlink and rename both succeeded %d times; %d dangling entries", rounds, both, dangling)
	}
}

// TestLookupRacingRenameOver: while a file is replaced again and again by
// renaming a new file over its name (objects on another server than the
// directory), a lookup of the name never fails: rename is atomic, the name
// always exists. Found by TestLinearizableUnderFaults.
func TestLookupRacingRenameOver(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c, dir := raceDir(t)
	ctx := opCtx(t)
	eu, east := c.Client("eu"), c.Client("east")
	put := func(i int) {
		tmp := fmt.Sprintf("tmp%d", i)
		if _, err := eu.Create(ctx, Owner(), client.NoCues, dir, tmp,
			client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		if err := eu.Rename(ctx, Owner(), client.NoCues, dir, tmp, dir, "f", 0); err != nil {
			t.Fatal(err)
		}
	}
	put(0)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var lookups, failed int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, err := east.Lookup(ctx, Owner(), client.NoCues, dir, "f")
			lookups++
			if err != nil {
				failed++
				if failed <= 3 {
					t.Errorf("lookup during renames over f: %v", err)
				}
			}
		}
	}()
	const renames = 200
	for i := 1; i <= renames; i++ {
		put(i)
	}
	close(stop)
	wg.Wait()
	if failed > 0 {
		t.Errorf("%d of %d lookups during %d renames over the name failed", failed, lookups, renames)
	}
	if lookups < 10 {
		t.Errorf("only %d lookups ran during the renames", lookups)
	}
}

// TestRemoveRemoteFileNameFirst: removing a name whose file lives on
// another server takes the name away first, then the file's link, so no
// reader sees the name without its file (listed, but ENOENT on lookup) in
// between. With the file's server down the name still goes: the file
// keeps a link (space until an fsck), not a name without a file.
func TestRemoveRemoteFileNameFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c, dir := raceDir(t)
	ctx := opCtx(t)
	m, err := c.Client("eu").Create(ctx, Owner(), client.NoCues, dir, "f", client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	owner, err := c.Primary(ctx, oid.ID(m.Id).Slice())
	if err != nil || owner.Site != "eu" {
		t.Fatalf("primary of the file: %v, %v; want eu's server", owner, err)
	}
	c.Crash(owner)
	west := c.Client("west")
	// eu's server also backs /d: two copies of the change are all that
	// two servers can give.
	if err := west.Remove(ctx, Owner(), cue.Set{SyncLevel: 2}, dir, "f", false); err != nil {
		t.Fatalf("remove of a name whose file's server is down: %v", err)
	}
	ents, _, err := west.ReadDir(ctx, Owner(), client.NoCues, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name == "f" {
			t.Fatal("the name is still listed after its remove succeeded")
		}
	}
	c.Restart(owner)
}
