package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
)

// POSIX ACLs (issue 13): kept in the object's meta-data, so they replicate
// and survive the primary's failure; enforced at the primary on the
// caller's identity; a directory's default ACL is inherited at create.

var (
	aclAlice = client.User{Uid: 2001, Gid: 2001} // named user with rw-
	aclBob   = client.User{Uid: 2002, Gid: 2002} // named user with r--
	aclCarol = client.User{Uid: 2003, Gid: 2003} // not named: other
	// in a named group with rw- (a trusted in-process client's groups
	// are taken as given)
	aclDave = client.User{Uid: 2004, Gid: 2004, Groups: []uint32{3000}}
)

func aclEntry(tag uint16, p uint16, id uint32) perm.ACLEntry {
	if tag != perm.TagUser && tag != perm.TagGroup {
		id = ^uint32(0)
	}
	return perm.ACLEntry{Tag: tag, Perm: p, ID: id}
}

// aclIs checks path's ACL attribute name as fs reads it (want nil: none).
func aclIs(ctx context.Context, fs *client.FS, id oid.ID, name string, want perm.ACL) error {
	v, err := fs.GetXattr(ctx, aclCarol, client.NoCues, id, name)
	if want == nil {
		if !errors.Is(err, fserr.ErrNoAttr) {
			return fmt.Errorf("getxattr %s: %v, %v; want ENODATA", name, v, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("getxattr %s: %w", name, err)
	}
	got, err := perm.ParseACLXattr(v)
	if err != nil || !slices.Equal(got, want) {
		return fmt.Errorf("getxattr %s = %v (%v), want %v", name, got, err, want)
	}
	return nil
}

// TestACLNamedUsers sets an access ACL for two named users and a default
// ACL at one site, checks what each user may do from another, that a file
// created there inherits the default ACL, and that the ACLs are still
// there, and enforced, after the primary crashed and a backup took over.
func TestACLNamedUsers(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second, ClientTimeout: 5 * time.Second})
	ctx := opCtx(t)
	west, east := c.Client("west"), c.Client("east")
	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := west.WriteFile(ctx, Owner(), "/d/f", []byte("shared"), 0o640); err != nil {
		t.Fatal(err)
	}
	f, d := mustID(t, west, "/d/f"), mustID(t, west, "/d")
	access := perm.ACL{
		aclEntry(perm.TagUserObj, 6, 0), aclEntry(perm.TagUser, 6, aclAlice.Uid), aclEntry(perm.TagUser, 4, aclBob.Uid),
		aclEntry(perm.TagGroupObj, 4, 0), aclEntry(perm.TagGroup, 6, 3000), aclEntry(perm.TagMask, 6, 0), aclEntry(perm.TagOther, 0, 0),
	}
	if err := west.SetXattr(ctx, aclAlice, client.NoCues, f, perm.XattrACLAccess, access.Xattr(), 0); !errors.Is(err, fserr.ErrPerm) {
		t.Errorf("a named user setting the ACL: %v, want EPERM", err)
	}
	if err := west.SetXattr(ctx, Owner(), client.NoCues, f, perm.XattrACLAccess, []byte{2, 0, 0, 0, 1}, 0); !errors.Is(err, fserr.ErrInvalid) {
		t.Errorf("a malformed ACL: %v, want EINVAL", err)
	}
	if err := west.SetXattr(ctx, Owner(), client.NoCues, f, perm.XattrACLAccess, access.Xattr(), 0); err != nil {
		t.Fatal(err)
	}
	def := perm.ACL{
		aclEntry(perm.TagUserObj, 7, 0), aclEntry(perm.TagUser, 7, aclAlice.Uid), aclEntry(perm.TagUser, 5, aclBob.Uid),
		aclEntry(perm.TagGroupObj, 5, 0), aclEntry(perm.TagMask, 7, 0), aclEntry(perm.TagOther, 0, 0),
	}
	if err := west.SetXattr(ctx, Owner(), client.NoCues, d, perm.XattrACLDefault, def.Xattr(), 0); err != nil {
		t.Fatal(err)
	}
	// The inherited ACL is the default limited by the create mode (0644
	// here): the mask becomes r--.
	if err := west.WriteFile(ctx, Owner(), "/d/new", []byte("inherited"), 0o644); err != nil {
		t.Fatal(err)
	}
	inherited := perm.ACL{
		aclEntry(perm.TagUserObj, 6, 0), aclEntry(perm.TagUser, 7, aclAlice.Uid), aclEntry(perm.TagUser, 5, aclBob.Uid),
		aclEntry(perm.TagGroupObj, 5, 0), aclEntry(perm.TagMask, 4, 0), aclEntry(perm.TagOther, 0, 0),
	}
	newID := mustID(t, west, "/d/new")

	check := func(fs *client.FS, where string) {
		t.Helper()
		for _, tc := range []struct {
			u     client.User
			path  string
			read  bool
			write bool
		}{
			{aclAlice, "/d/f", true, true},
			{aclBob, "/d/f", true, false},
			{aclCarol, "/d/f", false, false},
			{aclDave, "/d/f", true, true},
			{aclDave, "/d/new", false, false},
			{aclAlice, "/d/new", true, false}, // rwx limited by the mask r--
			{aclBob, "/d/new", true, false},
			{aclCarol, "/d/new", false, false},
		} {
			_, err := fs.ReadFile(ctx, tc.u, tc.path)
			if (err == nil) != tc.read || err != nil && !errors.Is(err, fserr.ErrAccess) {
				t.Errorf("%s: uid %d reading %s: %v, want allowed=%v", where, tc.u.Uid, tc.path, err, tc.read)
			}
			r := resolve(t, ctx, fs, tc.u, tc.path)
			_, _, err = fs.Open(ctx, tc.u, r.Cues, oid.ID(r.Meta.Id), 1) // O_WRONLY
			if (err == nil) != tc.write || err != nil && !errors.Is(err, fserr.ErrAccess) {
				t.Errorf("%s: uid %d opening %s for writing: %v, want allowed=%v", where, tc.u.Uid, tc.path, err, tc.write)
			}
		}
		for _, x := range []struct {
			id   oid.ID
			name string
			want perm.ACL
		}{{f, perm.XattrACLAccess, access}, {d, perm.XattrACLDefault, def}, {newID, perm.XattrACLAccess, inherited}, {newID, perm.XattrACLDefault, nil}} {
			if err := aclIs(ctx, fs, x.id, x.name, x.want); err != nil {
				t.Errorf("%s: %v", where, err)
			}
		}
	}
	check(east, "east")
	if err := west.WriteFile(ctx, aclAlice, "/d/f", []byte("by alice"), 0o644); err != nil {
		t.Errorf("alice writing through her ACL entry: %v", err)
	}

	// chmod changes the mask, not the owning group's entry.
	if _, err := west.ChangeAttr(ctx, Owner(), client.NoCues, f, client.AttrChange{Valid: client.SetMode, Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	masked := slices.Clone(access)
	masked[5].Perm = 0
	if err := aclIs(ctx, east, f, perm.XattrACLAccess, masked); err != nil {
		t.Errorf("after chmod 600: %v", err)
	}
	if _, err := east.ReadFile(ctx, aclAlice, "/d/f"); !errors.Is(err, fserr.ErrAccess) {
		t.Errorf("alice reading with the mask ---: %v, want EACCES", err)
	}
	if _, err := west.ChangeAttr(ctx, Owner(), client.NoCues, f, client.AttrChange{Valid: client.SetMode, Mode: 0o660}); err != nil {
		t.Fatal(err)
	}

	// The ACLs are meta-data: after the primary's crash its successor
	// has them and enforces them.
	in, err := info(ctx, west, "/d/f")
	if err != nil {
		t.Fatal(err)
	}
	primary := c.Node(in.Replicas[0].Server)
	c.Crash(primary)
	c.WaitFor(30*time.Second, "a backup takes over", func() error {
		n, err := c.Primary(ctx, oid.Slice(in.Slice))
		if err != nil || n == nil || n == primary {
			return fmt.Errorf("primary %v (%v)", n, err)
		}
		return nil
	})
	survivor := "east"
	if primary.Site == "east" {
		survivor = "eu"
	}
	check(c.Client(survivor), survivor+" after the crash of "+primary.Name)
}
