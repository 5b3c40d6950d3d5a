package cluster

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
)

// Permission belongs to the open: the primary of a file records what each
// open granted and checks writes through it against that (server/opens.go).

// user1k is an unprivileged user.
var user1k = client.User{Uid: 1000, Gid: 1000}

// opened is a handle with the cues of the path it was opened by.
type opened struct {
	*client.Handle
	cues cue.Set
}

// createOpen is open(path, O_CREAT|O_EXCL|O_RDWR, mode) as u.
func createOpen(t *testing.T, fs *client.FS, u client.User, path string, mode uint32) opened {
	t.Helper()
	ctx := opCtx(t)
	r := resolve(t, ctx, fs, u, path)
	h, _, err := fs.CreateOpen(ctx, u, r.Cues, r.Parent, r.Name, client.CreateArgs{Mode: mode}, syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR)
	if err != nil {
		t.Fatalf("create+open %s with mode %o: %v", path, mode, err)
	}
	return opened{h, r.Cues}
}

// writeThrough writes data through h, commits, and truncates to its
// length through h (ftruncate).
func writeThrough(t *testing.T, fs *client.FS, u client.User, h opened, data string) error {
	t.Helper()
	ctx := opCtx(t)
	if _, err := h.Write(ctx, []byte(data+"tail"), 0); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := h.Flush(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	_, err := fs.ChangeAttr(ctx, u, h.cues, h.ID(), client.AttrChange{Valid: client.SetSize, Size: uint64(len(data)), Handle: h.Handle})
	if err != nil {
		return fmt.Errorf("ftruncate: %w", err)
	}
	return nil
}

// TestCreateOpenAtAnotherServer: the directory's primary is at west, the
// new file goes to a server at the creating client's site (write-local,
// two-step create). The open made with the create is counted and granted
// there, where the file's data goes: a user creating a file with mode 0
// writes it through that open, and only through it.
func TestCreateOpenAtAnotherServer(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east"}})
	ctx := opCtx(t)
	if _, err := c.Client("west").Mkdir(ctx, Owner(), "/.Site=west/d", 0o777); err != nil {
		t.Fatal(err)
	}
	east := c.Client("east")
	h := createOpen(t, east, user1k, "/d/f", 0)
	dirPrimary, err := c.PrimaryOf(ctx, east, "/d")
	if err != nil {
		t.Fatal(err)
	}
	filePrimary, err := c.Primary(ctx, h.ID().Slice())
	if err != nil {
		t.Fatal(err)
	}
	if dirPrimary.Site != "west" || filePrimary.Site != "east" {
		t.Fatalf("directory's primary at %s, file's at %s: want west and east (a two-step create)", dirPrimary.Site, filePrimary.Site)
	}
	if err := writeThrough(t, east, user1k, h, "written through the creating open"); err != nil {
		t.Fatalf("through the open that created a mode 0 file: %v", err)
	}
	h.Release(ctx)
	if err := readIs(ctx, c.Client("west"), "/d/f", []byte("written through the creating open")); err != nil {
		t.Fatal(err)
	}
	// Any later open is checked against the mode.
	if _, _, err := east.Open(ctx, user1k, client.NoCues, h.ID(), syscall.O_RDWR); fserr.Errno(err) != syscall.EACCES {
		t.Fatalf("a second open of a mode 0 file: %v, want EACCES", err)
	}
}

// TestGrantsAfterFailover: grants are the primary's soft state, not
// replicated. The server that takes a slice over does not know the opens
// made at its predecessor and checks calls through them against the mode
// (docs/ARCHITECTURE.md): an open that the mode allows carries on; the
// open that created a mode 0 file loses its write access.
func TestGrantsAfterFailover(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east"}, LockTTL: 2 * time.Second})
	ctx := opCtx(t)
	east := c.Client("east")
	if _, err := east.Mkdir(ctx, Owner(), "/.Site=west/d", 0o777); err != nil {
		t.Fatal(err)
	}
	// Both files at west (the .Site cue), their client at east; commits
	// need only the primary (.SyncLevel=1), so that east alone can take
	// them after the failover.
	private := createOpen(t, east, user1k, "/.Site=west/.SyncLevel=1/d/private", 0o600)
	nomode := createOpen(t, east, user1k, "/.Site=west/.SyncLevel=1/d/nomode", 0)
	for _, h := range []opened{private, nomode} {
		if err := writeThrough(t, east, user1k, h, "v1"); err != nil {
			t.Fatalf("before the failover: %v", err)
		}
	}
	primary, err := c.Primary(ctx, nomode.ID().Slice())
	if err != nil || primary.Site != "west" || private.ID().Slice() != nomode.ID().Slice() {
		t.Fatalf("primary %v (%v) of slices %v and %v: want one slice at west", primary, err, private.ID().Slice(), nomode.ID().Slice())
	}
	c.WaitFor(30*time.Second, "east's copy up to date", func() error { return converged(ctx, t, c) })
	c.Crash(primary)
	c.WaitFor(30*time.Second, "east takes over", func() error {
		n, err := c.Primary(ctx, nomode.ID().Slice())
		if err != nil || n == nil || n.Site != "east" {
			return fmt.Errorf("primary %v (%v)", n, err)
		}
		return nil
	})
	if err := writeThrough(t, east, user1k, private, "v2"); err != nil {
		t.Errorf("through an open of a 0600 file of its user, after the failover: %v", err)
	}
	if err := writeThrough(t, east, user1k, nomode, "v2"); fserr.Errno(err) != syscall.EACCES {
		t.Errorf("through the open that created a mode 0 file, after the failover: %v, want EACCES", err)
	}
	private.Release(ctx)
	nomode.Release(ctx)
	if err := readIs(ctx, east, "/d/private", []byte("v2")); err != nil {
		t.Error(err)
	}
}
