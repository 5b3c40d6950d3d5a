package perm

import (
	"errors"
	"syscall"
	"testing"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

var (
	root  = Cred{Uid: 0, Gid: 0}
	alice = Cred{Uid: 1000, Gid: 1000}
	bob   = Cred{Uid: 1001, Gid: 1001, Groups: []uint32{50, 3000}}
	carol = Cred{Uid: 1002, Gid: 1002}
)

func reg(perm, uid, gid uint32) Attr { return Attr{Mode: syscall.S_IFREG | perm, Uid: uid, Gid: gid} }
func dir(perm, uid, gid uint32) Attr { return Attr{Mode: syscall.S_IFDIR | perm, Uid: uid, Gid: gid} }
func lnk(uid, gid uint32) Attr       { return Attr{Mode: syscall.S_IFLNK | 0777, Uid: uid, Gid: gid} }
func chr(perm, uid, gid uint32) Attr { return Attr{Mode: syscall.S_IFCHR | perm, Uid: uid, Gid: gid} }

// checkErr asserts err matches want (nil means success).
func checkErr(t *testing.T, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("got error %v, want success", err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Fatalf("got error %v, want %v", err, want)
	}
}

func TestCred(t *testing.T) {
	if !root.IsRoot() || alice.IsRoot() {
		t.Fatal("IsRoot: only uid 0 is root")
	}
	tests := []struct {
		c    Cred
		gid  uint32
		want bool
	}{
		{alice, 1000, true},
		{alice, 1001, false},
		{bob, 1001, true},
		{bob, 50, true},
		{bob, 3000, true},
		{bob, 51, false},
		{root, 1000, false}, // root is not implicitly in every group
	}
	for _, tt := range tests {
		if got := tt.c.InGroup(tt.gid); got != tt.want {
			t.Errorf("%+v.InGroup(%d) = %v, want %v", tt.c, tt.gid, got, tt.want)
		}
	}
}

func TestAccess(t *testing.T) {
	tests := []struct {
		name string
		c    Cred
		a    Attr
		want uint32
		err  error
	}{
		{"owner read", alice, reg(0400, 1000, 1000), R, nil},
		{"owner write denied", alice, reg(0400, 1000, 1000), W, fserr.ErrAccess},
		{"owner rw", alice, reg(0600, 1000, 1000), R | W, nil},
		{"owner rw partial", alice, reg(0400, 1000, 1000), R | W, fserr.ErrAccess},
		{"owner exec", alice, reg(0100, 1000, 1000), X, nil},
		{"owner class only", alice, reg(0077, 1000, 1000), R, fserr.ErrAccess},
		{"group primary", carol, reg(0040, 1000, 1002), R, nil},
		{"group supplementary", bob, reg(0040, 1000, 50), R, nil},
		{"group class only", bob, reg(0704, 1000, 50), R, fserr.ErrAccess},
		{"group write", bob, reg(0020, 1000, 3000), W, nil},
		{"other read", carol, reg(0004, 1000, 1000), R, nil},
		{"other write denied", carol, reg(0644, 1000, 1000), W, fserr.ErrAccess},
		{"other exec", carol, reg(0001, 1000, 1000), X, nil},
		{"other rwx", carol, reg(0007, 1000, 1000), R | W | X, nil},
		{"setuid grants nothing", alice, reg(04000, 1000, 1000), X, fserr.ErrAccess},
		{"F_OK always", carol, reg(0, 1000, 1000), 0, nil},
		{"invalid mask", alice, reg(0777, 1000, 1000), 8, fserr.ErrInvalid},
		{"dir search other", carol, dir(0711, 1000, 1000), X, nil},
		{"dir list denied", carol, dir(0711, 1000, 1000), R, fserr.ErrAccess},
		{"root read 000", root, reg(0, 1000, 1000), R, nil},
		{"root write 000", root, reg(0, 1000, 1000), W, nil},
		{"root rw 000", root, reg(0, 1000, 1000), R | W, nil},
		{"root exec no x bits", root, reg(0666, 1000, 1000), X, fserr.ErrAccess},
		{"root read+exec no x bits", root, reg(0644, 1000, 1000), R | X, fserr.ErrAccess},
		{"root exec other x", root, reg(0001, 1000, 1000), X, nil},
		{"root exec group x", root, reg(0010, 1000, 1000), X, nil},
		{"root exec owner x", root, reg(0100, 1000, 1000), R | W | X, nil},
		{"root owns 000 file", root, reg(0, 0, 0), R | W, nil},
		{"root search dir 000", root, dir(0, 1000, 1000), X, nil},
		{"root rwx dir 000", root, dir(0, 1000, 1000), R | W | X, nil},
		{"root exec device no x", root, chr(0666, 0, 0), X, fserr.ErrAccess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, Access(tt.c, tt.a, tt.want), tt.err)
		})
	}
}

func TestErrnoMapping(t *testing.T) {
	if got := fserr.Errno(Access(carol, reg(0600, 1000, 1000), R)); got != syscall.EACCES {
		t.Fatalf("Access denial errno = %v, want EACCES", got)
	}
	if got := fserr.Errno(MayRemove(carol, dir(01777, 0, 0), reg(0644, 1000, 1000))); got != syscall.EPERM {
		t.Fatalf("sticky denial errno = %v, want EPERM", got)
	}
}

func TestMayLookupCreate(t *testing.T) {
	tests := []struct {
		name      string
		c         Cred
		d         Attr
		lookupErr error
		createErr error
	}{
		{"owner 0700", alice, dir(0700, 1000, 1000), nil, nil},
		{"other 0700", carol, dir(0700, 1000, 1000), fserr.ErrAccess, fserr.ErrAccess},
		{"other 0755", carol, dir(0755, 1000, 1000), nil, fserr.ErrAccess},
		{"other 0711", carol, dir(0711, 1000, 1000), nil, fserr.ErrAccess},
		{"other write no search", carol, dir(0776, 1000, 1000), fserr.ErrAccess, fserr.ErrAccess},
		{"other 0777", carol, dir(0777, 1000, 1000), nil, nil},
		{"group 0730", bob, dir(0730, 1000, 50), nil, nil},
		{"owner 0500", alice, dir(0500, 1000, 1000), nil, fserr.ErrAccess},
		{"root 0000", root, dir(0, 1000, 1000), nil, nil},
		{"not a dir", alice, reg(0777, 1000, 1000), fserr.ErrNotDir, fserr.ErrNotDir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, MayLookup(tt.c, tt.d), tt.lookupErr)
			checkErr(t, MayCreate(tt.c, tt.d), tt.createErr)
		})
	}
}

func TestMayRemove(t *testing.T) {
	tmp := dir(01777, 0, 0)
	tests := []struct {
		name  string
		c     Cred
		d     Attr
		child Attr
		err   error
	}{
		{"plain dir other's file", bob, dir(0777, 0, 0), reg(0644, 1000, 1000), nil},
		{"plain dir readonly file", bob, dir(0777, 0, 0), reg(0, 1000, 1000), nil},
		{"sticky own file", alice, tmp, reg(0644, 1000, 1000), nil},
		{"sticky other's file", bob, tmp, reg(0666, 1000, 1000), fserr.ErrPerm},
		{"sticky other's dir", bob, tmp, dir(0777, 1000, 1000), fserr.ErrPerm},
		{"sticky dir owner", alice, dir(01777, 1000, 1000), reg(0644, 1001, 1001), nil},
		{"sticky root", root, tmp, reg(0644, 1000, 1000), nil},
		{"sticky group member is not enough", bob, dir(01777, 0, 50), reg(0664, 1000, 50), fserr.ErrPerm},
		{"no write on dir beats sticky", bob, dir(01755, 0, 0), reg(0644, 1000, 1000), fserr.ErrAccess},
		{"no search on dir", alice, dir(0666, 1000, 1000), reg(0644, 1000, 1000), fserr.ErrAccess},
		{"parent not a dir", alice, reg(0777, 1000, 1000), reg(0644, 1000, 1000), fserr.ErrNotDir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, MayRemove(tt.c, tt.d, tt.child), tt.err)
		})
	}
}

func TestMayRename(t *testing.T) {
	open := dir(0777, 0, 0)
	tmp := dir(01777, 0, 0)
	ro := dir(0755, 0, 0)
	ptr := func(a Attr) *Attr { return &a }
	tests := []struct {
		name     string
		c        Cred
		src      Attr
		child    Attr
		dst      Attr
		dstChild *Attr
		crossErr error // MayRename (different parents); dst ignored below
		sameErr  error // MayRenameWithin(src, child, dstChild)
	}{
		{"file to new name", alice, open, reg(0644, 1000, 1000), open, nil, nil, nil},
		{"file replacing file", alice, open, reg(0644, 1000, 1000), open, ptr(reg(0644, 1001, 1001)), nil, nil},
		{"source dir not writable", alice, ro, reg(0644, 1000, 1000), open, nil, fserr.ErrAccess, fserr.ErrAccess},
		{"target dir not writable", alice, open, reg(0644, 1000, 1000), ro, nil, fserr.ErrAccess, nil},
		{"sticky source other's file", bob, tmp, reg(0644, 1000, 1000), open, nil, fserr.ErrPerm, fserr.ErrPerm},
		{"sticky source own file", alice, tmp, reg(0644, 1000, 1000), open, nil, nil, nil},
		{"sticky target, no victim", alice, open, reg(0644, 1000, 1000), tmp, nil, nil, nil},
		{"sticky target other's victim", alice, open, reg(0644, 1000, 1000), tmp, ptr(reg(0666, 1001, 1001)), fserr.ErrPerm, nil},
		{"sticky target own victim", alice, open, reg(0644, 1000, 1000), tmp, ptr(reg(0600, 1000, 1000)), nil, nil},
		{"sticky same dir other's victim", alice, tmp, reg(0644, 1000, 1000), tmp, ptr(reg(0666, 1001, 1001)), fserr.ErrPerm, fserr.ErrPerm},
		{"dir over file", alice, open, dir(0755, 1000, 1000), open, ptr(reg(0644, 1000, 1000)), fserr.ErrNotDir, fserr.ErrNotDir},
		{"file over dir", alice, open, reg(0644, 1000, 1000), open, ptr(dir(0755, 1000, 1000)), fserr.ErrIsDir, fserr.ErrIsDir},
		{"writable dir", alice, open, dir(0755, 1000, 1000), open, nil, nil, nil},
		{"read-only own dir", alice, open, dir(0555, 1000, 1000), open, nil, fserr.ErrAccess, nil},
		{"other's dir", alice, open, dir(0755, 1001, 1001), open, nil, fserr.ErrAccess, nil},
		{"group-writable dir", bob, open, dir(0775, 1000, 50), open, nil, nil, nil},
		{"read-only dir over empty dir", alice, open, dir(0555, 1000, 1000), open, ptr(dir(0755, 1000, 1000)), fserr.ErrAccess, nil},
		{"read-only file", alice, open, reg(0444, 1000, 1000), open, nil, nil, nil},
		{"root read-only dir", root, open, dir(0555, 1000, 1000), open, nil, nil, nil},
		{"root sticky", root, tmp, reg(0644, 1000, 1000), tmp, ptr(reg(0644, 1001, 1001)), nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, MayRename(tt.c, tt.src, tt.child, tt.dst, tt.dstChild), tt.crossErr)
			checkErr(t, MayRenameWithin(tt.c, tt.src, tt.child, tt.dstChild), tt.sameErr)
		})
	}
}

func TestChmod(t *testing.T) {
	tests := []struct {
		name string
		c    Cred
		a    Attr
		mode uint32
		want uint32
		err  error
	}{
		{"owner", alice, reg(0600, 1000, 1000), 0644, syscall.S_IFREG | 0644, nil},
		{"owner without any access", alice, reg(0, 1000, 1000), 0700, syscall.S_IFREG | 0700, nil},
		{"non-owner", bob, reg(0666, 1000, 1000), 0777, 0, fserr.ErrPerm},
		{"group member non-owner", bob, reg(0660, 1000, 50), 0664, 0, fserr.ErrPerm},
		{"root any file", root, reg(0600, 1000, 1000), 04755, syscall.S_IFREG | 04755, nil},
		{"type bits in request ignored", alice, reg(0600, 1000, 1000), syscall.S_IFDIR | 0755, syscall.S_IFREG | 0755, nil},
		{"setuid by owner", alice, reg(0755, 1000, 1000), 04755, syscall.S_IFREG | 04755, nil},
		{"setgid in primary group", alice, reg(0755, 1000, 1000), 02755, syscall.S_IFREG | 02755, nil},
		{"setgid in supplementary group", bob, reg(0755, 1001, 50), 02755, syscall.S_IFREG | 02755, nil},
		{"setgid outside group cleared", alice, reg(0755, 1000, 2000), 06755, syscall.S_IFREG | 04755, nil},
		{"setgid outside group, dir too", alice, dir(0755, 1000, 2000), 02775, syscall.S_IFDIR | 0775, nil},
		{"setgid dir in group", alice, dir(0755, 1000, 1000), 02775, syscall.S_IFDIR | 02775, nil},
		{"root keeps setgid", root, reg(0755, 1000, 2000), 02755, syscall.S_IFREG | 02755, nil},
		{"sticky on file kept", alice, reg(0644, 1000, 1000), 01644, syscall.S_IFREG | 01644, nil},
		{"sticky dir", alice, dir(0777, 1000, 1000), 01777, syscall.S_IFDIR | 01777, nil},
		{"symlink", alice, lnk(1000, 1000), 0700, 0, fserr.ErrNotSupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Chmod(tt.c, tt.a, tt.mode)
			checkErr(t, err, tt.err)
			if err == nil && got != tt.want {
				t.Fatalf("mode = %#o, want %#o", got, tt.want)
			}
		})
	}
}

func TestChown(t *testing.T) {
	const u = Unchanged
	tests := []struct {
		name             string
		c                Cred
		a                Attr
		uid, gid         uint32
		wantUid, wantGid uint32
		wantMode         uint32
		err              error
	}{
		{"root chown clears suid and exec sgid", root, reg(06755, 1000, 1000), 1001, 1001, 1001, 1001, syscall.S_IFREG | 0755, nil},
		{"root keeps non-exec sgid", root, reg(06744, 1000, 1000), 1001, u, 1001, 1000, syscall.S_IFREG | 02744, nil},
		{"root same values still clears", root, reg(04755, 1000, 1000), 1000, 1000, 1000, 1000, syscall.S_IFREG | 0755, nil},
		{"root dir keeps bits", root, dir(06755, 1000, 1000), 1001, 1001, 1001, 1001, syscall.S_IFDIR | 06755, nil},
		{"root symlink", root, lnk(1000, 1000), 1001, u, 1001, 1000, syscall.S_IFLNK | 0777, nil},
		{"owner chgrp to supplementary", bob, reg(0644, 1001, 1001), u, 50, 1001, 50, syscall.S_IFREG | 0644, nil},
		{"owner chgrp to primary", bob, reg(0644, 1001, 50), u, 1001, 1001, 1001, syscall.S_IFREG | 0644, nil},
		{"owner chgrp to foreign group", alice, reg(0644, 1000, 1000), u, 2000, 1000, 1000, syscall.S_IFREG | 0644, fserr.ErrPerm},
		{"owner keeps foreign group", alice, reg(0644, 1000, 2000), u, 2000, 1000, 2000, syscall.S_IFREG | 0644, nil},
		{"owner gives file away", alice, reg(0644, 1000, 1000), 1001, u, 1000, 1000, syscall.S_IFREG | 0644, fserr.ErrPerm},
		{"owner sets own uid", alice, reg(04755, 1000, 1000), 1000, u, 1000, 1000, syscall.S_IFREG | 0755, nil},
		{"owner -1 -1 clears suid and exec sgid", alice, reg(06755, 1000, 1000), u, u, 1000, 1000, syscall.S_IFREG | 0755, nil},
		{"owner -1 -1 keeps non-exec sgid in group", alice, reg(02745, 1000, 1000), u, u, 1000, 1000, syscall.S_IFREG | 02745, nil},
		{"owner -1 -1 non-exec sgid outside group", alice, reg(02745, 1000, 2000), u, u, 1000, 2000, syscall.S_IFREG | 0745, nil},
		{"owner chgrp clears exec sgid", bob, reg(02775, 1001, 1001), u, 50, 1001, 50, syscall.S_IFREG | 0775, nil},
		{"owner chgrp keeps non-exec sgid", bob, reg(06745, 1001, 1001), u, 50, 1001, 50, syscall.S_IFREG | 02745, nil},
		{"owner dir keeps sgid", alice, dir(02775, 1000, 2000), u, 1000, 1000, 1000, syscall.S_IFDIR | 02775, nil},
		{"non-owner -1 -1 plain file", bob, reg(0644, 1000, 1000), u, u, 1000, 1000, syscall.S_IFREG | 0644, nil},
		{"non-owner -1 -1 setuid file", bob, reg(04755, 1000, 1000), u, u, 1000, 1000, syscall.S_IFREG | 04755, fserr.ErrPerm},
		{"non-owner same uid", bob, reg(0644, 1000, 1000), 1000, u, 1000, 1000, syscall.S_IFREG | 0644, fserr.ErrPerm},
		{"non-owner takes file", bob, reg(0644, 1000, 1000), 1001, u, 1000, 1000, syscall.S_IFREG | 0644, fserr.ErrPerm},
		{"non-owner chgrp to own group", bob, reg(0644, 1000, 50), u, 50, 1000, 50, syscall.S_IFREG | 0644, fserr.ErrPerm},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			uid, gid, mode, err := Chown(tt.c, tt.a, tt.uid, tt.gid)
			checkErr(t, err, tt.err)
			if uid != tt.wantUid || gid != tt.wantGid || mode != tt.wantMode {
				t.Fatalf("got %d:%d %#o, want %d:%d %#o", uid, gid, mode, tt.wantUid, tt.wantGid, tt.wantMode)
			}
		})
	}
}

func TestUtimens(t *testing.T) {
	tests := []struct {
		name     string
		c        Cred
		a        Attr
		explicit error
		now      error
	}{
		{"owner without write", alice, reg(0444, 1000, 1000), nil, nil},
		{"root", root, reg(0, 1000, 1000), nil, nil},
		{"other with write", carol, reg(0666, 1000, 1000), fserr.ErrPerm, nil},
		{"other without write", carol, reg(0644, 1000, 1000), fserr.ErrPerm, fserr.ErrAccess},
		{"group with write", bob, reg(0660, 1000, 50), fserr.ErrPerm, nil},
		{"group class without write", bob, reg(0646, 1000, 50), fserr.ErrPerm, fserr.ErrAccess},
		{"other dir with write", carol, dir(0777, 1000, 1000), fserr.ErrPerm, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, Utimens(tt.c, tt.a, false), tt.explicit)
			checkErr(t, Utimens(tt.c, tt.a, true), tt.now)
		})
	}
}

func TestKillSUID(t *testing.T) {
	tests := []struct {
		name string
		c    Cred
		a    Attr
		want uint32
	}{
		{"plain file", alice, reg(0755, 1000, 1000), syscall.S_IFREG | 0755},
		{"suid and exec sgid", bob, reg(06777, 1000, 1000), syscall.S_IFREG | 0777},
		{"suid only", alice, reg(04644, 1000, 1000), syscall.S_IFREG | 0644},
		{"owner's own suid file", alice, reg(04755, 1000, 1000), syscall.S_IFREG | 0755},
		{"exec sgid", alice, reg(02755, 1000, 1000), syscall.S_IFREG | 0755},
		{"non-exec sgid in group", alice, reg(02646, 1000, 1000), syscall.S_IFREG | 02646},
		{"non-exec sgid in supplementary group", bob, reg(02666, 1000, 50), syscall.S_IFREG | 02666},
		{"non-exec sgid outside group", carol, reg(02666, 1000, 1000), syscall.S_IFREG | 0666},
		{"sticky kept", carol, reg(01666, 1000, 1000), syscall.S_IFREG | 01666},
		{"root keeps bits", root, reg(06777, 1000, 1000), syscall.S_IFREG | 06777},
		{"directory untouched", alice, dir(06777, 1000, 1000), syscall.S_IFDIR | 06777},
		{"device untouched", alice, chr(06666, 1000, 1000), syscall.S_IFCHR | 06666},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := KillSUID(tt.c, tt.a); got != tt.want {
				t.Fatalf("mode = %#o, want %#o", got, tt.want)
			}
		})
	}
}

func TestNewObject(t *testing.T) {
	plain := dir(0777, 0, 0)
	sgid := dir(02777, 0, 3000)
	tests := []struct {
		name     string
		c        Cred
		parent   Attr
		mode     uint32
		wantMode uint32
		wantUid  uint32
		wantGid  uint32
	}{
		{"file", alice, plain, syscall.S_IFREG | 0644, syscall.S_IFREG | 0644, 1000, 1000},
		{"file keeps setid in plain parent", alice, plain, syscall.S_IFREG | 06755, syscall.S_IFREG | 06755, 1000, 1000},
		{"dir", alice, plain, syscall.S_IFDIR | 0755, syscall.S_IFDIR | 0755, 1000, 1000},
		{"mkdir ignores setid request", alice, plain, syscall.S_IFDIR | 06755, syscall.S_IFDIR | 0755, 1000, 1000},
		{"mkdir keeps sticky", alice, plain, syscall.S_IFDIR | 01777, syscall.S_IFDIR | 01777, 1000, 1000},
		{"file in setgid dir gets dir group", alice, sgid, syscall.S_IFREG | 0644, syscall.S_IFREG | 0644, 1000, 3000},
		{"dir in setgid dir inherits sgid", alice, sgid, syscall.S_IFDIR | 0755, syscall.S_IFDIR | 02755, 1000, 3000},
		{"exec sgid file outside group stripped", alice, sgid, syscall.S_IFREG | 02755, syscall.S_IFREG | 0755, 1000, 3000},
		{"exec sgid file in supplementary group kept", bob, sgid, syscall.S_IFREG | 02755, syscall.S_IFREG | 02755, 1001, 3000},
		{"root keeps exec sgid", root, sgid, syscall.S_IFREG | 02755, syscall.S_IFREG | 02755, 0, 3000},
		{"non-exec sgid outside group kept", alice, sgid, syscall.S_IFREG | 02644, syscall.S_IFREG | 02644, 1000, 3000},
		{"suid kept in setgid dir", alice, sgid, syscall.S_IFREG | 04755, syscall.S_IFREG | 04755, 1000, 3000},
		{"symlink is 0777", alice, sgid, syscall.S_IFLNK, syscall.S_IFLNK | 0777, 1000, 3000},
		{"fifo", alice, plain, syscall.S_IFIFO | 0600, syscall.S_IFIFO | 0600, 1000, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mode, uid, gid := NewObject(tt.c, tt.parent, tt.mode)
			if mode != tt.wantMode || uid != tt.wantUid || gid != tt.wantGid {
				t.Fatalf("got %#o %d:%d, want %#o %d:%d", mode, uid, gid, tt.wantMode, tt.wantUid, tt.wantGid)
			}
		})
	}
}

func TestMayLink(t *testing.T) {
	tests := []struct {
		name   string
		c      Cred
		d      Attr
		target Attr
		err    error
	}{
		{"own file", alice, dir(0755, 1000, 1000), reg(0644, 1000, 1000), nil},
		{"other's unreadable file", alice, dir(0755, 1000, 1000), reg(0, 1001, 1001), nil},
		{"symlink", alice, dir(0755, 1000, 1000), lnk(1000, 1000), nil},
		{"dir not writable", carol, dir(0755, 1000, 1000), reg(0644, 1002, 1002), fserr.ErrAccess},
		{"directory target", alice, dir(0755, 1000, 1000), dir(0755, 1000, 1000), fserr.ErrPerm},
		{"root directory target", root, dir(0755, 0, 0), dir(0755, 0, 0), fserr.ErrPerm},
		{"access checked before dir target", carol, dir(0755, 1000, 1000), dir(0777, 1002, 1002), fserr.ErrAccess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, MayLink(tt.c, tt.d, tt.target), tt.err)
		})
	}
}

func TestXattr(t *testing.T) {
	tests := []struct {
		name   string
		c      Cred
		a      Attr
		xattr  string
		getErr error
		setErr error
	}{
		{"user owner rw", alice, reg(0600, 1000, 1000), "user.a", nil, nil},
		{"user owner read-only", alice, reg(0400, 1000, 1000), "user.a", nil, fserr.ErrAccess},
		{"user other no access", carol, reg(0600, 1000, 1000), "user.a", fserr.ErrAccess, fserr.ErrAccess},
		{"user other read-only", carol, reg(0644, 1000, 1000), "user.a", nil, fserr.ErrAccess},
		{"user group write", bob, reg(0620, 1000, 50), "user.a", fserr.ErrAccess, nil},
		{"user root on 000", root, reg(0, 1000, 1000), "user.a", nil, nil},
		{"user dir", carol, dir(0777, 1000, 1000), "user.a", nil, nil},
		{"user sticky dir non-owner", carol, dir(01777, 1000, 1000), "user.a", nil, fserr.ErrPerm},
		{"user sticky dir owner", alice, dir(01777, 1000, 1000), "user.a", nil, nil},
		{"user sticky dir root", root, dir(01777, 1000, 1000), "user.a", nil, nil},
		{"user symlink", alice, lnk(1000, 1000), "user.a", fserr.ErrNoAttr, fserr.ErrPerm},
		{"user device", root, chr(0666, 0, 0), "user.a", fserr.ErrNoAttr, fserr.ErrPerm},
		{"user empty suffix", alice, reg(0600, 1000, 1000), "user.", fserr.ErrInvalid, fserr.ErrInvalid},
		{"trusted non-root", alice, reg(0666, 1000, 1000), "trusted.a", fserr.ErrNoAttr, fserr.ErrPerm},
		{"trusted root", root, reg(0, 1000, 1000), "trusted.a", nil, nil},
		{"trusted root symlink", root, lnk(0, 0), "trusted.a", nil, nil},
		{"security non-root", alice, reg(0600, 1000, 1000), "security.a", nil, fserr.ErrPerm},
		{"security get without access", carol, reg(0, 1000, 1000), "security.a", nil, fserr.ErrPerm},
		{"security root", root, reg(0, 1000, 1000), "security.capability", nil, nil},
		{"system acl owner", alice, reg(0600, 1000, 1000), "system.posix_acl_access", nil, nil},
		{"system acl non-owner", carol, reg(0, 1000, 1000), "system.posix_acl_default", nil, fserr.ErrPerm},
		{"system other", alice, reg(0600, 1000, 1000), "system.foo", fserr.ErrNotSupported, fserr.ErrNotSupported},
		{"unknown namespace", alice, reg(0600, 1000, 1000), "foo.a", fserr.ErrNotSupported, fserr.ErrNotSupported},
		{"unknown namespace checks access first", carol, reg(0600, 1000, 1000), "foo.a", fserr.ErrAccess, fserr.ErrAccess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, MayGetXattr(tt.c, tt.a, tt.xattr), tt.getErr)
			checkErr(t, MaySetXattr(tt.c, tt.a, tt.xattr), tt.setErr)
		})
	}
}

func TestListXattrVisible(t *testing.T) {
	tests := []struct {
		c    Cred
		name string
		want bool
	}{
		{alice, "user.a", true},
		{alice, "security.selinux", true},
		{alice, "trusted.a", false},
		{root, "trusted.a", true},
	}
	for _, tt := range tests {
		if got := ListXattrVisible(tt.c, tt.name); got != tt.want {
			t.Errorf("ListXattrVisible(uid %d, %q) = %v, want %v", tt.c.Uid, tt.name, got, tt.want)
		}
	}
}
