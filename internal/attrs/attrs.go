// Package attrs applies chmod, chown and utimens requests to an object's
// meta-data under POSIX permission rules. The server applies them
// authoritatively; a client applies them to a file it holds open with
// buffered writes, so they travel with the data in one commit.
package attrs

import (
	"syscall"

	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/wire"
)

var typeBits = map[wire.Type]uint32{
	wire.Type_TYPE_FILE:    syscall.S_IFREG,
	wire.Type_TYPE_DIR:     syscall.S_IFDIR,
	wire.Type_TYPE_SYMLINK: syscall.S_IFLNK,
	wire.Type_TYPE_FIFO:    syscall.S_IFIFO,
	wire.Type_TYPE_SOCKET:  syscall.S_IFSOCK,
	wire.Type_TYPE_CHAR:    syscall.S_IFCHR,
	wire.Type_TYPE_BLOCK:   syscall.S_IFBLK,
}

// TypeBits returns the S_IFMT bits of an object type.
func TypeBits(t wire.Type) uint32 { return typeBits[t] }

// TypeOfMode returns the object type of an st_mode, and false for none.
func TypeOfMode(mode uint32) (wire.Type, bool) {
	for t, bits := range typeBits {
		if mode&syscall.S_IFMT == bits {
			return t, true
		}
	}
	return wire.Type_TYPE_UNSPECIFIED, false
}

// Mode returns the full st_mode (type and permission bits) of m.
func Mode(m *wire.Meta) uint32 { return m.Mode&0o7777 | typeBits[m.Type] }

// Of returns m's permission-relevant attributes, its access ACL included.
func Of(m *wire.Meta) perm.Attr {
	mode := Mode(m)
	return perm.Attr{Mode: mode, Uid: m.Uid, Gid: m.Gid, ACL: ACL(m.Acl).WithMode(mode)}
}

// ACL converts ACL entries from the wire.
func ACL(es []*wire.AclEntry) perm.ACL {
	if len(es) == 0 {
		return nil
	}
	acl := make(perm.ACL, len(es))
	for i, e := range es {
		acl[i] = perm.ACLEntry{Tag: uint16(e.Tag), Perm: uint16(e.Perm), ID: e.Id}
	}
	return acl
}

// WireACL converts ACL entries to the wire.
func WireACL(acl perm.ACL) []*wire.AclEntry {
	if len(acl) == 0 {
		return nil
	}
	es := make([]*wire.AclEntry, len(acl))
	for i, e := range acl {
		es[i] = &wire.AclEntry{Tag: uint32(e.Tag), Perm: uint32(e.Perm), Id: e.ID}
	}
	return es
}

// ACLXattr returns the value of the ACL attribute name
// (perm.XattrACLAccess or perm.XattrACLDefault) of m, and false when m
// has no such ACL (ENODATA: getfacl then shows the mode).
func ACLXattr(m *wire.Meta, name string) ([]byte, bool) {
	var acl perm.ACL
	if name == perm.XattrACLAccess {
		acl = ACL(m.Acl).WithMode(Mode(m))
	} else {
		acl = ACL(m.DefaultAcl)
	}
	if acl == nil {
		return nil, false
	}
	return acl.Xattr(), true
}

// ACLNames lists the ACL attributes m has, as listxattr shows them.
func ACLNames(m *wire.Meta) []string {
	var names []string
	if len(m.Acl) > 0 {
		names = append(names, perm.XattrACLAccess)
	}
	if len(m.DefaultAcl) > 0 {
		names = append(names, perm.XattrACLDefault)
	}
	return names
}

// SetACLXattr sets (value non-nil) or removes the ACL attribute name of m
// for c, updating m's mode as Linux does for an access ACL. m is
// unchanged on error; the error wraps fserr.ErrInvalid for a malformed
// value. Removing an ACL that m does not have succeeds, as on ext4 (ACLs
// are set to "none" rather than removed as other attributes are).
func SetACLXattr(c perm.Cred, m *wire.Meta, name string, value []byte, remove bool) error {
	var acl perm.ACL
	if !remove {
		var err error
		if acl, err = perm.ParseACLXattr(value); err != nil {
			return err
		}
	}
	a := Of(m)
	if name == perm.XattrACLDefault {
		if err := perm.SetDefaultACL(c, a, acl); err != nil {
			return err
		}
		m.DefaultAcl = WireACL(acl)
		return nil
	}
	mode, ext, err := perm.SetACL(c, a, acl)
	if err != nil {
		return err
	}
	m.Mode, m.Acl = mode&0o7777, WireACL(ext)
	return nil
}

// Cred converts a wire caller; a missing caller is the least privileged user.
func Cred(c *wire.Caller) perm.Cred {
	if c == nil {
		return perm.Cred{Uid: 65534, Gid: 65534}
	}
	return perm.Cred{Uid: c.Uid, Gid: c.Gid, Groups: c.Groups}
}

// Apply changes m's mode, owner and times as req asks (size is not its
// business), checking the caller's permission first. m is unchanged on error.
func Apply(c perm.Cred, m *wire.Meta, req *wire.SetAttrRequest, now int64) error {
	mode, uid, gid := m.Mode, m.Uid, m.Gid
	if req.Valid&wire.SetMode != 0 {
		nm, err := perm.Chmod(c, Of(m), req.Mode&0o7777|typeBits[m.Type])
		switch {
		case err == nil:
			mode = nm & 0o7777
		case killsPrivOnly(c, m, req.Mode&0o7777):
			// Before a write by a non-owner the kernel asks, as that
			// user, to drop setuid/setgid: allowed to anyone who may write.
			mode = req.Mode & 0o7777
		default:
			return err
		}
	}
	if req.Valid&(wire.SetUID|wire.SetGID) != 0 {
		u, g := perm.Unchanged, perm.Unchanged
		if req.Valid&wire.SetUID != 0 {
			u = req.Uid
		}
		if req.Valid&wire.SetGID != 0 {
			g = req.Gid
		}
		a := perm.Attr{Mode: mode | typeBits[m.Type], Uid: uid, Gid: gid}
		nu, ng, nm, err := perm.Chown(c, a, u, g)
		if err != nil {
			return err
		}
		uid, gid, mode = nu, ng, nm&0o7777
	}
	atime, mtime := m.AtimeNs, m.MtimeNs
	if req.Valid&(wire.SetAtime|wire.SetMtime) != 0 {
		toNow := (req.Valid&wire.SetAtime == 0 || req.AtimeNow) && (req.Valid&wire.SetMtime == 0 || req.MtimeNow)
		if err := perm.Utimens(c, Of(m), toNow); err != nil && !(req.ViaHandle && c.Uid == m.Uid) {
			return err
		}
		if req.Valid&wire.SetAtime != 0 {
			atime = req.AtimeNs
			if req.AtimeNow {
				atime = now
			}
		}
		if req.Valid&wire.SetMtime != 0 {
			mtime = req.MtimeNs
			if req.MtimeNow {
				mtime = now
			}
		}
	}
	m.Mode, m.Uid, m.Gid, m.AtimeNs, m.MtimeNs = mode, uid, gid, atime, mtime
	return nil
}

// killsPrivOnly reports whether changing m's mode to mode only clears the
// setuid/setgid bits, by a caller with write access.
func killsPrivOnly(c perm.Cred, m *wire.Meta, mode uint32) bool {
	const priv = syscall.S_ISUID | syscall.S_ISGID
	old := m.Mode & 0o7777
	return mode != old && mode&^priv == old&^priv && mode&priv&^old == 0 && perm.Access(c, Of(m), perm.W) == nil
}
