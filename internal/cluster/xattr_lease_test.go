package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Extended attributes and missing names under the meta-data lease (issue
// 11): a client that holds a lease answers getxattr (ENODATA too),
// listxattr and lookups of missing names without a round trip, and a
// change made elsewhere is seen at once, because it revokes the lease.

// calls returns the requests fs sends while fn runs.
func calls(fs *client.FS, fn func()) client.Stats {
	before := fs.Stats()
	fn()
	return fs.Stats().Sub(before)
}

// resolvesMissing checks that path does not exist for fs.
func resolvesMissing(ctx context.Context, fs *client.FS, path string) error {
	r, err := fs.Resolve(ctx, Owner(), path)
	if err != nil || r.Meta != nil {
		return fmt.Errorf("resolve %s: %+v, %v; want missing", path, r, err)
	}
	return nil
}

// xattrIs checks fs's value of path's attribute name; want nil: missing.
func xattrIs(ctx context.Context, fs *client.FS, u client.User, id oid.ID, name string, want []byte) error {
	got, err := fs.GetXattr(ctx, u, client.NoCues, id, name)
	if want == nil {
		if !errors.Is(err, fserr.ErrNoAttr) {
			return fmt.Errorf("getxattr %q: %q, %v; want ENODATA", name, got, err)
		}
		return nil
	}
	if err != nil || !bytes.Equal(got, want) {
		return fmt.Errorf("getxattr %q: %q, %v; want %q", name, got, err, want)
	}
	return nil
}

func xattrNamesAre(ctx context.Context, fs *client.FS, id oid.ID, want ...string) error {
	got, err := fs.ListXattr(ctx, Owner(), client.NoCues, id)
	if err != nil || !slices.Equal(got, want) {
		return fmt.Errorf("listxattr: %q, %v; want %q", got, err, want)
	}
	return nil
}

// TestXattrsUnderLease checks that a client at another site answers
// getxattr and listxattr from its lease — a missing attribute, a small
// one, and a large one after fetching it once — and sees a setxattr or
// removexattr made at another site as soon as it returned.
func TestXattrsUnderLease(t *testing.T) {
	t.Parallel()
	const rtt = 100 * time.Millisecond
	_, ctx, west, east := leasedSites(t, rtt)
	for _, name := range []string{"f", "g"} {
		if err := west.WriteFile(ctx, Owner(), "/d/"+name, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, g := mustID(t, west, "/d/f"), mustID(t, west, "/d/g")
	big := bytes.Repeat([]byte("b"), 1000) // more than a summary carries
	for name, v := range map[string][]byte{"user.small": []byte("v1"), "user.big": big} {
		if err := west.SetXattr(ctx, Owner(), client.NoCues, f, name, v, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The first contact with a server opens the back channel and gets no
	// lease; after that, stat takes leases and summaries.
	for range 2 {
		mustID(t, east, "/d/f")
		mustID(t, east, "/d/g")
	}
	warm := func() {
		for _, err := range []error{
			xattrIs(ctx, east, Owner(), f, "security.selinux", nil),
			xattrIs(ctx, east, Owner(), g, "security.selinux", nil),
			xattrIs(ctx, east, Owner(), f, "user.small", []byte("v1")),
			xattrNamesAre(ctx, east, f, "user.big", "user.small"),
			xattrNamesAre(ctx, east, g),
		} {
			if err != nil {
				t.Error(err)
			}
		}
		mustID(t, east, "/d/f")
	}
	if n := calls(east, warm); n.Total() != 0 {
		t.Errorf("warm stat, getxattr and listxattr sent %v; want none", n.Calls)
	}
	// A large value is asked for once, then kept under the lease.
	n := calls(east, func() {
		for range 3 {
			if err := xattrIs(ctx, east, Owner(), f, "user.big", big); err != nil {
				t.Error(err)
			}
		}
	})
	if n.Total() != 1 || n.Calls["GetXattr"] != 1 {
		t.Errorf("three reads of a large attribute sent %v; want one GetXattr", n.Calls)
	}

	// Changes at another site: seen by the next call, no waiting.
	if err := west.SetXattr(ctx, Owner(), client.NoCues, f, "user.small", []byte("v2"), 0); err != nil {
		t.Fatal(err)
	}
	if err := xattrIs(ctx, east, Owner(), f, "user.small", []byte("v2")); err != nil {
		t.Errorf("after west's setxattr: %v", err)
	}
	if err := west.SetXattr(ctx, Owner(), client.NoCues, g, "user.new", []byte("n"), 0); err != nil {
		t.Fatal(err)
	}
	if err := xattrNamesAre(ctx, east, g, "user.new"); err != nil {
		t.Errorf("after west's setxattr of a new name: %v", err)
	}
	if err := west.RemoveXattr(ctx, Owner(), client.NoCues, f, "user.small"); err != nil {
		t.Fatal(err)
	}
	if err := xattrIs(ctx, east, Owner(), f, "user.small", nil); err != nil {
		t.Errorf("after west's removexattr: %v", err)
	}
	if err := xattrNamesAre(ctx, east, f, "user.big"); err != nil {
		t.Errorf("after west's removexattr: %v", err)
	}
	// The reads that followed the changes took new leases.
	n = calls(east, func() {
		for _, err := range []error{
			xattrIs(ctx, east, Owner(), f, "user.small", nil),
			xattrIs(ctx, east, Owner(), g, "user.new", []byte("n")),
			xattrNamesAre(ctx, east, g, "user.new"),
		} {
			if err != nil {
				t.Error(err)
			}
		}
	})
	if n.Total() != 0 {
		t.Errorf("reads after the changes were seen sent %v; want none", n.Calls)
	}
	// A change by the reader itself is seen by itself.
	if err := east.SetXattr(ctx, Owner(), client.NoCues, g, "user.new", []byte("mine"), 0); err != nil {
		t.Fatal(err)
	}
	if err := xattrIs(ctx, east, Owner(), g, "user.new", []byte("mine")); err != nil {
		t.Errorf("after its own setxattr: %v", err)
	}

	// Permissions are checked on the cached attributes as the server
	// checks them: another user may not read user.* of a file it cannot
	// read, and does not see trusted.* (which only root may set).
	if Owner().Uid != 0 {
		return
	}
	if err := west.SetXattr(ctx, Owner(), client.NoCues, g, "trusted.t", []byte("t"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := west.SetAttr(ctx, Owner(), client.NoCues, g, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	other := client.User{Uid: 4242, Gid: 4242}
	mustID(t, east, "/d/g") // a new lease after the changes
	n = calls(east, func() {
		if _, err := east.GetXattr(ctx, other, client.NoCues, g, "user.new"); !errors.Is(err, fserr.ErrAccess) {
			t.Errorf("another user reading user.* of a 0600 file: %v, want EACCES", err)
		}
		if err := xattrIs(ctx, east, other, g, "trusted.t", nil); err != nil {
			t.Errorf("another user: %v", err)
		}
		if got, err := east.ListXattr(ctx, other, client.NoCues, g); err != nil || !slices.Equal(got, []string{"user.new"}) {
			t.Errorf("another user lists %q, %v; want [user.new]", got, err)
		}
		if err := xattrIs(ctx, east, Owner(), g, "trusted.t", []byte("t")); err != nil {
			t.Errorf("root: %v", err)
		}
	})
	if n.Total() != 0 {
		t.Errorf("permission checks sent %v; want none", n.Calls)
	}
}

// TestNegativeLookupUnderLease checks that a lookup of a missing name is
// answered from the directory's lease, and that a create, rename or link
// of that name at another site is seen by the very next lookup.
func TestNegativeLookupUnderLease(t *testing.T) {
	t.Parallel()
	const rtt = 100 * time.Millisecond
	_, ctx, west, east := leasedSites(t, rtt)
	if err := west.WriteFile(ctx, Owner(), "/d/f", []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := func(path string) error { return resolvesMissing(ctx, east, path) }
	// A listing read under the lease answers for the names it lacks.
	for range 2 { // the first contact gets no lease
		listNames(t, east, "/d")
		mustID(t, east, "/d")
	}
	n := calls(east, func() {
		if err := missing("/d/unlisted"); err != nil {
			t.Error(err)
		}
	})
	if n.Total() != 0 {
		t.Errorf("a lookup of a name missing from a leased listing sent %v; want none", n.Calls)
	}
	names := []string{"created", "renamed", "linked"}
	for range 2 {
		for _, name := range names {
			if err := missing("/d/" + name); err != nil {
				t.Fatal(err)
			}
		}
	}
	n = calls(east, func() {
		for _, name := range names {
			if err := missing("/d/" + name); err != nil {
				t.Error(err)
			}
		}
	})
	if n.Total() != 0 {
		t.Errorf("warm lookups of missing names sent %v; want none", n.Calls)
	}

	d := mustID(t, west, "/d")
	if err := west.WriteFile(ctx, Owner(), "/d/created", []byte("c"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, east, "/d/created", []byte("c")); err != nil {
		t.Errorf("right after west's create: %v", err)
	}
	if err := west.WriteFile(ctx, Owner(), "/d/tmp", []byte("r"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := missing("/d/renamed"); err != nil { // a lease again
		t.Fatal(err)
	}
	if err := west.Rename(ctx, Owner(), client.NoCues, d, "tmp", d, "renamed", 0); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, east, "/d/renamed", []byte("r")); err != nil {
		t.Errorf("right after west's rename: %v", err)
	}
	if err := missing("/d/linked"); err != nil {
		t.Fatal(err)
	}
	if _, err := west.Link(ctx, Owner(), client.NoCues, d, "linked", mustID(t, west, "/d/f")); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, east, "/d/linked", []byte("f")); err != nil {
		t.Errorf("right after west's link: %v", err)
	}
	// A name the reader removes itself is gone for itself, and a name it
	// creates is there.
	if err := east.Remove(ctx, Owner(), client.NoCues, d, "linked", false); err != nil {
		t.Fatal(err)
	}
	if err := missing("/d/linked"); err != nil {
		t.Errorf("after its own unlink: %v", err)
	}
	if err := east.WriteFile(ctx, Owner(), "/d/linked", []byte("e"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, east, "/d/linked", []byte("e")); err != nil {
		t.Errorf("after its own create: %v", err)
	}
}
