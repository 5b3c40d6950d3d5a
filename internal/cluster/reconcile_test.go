package cluster

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/server"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Eventual consistency and reconciliation, driven through the servers'
// Storage API with Caller.eventual set (the client side is built
// separately).

// srv returns n's storage server.
func srv(t *testing.T, n *Node) *server.Server {
	t.Helper()
	h := n.Host()
	if h == nil || h.Server == nil {
		t.Fatalf("%s has no running server", n)
	}
	return h.Server
}

func evCaller() *wire.Caller {
	o := Owner()
	return &wire.Caller{Uid: o.Uid, Gid: o.Gid, Eventual: true}
}

func createAt(ctx context.Context, s *server.Server, dir oid.ID, name string, typ wire.Type, cues *wire.Cues) (*wire.Meta, error) {
	mode := uint32(0o644)
	if typ == wire.Type_TYPE_DIR {
		mode = 0o755
	}
	resp, err := s.Create(ctx, &wire.CreateRequest{Caller: evCaller(), Dir: uint64(dir), Name: name,
		Type: typ, Mode: mode, Cues: cues, Exclusive: true})
	if err != nil {
		return nil, fmt.Errorf("create %q: %w", name, err)
	}
	return resp.Meta, nil
}

// writeAt replaces the content of file id at server s.
func writeAt(ctx context.Context, s *server.Server, id oid.ID, data []byte) error {
	pb, err := s.PutBlocks(ctx, &wire.PutBlocksRequest{Caller: evCaller(), Id: uint64(id), Data: [][]byte{data}})
	if err != nil {
		return fmt.Errorf("put blocks of %v: %w", id, err)
	}
	_, err = s.Commit(ctx, &wire.CommitRequest{Caller: evCaller(), Id: uint64(id), Size: uint64(len(data)),
		MtimeNs: time.Now().UnixNano(),
		Blocks:  []*wire.BlockRef{{Index: 0, Hash: pb.Hashes[0], Len: uint32(len(data))}}})
	if err != nil {
		return fmt.Errorf("commit %v: %w", id, err)
	}
	return nil
}

// readAt returns the content of file id in server s's copy.
func readAt(ctx context.Context, s *server.Server, id oid.ID) ([]byte, error) {
	gb, err := s.GetBlocks(ctx, &wire.GetBlocksRequest{Caller: evCaller(), Id: uint64(id), Count: 16})
	if err != nil {
		return nil, err
	}
	var hs [][]byte
	for _, b := range gb.Blocks {
		hs = append(hs, b.Hash)
	}
	rb, err := s.ReadBlocks(ctx, &wire.ReadBlocksRequest{Caller: evCaller(), Id: uint64(id), Hashes: hs})
	if err != nil {
		return nil, err
	}
	out := bytes.Join(rb.Data, nil)
	return out[:min(len(out), int(gb.Meta.GetSize()))], nil
}

// entriesAt returns directory dir's entries (name → id) in s's copy.
func entriesAt(ctx context.Context, s *server.Server, dir oid.ID) (map[string]uint64, error) {
	resp, err := s.ReadDir(ctx, &wire.ReadDirRequest{Caller: evCaller(), Dir: uint64(dir)})
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, e := range resp.Entries {
		out[e.Name] = e.Id
	}
	return out, nil
}

// converged checks that every replica of every slice holds the same
// objects at the same versions and meta-data sums, and that no server
// still holds unmerged eventual changes.
func converged(ctx context.Context, t *testing.T, c *Cluster) error {
	tab, err := c.Conf.Table(ctx)
	if err != nil {
		return err
	}
	for _, n := range c.Servers("") {
		for id := range tab.Slices {
			if n.Up() && srv(t, n).Diverged(id) {
				return fmt.Errorf("slice %d: %s still holds eventual changes", id, n)
			}
		}
	}
	for id, sl := range tab.Slices {
		var first *wire.DigestResponse
		for _, r := range sl.Replicas {
			n := c.Node(r)
			if n == nil || !n.Up() {
				return fmt.Errorf("slice %d: replica %s is down", id, r)
			}
			s := srv(t, n)
			if s.Diverged(id) {
				return fmt.Errorf("slice %d: %s still holds eventual changes", id, n)
			}
			d, err := s.PeerService().Digest(ctx, &wire.DigestRequest{Slice: uint32(id)})
			if err != nil {
				return err
			}
			if first == nil {
				first = d
				continue
			}
			if !slices.Equal(first.Ids, d.Ids) || !slices.Equal(first.Versions, d.Versions) || !slices.Equal(first.Sums, d.Sums) {
				return fmt.Errorf("slice %d: %s differs from %s (ids %x vs %x, versions %v vs %v)",
					id, n, sl.Replicas[0], d.Ids, first.Ids, d.Versions, first.Versions)
			}
		}
	}
	return nil
}

func TestEventualReconcile(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second,
		Adjust: func(n *Node, cfg *deploy.Config) {
			cfg.Server.MaintainPeriod = 200 * time.Millisecond
			// Keep the cut-off backups in the replica lists.
			cfg.Server.DeadAfter = 5 * time.Minute
		}})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	var p *Node
	c.WaitFor(20*time.Second, "root primary", func() (err error) {
		p, err = c.Primary(ctx, oid.RootSlice)
		return err
	})
	ps := srv(t, p)
	var b *Node // a backup at another site
	for _, n := range c.Servers("") {
		if n.Site != p.Site && b == nil {
			b = n
		}
	}
	bs := srv(t, b)

	// A union-merged directory and three files, written at the primary.
	d, err := createAt(ctx, ps, oid.Root, "mail", wire.Type_TYPE_DIR, &wire.Cues{Eventual: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := oid.ID(d.Id)
	ids := map[string]oid.ID{}
	for _, name := range []string{"a", "b", "c", "d"} {
		m, err := createAt(ctx, ps, dir, name, wire.Type_TYPE_FILE, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = oid.ID(m.Id)
		if err := writeAt(ctx, ps, ids[name], []byte(name+" v1")); err != nil {
			t.Fatal(err)
		}
	}
	c.WaitFor(30*time.Second, "replicas converge before the partition", func() error { return converged(ctx, t, c) })

	// Cut the primary's site off from the others' servers (the
	// configuration service still works, so the primary keeps its locks).
	for _, site := range c.Sites() {
		if site != p.Site {
			c.PartitionLink(p.Site, site)
		}
	}

	// (d) The cut-off primary keeps accepting eventual creates quickly.
	var slowest time.Duration
	for i := range 10 {
		began := time.Now()
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := createAt(cctx, ps, dir, fmt.Sprintf("p%d", i), wire.Type_TYPE_FILE, nil)
		ccancel()
		if err != nil {
			t.Fatalf("eventual create at the cut-off primary: %v", err)
		}
		slowest = max(slowest, time.Since(began))
	}
	if slowest > time.Second {
		t.Errorf("slowest eventual create at the cut-off primary took %v", slowest)
	}
	t.Logf("cut-off primary: slowest of 10 eventual creates %v", slowest)
	// Without the cue a write waits for backups it cannot reach.
	sctx, scancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = ps.SetAttr(sctx, &wire.SetAttrRequest{Caller: &wire.Caller{Uid: Owner().Uid, Gid: Owner().Gid},
		Id: uint64(ids["c"]), Valid: wire.SetMode, Mode: 0o640})
	scancel()
	if err == nil {
		t.Errorf("a strict setattr at the cut-off primary succeeded without its backups")
	}

	// (a) Both sides write: the backup twice to a, the primary once to a
	// and to c; the backup removes b; (c) both create "dup".
	for _, v := range []string{"a from backup 1", "a from backup 2"} {
		if err := writeAt(ctx, bs, ids["a"], []byte(v)); err != nil {
			t.Fatalf("eventual write at the backup: %v", err)
		}
	}
	if err := writeAt(ctx, ps, ids["a"], []byte("a from primary")); err != nil {
		t.Fatal(err)
	}
	if err := writeAt(ctx, ps, ids["c"], []byte("c from primary")); err != nil {
		t.Fatal(err)
	}
	if _, err := bs.Remove(ctx, &wire.RemoveRequest{Caller: evCaller(), Dir: uint64(dir), Name: "b", FileOnly: true}); err != nil {
		t.Fatalf("eventual remove at the backup: %v", err)
	}
	// (b) The primary removes d while the backup writes to it.
	if _, err := ps.Remove(ctx, &wire.RemoveRequest{Caller: evCaller(), Dir: uint64(dir), Name: "d", FileOnly: true}); err != nil {
		t.Fatal(err)
	}
	if err := writeAt(ctx, bs, ids["d"], []byte("d from backup")); err != nil {
		t.Fatal(err)
	}
	nb, err := createAt(ctx, bs, dir, "from-backup", wire.Type_TYPE_FILE, nil)
	if err != nil {
		t.Fatalf("eventual create at the backup: %v", err)
	}
	dupP, err := createAt(ctx, ps, dir, "dup", wire.Type_TYPE_FILE, nil)
	if err != nil {
		t.Fatal(err)
	}
	dupB, err := createAt(ctx, bs, dir, "dup", wire.Type_TYPE_FILE, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeAt(ctx, ps, oid.ID(dupP.Id), []byte("dup at primary")); err != nil {
		t.Fatal(err)
	}
	if err := writeAt(ctx, bs, oid.ID(dupB.Id), []byte("dup at backup")); err != nil {
		t.Fatal(err)
	}
	// The backup answers eventual reads from its own copy meanwhile.
	if got, err := readAt(ctx, bs, ids["a"]); err != nil || string(got) != "a from backup 2" {
		t.Fatalf("eventual read at the backup: %q, %v", got, err)
	}
	// Without the cue the backup refuses.
	if _, err := bs.GetAttr(ctx, &wire.GetAttrRequest{Caller: &wire.Caller{Uid: Owner().Uid}, Id: uint64(ids["a"])}); err == nil {
		t.Errorf("a backup answered a request without .EventualConsistency")
	}

	for _, site := range c.Sites() {
		if site != p.Site {
			c.HealLink(p.Site, site)
		}
	}
	healed := time.Now()
	c.WaitFor(60*time.Second, "replicas converge after the partition", func() error { return converged(ctx, t, c) })
	t.Logf("replicas identical %v after healing", time.Since(healed))

	// The expected winners, at every replica.
	small, big := min(dupP.Id, dupB.Id), max(dupP.Id, dupB.Id)
	want := map[string]uint64{"a": uint64(ids["a"]), "c": uint64(ids["c"]), "from-backup": nb.Id,
		"dup": small, fmt.Sprintf("dup~%016x", big): big}
	for i := range 10 {
		want[fmt.Sprintf("p%d", i)] = 0 // any id
	}
	// Every replica of the directory's slice (maintenance may have moved
	// one since the partition: a server that no longer holds the slice
	// refuses even an eventual read).
	tab, err := c.Conf.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range tab.Slices[dir.Slice()].Replicas {
		n := c.Node(r)
		s := srv(t, n)
		got, err := entriesAt(ctx, s, dir)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		for name, id := range want {
			if gid, ok := got[name]; !ok || id != 0 && gid != id {
				t.Errorf("%s: %q → %x, want %x (entries %v)", n, name, gid, id, got)
			}
		}
		for _, gone := range []string{"b", "d"} {
			if _, ok := got[gone]; ok {
				t.Errorf("%s: removed name %s is back", n, gone)
			}
			if _, err := s.GetAttr(ctx, &wire.GetAttrRequest{Caller: evCaller(), Id: uint64(ids[gone])}); err == nil {
				t.Errorf("%s: removed object %s is back", n, gone)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d entries, want %d: %v", n, len(got), len(want), got)
		}
		for id, data := range map[oid.ID]string{ids["a"]: "a from backup 2", ids["c"]: "c from primary",
			oid.ID(dupP.Id): "dup at primary", oid.ID(dupB.Id): "dup at backup"} {
			if got, err := readAt(ctx, s, id); err != nil || string(got) != data {
				t.Errorf("%s: %v holds %q (%v), want %q", n, id, got, err, data)
			}
		}
	}

	// (b) Tombstones are collected once every replica has them, and the
	// name stays gone.
	c.WaitFor(30*time.Second, "tombstones collected", func() error {
		for _, n := range c.Servers("") {
			if k, err := srv(t, n).Tombstones(dir); err != nil || k > 0 {
				return fmt.Errorf("%s holds %d tombstones (%v)", n, k, err)
			}
		}
		return nil
	})
	for _, n := range c.Servers("") {
		got, err := entriesAt(ctx, srv(t, n), dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("%s: after tombstone collection %d entries, want %d: %v", n, len(got), len(want), got)
		}
	}
}

// TestEventualPartitionedSite cuts the primary's site off entirely: it
// loses the configuration majority and its locks, a backup takes over,
// and the old primary keeps changing its copy in backup mode. After
// healing, its changes reach the new primary.
func TestEventualPartitionedSite(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second,
		Adjust: func(n *Node, cfg *deploy.Config) {
			cfg.Server.MaintainPeriod = 200 * time.Millisecond
		}})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var p *Node
	c.WaitFor(20*time.Second, "root primary", func() (err error) {
		p, err = c.Primary(ctx, oid.RootSlice)
		return err
	})
	ps := srv(t, p)
	d, err := createAt(ctx, ps, oid.Root, "spool", wire.Type_TYPE_DIR, &wire.Cues{Eventual: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := oid.ID(d.Id)
	ids := map[string]oid.ID{}
	for _, name := range []string{"a", "b", "c"} {
		m, err := createAt(ctx, ps, dir, name, wire.Type_TYPE_FILE, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = oid.ID(m.Id)
		if err := writeAt(ctx, ps, ids[name], []byte(name+" v1")); err != nil {
			t.Fatal(err)
		}
	}
	c.WaitFor(30*time.Second, "replicas converge before the partition", func() error { return converged(ctx, t, c) })

	c.PartitionSite(p.Site)
	var np *Node
	c.WaitFor(30*time.Second, "another site takes the directory's slice over", func() (err error) {
		np, err = c.Primary(ctx, dir.Slice())
		if err == nil && np == p {
			err = fmt.Errorf("still %s", p)
		}
		return err
	})
	// The old primary, without its lock, changes its copy in backup mode.
	if err := writeAt(ctx, ps, ids["a"], []byte("a at the cut-off site")); err != nil {
		t.Fatalf("eventual write at the cut-off site: %v", err)
	}
	if _, err := ps.Remove(ctx, &wire.RemoveRequest{Caller: evCaller(), Dir: uint64(dir), Name: "b", FileOnly: true}); err != nil {
		t.Fatalf("eventual remove at the cut-off site: %v", err)
	}
	// The new primary's side goes on as well.
	nps := srv(t, np)
	nx, err := createAt(ctx, nps, dir, "x", wire.Type_TYPE_FILE, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeAt(ctx, nps, ids["c"], []byte("c at the majority")); err != nil {
		t.Fatal(err)
	}

	c.HealSite(p.Site)
	healed := time.Now()
	c.WaitFor(60*time.Second, "replicas converge after healing", func() error { return converged(ctx, t, c) })
	t.Logf("replicas identical %v after healing", time.Since(healed))
	want := map[string]uint64{"a": uint64(ids["a"]), "c": uint64(ids["c"]), "x": nx.Id}
	content := map[oid.ID]string{ids["a"]: "a at the cut-off site", ids["c"]: "c at the majority"}
	tab, err := c.Conf.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range tab.Slices[dir.Slice()].Replicas {
		n := c.Node(id)
		s := srv(t, n)
		got, err := entriesAt(ctx, s, dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Errorf("%s: entries %v, want %v", n, got, want)
		}
		for name, id := range want {
			if got[name] != id {
				t.Errorf("%s: %q → %x, want %x", n, name, got[name], id)
			}
		}
		for id, data := range content {
			if got, err := readAt(ctx, s, id); err != nil || string(got) != data {
				t.Errorf("%s: %v holds %q (%v), want %q", n, id, got, err, data)
			}
		}
	}
}
