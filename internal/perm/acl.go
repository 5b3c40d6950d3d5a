package perm

import (
	"encoding/binary"
	"fmt"
	"syscall"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

// POSIX ACLs as Linux keeps them (fs/posix_acl.c): an ACL is a list of
// entries in canonical order (owner, named users by uid, owning group,
// named groups by gid, mask, other). The access ACL of an object shares
// three entries with its mode: the owner's and other's permissions are the
// mode's, and the group class bits of the mode are the mask when the ACL
// has one (else the owning group's permissions).

// Names of the extended attributes through which ACLs are read and written.
const (
	XattrACLAccess  = "system.posix_acl_access"
	XattrACLDefault = "system.posix_acl_default"
)

// ACL entry tags (ACL_USER_OBJ... in linux/posix_acl.h).
const (
	TagUserObj  = 0x01
	TagUser     = 0x02
	TagGroupObj = 0x04
	TagGroup    = 0x08
	TagMask     = 0x10
	TagOther    = 0x20
)

// aclVersion is POSIX_ACL_XATTR_VERSION; undefinedID is ACL_UNDEFINED_ID,
// the id written for entries that name no one.
const (
	aclVersion  = 2
	undefinedID = ^uint32(0)
)

// ACLEntriesMax bounds the entries of one ACL (an ext4 block holds about
// 500; the value then stays far below XATTR_SIZE_MAX).
const ACLEntriesMax = 1024

// ACLEntry is one entry: a tag, rwx permission bits and, for TagUser and
// TagGroup, the uid or gid it names.
type ACLEntry struct {
	Tag  uint16
	Perm uint16
	ID   uint32
}

// ACL is a POSIX ACL in canonical order; nil is "none".
type ACL []ACLEntry

// tagRank orders tags canonically.
func tagRank(tag uint16) int {
	switch tag {
	case TagUserObj:
		return 0
	case TagUser:
		return 1
	case TagGroupObj:
		return 2
	case TagGroup:
		return 3
	case TagMask:
		return 4
	case TagOther:
		return 5
	}
	return -1
}

// Valid checks acl as posix_acl_valid does: entries in canonical order,
// exactly one owner, owning group and other entry, named users and groups
// each in strictly ascending id order, permissions within rwx, and a mask
// whenever there is a named entry. Errors wrap fserr.ErrInvalid.
func (acl ACL) Valid() error {
	if len(acl) > ACLEntriesMax {
		return fmt.Errorf("perm: ACL of %d entries: %w", len(acl), fserr.ErrInvalid)
	}
	rank, named, counts := -1, false, [6]int{}
	var prevID uint32
	for i, e := range acl {
		r := tagRank(e.Tag)
		switch {
		case r < 0:
			return fmt.Errorf("perm: ACL entry %d has tag %#x: %w", i, e.Tag, fserr.ErrInvalid)
		case e.Perm&^7 != 0:
			return fmt.Errorf("perm: ACL entry %d has permissions %#o: %w", i, e.Perm, fserr.ErrInvalid)
		case r < rank:
			return fmt.Errorf("perm: ACL entry %d out of order: %w", i, fserr.ErrInvalid)
		case r == rank && e.Tag != TagUser && e.Tag != TagGroup:
			return fmt.Errorf("perm: ACL has two entries with tag %#x: %w", e.Tag, fserr.ErrInvalid)
		case r == rank && e.ID <= prevID:
			return fmt.Errorf("perm: ACL names id %d twice or out of order: %w", e.ID, fserr.ErrInvalid)
		}
		if e.Tag == TagUser || e.Tag == TagGroup {
			named = true
		}
		rank, prevID = r, e.ID
		counts[r]++
	}
	if counts[0] != 1 || counts[2] != 1 || counts[5] != 1 || named && counts[4] == 0 {
		return fmt.Errorf("perm: ACL lacks a required entry: %w", fserr.ErrInvalid)
	}
	return nil
}

// ParseACLXattr decodes the value of system.posix_acl_access or
// system.posix_acl_default as Linux's posix_acl_from_xattr: a little-endian
// header (version 2) then 8-byte entries of tag, perm and id. The id of an
// entry naming no one is ignored. A header with no entries means "no ACL"
// (nil). The ACL must be Valid; every error wraps fserr.ErrInvalid.
func ParseACLXattr(b []byte) (ACL, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("perm: ACL xattr of %d bytes: %w", len(b), fserr.ErrInvalid)
	}
	if v := binary.LittleEndian.Uint32(b); v != aclVersion {
		return nil, fmt.Errorf("perm: ACL xattr version %d: %w", v, fserr.ErrInvalid)
	}
	n := (len(b) - 4) / 8
	if n == 0 {
		return nil, nil
	}
	if n > ACLEntriesMax {
		return nil, fmt.Errorf("perm: ACL of %d entries: %w", n, fserr.ErrInvalid)
	}
	acl := make(ACL, n)
	for i := range acl {
		p := b[4+8*i:]
		e := ACLEntry{Tag: binary.LittleEndian.Uint16(p), Perm: binary.LittleEndian.Uint16(p[2:]), ID: binary.LittleEndian.Uint32(p[4:])}
		if e.Tag != TagUser && e.Tag != TagGroup {
			e.ID = undefinedID
		}
		acl[i] = e
	}
	if err := acl.Valid(); err != nil {
		return nil, err
	}
	return acl, nil
}

// Xattr encodes acl as posix_acl_to_xattr does.
func (acl ACL) Xattr() []byte {
	b := make([]byte, 4+8*len(acl))
	binary.LittleEndian.PutUint32(b, aclVersion)
	for i, e := range acl {
		p := b[4+8*i:]
		id := e.ID
		if e.Tag != TagUser && e.Tag != TagGroup {
			id = undefinedID
		}
		binary.LittleEndian.PutUint16(p, e.Tag)
		binary.LittleEndian.PutUint16(p[2:], e.Perm)
		binary.LittleEndian.PutUint32(p[4:], id)
	}
	return b
}

// find returns the index of the first entry with tag, or -1.
func (acl ACL) find(tag uint16) int {
	for i, e := range acl {
		if e.Tag == tag {
			return i
		}
	}
	return -1
}

// EquivMode is posix_acl_equiv_mode: the permission bits acl sets (owner,
// the mask or else the owning group, other) and whether acl says no more
// than those bits (no mask, no named entry), so that it need not be kept.
func (acl ACL) EquivMode() (mode uint32, equiv bool) {
	equiv = true
	for _, e := range acl {
		p := uint32(e.Perm & 7)
		switch e.Tag {
		case TagUserObj:
			mode |= p << 6
		case TagGroupObj:
			if acl.find(TagMask) < 0 {
				mode |= p << 3
			}
		case TagMask:
			mode |= p << 3
			equiv = false
		case TagOther:
			mode |= p
		default:
			equiv = false
		}
	}
	return mode, equiv
}

// Extended returns what an access ACL keeps beyond its mode: the owning
// group's entry and the named entries, in order, or nil when acl is
// equivalent to a mode. WithMode is its inverse.
func (acl ACL) Extended() ACL {
	if _, equiv := acl.EquivMode(); equiv {
		return nil
	}
	var ext ACL
	for _, e := range acl {
		if e.Tag == TagUser || e.Tag == TagGroupObj || e.Tag == TagGroup {
			ext = append(ext, e)
		}
	}
	return ext
}

// WithMode rebuilds the full access ACL from ext (as Extended returns it)
// and the mode, whose group class bits are the mask. Nil ext gives nil:
// the mode alone is the ACL.
func (ext ACL) WithMode(mode uint32) ACL {
	if len(ext) == 0 {
		return nil
	}
	acl := make(ACL, 0, len(ext)+3)
	acl = append(acl, ACLEntry{Tag: TagUserObj, Perm: uint16(mode >> 6 & 7), ID: undefinedID})
	acl = append(acl, ext...)
	acl = append(acl, ACLEntry{Tag: TagMask, Perm: uint16(mode >> 3 & 7), ID: undefinedID},
		ACLEntry{Tag: TagOther, Perm: uint16(mode & 7), ID: undefinedID})
	return acl
}

// FromMode is the minimal ACL a mode stands for (what getfacl shows for
// an object without an ACL).
func FromMode(mode uint32) ACL {
	return ACL{
		{Tag: TagUserObj, Perm: uint16(mode >> 6 & 7), ID: undefinedID},
		{Tag: TagGroupObj, Perm: uint16(mode >> 3 & 7), ID: undefinedID},
		{Tag: TagOther, Perm: uint16(mode & 7), ID: undefinedID},
	}
}

// aclPermission is posix_acl_permission: the owner entry for the owner,
// else the first named user entry that matches (limited by the mask),
// else any owning-group or named-group entry of the caller's that grants
// want (limited by the mask), EACCES if some group matched but none
// granted, else the other entry.
func aclPermission(c Cred, a Attr, want uint32) bool {
	acl := a.ACL
	mask := uint16(7)
	if i := acl.find(TagMask); i >= 0 {
		mask = acl[i].Perm
	}
	w := uint16(want)
	found := false
	for _, e := range acl {
		switch e.Tag {
		case TagUserObj:
			if c.Uid == a.Uid {
				return e.Perm&w == w
			}
		case TagUser:
			if c.Uid == e.ID {
				return e.Perm&mask&w == w
			}
		case TagGroupObj, TagGroup:
			gid := e.ID
			if e.Tag == TagGroupObj {
				gid = a.Gid
			}
			if c.InGroup(gid) {
				found = true
				if e.Perm&w == w {
					return e.Perm&mask&w == w
				}
			}
		case TagOther:
			return !found && e.Perm&w == w
		}
	}
	return false
}

// aclAllows is acl_permission_check for an object with an access ACL: the
// owner is judged by the mode's owner bits; when the group class bits (the
// mask) are all clear, Linux skips the ACL and uses the mode's group and
// other bits, as does this.
func aclAllows(c Cred, a Attr, want uint32) bool {
	if c.Uid == a.Uid {
		return want&^(a.Mode>>6)&7 == 0
	}
	if a.Mode&syscall.S_IRWXG != 0 {
		return aclPermission(c, a, want)
	}
	mode := a.Mode
	if c.InGroup(a.Gid) {
		mode >>= 3
	}
	return want&^mode&7 == 0
}

// SetACL returns the mode and extended access ACL (see Extended) of a
// after setting its access ACL to acl (nil removes it, keeping the mode),
// as vfs_set_acl and posix_acl_update_mode: only the owner or root may
// (EPERM), not on symlinks (EOPNOTSUPP); the mode takes the ACL's bits,
// and S_ISGID is dropped unless the caller is root or in the group.
func SetACL(c Cred, a Attr, acl ACL) (newMode uint32, ext ACL, err error) {
	if err := maySetACL(c, a); err != nil {
		return a.Mode, nil, err
	}
	if acl == nil {
		return a.Mode, nil, nil
	}
	if err := acl.Valid(); err != nil {
		return a.Mode, nil, err
	}
	bits, _ := acl.EquivMode()
	newMode = a.Mode&^0o777 | bits
	if !inGroupOrRoot(c, a.Gid) {
		newMode &^= setGID
	}
	return newMode, acl.Extended(), nil
}

// SetDefaultACL checks setting a's default ACL to acl (nil removes it):
// owner or root (EPERM); only directories have one (EACCES when setting,
// nothing to do when removing, as posix_acl_xattr_set).
func SetDefaultACL(c Cred, a Attr, acl ACL) error {
	if err := maySetACL(c, a); err != nil {
		return err
	}
	switch {
	case acl == nil:
		return nil
	case !isDir(a.Mode):
		return fmt.Errorf("perm: default ACL on mode %#o: %w", a.Mode, fserr.ErrAccess)
	}
	return acl.Valid()
}

func maySetACL(c Cred, a Attr) error {
	if isLnk(a.Mode) {
		return fmt.Errorf("perm: ACL on symlink: %w", fserr.ErrNotSupported)
	}
	if !ownerOrRoot(c, a) {
		return fmt.Errorf("perm: uid %d setting ACL of file owned by %d: %w", c.Uid, a.Uid, fserr.ErrPerm)
	}
	return nil
}

// InheritACL is posix_acl_create for a new object with (type and
// permission) mode in a directory whose default ACL is def (non-nil;
// without one the caller applies the umask instead). The new object's
// access ACL is def with the owner, other and mask (or owning group)
// entries limited by mode's bits, and the mode takes that ACL's bits; a
// directory also gets def as its default ACL. Symlinks get neither.
// access is the full ACL, nil when equivalent to the mode.
func InheritACL(def ACL, mode uint32) (newMode uint32, access, dflt ACL) {
	if isLnk(mode) || def == nil {
		return mode, nil, nil
	}
	acl := append(ACL(nil), def...)
	hasMask := acl.find(TagMask) >= 0
	for i := range acl {
		e := &acl[i]
		switch {
		case e.Tag == TagUserObj:
			e.Perm &= uint16(mode >> 6 & 7)
		case e.Tag == TagMask, e.Tag == TagGroupObj && !hasMask:
			e.Perm &= uint16(mode >> 3 & 7)
		case e.Tag == TagOther:
			e.Perm &= uint16(mode & 7)
		}
	}
	bits, equiv := acl.EquivMode()
	newMode = mode&^0o777 | bits
	if !equiv {
		access = acl
	}
	if isDir(mode) {
		dflt = append(ACL(nil), def...)
	}
	return newMode, access, dflt
}
