// The client API's own types: what callers (the FUSE adapter, tools) get
// back instead of the storage protocol's messages.

package client

import (
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Type is the kind of an object. It is the wire enum under the client's
// name, so callers build CreateArgs without importing the wire package.
type Type = wire.Type

// The object types.
const (
	TypeFile    = wire.Type_TYPE_FILE
	TypeDir     = wire.Type_TYPE_DIR
	TypeSymlink = wire.Type_TYPE_SYMLINK
)

// Attr is an object's meta-data as the client API returns it. Field names
// follow wire.Meta, so code moving from one to the other reads the same.
type Attr struct {
	Id      uint64
	Type    Type
	Mode    uint32 // permission bits incl. setuid/setgid/sticky (no type bits)
	Uid     uint32
	Gid     uint32
	Size    uint64
	Nlink   uint32
	AtimeNs int64
	MtimeNs int64
	CtimeNs int64
	Version uint64
	Rdev    uint32
	Target  string // symlink target
	Parent  uint64 // directories: the parent directory (for "..")
}

// attrOf converts wire meta-data; nil stays nil.
func attrOf(m *wire.Meta) *Attr {
	if m == nil {
		return nil
	}
	return &Attr{Id: m.Id, Type: m.Type, Mode: m.Mode, Uid: m.Uid, Gid: m.Gid, Size: m.Size,
		Nlink: m.Nlink, AtimeNs: m.AtimeNs, MtimeNs: m.MtimeNs, CtimeNs: m.CtimeNs,
		Version: m.Version, Rdev: m.Rdev, Target: m.Target, Parent: m.Parent}
}

// attrResult converts the result of an operation returning wire meta-data.
func attrResult(m *wire.Meta, err error) (*Attr, error) {
	if err != nil {
		return nil, err
	}
	return attrOf(m), nil
}

// Entry is one name in a directory listing.
type Entry struct {
	Name string
	Id   uint64
	Type Type
	// Attr is the object's meta-data when the listing brought it
	// (.WholeFile), nil otherwise.
	Attr *Attr
}

// entriesOf converts a listing; metas, when not nil, parallels entries.
func entriesOf(entries []*wire.Entry, metas []*wire.Meta) []Entry {
	byID := make(map[uint64]*wire.Meta, len(metas))
	for _, m := range metas {
		byID[m.Id] = m
	}
	out := make([]Entry, len(entries))
	for i, e := range entries {
		out[i] = Entry{Name: e.Name, Id: e.Id, Type: e.Type}
		if m := byID[e.Id]; m != nil {
			out[i].Attr = attrOf(m)
		}
	}
	return out
}

// The attributes an AttrChange sets (its Valid bits).
const (
	SetMode  = wire.SetMode
	SetUID   = wire.SetUID
	SetGID   = wire.SetGID
	SetSize  = wire.SetSize
	SetAtime = wire.SetAtime
	SetMtime = wire.SetMtime
)

// AttrChange is a chmod, chown, truncate or utimens: Valid says which
// fields apply.
type AttrChange struct {
	Valid    uint32
	Mode     uint32
	Uid      uint32
	Gid      uint32
	Size     uint64
	AtimeNs  int64
	MtimeNs  int64
	AtimeNow bool
	MtimeNow bool
	// Handle, when not nil, is the open file the change goes through
	// (ftruncate, futimens): a size change is checked against what its
	// open was granted, not against the mode.
	Handle *Handle
}

func (c AttrChange) request() *wire.SetAttrRequest {
	return &wire.SetAttrRequest{Valid: c.Valid, Mode: c.Mode, Uid: c.Uid, Gid: c.Gid, Size: c.Size,
		AtimeNs: c.AtimeNs, MtimeNs: c.MtimeNs, AtimeNow: c.AtimeNow, MtimeNow: c.MtimeNow, ViaHandle: c.Handle != nil}
}

// StatFS is the file system's capacity, as statfs(2) reports it.
type StatFS struct {
	Blocks, Bfree, Bavail uint64 // in units of Bsize
	Files, Ffree          uint64
	Bsize                 uint32
	NameLen               uint32
}
