package perm

import (
	"bytes"
	"errors"
	"slices"
	"syscall"
	"testing"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

func u(id uint32, p uint16) ACLEntry { return ACLEntry{Tag: TagUser, Perm: p, ID: id} }
func g(id uint32, p uint16) ACLEntry { return ACLEntry{Tag: TagGroup, Perm: p, ID: id} }
func e(tag, p uint16) ACLEntry       { return ACLEntry{Tag: tag, Perm: p, ID: undefinedID} }
func acl(es ...ACLEntry) ACL         { return ACL(es) }
func raw(es ...ACLEntry) []byte      { return ACL(es).Xattr() }
func entryBytes(tag, p uint16, id uint32) []byte {
	return []byte{byte(tag), byte(tag >> 8), byte(p), byte(p >> 8), byte(id), byte(id >> 8), byte(id >> 16), byte(id >> 24)}
}

func TestParseACLXattr(t *testing.T) {
	good := acl(e(TagUserObj, 6), u(201, 6), u(202, 4), e(TagGroupObj, 4), g(300, 7), e(TagMask, 6), e(TagOther, 0))
	// What setfacl sends for "u::rw-,u:201:rw-,g::r--,o::---,m::rw-": a
	// header then entries of (tag, perm, id), little-endian.
	wire := []byte{2, 0, 0, 0}
	wire = append(wire, entryBytes(TagUserObj, 6, undefinedID)...)
	wire = append(wire, entryBytes(TagUser, 6, 201)...)
	wire = append(wire, entryBytes(TagGroupObj, 4, undefinedID)...)
	wire = append(wire, entryBytes(TagMask, 6, undefinedID)...)
	wire = append(wire, entryBytes(TagOther, 0, undefinedID)...)
	for _, tc := range []struct {
		name string
		in   []byte
		want ACL
		err  error
	}{
		{"full", good.Xattr(), good, nil},
		{"setfacl bytes", wire, acl(e(TagUserObj, 6), u(201, 6), e(TagGroupObj, 4), e(TagMask, 6), e(TagOther, 0)), nil},
		{"minimal", raw(e(TagUserObj, 7), e(TagGroupObj, 5), e(TagOther, 0)), acl(e(TagUserObj, 7), e(TagGroupObj, 5), e(TagOther, 0)), nil},
		{"mask only", raw(e(TagUserObj, 7), e(TagGroupObj, 5), e(TagMask, 1), e(TagOther, 0)), acl(e(TagUserObj, 7), e(TagGroupObj, 5), e(TagMask, 1), e(TagOther, 0)), nil},
		{"id of unnamed entry ignored", append([]byte{2, 0, 0, 0}, slices.Concat(entryBytes(TagUserObj, 7, 5), entryBytes(TagGroupObj, 0, 9), entryBytes(TagOther, 0, 0))...), acl(e(TagUserObj, 7), e(TagGroupObj, 0), e(TagOther, 0)), nil},
		{"header only is no ACL", []byte{2, 0, 0, 0}, nil, nil},
		{"empty", nil, nil, fserr.ErrInvalid},
		{"version 1", []byte{1, 0, 0, 0}, nil, fserr.ErrInvalid},
		{"torn entry", append(raw(e(TagUserObj, 7), e(TagGroupObj, 5), e(TagOther, 0)), 0), nil, fserr.ErrInvalid},
		{"named user without mask", raw(e(TagUserObj, 7), u(1, 7), e(TagGroupObj, 5), e(TagOther, 0)), nil, fserr.ErrInvalid},
		{"no owner", raw(e(TagGroupObj, 5), e(TagOther, 0)), nil, fserr.ErrInvalid},
		{"no other", raw(e(TagUserObj, 7), e(TagGroupObj, 5)), nil, fserr.ErrInvalid},
		{"out of order", raw(e(TagGroupObj, 5), e(TagUserObj, 7), e(TagOther, 0)), nil, fserr.ErrInvalid},
		{"users unsorted", raw(e(TagUserObj, 7), u(5, 7), u(4, 7), e(TagGroupObj, 5), e(TagMask, 7), e(TagOther, 0)), nil, fserr.ErrInvalid},
		{"user twice", raw(e(TagUserObj, 7), u(5, 7), u(5, 4), e(TagGroupObj, 5), e(TagMask, 7), e(TagOther, 0)), nil, fserr.ErrInvalid},
		{"two masks", raw(e(TagUserObj, 7), e(TagGroupObj, 5), e(TagMask, 7), e(TagMask, 7), e(TagOther, 0)), nil, fserr.ErrInvalid},
		{"bad perm", raw(e(TagUserObj, 8), e(TagGroupObj, 5), e(TagOther, 0)), nil, fserr.ErrInvalid},
		{"bad tag", raw(e(TagUserObj, 7), e(0x40, 0), e(TagGroupObj, 5), e(TagOther, 0)), nil, fserr.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseACLXattr(tc.in)
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if err == nil && got != nil && !bytes.Equal(got.Xattr(), tc.want.Xattr()) {
				t.Fatalf("re-encoded differs")
			}
		})
	}
	if !bytes.Equal(acl(e(TagUserObj, 6), u(201, 6), e(TagGroupObj, 4), e(TagMask, 6), e(TagOther, 0)).Xattr(), wire) {
		t.Fatal("Xattr does not produce what setfacl sends")
	}
}

func TestAccessACL(t *testing.T) {
	// user::rw- user:201:rw- user:202:r-- group::r-- group:300:rwx
	// mask::rw- other::--- on a file of 100:100; the mode is 0660.
	file := Attr{Mode: syscall.S_IFREG | 0o660, Uid: 100, Gid: 100}
	file.ACL = acl(u(201, 6), u(202, 4), e(TagGroupObj, 4), g(300, 7)).WithMode(file.Mode)
	// The same with a mask of --- (mode 0604): Linux then ignores the ACL.
	masked := Attr{Mode: syscall.S_IFREG | 0o604, Uid: 100, Gid: 100}
	masked.ACL = acl(u(201, 6), e(TagGroupObj, 4)).WithMode(masked.Mode)
	for _, tc := range []struct {
		name string
		c    Cred
		a    Attr
		want uint32
		ok   bool
	}{
		{"owner rw", Cred{Uid: 100, Gid: 1}, file, R | W, true},
		{"owner no x", Cred{Uid: 100, Gid: 1}, file, X, false},
		{"named user rw", Cred{Uid: 201, Gid: 1}, file, R | W, true},
		{"named user x masked", Cred{Uid: 201, Gid: 1}, file, X, false},
		{"named user r only", Cred{Uid: 202, Gid: 1}, file, W, false},
		{"named user r", Cred{Uid: 202, Gid: 1}, file, R, true},
		{"named user entry beats group", Cred{Uid: 202, Gid: 300}, file, W, false},
		{"owning group r", Cred{Uid: 203, Gid: 100}, file, R, true},
		{"owning group no w, no fallback to other", Cred{Uid: 203, Gid: 100}, file, W, false},
		{"named group w", Cred{Uid: 204, Gid: 9, Groups: []uint32{300}}, file, W, true},
		{"named group x beyond mask", Cred{Uid: 204, Gid: 9, Groups: []uint32{300}}, file, X, false},
		{"any granting group", Cred{Uid: 205, Gid: 100, Groups: []uint32{300}}, file, R | W, true},
		{"other", Cred{Uid: 206, Gid: 9}, file, R, false},
		{"root", Cred{Uid: 0, Gid: 0}, file, R | W, true},
		{"root no x on non-exec file", Cred{Uid: 0, Gid: 0}, file, X, false},
		{"mask --- named user falls to other r", Cred{Uid: 201, Gid: 9}, masked, R, true},
		{"mask --- named user gets no w", Cred{Uid: 201, Gid: 9}, masked, W, false},
		{"mask --- owning group gets group bits", Cred{Uid: 203, Gid: 100}, masked, R, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Access(tc.c, tc.a, tc.want)
			if (err == nil) != tc.ok {
				t.Fatalf("Access = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, fserr.ErrAccess) {
				t.Fatalf("err %v is not EACCES", err)
			}
		})
	}
}

func TestACLModeRoundTrip(t *testing.T) {
	full := acl(e(TagUserObj, 7), u(201, 6), e(TagGroupObj, 4), g(300, 7), e(TagMask, 5), e(TagOther, 1))
	mode, equiv := full.EquivMode()
	if mode != 0o751 || equiv {
		t.Fatalf("EquivMode = %#o, %v; want 0751, false", mode, equiv)
	}
	if got := full.Extended().WithMode(mode); !slices.Equal(got, full) {
		t.Fatalf("WithMode(Extended) = %v, want %v", got, full)
	}
	min := FromMode(0o640)
	if mode, equiv := min.EquivMode(); mode != 0o640 || !equiv || min.Extended() != nil {
		t.Fatalf("minimal ACL: mode %#o equiv %v extended %v", mode, equiv, min.Extended())
	}
}

func TestSetACL(t *testing.T) {
	a := Attr{Mode: syscall.S_IFREG | setGID | 0o644, Uid: 100, Gid: 100}
	withMask := acl(e(TagUserObj, 6), u(201, 7), e(TagGroupObj, 4), e(TagMask, 7), e(TagOther, 0))
	for _, tc := range []struct {
		name     string
		c        Cred
		a        Attr
		acl      ACL
		mode     uint32
		extended bool
		err      error
	}{
		{"owner sets mask", Cred{Uid: 100, Gid: 100}, a, withMask, syscall.S_IFREG | setGID | 0o670, true, nil},
		{"not in group drops setgid", Cred{Uid: 100, Gid: 5}, a, withMask, syscall.S_IFREG | 0o670, true, nil},
		{"equivalent stored as mode", Cred{Uid: 100, Gid: 100}, a, FromMode(0o600), syscall.S_IFREG | setGID | 0o600, false, nil},
		{"remove keeps mode", Cred{Uid: 100, Gid: 100}, a, nil, a.Mode, false, nil},
		{"root", Cred{}, a, withMask, syscall.S_IFREG | setGID | 0o670, true, nil},
		{"non-owner", Cred{Uid: 201, Gid: 100}, a, withMask, a.Mode, false, fserr.ErrPerm},
		{"symlink", Cred{}, Attr{Mode: syscall.S_IFLNK | 0o777}, withMask, syscall.S_IFLNK | 0o777, false, fserr.ErrNotSupported},
		{"invalid", Cred{Uid: 100}, a, acl(e(TagUserObj, 6), u(201, 7), e(TagGroupObj, 4), e(TagOther, 0)), a.Mode, false, fserr.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, ext, err := SetACL(tc.c, tc.a, tc.acl)
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if mode != tc.mode || (ext != nil) != tc.extended {
				t.Fatalf("mode %#o ext %v; want %#o extended=%v", mode, ext, tc.mode, tc.extended)
			}
		})
	}
	dir := Attr{Mode: syscall.S_IFDIR | 0o755, Uid: 100, Gid: 100}
	if err := SetDefaultACL(Cred{Uid: 100}, a, withMask); !errors.Is(err, fserr.ErrAccess) {
		t.Errorf("default ACL on a file: %v, want EACCES", err)
	}
	if err := SetDefaultACL(Cred{Uid: 100}, a, nil); err != nil {
		t.Errorf("removing a file's default ACL: %v", err)
	}
	if err := SetDefaultACL(Cred{Uid: 201}, dir, withMask); !errors.Is(err, fserr.ErrPerm) {
		t.Errorf("default ACL by non-owner: %v, want EPERM", err)
	}
	if err := SetDefaultACL(Cred{Uid: 100}, dir, withMask); err != nil {
		t.Errorf("default ACL by owner: %v", err)
	}
}

func TestInheritACL(t *testing.T) {
	def := acl(e(TagUserObj, 7), u(201, 7), e(TagGroupObj, 5), e(TagMask, 7), e(TagOther, 5))
	for _, tc := range []struct {
		name       string
		def        ACL
		mode       uint32
		wantMode   uint32
		wantAccess ACL
		wantDef    bool
	}{
		{"file", def, syscall.S_IFREG | 0o666, syscall.S_IFREG | 0o664,
			acl(e(TagUserObj, 6), u(201, 7), e(TagGroupObj, 5), e(TagMask, 6), e(TagOther, 4)), false},
		{"dir", def, syscall.S_IFDIR | 0o777, syscall.S_IFDIR | 0o775, def, true},
		{"restrictive create mode", def, syscall.S_IFREG | 0o600, syscall.S_IFREG | 0o600,
			acl(e(TagUserObj, 6), u(201, 7), e(TagGroupObj, 5), e(TagMask, 0), e(TagOther, 0)), false},
		{"minimal default", FromMode(0o750), syscall.S_IFREG | 0o666, syscall.S_IFREG | 0o640, nil, false},
		{"minimal default dir", FromMode(0o750), syscall.S_IFDIR | 0o777, syscall.S_IFDIR | 0o750, nil, true},
		{"symlink", def, syscall.S_IFLNK | 0o777, syscall.S_IFLNK | 0o777, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, access, dflt := InheritACL(tc.def, tc.mode)
			if mode != tc.wantMode || !slices.Equal(access, tc.wantAccess) {
				t.Fatalf("InheritACL = %#o %v; want %#o %v", mode, access, tc.wantMode, tc.wantAccess)
			}
			if (dflt != nil) != tc.wantDef || (dflt != nil && !slices.Equal(dflt, tc.def)) {
				t.Fatalf("default ACL %v; want inherited=%v", dflt, tc.wantDef)
			}
		})
	}
}

func TestACLXattrPermission(t *testing.T) {
	a := Attr{Mode: syscall.S_IFREG | 0o600, Uid: 100, Gid: 100}
	if err := MayGetXattr(Cred{Uid: 5}, a, XattrACLAccess); err != nil {
		t.Errorf("reading an ACL needs no permission: %v", err)
	}
	if err := MaySetXattr(Cred{Uid: 5}, a, XattrACLDefault); !errors.Is(err, fserr.ErrPerm) {
		t.Errorf("non-owner setting an ACL: %v, want EPERM", err)
	}
	if err := MaySetXattr(Cred{Uid: 100}, a, XattrACLAccess); err != nil {
		t.Errorf("owner setting an ACL: %v", err)
	}
	if err := MayGetXattr(Cred{Uid: 100}, a, "system.other"); !errors.Is(err, fserr.ErrNotSupported) {
		t.Errorf("other system xattr: %v, want EOPNOTSUPP", err)
	}
}

func FuzzParseACLXattr(f *testing.F) {
	f.Add(acl(e(TagUserObj, 6), u(201, 6), e(TagGroupObj, 4), e(TagMask, 6), e(TagOther, 0)).Xattr())
	f.Add(FromMode(0o755).Xattr())
	f.Add([]byte{2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseACLXattr(b)
		if err != nil || a == nil {
			return
		}
		again, err := ParseACLXattr(a.Xattr())
		if err != nil || !slices.Equal(a, again) {
			t.Fatalf("round trip of %v: %v, %v", a, again, err)
		}
		mode, _ := a.EquivMode()
		if ext := a.Extended(); ext != nil && !slices.Equal(ext.WithMode(mode), a) {
			t.Fatalf("WithMode(Extended(%v)) = %v", a, ext.WithMode(mode))
		}
	})
}
