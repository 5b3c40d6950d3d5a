package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fsck"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// fsckRemote reaches the cluster's servers as wheelfs fsck does, with
// credentials creds.
func fsckRemote(t *testing.T, c *Cluster, creds *pki.Credentials) *fsck.Remote {
	t.Helper()
	r := fsck.NewRemote(c.Conf, creds, c.Network.Dialer(c.Sites()[0]))
	t.Cleanup(func() { r.Close() })
	return r
}

// runFsck runs fsck as the CA key's holder (wheelfs fsck --ca).
func runFsck(ctx context.Context, t *testing.T, c *Cluster, repair bool) *fsck.Report {
	t.Helper()
	creds, err := c.AdminCredentials()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := fsck.Check(ctx, fsckRemote(t, c, creds), fsck.Options{Repair: repair,
		Settle: 500 * time.Millisecond, CallTimeout: 20 * time.Second, Young: -1})
	if err != nil {
		t.Fatalf("fsck: %v", err)
	}
	for _, f := range rep.Findings {
		t.Logf("fsck (repair %v): %s slice %d: %s (repaired %v %s)", repair, f.Kind, f.Slice, f.Detail, f.Repaired, f.RepairError)
	}
	for _, u := range rep.Unchecked {
		t.Logf("fsck: unchecked: %s", u)
	}
	return rep
}

// fsckErrors is what a run could not read, as one error (nil: none); a
// poll retries on it, a single run fails the test with it.
func fsckErrors(rep *fsck.Report) error {
	if len(rep.Errors) == 0 {
		return nil
	}
	return fmt.Errorf("fsck could not read everything: %v", rep.Errors)
}

// onReplicas runs fn in a store transaction at every replica of slice sl,
// bypassing replication: the same damage at every copy, so the replicas
// still agree.
func onReplicas(ctx context.Context, t *testing.T, c *Cluster, sl oid.Slice, fn func(tx *store.Tx) error) {
	t.Helper()
	tab, err := c.Conf.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range tab.Slices[sl].Replicas {
		onStore(ctx, t, c, id, fn)
	}
}

// onStore runs fn in a store transaction at server id alone.
func onStore(ctx context.Context, t *testing.T, c *Cluster, id string, fn func(tx *store.Tx) error) {
	t.Helper()
	h := c.Node(id).Host()
	if h == nil {
		t.Fatalf("server %s is down", id)
	}
	if err := h.Store.Update(ctx, fn); err != nil {
		t.Fatalf("damage at %s: %v", id, err)
	}
}

// idOf resolves path to its object ID.
func idOf(ctx context.Context, t *testing.T, c *Cluster, path string) oid.ID {
	t.Helper()
	r, err := c.Client("west").Resolve(ctx, Owner(), path)
	if err != nil || r.Meta == nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	return oid.ID(r.Meta.Id)
}

func kinds(rep *fsck.Report) map[fsck.Kind][]fsck.Finding {
	out := map[fsck.Kind][]fsck.Finding{}
	for _, f := range rep.Findings {
		out[f.Kind] = append(out[f.Kind], f)
	}
	return out
}

// TestFsckFindsAndRepairsDamage injects each kind of damage fsck knows
// straight into servers' stores — a dangling entry, a wrong link count,
// a leaked file and a leaked directory, a backup whose directory entries differ from its
// primary's at the same position, a copy of a slice at a server not in
// its replica list — and checks that fsck reports each, that --repair
// fixes each through the servers, and that a second fsck is clean.
func TestFsckFindsAndRepairsDamage(t *testing.T) {
	// Four servers, three replicas: every slice has a server that is
	// not its replica.
	c := Start(t, Options{Sites: []string{"west", "east"}, ServersPerSite: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// The files at east (write-local), their names at west: repairs
	// reach the primaries of several slices.
	if _, err := c.Client("west").Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/d/a", "/d/b", "/leak", "/nl"} {
		if err := c.Client("east").WriteFile(ctx, Owner(), p, []byte("data of "+p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client("east").Mkdir(ctx, Owner(), "/ld", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Client("east").WriteFile(ctx, Owner(), "/ld/in", []byte("data of /ld/in"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, a, leak, nl := idOf(ctx, t, c, "/d"), idOf(ctx, t, c, "/d/a"), idOf(ctx, t, c, "/leak"), idOf(ctx, t, c, "/nl")
	ld := idOf(ctx, t, c, "/ld")
	t.Logf("/d %v, /d/a %v, /leak %v, /nl %v, /ld %v", d, a, leak, nl, ld)

	// A healthy deployment is clean (replication settles first).
	c.WaitFor(time.Minute, "a clean fsck before the damage", func() error {
		rep := runFsck(ctx, t, c, false)
		if len(rep.Findings) > 0 {
			return fmt.Errorf("%d findings", len(rep.Findings))
		}
		return fsckErrors(rep)
	})

	// Dangling: an entry naming an object that never existed.
	ghost := oid.Make(d.Slice(), 1<<40)
	onReplicas(ctx, t, c, d.Slice(), func(tx *store.Tx) error {
		return tx.PutEntry(d, &wire.Entry{Name: "ghost", Id: uint64(ghost), Type: wire.Type_TYPE_FILE, Version: 1})
	})
	// Link count: as a link changed in backup mode leaves it.
	onReplicas(ctx, t, c, nl.Slice(), func(tx *store.Tx) error {
		m, err := tx.Meta(nl)
		if err != nil {
			return err
		}
		m.Nlink = 3
		return tx.PutMeta(m)
	})
	// Leaked: the name of /leak gone, its object left (an interrupted
	// two-step create or a remove in backup mode).
	onReplicas(ctx, t, c, oid.Root.Slice(), func(tx *store.Tx) error { return tx.DeleteEntry(oid.Root, "leak") })
	// A leaked directory: its name gone and the root's link count with
	// it, as a remove whose second step never ran leaves them.
	onReplicas(ctx, t, c, oid.Root.Slice(), func(tx *store.Tx) error {
		if err := tx.DeleteEntry(oid.Root, "ld"); err != nil {
			return err
		}
		m, err := tx.Meta(oid.Root)
		if err != nil {
			return err
		}
		m.Nlink--
		return tx.PutMeta(m)
	})
	// Replicas differ: one backup of /d has an entry the others lack
	// (the snapshot digest, meta-data only, does not see it).
	tab, err := c.Conf.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dReps := tab.Slices[d.Slice()]
	backup := ""
	for _, r := range dReps.Replicas {
		if r != dReps.Holder {
			backup = r
			break
		}
	}
	onStore(ctx, t, c, backup, func(tx *store.Tx) error {
		return tx.PutEntry(d, &wire.Entry{Name: "extra", Id: uint64(a), Type: wire.Type_TYPE_FILE, Version: 1})
	})
	// Stale copy: the root slice's objects at a server not in its list.
	rootReps := tab.Slices[oid.RootSlice]
	stale := ""
	for id := range tab.Servers {
		if !slices.Contains(rootReps.Replicas, id) && id != rootReps.Holder {
			stale = id
		}
	}
	if stale == "" {
		t.Fatalf("every server replicates the root slice: %v", rootReps.Replicas)
	}
	var states []*wire.ObjectState
	if err := c.Node(rootReps.Holder).Host().Store.View(func(tx *store.Tx) error {
		return tx.SliceMetas(oid.RootSlice, func(m *wire.Meta) bool {
			st, err := tx.ObjectState(oid.ID(m.Id))
			if err == nil && len(st.Blocks) == 0 {
				states = append(states, st)
			}
			return true
		})
	}); err != nil {
		t.Fatal(err)
	}
	onStore(ctx, t, c, stale, func(tx *store.Tx) error {
		for _, st := range states {
			if err := tx.InstallObject(st); err != nil {
				return err
			}
		}
		return nil
	})

	rep := runFsck(ctx, t, c, false)
	if err := fsckErrors(rep); err != nil {
		t.Error(err)
	}
	k := kinds(rep)
	want := func(kind fsck.Kind, ok func(f fsck.Finding) bool) {
		t.Helper()
		if !slices.ContainsFunc(k[kind], ok) {
			t.Errorf("fsck did not report the %s", kind)
		}
	}
	want(fsck.Dangling, func(f fsck.Finding) bool { return f.Name == "ghost" && f.Dir == d.String() && f.ID == ghost.String() })
	want(fsck.LinkCount, func(f fsck.Finding) bool { return f.ID == nl.String() && f.Nlink == 3 && f.Want == 1 })
	want(fsck.Leaked, func(f fsck.Finding) bool { return f.ID == leak.String() })
	want(fsck.Leaked, func(f fsck.Finding) bool { return f.ID == ld.String() })
	want(fsck.ReplicaDiffers, func(f fsck.Finding) bool { return f.Server == backup && f.Slice == uint32(d.Slice()) })
	want(fsck.StaleCopy, func(f fsck.Finding) bool { return f.Server == stale && f.Slice == uint32(oid.RootSlice) })
	if len(rep.Findings) != 6 {
		t.Errorf("%d findings, want the 6 injected", len(rep.Findings))
	}
	if rep.Unrepaired() != len(rep.Findings) {
		t.Errorf("a check without --repair repaired %d", len(rep.Findings)-rep.Unrepaired())
	}
	if t.Failed() {
		t.FailNow()
	}

	rep = runFsck(ctx, t, c, true)
	if err := fsckErrors(rep); err != nil {
		t.Error(err)
	}
	if len(rep.Findings) != 6 || rep.Unrepaired() != 0 {
		t.Fatalf("repair: %d findings, %d not repaired", len(rep.Findings), rep.Unrepaired())
	}
	// The resync is asynchronous (the primary's follower sends it).
	c.WaitFor(time.Minute, "a clean fsck after the repairs", func() error {
		rep := runFsck(ctx, t, c, false)
		if len(rep.Findings) > 0 {
			return fmt.Errorf("%d findings", len(rep.Findings))
		}
		return fsckErrors(rep)
	})

	// The repairs as a client sees them.
	east := c.Client("east")
	lost := fmt.Sprintf("/lost+found/#%016x", uint64(leak))
	if got, err := east.ReadFile(ctx, Owner(), lost); err != nil || string(got) != "data of /leak" {
		t.Errorf("read %s: %q, %v", lost, got, err)
	}
	lostDir := fmt.Sprintf("/lost+found/#%016x/in", uint64(ld))
	if got, err := east.ReadFile(ctx, Owner(), lostDir); err != nil || string(got) != "data of /ld/in" {
		t.Errorf("read %s: %q, %v", lostDir, got, err)
	}
	if r, err := east.Resolve(ctx, Owner(), "/lost+found/"+fmt.Sprintf("#%016x", uint64(ld))); err != nil || r.Meta == nil ||
		r.Meta.Parent != uint64(idOf(ctx, t, c, "/lost+found")) || r.Meta.Nlink != 2 {
		t.Errorf("the adopted directory: %v, %v; want its parent /lost+found, 2 links", r, err)
	}
	if r, err := east.Resolve(ctx, Owner(), "/d/ghost"); err != nil || r.Meta != nil {
		t.Errorf("/d/ghost after the repair: %v, %v", r, err)
	}
	if r, err := east.Resolve(ctx, Owner(), "/nl"); err != nil || r.Meta == nil || r.Meta.Nlink != 1 {
		t.Errorf("/nl after the repair: %v, %v", r, err)
	}
	onStore(ctx, t, c, backup, func(tx *store.Tx) error {
		if _, err := tx.Entry(d, "extra"); err == nil {
			return errors.New("the backup still has the entry only it had")
		}
		return nil
	})
	onStore(ctx, t, c, stale, func(tx *store.Tx) error {
		if _, err := tx.Meta(oid.Root); err == nil {
			return errors.New("the stale copy of the root slice is still there")
		}
		return nil
	})
}

// TestFsckAdminOnly: fsck's RPCs refuse a client node (EPERM), and serve a
// registered server and the CA key's holder.
func TestFsckAdminOnly(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	call := func(creds *pki.Credentials) error {
		r := fsckRemote(t, c, creds)
		if _, err := r.Table(ctx); err != nil {
			return err
		}
		p, err := r.Peer(ctx, c.Servers("west")[0].ID())
		if err != nil {
			return err
		}
		_, err = p.FsckList(ctx, &wire.FsckListRequest{Slice: uint32(oid.RootSlice)})
		return err
	}
	if err := call(c.ClientNode("west").Host().Creds); !errors.Is(fserr.FromStatus(err), fserr.ErrPerm) {
		t.Errorf("a client node's fsck call: %v, want EPERM", err)
	}
	admin, err := c.AdminCredentials()
	if err != nil {
		t.Fatal(err)
	}
	if err := call(admin); err != nil {
		t.Errorf("the administrator's fsck call: %v", err)
	}
	if err := call(c.Servers("west")[0].Host().Creds); err != nil {
		t.Errorf("a server's fsck call: %v", err)
	}
}

// TestFsckOnlineUnderWrites runs fsck while clients create, rename and
// remove files across servers (two-step creates, renames between
// servers, replication in flight): the transient states are not
// reported, even without the grace for young objects.
func TestFsckOnlineUnderWrites(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east"}, ServersPerSite: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dirs := map[string]oid.ID{}
	for dir, site := range map[string]string{"/w": "west", "/e": "east"} {
		a, err := c.Client(site).Mkdir(ctx, Owner(), dir, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		dirs[dir] = oid.ID(a.Id)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := make(chan struct{})
	var ops atomic.Int64
	go func() {
		// Files at east named in /w (west's), moved to /e and removed.
		fs := c.Client("east")
		var err error
		for i := 0; wctx.Err() == nil; i++ {
			name := fmt.Sprintf("f%d", i)
			if err = fs.WriteFile(wctx, Owner(), "/w/"+name, []byte(name), 0o644); err != nil {
				break
			}
			if err = fs.Rename(wctx, Owner(), cue.Set{}, dirs["/w"], name, dirs["/e"], name, 0); err != nil {
				break
			}
			if i%2 == 0 {
				if err = fs.Remove(wctx, Owner(), cue.Set{}, dirs["/e"], name, false); err != nil {
					break
				}
			}
			if ops.Add(1) == 20 {
				close(started)
			}
		}
		if wctx.Err() != nil {
			err = nil
		}
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("writer: %v", err)
	}
	creds, err := c.AdminCredentials()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		rep, err := fsck.Check(ctx, fsckRemote(t, c, creds), fsck.Options{CallTimeout: 20 * time.Second, Young: -1})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range rep.Findings {
			t.Errorf("fsck under writes: %s slice %d: %s", f.Kind, f.Slice, f.Detail)
		}
		for _, e := range rep.Errors {
			t.Errorf("fsck under writes: %s", e)
		}
		t.Logf("fsck under writes: %d objects, %d writer rounds, unchecked %q", rep.Objects, ops.Load(), rep.Unchecked)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
}
