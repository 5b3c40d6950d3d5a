package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Renames between directories whose primaries are different servers
// (server/xrename.go): /a at west, /b at east, objects at west, east or eu.

// renameSetup starts three sites and makes /a (west) and /b (east).
func renameSetup(t *testing.T, o Options) (*Cluster, context.Context) {
	o.Sites = []string{"west", "east", "eu"}
	c := Start(t, o)
	ctx := opCtx(t)
	fs := c.Client("west")
	for _, d := range []string{"/.Site=west/a", "/.Site=east/b"} {
		if _, err := fs.Mkdir(ctx, Owner(), d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	for path, site := range map[string]string{"/a": "west", "/b": "east"} {
		if n, err := c.PrimaryOf(ctx, fs, path); err != nil || n.Site != site {
			t.Fatalf("%s: primary %v (%v), want one at %s", path, n, err, site)
		}
	}
	return c, ctx
}

func resolve(t *testing.T, ctx context.Context, fs *client.FS, u client.User, path string) *client.Resolved {
	t.Helper()
	r, err := fs.Resolve(ctx, u, path)
	if err != nil {
		t.Fatalf("resolve %s: %v", path, err)
	}
	return r
}

// renamePath renames src to dst (absolute paths without cues).
func renamePath(ctx context.Context, fs *client.FS, u client.User, src, dst string, flags uint32) error {
	rs, err := fs.Resolve(ctx, u, src)
	if err != nil {
		return err
	}
	rd, err := fs.Resolve(ctx, u, dst)
	if err != nil {
		return err
	}
	return fs.Rename(ctx, u, client.NoCues, rs.Parent, rs.Name, rd.Parent, rd.Name, flags)
}

// checkFile fails unless path, seen from every site's client, holds data
// and its object has nlink links.
func checkFile(t *testing.T, ctx context.Context, c *Cluster, path string, data []byte, nlink uint32) {
	t.Helper()
	for _, site := range c.Sites() {
		fs := c.Client(site)
		if err := readIs(ctx, fs, path, data); err != nil {
			t.Fatalf("client at %s: %v", site, err)
		}
		r := resolve(t, ctx, fs, Owner(), path)
		m, err := fs.GetAttr(ctx, Owner(), client.NoCues, oid.ID(r.Meta.Id))
		if err != nil {
			t.Fatalf("client at %s: getattr %s: %v", site, path, err)
		}
		if m.Nlink != nlink {
			t.Fatalf("client at %s: %s has nlink %d, want %d", site, path, m.Nlink, nlink)
		}
	}
}

func checkGone(t *testing.T, ctx context.Context, c *Cluster, path string) {
	t.Helper()
	for _, site := range c.Sites() {
		if r := resolve(t, ctx, c.Client(site), Owner(), path); r.Meta != nil {
			t.Fatalf("client at %s still finds %s", site, path)
		}
	}
}

func TestRenameAcrossServers(t *testing.T) {
	c, ctx := renameSetup(t, Options{})
	fs := c.Client("west")
	// The object lives at the source's server, the destination's, or a third.
	for _, site := range []string{"west", "east", "eu"} {
		t.Run("object at "+site, func(t *testing.T) {
			src, dst := "/a/f-"+site, "/b/g-"+site
			data := []byte("contents placed at " + site)
			if err := fs.WriteFile(ctx, Owner(), "/.Site="+site+src, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if n, err := c.PrimaryOf(ctx, fs, src); err != nil || n.Site != site {
				t.Fatalf("object primary %v (%v), want %s", n, err, site)
			}
			if err := renamePath(ctx, fs, Owner(), src, dst, 0); err != nil {
				t.Fatal(err)
			}
			checkGone(t, ctx, c, src)
			checkFile(t, ctx, c, dst, data, 1)
			// And back, from a client at another site.
			if err := renamePath(ctx, c.Client("eu"), Owner(), dst, src, 0); err != nil {
				t.Fatal(err)
			}
			checkGone(t, ctx, c, dst)
			checkFile(t, ctx, c, src, data, 1)
		})
	}
}

func TestRenameAcrossServersReplaces(t *testing.T) {
	const grace = 2 * time.Second
	c, ctx := renameSetup(t, Options{Adjust: func(_ *Node, cfg *deploy.Config) { cfg.Server.RenameGrace = grace }})
	fs := c.Client("west")
	// The replaced object lives at the destination's server or a third.
	for _, site := range []string{"east", "eu"} {
		t.Run("replaced at "+site, func(t *testing.T) {
			src, dst := "/a/new-"+site, "/b/old-"+site
			if err := fs.WriteFile(ctx, Owner(), "/.Site="+site+dst, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			old := resolve(t, ctx, fs, Owner(), dst).Meta
			data := []byte("new contents")
			if err := fs.WriteFile(ctx, Owner(), src, data, 0o644); err != nil {
				t.Fatal(err)
			}
			err := renamePath(ctx, fs, Owner(), src, dst, wire.RenameNoReplace)
			if !errors.Is(err, fserr.ErrExist) {
				t.Fatalf("RENAME_NOREPLACE over an existing name: %v, want EEXIST", err)
			}
			checkFile(t, ctx, c, src, data, 1)
			checkFile(t, ctx, c, dst, []byte("old"), 1)

			if err := renamePath(ctx, fs, Owner(), src, dst, 0); err != nil {
				t.Fatal(err)
			}
			// A reader that resolved dst just before the rename opens the
			// old file by id in the rename grace (server/orphans.go), even
			// with the old object at a third server.
			h, _, err := c.Client("eu").Open(ctx, Owner(), client.NoCues, oid.ID(old.Id), 0)
			if err != nil {
				t.Fatalf("open of the replaced file by id in the grace: %v", err)
			}
			buf := make([]byte, 16)
			n, err := h.Read(ctx, buf, 0)
			h.Release(ctx)
			if err != nil || string(buf[:n]) != "old" {
				t.Fatalf("read of the replaced file in the grace: %q, %v", buf[:n], err)
			}
			checkGone(t, ctx, c, src)
			checkFile(t, ctx, c, dst, data, 1)
			WaitFor(t, grace+10*time.Second, "the replaced object to be deleted", func() error {
				if _, err := fs.GetAttr(ctx, Owner(), client.NoCues, oid.ID(old.Id)); !errors.Is(err, fserr.ErrNotExist) {
					return fmt.Errorf("replaced object: %v", err)
				}
				return nil
			})
		})
	}
	t.Run("exchange", func(t *testing.T) {
		if err := fs.WriteFile(ctx, Owner(), "/a/x", nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile(ctx, Owner(), "/b/y", nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := renamePath(ctx, fs, Owner(), "/a/x", "/b/y", wire.RenameExchange); !errors.Is(err, fserr.ErrCrossDevice) {
			t.Fatalf("exchange across servers: %v, want EXDEV", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		if _, err := fs.Mkdir(ctx, Owner(), "/a/sub", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := renamePath(ctx, fs, Owner(), "/a/sub", "/b/sub", 0); !errors.Is(err, fserr.ErrCrossDevice) {
			t.Fatalf("directory across servers: %v, want EXDEV", err)
		}
	})
}

// TestRenameAcrossServersPermission checks that the destination's server
// refuses a user who may not write there, and that the source keeps the
// file with its link count.
func TestRenameAcrossServersPermission(t *testing.T) {
	c, ctx := renameSetup(t, Options{})
	fs := c.Client("west")
	user := client.User{Uid: 54321, Gid: 54321}
	if _, err := fs.Mkdir(ctx, Owner(), "/.Site=east/b/closed", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(ctx, user, "/a/mine", []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := renamePath(ctx, fs, user, "/a/mine", "/b/closed/mine", 0)
	if !errors.Is(err, fserr.ErrAccess) {
		t.Fatalf("rename into a directory the user may not write: %v, want EACCES", err)
	}
	checkFile(t, ctx, c, "/a/mine", []byte("mine"), 1)
	checkGone(t, ctx, c, "/b/closed/mine")
	// Into /b (mode 0777) the same user may.
	if err := renamePath(ctx, fs, user, "/a/mine", "/b/mine", 0); err != nil {
		t.Fatal(err)
	}
	checkFile(t, ctx, c, "/b/mine", []byte("mine"), 1)
}

// TestRenameAcrossServersCrash crashes the source directory's server after
// the destination added the name and before the source removed its own:
// after failover the file is named by at least one directory, its link
// count counts every name, and removing the extra name leaves it whole.
func TestRenameAcrossServersCrash(t *testing.T) {
	linked := make(chan struct{})
	release := make(chan struct{})
	var fired atomic.Bool
	// Two servers a site: the crashed one's backups are replaced, so the
	// removal at the end is acknowledged by three replicas as before.
	c, ctx := renameSetup(t, Options{ServersPerSite: 2, Adjust: func(n *Node, cfg *deploy.Config) {
		if n.server && n.Site == "west" {
			cfg.Server.AfterRenameLink = func(ctx context.Context) error {
				if !fired.CompareAndSwap(false, true) {
					return nil
				}
				close(linked)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return errors.New("crashed between link and unlink")
			}
		}
	}})
	fs := c.Client("east")
	data := []byte("survives the crash")
	if err := fs.WriteFile(ctx, Owner(), "/.Site=west/a/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	west, err := c.PrimaryOf(ctx, fs, "/a")
	if err != nil || west.Site != "west" {
		t.Fatalf("primary of /a: %v, %v", west, err)
	}
	done := make(chan error, 1)
	go func() { done <- renamePath(ctx, fs, Owner(), "/a/f", "/b/g", 0) }()
	select {
	case <-linked:
	case err := <-done:
		t.Fatalf("rename finished before the hook: %v", err)
	case <-ctx.Done():
		t.Fatal("the hook never ran")
	}
	c.Crash(west)
	close(release)
	// The client retries at the slice's new primary; both outcomes are
	// allowed, the file must stay reachable either way.
	select {
	case err := <-done:
		t.Logf("rename after the crash: %v", err)
	case <-ctx.Done():
		t.Fatal("rename still running")
	}
	eu := c.Client("eu")
	var names []string
	WaitFor(t, 30*time.Second, "the file to be reachable", func() error {
		names = names[:0]
		for _, p := range []string{"/a/f", "/b/g"} {
			r, err := eu.Resolve(ctx, Owner(), p)
			if err != nil {
				return err
			}
			if r.Meta != nil {
				names = append(names, p)
			}
		}
		if len(names) == 0 {
			return errors.New("named by no directory")
		}
		return nil
	})
	t.Logf("names after the crash: %v", names)
	for _, p := range names {
		checkFile(t, ctx, c, p, data, uint32(len(names)))
	}
	if len(names) == 2 {
		r := resolve(t, ctx, eu, Owner(), "/a/f")
		if err := eu.Remove(ctx, Owner(), client.NoCues, r.Parent, r.Name, false); err != nil {
			t.Fatal(err)
		}
		checkGone(t, ctx, c, "/a/f")
		checkFile(t, ctx, c, "/b/g", data, 1)
	}
}
