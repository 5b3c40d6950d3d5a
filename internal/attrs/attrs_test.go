package attrs

import (
	"errors"
	"syscall"
	"testing"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/wire"
)

func TestApply(t *testing.T) {
	owner := perm.Cred{Uid: 1000, Gid: 1000}
	writer := perm.Cred{Uid: 1001, Gid: 1000} // in the file's group, which may write
	other := perm.Cred{Uid: 1002, Gid: 1002}
	file := func() *wire.Meta {
		return &wire.Meta{Type: wire.Type_TYPE_FILE, Mode: 0o6775, Uid: 1000, Gid: 1000, MtimeNs: 5}
	}
	tests := []struct {
		name     string
		c        perm.Cred
		req      *wire.SetAttrRequest
		wantErr  syscall.Errno
		wantMode uint32
	}{
		{"owner chmod", owner, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o644}, 0, 0o644},
		{"other chmod refused", other, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o777}, syscall.EPERM, 0o6775},
		{"writer drops suid/sgid before writing", writer, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o0775}, 0, 0o0775},
		{"writer may not change other bits", writer, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o0777}, syscall.EPERM, 0o6775},
		{"non-writer may not drop suid", other, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o0775}, syscall.EPERM, 0o6775},
		{"other explicit utimens refused", other, &wire.SetAttrRequest{Valid: wire.SetMtime, MtimeNs: 9}, syscall.EPERM, 0o6775},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := file()
			err := Apply(tt.c, m, tt.req, 100)
			var got syscall.Errno
			if err != nil {
				got = fserr.Errno(err)
			}
			if got != tt.wantErr || m.Mode != tt.wantMode {
				t.Fatalf("err %v mode %o, want err %v mode %o", err, m.Mode, tt.wantErr, tt.wantMode)
			}
			if err != nil && m.MtimeNs != 5 {
				t.Fatal("meta changed on error")
			}
		})
	}
}

// TestACLXattrs sets an access ACL through its xattr, then checks that
// chmod moves the mask (not the owning group's entry), that a named user's
// access follows, and that removing the ACL keeps the mode.
func TestACLXattrs(t *testing.T) {
	owner, named := perm.Cred{Uid: 1000, Gid: 1000}, perm.Cred{Uid: 1001, Gid: 1001}
	m := &wire.Meta{Type: wire.Type_TYPE_FILE, Mode: 0o600, Uid: 1000, Gid: 1000}
	none := perm.ACL{{Tag: perm.TagUserObj, ID: ^uint32(0)}}
	acl := perm.ACL{
		{Tag: perm.TagUserObj, Perm: 6, ID: ^uint32(0)}, {Tag: perm.TagUser, Perm: 6, ID: 1001},
		{Tag: perm.TagGroupObj, Perm: 4, ID: ^uint32(0)}, {Tag: perm.TagMask, Perm: 6, ID: ^uint32(0)},
		{Tag: perm.TagOther, Perm: 0, ID: ^uint32(0)},
	}
	if err := SetACLXattr(named, m, perm.XattrACLAccess, acl.Xattr(), false); !errors.Is(err, fserr.ErrPerm) {
		t.Fatalf("non-owner: %v, want EPERM", err)
	}
	if err := SetACLXattr(owner, m, perm.XattrACLAccess, none.Xattr(), false); !errors.Is(err, fserr.ErrInvalid) {
		t.Fatalf("malformed: %v, want EINVAL", err)
	}
	if err := SetACLXattr(owner, m, perm.XattrACLAccess, acl.Xattr(), false); err != nil {
		t.Fatal(err)
	}
	if m.Mode != 0o660 || perm.Access(named, Of(m), perm.W) != nil {
		t.Fatalf("after setfacl: mode %o, named user's write %v", m.Mode, perm.Access(named, Of(m), perm.W))
	}
	if err := Apply(owner, m, &wire.SetAttrRequest{Valid: wire.SetMode, Mode: 0o640}, 0); err != nil {
		t.Fatal(err)
	}
	v, ok := ACLXattr(m, perm.XattrACLAccess)
	got, err := perm.ParseACLXattr(v)
	if !ok || err != nil || got[3].Perm != 4 || got[2].Perm != 4 {
		t.Fatalf("after chmod 640: %v (%v); want mask r-- and group r--", got, err)
	}
	if perm.Access(named, Of(m), perm.W) == nil || perm.Access(named, Of(m), perm.R) != nil {
		t.Fatal("named user's access does not follow the mask")
	}
	if err := SetACLXattr(owner, m, perm.XattrACLAccess, nil, true); err != nil {
		t.Fatal(err)
	}
	if _, ok := ACLXattr(m, perm.XattrACLAccess); ok || m.Mode != 0o640 {
		t.Fatalf("after removal: ACL still there (%v) or mode %o changed", ok, m.Mode)
	}
	if err := SetACLXattr(owner, m, perm.XattrACLAccess, nil, true); err != nil {
		t.Fatalf("removing a missing ACL: %v, want success as on ext4", err)
	}
	if err := SetACLXattr(owner, m, perm.XattrACLDefault, nil, true); err != nil {
		t.Fatalf("removing a file's (missing) default ACL: %v, want success", err)
	}
}
