package server

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/protobuf/proto"
)

// Rename implements wire.StorageServer. When both directories are on this
// server their entries change in one atomic transaction (otherwise see
// renameAcross, which is not atomic with respect to failures). The objects
// named may live on other servers (write-local placement puts a file
// created by another site's client there): a remote file moves by its
// entries alone (its ctime is not updated), a replaced remote file loses
// its link afterwards, and anything that would need the remote object
// changed atomically (a directory moving between directories or being
// replaced, an exchange) is EXDEV.
func (s *Server) Rename(ctx context.Context, req *wire.RenameRequest) (*wire.RenameResponse, error) {
	src, dst := oid.ID(req.SrcDir), oid.ID(req.DstDir)
	if err := checkRenameFlags(req.Flags); err != nil {
		return nil, err
	}
	ctx, aerr := s.admit(ctx, req.Caller, src)
	if aerr != nil {
		return nil, aerr
	}
	unlock, err := s.names.lock(ctx, nameKey(src, req.SrcName), nameKey(dst, req.DstName))
	if err != nil {
		return nil, fmt.Errorf("rename %q: %w", req.SrcName, err)
	}
	defer unlock()
	resp := &wire.RenameResponse{}
	op := s.once(ctx, req.Caller, src, resp)
	if !s.local(ctx, dst) {
		if s.primary(src) != nil {
			// Backup mode cannot coordinate with another server.
			return nil, fmt.Errorf("rename across servers: %w", fserr.ErrCrossDevice)
		}
		return s.renameAcross(ctx, req, op) // xrename.go
	}
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	var dying, spared []oid.ID
	defer func() { s.buried(dying); s.files.unspared(spared) }()
	// Objects on other servers: their meta-data for the permission checks.
	remote := map[uint64]*wire.Meta{}
	owners := map[uint64]string{}
	var names []*wire.Entry
	_ = s.store.View(func(tx *store.Tx) error {
		if e, err := tx.Entry(src, req.SrcName); err == nil {
			names = append(names, e)
		}
		if e, err := tx.Entry(dst, req.DstName); err == nil {
			names = append(names, e)
		}
		return nil
	})
	for _, e := range names {
		if s.local(ctx, oid.ID(e.Id)) {
			continue
		}
		if req.Flags&wire.RenameExchange != 0 || e.Type == wire.Type_TYPE_DIR && (src != dst || e.Name == req.DstName) {
			return nil, fmt.Errorf("rename involving a directory on another server: %w", fserr.ErrCrossDevice)
		}
		m, owner, err := s.remoteMeta(ctx, oid.ID(e.Id))
		if err != nil {
			return nil, fmt.Errorf("rename %q: %w", req.SrcName, err)
		}
		remote[e.Id], owners[e.Id] = m, owner
	}
	meta := func(tx *store.Tx, id uint64) (*wire.Meta, error) {
		if m, ok := remote[id]; ok {
			return proto.Clone(m).(*wire.Meta), nil
		}
		if !s.local(ctx, oid.ID(id)) {
			return nil, fmt.Errorf("%v changed servers meanwhile: %w", oid.ID(id), fserr.ErrNotPrimary)
		}
		return tx.Meta(oid.ID(id))
	}
	var dropRemote uint64 // a replaced remote file, unlinked after the commit
	err = s.updateUndo(ctx, 0, op.wrap(func(tx *store.Tx) error {
		sd, err := s.dirMeta(tx, src)
		if err != nil {
			return err
		}
		dd := sd
		if dst != src {
			if dd, err = s.dirMeta(tx, dst); err != nil {
				return err
			}
		}
		se, err := tx.Entry(src, req.SrcName)
		if err != nil {
			return err
		}
		child, err := meta(tx, se.Id)
		if err != nil {
			return err
		}
		de, err := entryIfAny(tx, dst, req.DstName)
		if err != nil {
			return err
		}
		var target *wire.Meta
		if de != nil {
			if req.Flags&wire.RenameNoReplace != 0 {
				return fmt.Errorf("%q: %w", req.DstName, fserr.ErrExist)
			}
			if target, err = meta(tx, de.Id); err != nil {
				return err
			}
		} else if req.Flags&wire.RenameExchange != 0 {
			return fmt.Errorf("exchange with missing %q: %w", req.DstName, fserr.ErrNotExist)
		}
		if err := mayRename(c, sd, child, dd, target, req.Flags&wire.RenameExchange != 0); err != nil {
			return err
		}
		if target != nil && target.Id == child.Id {
			return nil // both names are links to one object: nothing to do
		}
		if isDir(child) && src != dst {
			if err := s.checkNotAncestor(tx, oid.ID(child.Id), dst); err != nil {
				return err
			}
		}
		if req.Flags&wire.RenameExchange != 0 {
			return s.exchange(tx, sd, dd, se, de, child, target, now)
		}
		if target != nil {
			// The target loses its name as in rmdir or unlink.
			if err := unlinkKind(target, isDir(child), !isDir(child)); err != nil {
				return err
			}
			if err := emptyDir(tx, target); err != nil {
				return err
			}
			if isDir(target) {
				dd.Nlink--
			}
			if _, ok := remote[target.Id]; ok {
				dropRemote = target.Id
			} else if err := s.unlinkReplaced(tx, target, now, &dying, &spared); err != nil {
				return err
			}
			resp.Replaced = target
		}
		if err := tx.DeleteEntry(src, req.SrcName); err != nil {
			return err
		}
		ne := &wire.Entry{Name: req.DstName, Id: child.Id, Type: child.Type, Version: 1}
		if de != nil {
			ne.Version = de.Version + 1
		}
		if err := tx.PutEntry(dst, ne); err != nil {
			return err
		}
		moveDir(child, sd, dd)
		if _, ok := remote[child.Id]; !ok {
			touch(child, now, false)
			if err := tx.PutMeta(child); err != nil {
				return err
			}
		}
		return putDirs(tx, sd, dd, now)
	}), func() { s.buried(dying); s.files.unspared(spared); dying, spared = nil, nil })
	if err == nil {
		err = op.settle(ctx, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("rename %q to %q: %w", req.SrcName, req.DstName, err)
	}
	if dropRemote != 0 {
		if err := s.dropLink(ctx, owners[dropRemote], oid.ID(dropRemote), true); err != nil {
			// The name is gone; the object keeps one link too many
			// (space, not data, is lost) until an fsck.
			s.log.Warn("could not unlink a replaced file on its server", "id", oid.ID(dropRemote), "err", err)
		}
	}
	return resp, nil
}

// mayRename checks the caller may move child from sd to dd, replacing
// target (nil if none). An exchange moves each of the two objects into the
// other's place, so both moves are checked, and any types may swap.
func mayRename(c perm.Cred, sd, child, dd, target *wire.Meta, exchange bool) error {
	check := func(from, obj, to, over *wire.Meta) error {
		var overAttr *perm.Attr
		if over != nil {
			a := attr(over)
			overAttr = &a
		}
		if from.Id == to.Id {
			return perm.MayRenameWithin(c, attr(from), attr(obj), overAttr)
		}
		return perm.MayRename(c, attr(from), attr(obj), attr(to), overAttr)
	}
	if !exchange {
		return check(sd, child, dd, target)
	}
	if err := check(sd, child, dd, nil); err != nil {
		return err
	}
	return check(dd, target, sd, nil)
}

// checkRenameFlags refuses flags this server does not implement
// (RENAME_WHITEOUT: there are no whiteouts) and invalid combinations, as
// renameat2(2) does: accepting a flag without doing what it asks would
// be a silent lie.
func checkRenameFlags(flags uint32) error {
	switch {
	case flags&^(wire.RenameNoReplace|wire.RenameExchange) != 0:
		return fmt.Errorf("rename flags %#x: %w", flags, fserr.ErrInvalid)
	case flags&wire.RenameNoReplace != 0 && flags&wire.RenameExchange != 0:
		return fmt.Errorf("rename flags %#x: NOREPLACE with EXCHANGE: %w", flags, fserr.ErrInvalid)
	}
	return nil
}

// exchange swaps two names atomically (RENAME_EXCHANGE).
func (s *Server) exchange(tx *store.Tx, sd, dd *wire.Meta, se, de *wire.Entry, a, b *wire.Meta, now int64) error {
	src, dst := oid.ID(sd.Id), oid.ID(dd.Id)
	if isDir(b) && src != dst {
		if err := s.checkNotAncestor(tx, oid.ID(b.Id), src); err != nil {
			return err
		}
	}
	if err := tx.PutEntry(src, &wire.Entry{Name: se.Name, Id: b.Id, Type: b.Type, Version: se.Version + 1}); err != nil {
		return err
	}
	if err := tx.PutEntry(dst, &wire.Entry{Name: de.Name, Id: a.Id, Type: a.Type, Version: de.Version + 1}); err != nil {
		return err
	}
	moveDir(a, sd, dd)
	moveDir(b, dd, sd)
	for _, m := range []*wire.Meta{a, b} {
		touch(m, now, false)
		if err := tx.PutMeta(m); err != nil {
			return err
		}
	}
	return putDirs(tx, sd, dd, now)
}

// moveDir does the bookkeeping of moving obj from directory from to
// directory to: a directory's parent pointer and both link counts ("..").
func moveDir(obj, from, to *wire.Meta) {
	if !isDir(obj) || from.Id == to.Id {
		return
	}
	obj.Parent = to.Id
	from.Nlink--
	to.Nlink++
}

// putDirs stores the one or two directories a rename changed.
func putDirs(tx *store.Tx, sd, dd *wire.Meta, now int64) error {
	touch(sd, now, true)
	if err := tx.PutMeta(sd); err != nil {
		return err
	}
	if sd.Id != dd.Id {
		touch(dd, now, true)
		return tx.PutMeta(dd)
	}
	return nil
}

// checkNotAncestor refuses to move directory id into its own subtree.
func (s *Server) checkNotAncestor(tx *store.Tx, id, dst oid.ID) error {
	for cur := dst; ; {
		if cur == id {
			return fmt.Errorf("move directory into itself: %w", fserr.ErrInvalid)
		}
		if cur == oid.Root {
			return nil
		}
		m, err := tx.Meta(cur)
		if err != nil {
			return err
		}
		cur = oid.ID(m.Parent)
	}
}

// entryIfAny returns the entry name has in dir, nil if none: the name a
// rename replaces.
func entryIfAny(tx *store.Tx, dir oid.ID, name string) (*wire.Entry, error) {
	e, err := tx.Entry(dir, name)
	if fserr.Errno(err) == syscall.ENOENT {
		return nil, nil
	}
	return e, err
}
