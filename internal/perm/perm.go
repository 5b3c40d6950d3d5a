// Package perm implements Linux local-filesystem (ext4) permission semantics
// as pure functions, so WheelFS servers can enforce UNIX permissions on the
// authenticated caller exactly as the Linux VFS would for a local user.
//
// The rules follow current Linux (6.x): generic_permission and may_delete /
// may_create / vfs_rename / vfs_link in fs/namei.c, setattr_prepare,
// setattr_should_drop_sgid and notify_change in fs/attr.c, chown_common and
// vfs_utimes in fs/open.c and fs/utimes.c, inode_init_owner and
// mode_strip_sgid in fs/inode.c, and xattr_permission in fs/xattr.c. Root
// (uid 0) stands for a caller holding every capability. Sysctl policies
// enforced above the filesystem (fs.protected_hardlinks, protected_regular)
// are not modelled. Denials wrap sentinels from package fserr.
package perm

import (
	"fmt"
	"strings"
	"syscall"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

// Access bits, as in access(2) and the kernel's MAY_READ/MAY_WRITE/MAY_EXEC.
const (
	R = 4
	W = 2
	X = 1
)

// OpenAccess returns the access an open(2) with flags gives its
// descriptor: R, W or both. O_TRUNC needs write permission at open but
// gives a read-only descriptor no write access.
func OpenAccess(flags uint32) uint32 {
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		return R
	case syscall.O_WRONLY:
		return W
	default:
		return R | W
	}
}

// Unchanged is the uid/gid value (-1) that Chown treats as "leave as is".
const Unchanged = ^uint32(0)

const (
	modeType = syscall.S_IFMT
	setUID   = syscall.S_ISUID
	setGID   = syscall.S_ISGID
	sticky   = syscall.S_ISVTX
	permBits = 07777
	anyExec  = syscall.S_IXUSR | syscall.S_IXGRP | syscall.S_IXOTH
)

// Cred is the caller's filesystem identity (fsuid, fsgid and supplementary
// groups).
type Cred struct {
	Uid, Gid uint32
	Groups   []uint32 // supplementary groups
}

// IsRoot reports whether the caller is uid 0, which is treated as holding
// all capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_CHOWN...).
func (c Cred) IsRoot() bool { return c.Uid == 0 }

// InGroup reports whether gid is the caller's primary or a supplementary
// group (the kernel's in_group_p).
func (c Cred) InGroup(gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	for _, g := range c.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// Attr is the permission-relevant part of an inode.
type Attr struct {
	Mode     uint32 // full st_mode: S_IFMT type bits, setuid/setgid/sticky, rwx
	Uid, Gid uint32
	// ACL is the full access ACL, consistent with Mode (see
	// ACL.WithMode); nil when the mode alone decides.
	ACL ACL
}

func isDir(mode uint32) bool { return mode&modeType == syscall.S_IFDIR }
func isReg(mode uint32) bool { return mode&modeType == syscall.S_IFREG }
func isLnk(mode uint32) bool { return mode&modeType == syscall.S_IFLNK }

// ownerOrRoot is the kernel's inode_owner_or_capable (CAP_FOWNER).
func ownerOrRoot(c Cred, a Attr) bool { return c.IsRoot() || c.Uid == a.Uid }

// inGroupOrRoot is the kernel's in_group_or_capable (CAP_FSETID).
func inGroupOrRoot(c Cred, gid uint32) bool { return c.IsRoot() || c.InGroup(gid) }

// Access checks want (a combination of R, W and X) like generic_permission:
// only the first matching class (owner, group, other) counts, or with an
// access ACL the first matching entry as Linux's posix_acl_permission does
// (owner, named users, then any group entry that grants, all but the owner
// limited by the mask, then other). Root bypasses
// R and W, and X on directories; on other objects root gets X only if some x
// bit is set. A zero want (F_OK) always succeeds.
func Access(c Cred, a Attr, want uint32) error {
	if want&^(R|W|X) != 0 {
		return fmt.Errorf("perm: access mask %#o: %w", want, fserr.ErrInvalid)
	}
	if a.ACL != nil {
		if aclAllows(c, a, want) {
			return nil
		}
	} else {
		mode := a.Mode
		switch {
		case c.Uid == a.Uid:
			mode >>= 6
		case c.InGroup(a.Gid):
			mode >>= 3
		}
		if want&^mode&7 == 0 {
			return nil
		}
	}
	if c.IsRoot() && (isDir(a.Mode) || want&X == 0 || a.Mode&anyExec != 0) {
		return nil
	}
	return fmt.Errorf("perm: uid %d wants %s on mode %#o owned by %d:%d: %w",
		c.Uid, bitsString(want), a.Mode&permBits, a.Uid, a.Gid, fserr.ErrAccess)
}

func bitsString(want uint32) string {
	b := []byte("---")
	if want&R != 0 {
		b[0] = 'r'
	}
	if want&W != 0 {
		b[1] = 'w'
	}
	if want&X != 0 {
		b[2] = 'x'
	}
	return string(b)
}

func needDir(dir Attr) error {
	if !isDir(dir.Mode) {
		return fmt.Errorf("perm: parent mode %#o: %w", dir.Mode, fserr.ErrNotDir)
	}
	return nil
}

// MayLookup checks search (X) permission on dir (may_lookup).
func MayLookup(c Cred, dir Attr) error {
	if err := needDir(dir); err != nil {
		return err
	}
	return Access(c, dir, X)
}

// MayCreate checks that a new entry may be added to dir (may_create: W|X).
func MayCreate(c Cred, dir Attr) error {
	if err := needDir(dir); err != nil {
		return err
	}
	return Access(c, dir, W|X)
}

// MayRemove checks that child may be unlinked from dir (may_delete): W|X on
// dir (EACCES), then the sticky rule: in an S_ISVTX directory only the owner
// of the directory or of the child, or root, may remove it (EPERM, as Linux's
// check_sticky). It does not check unlink-vs-rmdir type mismatches.
func MayRemove(c Cred, dir Attr, child Attr) error {
	if err := MayCreate(c, dir); err != nil {
		return err
	}
	if dir.Mode&sticky != 0 && !c.IsRoot() && c.Uid != dir.Uid && c.Uid != child.Uid {
		return fmt.Errorf("perm: uid %d may not remove entry of uid %d from sticky dir of uid %d: %w",
			c.Uid, child.Uid, dir.Uid, fserr.ErrPerm)
	}
	return nil
}

// MayRename checks moving child from srcDir to a DIFFERENT parent dstDir,
// replacing dstChild (nil when the target name is absent). Like vfs_rename:
// may_delete on the source, may_create or may_delete (sticky included) on the
// target, ENOTDIR/EISDIR when a directory and a non-directory would replace
// each other, and W on child itself when it is a directory, since its ".."
// entry must be rewritten. Use MayRenameWithin when both parents are the same
// directory: Linux skips the ".." check then.
func MayRename(c Cred, srcDir, child, dstDir Attr, dstChild *Attr) error {
	return mayRename(c, srcDir, child, dstDir, dstChild, true)
}

// MayRenameWithin checks renaming child inside dir, replacing dstChild (nil
// when the target name is absent).
func MayRenameWithin(c Cred, dir, child Attr, dstChild *Attr) error {
	return mayRename(c, dir, child, dir, dstChild, false)
}

func mayRename(c Cred, srcDir, child, dstDir Attr, dstChild *Attr, crossDir bool) error {
	if err := MayRemove(c, srcDir, child); err != nil {
		return err
	}
	if dstChild == nil {
		if err := MayCreate(c, dstDir); err != nil {
			return err
		}
	} else {
		if err := MayRemove(c, dstDir, *dstChild); err != nil {
			return err
		}
		switch srcIsDir, dstIsDir := isDir(child.Mode), isDir(dstChild.Mode); {
		case srcIsDir && !dstIsDir:
			return fmt.Errorf("perm: rename directory over non-directory: %w", fserr.ErrNotDir)
		case !srcIsDir && dstIsDir:
			return fmt.Errorf("perm: rename non-directory over directory: %w", fserr.ErrIsDir)
		}
	}
	if crossDir && isDir(child.Mode) {
		if err := Access(c, child, W); err != nil {
			return fmt.Errorf("perm: moving directory to new parent needs write on it for '..': %w", err)
		}
	}
	return nil
}

// Chmod returns the mode to store for chmod(mode). Only the owner or root may
// chmod (EPERM). A non-root caller outside the file's group silently loses
// S_ISGID; like setattr_prepare this applies to directories too (POSIX only
// demands it for regular files). Sticky on non-directories is kept, as Linux
// does. Symlink modes cannot change (EOPNOTSUPP, notify_change).
func Chmod(c Cred, a Attr, mode uint32) (newMode uint32, err error) {
	if isLnk(a.Mode) {
		return a.Mode, fmt.Errorf("perm: chmod on symlink: %w", fserr.ErrNotSupported)
	}
	if !ownerOrRoot(c, a) {
		return a.Mode, fmt.Errorf("perm: uid %d chmod of file owned by %d: %w", c.Uid, a.Uid, fserr.ErrPerm)
	}
	newMode = a.Mode&modeType | mode&permBits
	if !inGroupOrRoot(c, a.Gid) {
		newMode &^= setGID
	}
	return newMode, nil
}

// dropSGID is setattr_should_drop_sgid: S_ISGID goes when group-exec is set
// (a real setgid binary) or when the caller could not have set it.
func dropSGID(c Cred, a Attr) bool {
	return a.Mode&setGID != 0 && (a.Mode&syscall.S_IXGRP != 0 || !inGroupOrRoot(c, a.Gid))
}

// Chown applies chown(uid, gid); Unchanged (-1) leaves a field as is. Root may
// set anything. Otherwise (chown_ok/chgrp_ok) only the owner may act: uid may
// only be "changed" to the current owner, and gid to the current group or a
// group the caller is in; anything else is EPERM.
//
// Like chown_common, every chown of a non-directory, even (-1, -1) and even by
// root, clears S_ISUID, and clears S_ISGID if S_IXGRP is set or the caller is
// neither root nor in the file's group. Linux turns that into a mode change,
// which a non-owner non-root caller is refused with EPERM. Directories keep
// their mode.
func Chown(c Cred, a Attr, uid, gid uint32) (newUid, newGid, newMode uint32, err error) {
	root, owner := c.IsRoot(), c.Uid == a.Uid
	newUid, newGid, newMode = a.Uid, a.Gid, a.Mode
	if uid != Unchanged {
		if !root && !(owner && uid == a.Uid) {
			return a.Uid, a.Gid, a.Mode, fmt.Errorf("perm: uid %d chown %d->%d: %w", c.Uid, a.Uid, uid, fserr.ErrPerm)
		}
		newUid = uid
	}
	if gid != Unchanged {
		if !root && !(owner && (gid == a.Gid || c.InGroup(gid))) {
			return a.Uid, a.Gid, a.Mode, fmt.Errorf("perm: uid %d chgrp %d->%d: %w", c.Uid, a.Gid, gid, fserr.ErrPerm)
		}
		newGid = gid
	}
	if isDir(a.Mode) {
		return newUid, newGid, newMode, nil
	}
	killed := a.Mode &^ setUID
	if dropSGID(c, a) {
		killed &^= setGID
	}
	if killed != a.Mode {
		if !root && !owner {
			return a.Uid, a.Gid, a.Mode, fmt.Errorf("perm: uid %d would clear set-id bits of file owned by %d: %w", c.Uid, a.Uid, fserr.ErrPerm)
		}
		// setattr_prepare re-checks S_ISGID against the new group.
		if !inGroupOrRoot(c, newGid) {
			killed &^= setGID
		}
		newMode = killed
	}
	return newUid, newGid, newMode, nil
}

// Utimens checks utimensat. Explicit times (anything but both UTIME_NOW or a
// NULL times pointer) need owner or root (EPERM); toNow needs owner, root or
// W access (EACCES), as may_setattr's ATTR_TOUCH case.
func Utimens(c Cred, a Attr, toNow bool) error {
	if ownerOrRoot(c, a) {
		return nil
	}
	if !toNow {
		return fmt.Errorf("perm: uid %d setting times of file owned by %d: %w", c.Uid, a.Uid, fserr.ErrPerm)
	}
	return Access(c, a, W)
}

// KillSUID returns the mode after a write or truncate by c
// (setattr_should_drop_suidgid): for regular files and non-root callers,
// S_ISUID is cleared, and S_ISGID if S_IXGRP is set or the caller is not in
// the file's group. Check Access(c, a, W) separately for truncate(2).
func KillSUID(c Cred, a Attr) uint32 {
	if !isReg(a.Mode) || c.IsRoot() {
		return a.Mode
	}
	mode := a.Mode &^ setUID
	if dropSGID(c, a) {
		mode &^= setGID
	}
	return mode
}

// NewObject returns mode, uid and gid for an object created by c in parent.
// mode must include the S_IFMT type (FUSE mkdir omits S_IFDIR; add it) and be
// already umasked. The owner is the caller; the group is the parent's if the
// parent is setgid, else the caller's (inode_init_owner). Directories drop
// requested S_ISUID/S_ISGID (vfs_mkdir) and inherit S_ISGID from a setgid
// parent. A non-directory asking for S_ISGID|S_IXGRP in a setgid parent whose
// group a non-root caller is not in loses S_ISGID (mode_strip_sgid). Symlinks
// are always 0777.
func NewObject(c Cred, parent Attr, mode uint32) (newMode, uid, gid uint32) {
	uid, gid = c.Uid, c.Gid
	parentSGID := parent.Mode&setGID != 0
	if parentSGID {
		gid = parent.Gid
	}
	typ, perm := mode&modeType, mode&permBits
	switch {
	case typ == syscall.S_IFDIR:
		perm &= 0777 | sticky
		if parentSGID {
			perm |= setGID
		}
	case typ == syscall.S_IFLNK:
		perm = 0777
	case parentSGID && perm&(setGID|syscall.S_IXGRP) == setGID|syscall.S_IXGRP && !inGroupOrRoot(c, parent.Gid):
		perm &^= setGID
	}
	return typ | perm, uid, gid
}

// MayLink checks creating a hard link to target in dir (vfs_link): MayCreate
// on dir first (EACCES), then EPERM for directories.
func MayLink(c Cred, dir Attr, target Attr) error {
	if err := MayCreate(c, dir); err != nil {
		return err
	}
	if isDir(target.Mode) {
		return fmt.Errorf("perm: hard link to directory: %w", fserr.ErrPerm)
	}
	return nil
}

// Xattr namespaces.
const (
	prefixUser     = "user."
	prefixTrusted  = "trusted."
	prefixSecurity = "security."
	prefixSystem   = "system."
)

// MayGetXattr checks getxattr(name) (xattr_permission with MAY_READ).
// user.*: R on regular files and directories, ENODATA on other types.
// trusted.*: root only, ENODATA for others (it looks absent). security.*: no
// check. system.posix_acl_access and system.posix_acl_default: no check;
// other system.* and unknown namespaces: EOPNOTSUPP, the latter after an R
// check as in Linux. An empty name suffix is EINVAL.
func MayGetXattr(c Cred, a Attr, name string) error {
	return mayXattr(c, a, name, false)
}

// MaySetXattr checks setxattr/removexattr(name) (MAY_WRITE). user.*: W on
// regular files and directories (EACCES); EPERM on other types and, for
// sticky directories, for callers other than the owner or root. trusted.*
// and security.*: root only (EPERM; security.* via the capability LSM).
// The POSIX ACL names: the owner or root (EPERM), not on symlinks
// (EOPNOTSUPP); SetACL and SetDefaultACL check the rest. Other system.*
// and unknown namespaces: EOPNOTSUPP (unknown after a W check).
func MaySetXattr(c Cred, a Attr, name string) error {
	return mayXattr(c, a, name, true)
}

// ListXattrVisible reports whether name is shown to c by listxattr, which
// itself needs no permission: ext4 hides trusted.* from non-root callers.
func ListXattrVisible(c Cred, name string) bool {
	return !strings.HasPrefix(name, prefixTrusted) || c.IsRoot()
}

func mayXattr(c Cred, a Attr, name string, write bool) error {
	want := uint32(R)
	if write {
		want = W
	}
	var suffix string
	switch {
	case IsACLXattr(name):
		if write {
			return maySetACL(c, a)
		}
		return nil
	case strings.HasPrefix(name, prefixSystem):
		return fmt.Errorf("perm: xattr %q: %w", name, fserr.ErrNotSupported)
	case strings.HasPrefix(name, prefixSecurity):
		if write && !c.IsRoot() {
			return fmt.Errorf("perm: uid %d setting %q: %w", c.Uid, name, fserr.ErrPerm)
		}
		suffix = name[len(prefixSecurity):]
	case strings.HasPrefix(name, prefixTrusted):
		if !c.IsRoot() {
			if write {
				return fmt.Errorf("perm: uid %d setting %q: %w", c.Uid, name, fserr.ErrPerm)
			}
			return fmt.Errorf("perm: uid %d reading %q: %w", c.Uid, name, fserr.ErrNoAttr)
		}
		suffix = name[len(prefixTrusted):]
	case strings.HasPrefix(name, prefixUser):
		if !isReg(a.Mode) && !isDir(a.Mode) {
			if write {
				return fmt.Errorf("perm: user xattr on mode %#o: %w", a.Mode, fserr.ErrPerm)
			}
			return fmt.Errorf("perm: user xattr on mode %#o: %w", a.Mode, fserr.ErrNoAttr)
		}
		if write && isDir(a.Mode) && a.Mode&sticky != 0 && !ownerOrRoot(c, a) {
			return fmt.Errorf("perm: uid %d setting %q on sticky dir of uid %d: %w", c.Uid, name, a.Uid, fserr.ErrPerm)
		}
		if err := Access(c, a, want); err != nil {
			return err
		}
		suffix = name[len(prefixUser):]
	default:
		if err := Access(c, a, want); err != nil {
			return err
		}
		return fmt.Errorf("perm: xattr namespace of %q: %w", name, fserr.ErrNotSupported)
	}
	if suffix == "" {
		return fmt.Errorf("perm: xattr name %q: %w", name, fserr.ErrInvalid)
	}
	return nil
}

// IsACLXattr reports whether name is one of the POSIX ACL attributes, which
// live in an object's meta-data rather than among its extended attributes.
func IsACLXattr(name string) bool { return name == XattrACLAccess || name == XattrACLDefault }
