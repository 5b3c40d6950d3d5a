package cluster

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// Orphans survive failover (issue 16 item 4): a file unlinked while open
// is replicated with its holders (server/orphans.go), so the next primary
// keeps it for the handles still open and removes it when the last one
// is released there, or when its client's session is gone.

// orphanIdle is the servers' HolderIdle in these tests: short enough to
// see a session's holders end, long enough for a live client core to
// reach a new primary on a loaded machine.
const orphanIdle = 10 * time.Second

// orphanPath places the file at west, with one backup: after west dies a
// third server is recruited, so that writes (at SyncLevel 2) go on.
const orphanPath = "/.Site=west/.RepLevel=2/f"

// orphanData is a file of 16 blocks: an open brings the first 256 KiB
// at most, so a read near the end must ask the primary.
var orphanData = bytes.Repeat([]byte("0123456789abcdef"), 1<<16)

// orphanCtx bounds a test's operations: its waits add up to more than
// opCtx's minute.
func orphanCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startOrphans starts three sites with one server each, the servers'
// HolderIdle at orphanIdle; edge, when set, moves that site's client
// host to a site of its own ("edge"), which a test can isolate.
func startOrphans(t *testing.T, edge string) *Cluster {
	return Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second,
		Adjust: func(n *Node, cfg *deploy.Config) {
			cfg.Server.HolderIdle = orphanIdle
			if edge != "" && n.Name == edge+"-client" {
				cfg.Site = "edge"
			}
		}})
}

// openOrphan writes orphanPath from b, opens it for reading and writing
// at a, and unlinks it from b. It returns the handle and the file's ID.
// (a's block cache holds none of the file: its reads ask a server.)
func openOrphan(t *testing.T, ctx context.Context, a, b *client.FS) (*client.Handle, oid.ID) {
	t.Helper()
	if err := b.WriteFile(ctx, Owner(), orphanPath, orphanData, 0o644); err != nil {
		t.Fatal(err)
	}
	r := resolve(t, ctx, a, Owner(), orphanPath)
	id := oid.ID(r.Meta.Id)
	h, _, err := a.Open(ctx, Owner(), r.Cues, id, syscall.O_RDWR)
	if err != nil {
		t.Fatalf("open %s: %v", orphanPath, err)
	}
	rb := resolve(t, ctx, b, Owner(), orphanPath)
	if err := b.Remove(ctx, Owner(), rb.Cues, rb.Parent, rb.Name, false); err != nil {
		t.Fatalf("unlink %s while open: %v", orphanPath, err)
	}
	if _, err := b.ReadFile(ctx, Owner(), orphanPath); err == nil {
		t.Fatalf("%s readable by name after its unlink", orphanPath)
	}
	return h, id
}

// failOver waits until id's replicas both hold it as an orphan with a
// holder, crashes its primary and waits for another server to take the
// slice over; it returns the crashed node.
func failOver(t *testing.T, ctx context.Context, c *Cluster, id oid.ID) *Node {
	t.Helper()
	heldAtReplicas(t, ctx, c, id, 1, "the orphan and its holder")
	return crashPrimary(t, ctx, c, id)
}

// crashPrimary crashes the primary of id (west's server) and waits for
// another server to take the slice over; it returns the crashed node.
func crashPrimary(t *testing.T, ctx context.Context, c *Cluster, id oid.ID) *Node {
	t.Helper()
	old, err := c.Primary(ctx, id.Slice())
	if err != nil || old.Site != "west" {
		t.Fatalf("primary of %v: %v (%v), want west's server", id, old, err)
	}
	c.Crash(old)
	c.WaitFor(30*time.Second, "a backup takes over", func() error {
		n, err := c.Primary(ctx, id.Slice())
		if err != nil || n == old {
			return fmt.Errorf("primary %v (%v)", n, err)
		}
		return nil
	})
	return old
}

// heldAtReplicas waits until both replicas of id hold it as an orphan
// with holders holders (what: the wait).
func heldAtReplicas(t *testing.T, ctx context.Context, c *Cluster, id oid.ID, holders int, what string) {
	t.Helper()
	c.WaitFor(30*time.Second, what+" at both replicas", func() error {
		reps, err := replicaNodes(ctx, c, id)
		if err != nil || len(reps) != 2 {
			return fmt.Errorf("replicas %v (%v)", reps, err)
		}
		for _, n := range reps {
			if exists, got, err := srv(t, n).Orphan(id); err != nil || !exists || got != holders {
				return fmt.Errorf("%s: exists %v, holders %d (%v)", n, exists, got, err)
			}
		}
		return nil
	})
}

// keptFor fails the test if id, an orphan held by an open handle, goes
// at its current primary before d (what: the wait) has passed.
func keptFor(t *testing.T, ctx context.Context, c *Cluster, id oid.ID, d time.Duration, what string) {
	t.Helper()
	p, err := c.Primary(ctx, id.Slice())
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(d)
	c.WaitFor(d+time.Minute, what+" to pass at the new primary", func() error {
		if exists, _, err := srv(t, p).Orphan(id); err != nil || !exists {
			t.Fatalf("%v went at %s while a handle held it (exists %v, %v)", id, p, exists, err)
		}
		if time.Now().Before(until) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}

// replicaNodes returns the running servers of id's replica list.
func replicaNodes(ctx context.Context, c *Cluster, id oid.ID) ([]*Node, error) {
	tab, err := c.Conf.Table(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Node
	for _, r := range tab.Slices[id.Slice()].Replicas {
		if n := c.Node(r); n != nil && n.Up() {
			out = append(out, n)
		}
	}
	return out, nil
}

// orphanGone reports an error while some running replica of id, or
// another of nodes, still has it.
func orphanGone(t *testing.T, ctx context.Context, c *Cluster, id oid.ID, nodes ...*Node) error {
	reps, err := replicaNodes(ctx, c, id)
	if err != nil {
		return err
	}
	if len(reps) < 2 {
		return fmt.Errorf("running replicas %v", reps)
	}
	for _, n := range nodes {
		if !slices.Contains(reps, n) {
			reps = append(reps, n)
		}
	}
	for _, n := range reps {
		if exists, holders, err := srv(t, n).Orphan(id); err != nil || exists {
			return fmt.Errorf("%s still has %v (holders %d, %v)", n, id, holders, err)
		}
	}
	return nil
}

// readThrough reads the last block of orphanData through h and checks it
// came from a server.
func readThrough(ctx context.Context, fs *client.FS, h *client.Handle) error {
	before := fs.Stats().Calls["ReadBlocks"]
	off := len(orphanData) - 64<<10
	buf := make([]byte, 64<<10)
	n, err := h.Read(ctx, buf, int64(off))
	if err != nil {
		return fmt.Errorf("read through the handle: %w", err)
	}
	if !bytes.Equal(buf[:n], orphanData[off:]) {
		return fmt.Errorf("read %d bytes through the handle, not the file's", n)
	}
	if fs.Stats().Calls["ReadBlocks"] == before {
		return fmt.Errorf("the read asked no server")
	}
	return nil
}

// TestOrphanSurvivesFailover: client east opens a file, client eu
// unlinks it, and its primary (west) dies. The server that takes over
// keeps the orphan: east reads, writes and commits through its handle;
// when east closes it, the orphan goes at every replica, the restarted
// west included. Without replicated holders the new primary kept the
// file for ever (the release of a handle it had not counted did nothing).
func TestOrphanSurvivesFailover(t *testing.T) {
	c := startOrphans(t, "")
	ctx := orphanCtx(t)
	a := c.Client("east")
	h, id := openOrphan(t, ctx, a, c.Client("eu"))
	west := failOver(t, ctx, c, id)
	if err := readThrough(ctx, a, h); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if _, err := h.Write(ctx, []byte("after the failover"), 0); err != nil {
		t.Fatalf("write through the handle after the failover: %v", err)
	}
	if err := h.Flush(ctx); err != nil {
		t.Fatalf("commit through the handle after the failover: %v", err)
	}
	// A live holder keeps the orphan past HolderIdle.
	keptFor(t, ctx, c, id, orphanIdle+3*time.Second, "HolderIdle")
	h.Release(ctx)
	c.WaitFor(time.Minute, "the orphan gone at every replica", func() error {
		return orphanGone(t, ctx, c, id)
	})
	c.Restart(west)
	c.WaitFor(time.Minute, "the orphan gone at the restarted primary too", func() error {
		tab, err := c.Conf.Table(ctx)
		if err != nil {
			return err
		}
		if !slices.Contains(tab.Slices[id.Slice()].Replicas, west.ID()) {
			return nil // replaced: its stale copy is not a replica's
		}
		return orphanGone(t, ctx, c, id, west)
	})
}

// TestReplacedOpenSurvivesFailover: client east resolves a file, client
// eu replaces it by a rename, east opens the old file by id in the rename
// grace, and the primary (west) dies before the grace ends there. The
// server that takes over, where the grace is over by then, keeps the old
// file for east's handle until its release. Opens in the grace used to be
// counted only at the primary until the grace ended, so the new primary
// deleted the file under the handle.
func TestReplacedOpenSurvivesFailover(t *testing.T) {
	const grace = 2 * time.Second
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second,
		Adjust: func(_ *Node, cfg *deploy.Config) {
			cfg.Server.HolderIdle = orphanIdle
			cfg.Server.RenameGrace = grace
		}})
	ctx := orphanCtx(t)
	a, b := c.Client("east"), c.Client("eu")
	if err := b.WriteFile(ctx, Owner(), orphanPath, orphanData, 0o644); err != nil {
		t.Fatal(err)
	}
	r := resolve(t, ctx, a, Owner(), orphanPath)
	id := oid.ID(r.Meta.Id)
	if err := b.WriteFile(ctx, Owner(), orphanPath+".new", []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := renamePath(ctx, b, Owner(), orphanPath+".new", orphanPath, 0); err != nil {
		t.Fatal(err)
	}
	h, _, err := a.Open(ctx, Owner(), r.Cues, id, syscall.O_RDONLY)
	if err != nil {
		t.Fatalf("open of the replaced file by id in the grace: %v", err)
	}
	defer h.Release(ctx)
	// The handle is a holder at both replicas at once, beside the grace.
	heldAtReplicas(t, ctx, c, id, 2, "the replaced file held by the grace and the handle")
	crashPrimary(t, ctx, c, id)
	// Past the grace and a sweep at the new primary, the file is still
	// there for the handle.
	keptFor(t, ctx, c, id, grace+3*time.Second, "the grace and a sweep")
	if err := readThrough(ctx, a, h); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	h.Release(ctx)
	c.WaitFor(time.Minute, "the replaced file gone at every replica", func() error {
		return orphanGone(t, ctx, c, id)
	})
}

// TestOrphanEndsWithItsSession: as TestOrphanSurvivesFailover, but the
// holder's client host is then cut off for good without closing
// anything (no bye): the new primary removes the orphan once the
// session showed no sign for HolderIdle. Without replicated holders the
// file stayed for ever.
func TestOrphanEndsWithItsSession(t *testing.T) {
	c := startOrphans(t, "east")
	ctx := orphanCtx(t)
	a := c.Client("east")
	h, id := openOrphan(t, ctx, a, c.Client("eu"))
	failOver(t, ctx, c, id)
	if err := readThrough(ctx, a, h); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	c.Network.Isolate("edge")
	cut := time.Now()
	c.WaitFor(2*time.Minute, "the orphan of the vanished client gone at every replica", func() error {
		return orphanGone(t, ctx, c, id)
	})
	if took := time.Since(cut); took < orphanIdle {
		t.Errorf("the orphan went %v after its client was cut off, before HolderIdle (%v)", took, orphanIdle)
	}
}

// TestOrphanSurvivesRestartOfAll: every server stops and starts again
// while a client holds an unlinked file open. The restarted primary
// neither deletes it at start (it used to: orphans were taken for
// leftovers of the previous process) nor keeps it after the release.
func TestOrphanSurvivesRestartOfAll(t *testing.T) {
	c := startOrphans(t, "")
	ctx := orphanCtx(t)
	a := c.Client("east")
	h, id := openOrphan(t, ctx, a, c.Client("eu"))
	heldAtReplicas(t, ctx, c, id, 1, "the orphan")
	nodes := c.Servers("")
	c.StopAll(nodes...)
	for _, n := range nodes {
		c.Restart(n)
	}
	if err := readThrough(ctx, a, h); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if _, err := h.Write(ctx, []byte("after the restart"), 0); err != nil {
		t.Fatalf("write through the handle after the restart: %v", err)
	}
	if err := h.Flush(ctx); err != nil {
		t.Fatalf("commit through the handle after the restart: %v", err)
	}
	h.Release(ctx)
	c.WaitFor(time.Minute, "the orphan gone at every replica", func() error {
		return orphanGone(t, ctx, c, id)
	})
}

// TestOpenBeforeFailoverUnlinkAfter: client east opens a file, its
// primary (west) dies, and client eu unlinks it at the server that took
// over. That server counted no open of the file; east's client core
// registers its open there, so the unlink makes an orphan instead of
// deleting the file under the handle. Without the registration the
// unlink deleted it and east's next read through the handle failed.
func TestOpenBeforeFailoverUnlinkAfter(t *testing.T) {
	c := startOrphans(t, "")
	ctx := orphanCtx(t)
	a, b := c.Client("east"), c.Client("eu")
	// The directory fails over with the file: the root's slice keeps
	// three replicas, and with one of three servers down takes no write.
	const dir = "/.Site=west/.RepLevel=2/d"
	const path = dir + "/f"
	if _, err := a.Mkdir(ctx, Owner(), dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteFile(ctx, Owner(), path, orphanData, 0o644); err != nil { // not cached at a
		t.Fatal(err)
	}
	r := resolve(t, ctx, a, Owner(), path)
	id := oid.ID(r.Meta.Id)
	h, _, err := a.Open(ctx, Owner(), r.Cues, id, syscall.O_RDWR)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	crashPrimary(t, ctx, c, id)
	p, err := c.Primary(ctx, id.Slice())
	if err != nil {
		t.Fatal(err)
	}
	c.WaitFor(30*time.Second, "east's open registered at the new primary", func() error {
		if n := srv(t, p).Opens(id); n != 1 {
			return fmt.Errorf("%s counts %d opens of %v", p, n, id)
		}
		return nil
	})
	rb := resolve(t, ctx, b, Owner(), path)
	if err := b.Remove(ctx, Owner(), rb.Cues, rb.Parent, rb.Name, false); err != nil {
		t.Fatalf("unlink %s while open, after the failover: %v", path, err)
	}
	if err := readThrough(ctx, a, h); err != nil {
		t.Fatalf("after the unlink: %v", err)
	}
	if _, err := h.Write(ctx, []byte("after the unlink"), 0); err != nil {
		t.Fatalf("write through the handle after the unlink: %v", err)
	}
	if err := h.Flush(ctx); err != nil {
		t.Fatalf("commit through the handle after the unlink: %v", err)
	}
	h.Release(ctx)
	c.WaitFor(time.Minute, "the orphan gone at every replica", func() error {
		return orphanGone(t, ctx, c, id)
	})
}
