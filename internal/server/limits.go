package server

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Limits on what a client may ask (wire/limits.go), checked at the edge
// before any handler runs, with the errors Linux gives for the same
// mistakes: a client core that checks nothing, or a hostile one, gets a
// clear refusal instead of reaching the store with a name like "a/b" or
// "..", a 1 GiB symlink target or a million-block read.

// Bounds of login messages: an SSH public key or signature in wire format
// (an RSA-16384 key is about 2 KiB) and a nonce (32 bytes).
const (
	maxLoginBlob  = 16 << 10
	maxLoginNonce = 64
)

// checkRequest checks a Storage request's sizes and names. Peer requests
// come from servers, which are trusted (edge.go), and are not checked.
func checkRequest(req any) error {
	if r, ok := req.(interface{ GetCaller() *wire.Caller }); ok {
		if err := checkCaller(r.GetCaller()); err != nil {
			return err
		}
	}
	switch r := req.(type) {
	case *wire.LookupRequest:
		if r.Name == ".." || r.Name == "." {
			return nil // the parent (Meta.parent); "." is no entry (ENOENT)
		}
		return checkName(r.Name)
	case *wire.CreateRequest:
		return checkCreate(r)
	case *wire.LinkRequest:
		return checkName(r.Name)
	case *wire.RemoveRequest:
		if r.DirOnly && r.FileOnly {
			return fmt.Errorf("remove both only a directory and only a file: %w", fserr.ErrInvalid)
		}
		return checkName(r.Name)
	case *wire.RenameRequest:
		if err := checkName(r.SrcName); err != nil {
			return err
		}
		return checkName(r.DstName)
	case *wire.SetAttrRequest:
		return checkSetAttr(r)
	case *wire.ReadDirRequest:
		if len(r.After) > wire.NameMax {
			return fmt.Errorf("readdir after a name of %d bytes: %w", len(r.After), fserr.ErrNameTooLong)
		}
	case *wire.GetBlocksRequest:
		if r.Count > wire.MaxBlockRefs {
			return fmt.Errorf("%d block references asked, at most %d per call: %w", r.Count, wire.MaxBlockRefs, fserr.ErrArgTooBig)
		}
	case *wire.ReadBlocksRequest:
		if len(r.Hashes) > wire.MaxBlocksPerCall {
			return fmt.Errorf("%d blocks asked, at most %d per call: %w", len(r.Hashes), wire.MaxBlocksPerCall, fserr.ErrArgTooBig)
		}
		for _, h := range r.Hashes {
			if len(h) != 32 {
				return fmt.Errorf("block hash of %d bytes: %w", len(h), fserr.ErrInvalid)
			}
		}
	case *wire.PutBlocksRequest:
		if len(r.Data) > wire.MaxBlocksPerCall {
			return fmt.Errorf("%d blocks sent, at most %d per call: %w", len(r.Data), wire.MaxBlocksPerCall, fserr.ErrArgTooBig)
		}
		for _, d := range r.Data {
			if len(d) > blockSize {
				return fmt.Errorf("block of %d bytes: %w", len(d), fserr.ErrInvalid)
			}
		}
	case *wire.CommitRequest:
		return checkCommit(r)
	case *wire.SyncRequest:
		if len(r.Changes) > wire.MaxSyncChanges {
			return fmt.Errorf("%d changes to sync, at most %d per call: %w", len(r.Changes), wire.MaxSyncChanges, fserr.ErrArgTooBig)
		}
		for _, c := range r.Changes {
			if len(c.Settle) > wire.MaxSyncChanges {
				return fmt.Errorf("%d objects to settle in one change, at most %d: %w", len(c.Settle), wire.MaxSyncChanges, fserr.ErrArgTooBig)
			}
		}
	case *wire.XattrRequest:
		return checkXattr(r)
	case *wire.HoldersRequest:
		if len(r.Blocks) > wire.MaxHolderRanges {
			return fmt.Errorf("%d block ranges, at most %d: %w", len(r.Blocks), wire.MaxHolderRanges, fserr.ErrArgTooBig)
		}
		return checkString("node", r.Node)
	case *wire.ReportHoldingRequest:
		if len(r.Held) > wire.MaxHeldFiles {
			return fmt.Errorf("%d files reported, at most %d: %w", len(r.Held), wire.MaxHeldFiles, fserr.ErrArgTooBig)
		}
		for _, h := range r.Held {
			if err := checkCaller(h.Caller); err != nil {
				return err
			}
		}
		if err := checkString("node", r.Node); err != nil {
			return err
		}
		return checkString("site", r.Site)
	case *wire.LoginChallengeRequest:
		return checkString("user", r.User)
	case *wire.LoginRequest:
		if err := checkString("user", r.User); err != nil {
			return err
		}
		if len(r.Nonce) > maxLoginNonce || len(r.PublicKey) > maxLoginBlob || len(r.Signature) > maxLoginBlob {
			return fmt.Errorf("login with a nonce, key or signature too large: %w", fserr.ErrInvalid)
		}
	}
	return nil
}

// checkName checks a directory entry's name as Linux would: at most
// NAME_MAX bytes, not empty, ".", "..", and no '/' or NUL.
func checkName(name string) error {
	switch {
	case len(name) > wire.NameMax:
		return fmt.Errorf("name of %d bytes: %w", len(name), fserr.ErrNameTooLong)
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("name %q: %w", name, fserr.ErrInvalid)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("name %q contains '/' or NUL: %w", name, fserr.ErrInvalid)
	}
	return nil
}

// checkString bounds a site name, node ID or user name.
func checkString(what, s string) error {
	if len(s) > wire.MaxCueString {
		return fmt.Errorf("%s of %d bytes: %w", what, len(s), fserr.ErrNameTooLong)
	}
	return nil
}

func checkCaller(c *wire.Caller) error {
	if len(c.GetGroups()) > wire.MaxGroups {
		return fmt.Errorf("%d groups: %w", len(c.GetGroups()), fserr.ErrInvalid)
	}
	if len(c.GetAdopt()) > wire.MaxAdopt {
		return fmt.Errorf("%d objects to adopt: %w", len(c.GetAdopt()), fserr.ErrInvalid)
	}
	return nil
}

func checkCreate(r *wire.CreateRequest) error {
	if err := checkName(r.Name); err != nil {
		return err
	}
	if r.Type == wire.Type_TYPE_SYMLINK {
		switch {
		case len(r.Target) >= wire.PathMax:
			return fmt.Errorf("symlink target of %d bytes: %w", len(r.Target), fserr.ErrNameTooLong)
		case r.Target == "":
			return fmt.Errorf("empty symlink target: %w", fserr.ErrNotExist)
		case strings.IndexByte(r.Target, 0) >= 0:
			return fmt.Errorf("symlink target contains NUL: %w", fserr.ErrInvalid)
		}
	} else if r.Target != "" {
		return fmt.Errorf("a target for a %v: %w", r.Type, fserr.ErrInvalid)
	}
	if r.SyncLevel > cue.MaxRepLevel {
		return fmt.Errorf("sync level %d: %w", r.SyncLevel, fserr.ErrInvalid)
	}
	if c := r.Cues; c != nil {
		if c.RepLevel < 0 || c.RepLevel > cue.MaxRepLevel || c.RepSites < 0 || c.RepSites > cue.MaxRepLevel {
			return fmt.Errorf("cues RepLevel=%d RepSites=%d: %w", c.RepLevel, c.RepSites, fserr.ErrInvalid)
		}
		if err := checkString("site cue", c.Site); err != nil {
			return err
		}
	}
	if err := checkString("origin", r.Origin); err != nil {
		return err
	}
	return checkString("client site", r.ClientSite)
}

// checkSize checks a new file size: as Linux's truncate, EINVAL for a
// negative one (off_t), EFBIG beyond the largest file.
func checkSize(size uint64) error {
	switch {
	case size > 1<<63-1:
		return fmt.Errorf("negative size: %w", fserr.ErrInvalid)
	case size > wire.MaxFileSize:
		return fmt.Errorf("size %d above %d: %w", size, uint64(wire.MaxFileSize), fserr.ErrTooBig)
	}
	return nil
}

func checkSetAttr(r *wire.SetAttrRequest) error {
	if r.Valid&wire.SetSize != 0 {
		if err := checkSize(r.Size); err != nil {
			return err
		}
	}
	if r.SyncLevel > cue.MaxRepLevel {
		return fmt.Errorf("sync level %d: %w", r.SyncLevel, fserr.ErrInvalid)
	}
	return nil
}

func checkCommit(r *wire.CommitRequest) error {
	if err := checkSize(r.Size); err != nil {
		return err
	}
	if r.SyncLevel > cue.MaxRepLevel {
		return fmt.Errorf("sync level %d: %w", r.SyncLevel, fserr.ErrInvalid)
	}
	for _, b := range r.Blocks {
		if len(b.Hash) != 32 {
			return fmt.Errorf("block %d with a hash of %d bytes: %w", b.Index, len(b.Hash), fserr.ErrInvalid)
		}
		if b.Index >= wire.MaxFileSize/blockSize {
			return fmt.Errorf("block %d: %w", b.Index, fserr.ErrTooBig)
		}
	}
	for _, a := range r.Attrs {
		if err := checkCaller(a.Caller); err != nil {
			return err
		}
		if err := checkSetAttr(a); err != nil {
			return err
		}
	}
	return nil
}

// checkXattr checks an attribute's name and value as Linux's getxattr,
// setxattr and removexattr do: ERANGE for an empty or too long name,
// E2BIG for a value above XATTR_SIZE_MAX.
func checkXattr(r *wire.XattrRequest) error {
	if r.Flags&^(xattrCreate|xattrReplace) != 0 || r.Flags == xattrCreate|xattrReplace {
		return fmt.Errorf("xattr flags %#x: %w", r.Flags, fserr.ErrInvalid)
	}
	if len(r.Value) > wire.XattrSizeMax {
		return fmt.Errorf("xattr value of %d bytes: %w", len(r.Value), fserr.ErrArgTooBig)
	}
	if len(r.Name) > wire.XattrNameMax {
		return fmt.Errorf("xattr name of %d bytes: %w", len(r.Name), fserr.ErrRange)
	}
	return nil
}

// xattrRoom refuses to set attribute name to value on id when the
// object's visible attributes would no longer fit a listxattr answer
// (XattrListMax) or together exceed XattrTotalMax: ENOSPC, as ext4 says
// when its attribute block is full. Hidden names (tombstones) do not count.
func xattrRoom(tx *store.Tx, id oid.ID, name string, value []byte) error {
	names, total := len(name)+1, len(name)+len(value)
	tx.EachXattr(id, "\x01", func(n string, v []byte) bool {
		if n != name {
			names += len(n) + 1
			total += len(n) + len(v)
		}
		return names <= wire.XattrListMax && total <= wire.XattrTotalMax
	})
	if names > wire.XattrListMax || total > wire.XattrTotalMax {
		return fmt.Errorf("extended attributes of %v full: %w", id, fserr.ErrNoSpace)
	}
	return nil
}

// boundListing trims a ReadDir answer to MaxListBytes of entries and
// their meta-data (at least one entry, so that a listing progresses); the
// client continues after the last entry it got.
func boundListing(resp *wire.ReadDirResponse) {
	size, m := 0, 0
	for i, e := range resp.Entries {
		n := proto.Size(e)
		meta := m < len(resp.Metas) && resp.Metas[m].Id == e.Id // metas follow the entries' order
		if meta {
			// Xattrs and datas (readdir-plus) are aligned with metas.
			n += proto.Size(resp.Metas[m])
			if m < len(resp.Xattrs) {
				n += proto.Size(resp.Xattrs[m])
			}
			if m < len(resp.Datas) {
				n += proto.Size(resp.Datas[m])
			}
		}
		if size+n > wire.MaxListBytes && i > 0 {
			resp.Entries, resp.Metas = resp.Entries[:i], resp.Metas[:m]
			resp.Xattrs = resp.Xattrs[:min(m, len(resp.Xattrs))]
			resp.Datas = resp.Datas[:min(m, len(resp.Datas))]
			resp.Eof = false
			return
		}
		size += n
		if meta {
			m++
		}
	}
}
