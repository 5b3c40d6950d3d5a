package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

var root = client.User{}

func host(t *testing.T) (*client.FS, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return deploytest.Start(t, nil).Client, ctx
}

func mk(t *testing.T, fs *client.FS, ctx context.Context, dir oid.ID, name string, typ wire.Type) oid.ID {
	t.Helper()
	m, err := fs.Create(ctx, root, client.NoCues, dir, name, client.CreateArgs{Type: typ, Mode: 0o755})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return oid.ID(m.Id)
}

// TestRenameSemantics checks rename(2)'s rules at the primary.
func TestRenameSemantics(t *testing.T) {
	fs, ctx := host(t)
	a := mk(t, fs, ctx, oid.Root, "a", wire.Type_TYPE_DIR)
	b := mk(t, fs, ctx, a, "b", wire.Type_TYPE_DIR)
	mk(t, fs, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	mk(t, fs, ctx, oid.Root, "g", wire.Type_TYPE_FILE)
	mk(t, fs, ctx, b, "x", wire.Type_TYPE_FILE) // b is not empty

	tests := []struct {
		name   string
		srcDir oid.ID
		src    string
		dstDir oid.ID
		dst    string
		flags  uint32
		want   syscall.Errno
	}{
		{"directory into its own subtree", oid.Root, "a", b, "a2", 0, syscall.EINVAL},
		{"file over directory", oid.Root, "f", a, "b", 0, syscall.EISDIR},
		{"directory over file", a, "b", oid.Root, "f", 0, syscall.ENOTDIR},
		{"noreplace over existing", oid.Root, "f", oid.Root, "g", wire.RenameNoReplace, syscall.EEXIST},
		{"exchange with missing", oid.Root, "f", oid.Root, "nope", wire.RenameExchange, syscall.ENOENT},
		{"missing source", oid.Root, "nope", oid.Root, "z", 0, syscall.ENOENT},
		{"exchange file and dir", oid.Root, "f", oid.Root, "a", wire.RenameExchange, 0},
	}
	for _, tt := range tests {
		err := fs.Rename(ctx, root, client.NoCues, tt.srcDir, tt.src, tt.dstDir, tt.dst, tt.flags)
		if got := fserr.Errno(err); got != tt.want {
			t.Errorf("%s: errno %v (%v), want %v", tt.name, got, err, tt.want)
		}
	}
	// After the exchange, "a" names the old file and "f" the directory.
	if m, err := fs.Lookup(ctx, root, client.NoCues, oid.Root, "f"); err != nil || oid.ID(m.Id) != a {
		t.Fatalf("after exchange f = %v, %v; want the directory", m, err)
	}
	// Replacing a file with a file drops the old one.
	if err := fs.Rename(ctx, root, client.NoCues, oid.Root, "a", oid.Root, "g", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Lookup(ctx, root, client.NoCues, oid.Root, "a"); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("old name still there: %v", err)
	}
	// A directory moved to a new parent updates both link counts and "..".
	mk(t, fs, ctx, oid.Root, "c", wire.Type_TYPE_DIR)
	c, _ := fs.Lookup(ctx, root, client.NoCues, oid.Root, "c")
	if err := fs.Rename(ctx, root, client.NoCues, a, "b", oid.ID(c.Id), "b", 0); err != nil {
		t.Fatal(err)
	}
	ma, _ := fs.GetAttr(ctx, root, client.NoCues, a)
	mc, _ := fs.GetAttr(ctx, root, client.NoCues, oid.ID(c.Id))
	mb, _ := fs.GetAttr(ctx, root, client.NoCues, b)
	if ma.Nlink != 2 || mc.Nlink != 3 || mb.Parent != c.Id {
		t.Fatalf("nlink a=%d c=%d, parent of b=%x; want 2, 3, %x", ma.Nlink, mc.Nlink, mb.Parent, c.Id)
	}
}

// TestLinkAndUnlinkCounts checks hard links and link counts.
func TestLinkAndUnlinkCounts(t *testing.T) {
	fs, ctx := host(t)
	f := mk(t, fs, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	d := mk(t, fs, ctx, oid.Root, "d", wire.Type_TYPE_DIR)
	if _, err := fs.Link(ctx, root, client.NoCues, oid.Root, "dlink", d); fserr.Errno(err) != syscall.EPERM {
		t.Fatalf("hard link to a directory: %v, want EPERM", err)
	}
	if _, err := fs.Link(ctx, root, client.NoCues, d, "f2", f); err != nil {
		t.Fatal(err)
	}
	if m, _ := fs.GetAttr(ctx, root, client.NoCues, f); m.Nlink != 2 {
		t.Fatalf("nlink after link = %d", m.Nlink)
	}
	if err := fs.Remove(ctx, root, client.NoCues, oid.Root, "f", false); err != nil {
		t.Fatal(err)
	}
	if m, err := fs.GetAttr(ctx, root, client.NoCues, f); err != nil || m.Nlink != 1 {
		t.Fatalf("after unlink of one name: %v, %v", m, err)
	}
	if err := fs.Remove(ctx, root, client.NoCues, oid.Root, "d", false); fserr.Errno(err) != syscall.EISDIR {
		t.Fatalf("unlink of a directory: %v, want EISDIR", err)
	}
	if err := fs.Remove(ctx, root, client.NoCues, d, "f2", true); fserr.Errno(err) != syscall.ENOTDIR {
		t.Fatalf("rmdir of a file: %v, want ENOTDIR", err)
	}
	if err := fs.Remove(ctx, root, client.NoCues, d, "f2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.GetAttr(ctx, root, client.NoCues, f); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("object survives its last link: %v", err)
	}
}

// TestReconcileKeepsRemovedNames checks that a push re-sent after its
// answer was lost (it names an entry the primary has removed since) does
// not bring the name back: the removal left a tombstone.
func TestReconcileKeepsRemovedNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := deploytest.Start(t, func(c *deploy.Config) {
		c.Server.MaintainPeriod = time.Hour // no tombstone collection during the test
	})
	fs := h.Client
	f := mk(t, fs, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	if err := fs.Rename(ctx, root, client.NoCues, oid.Root, "f", oid.Root, "g", 0); err != nil {
		t.Fatal(err)
	}
	if n, err := h.Server.Tombstones(oid.Root); err != nil || n != 1 {
		t.Fatalf("tombstones after rename: %d, %v; want 1", n, err)
	}
	push := &wire.ReconcileRequest{Slice: uint32(oid.Root.Slice()), Source: h.ServerID(),
		Entries: []*wire.EntryChange{
			{Dir: uint64(oid.Root), Name: "f", Entry: &wire.Entry{Name: "f", Id: uint64(f), Type: wire.Type_TYPE_FILE, Version: 1}},
			{Dir: uint64(oid.Root), Name: "new", Entry: &wire.Entry{Name: "new", Id: uint64(f), Type: wire.Type_TYPE_FILE, Version: 1}},
		}}
	if _, err := h.Server.PeerService().Reconcile(ctx, push); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Lookup(ctx, root, client.NoCues, oid.Root, "f"); fserr.Errno(err) != syscall.ENOENT {
		t.Errorf("removed name f came back: %v", err)
	}
	// An entry without a tombstone is merged.
	if m, err := fs.Lookup(ctx, root, client.NoCues, oid.Root, "new"); err != nil || oid.ID(m.Id) != f {
		t.Errorf("pushed name new: %v, %v", m, err)
	}
	// Tombstones are hidden from clients.
	names, err := fs.ListXattr(ctx, root, client.NoCues, oid.Root)
	if err != nil || len(names) != 0 {
		t.Errorf("attributes of / = %q, %v; want none", names, err)
	}
}

// TestSlowWriterOutlivesPendingTTL: a file written for longer than the
// server keeps uploaded blocks that no commit names (store.PendingTTL,
// ten minutes; two seconds here), with pauses longer than that between
// its writes. The blocks uploaded ahead of close used to be forgotten
// before the close committed them: the close failed with EINVAL ("unknown
// block") and the data written so far was lost. The client now commits
// blocks that waited client.Config.StagedFor.
func TestSlowWriterOutlivesPendingTTL(t *testing.T) {
	if client.DefaultStagedFor >= store.PendingTTL/2 {
		t.Fatalf("client.DefaultStagedFor %v is not well inside store.PendingTTL %v", client.DefaultStagedFor, store.PendingTTL)
	}
	const ttl = 2 * time.Second
	h := deploytest.Start(t, func(c *deploy.Config) {
		c.Store.PendingTTL = ttl
		c.Client.StagedFor = ttl / 10
	})
	fs := h.Client
	ctx := t.Context()
	f, _, err := fs.CreateOpen(ctx, root, client.NoCues, oid.Root, "slow", client.CreateArgs{Mode: 0o644}, syscall.O_CREAT|syscall.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 24<<20)
	rand.Read(data)
	third := len(data) / 3
	for i := 0; i < 3; i++ {
		if _, err := f.Write(ctx, data[i*third:(i+1)*third], int64(i*third)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ttl + time.Second) // past the TTL: the next upload sweeps what is older
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	f.Release(ctx)
	got, err := fs.ReadFile(ctx, root, "/slow")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v", len(got), err)
	}
}
