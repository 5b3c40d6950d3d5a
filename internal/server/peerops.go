package server

import (
	"context"
	"fmt"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/protobuf/proto"
)

// createObject stores a new object under policy pol; with access, it
// also opens it for handle h (see Create), counted and granted in the
// same transaction.
func (s *Server) createObject(ctx context.Context, pol configsvc.Policy, tmpl *wire.Meta, sync uint32, h *wire.HandleRef, access uint32) (*wire.Meta, error) {
	slice, err := s.sliceFor(ctx, pol)
	if err != nil {
		return nil, err
	}
	m := proto.Clone(tmpl).(*wire.Meta)
	var opened oid.ID
	unopen := func() {
		if opened != 0 {
			s.files.unopen(h, opened)
			opened = 0
		}
	}
	err = s.updateUndo(ctx, sync, func(tx *store.Tx) error {
		unopen()
		n, err := tx.NextCounter(slice)
		if err != nil {
			return err
		}
		m.Id = uint64(oid.Make(slice, n))
		if err := tx.PutMeta(m); err != nil {
			return err
		}
		if access != 0 && s.files.openNew(h, oid.ID(m.Id), access) {
			opened = oid.ID(m.Id)
		}
		return nil
	}, unopen)
	if err != nil {
		unopen()
		return nil, fmt.Errorf("create object: %w", err)
	}
	return m, nil
}

func (s *Server) addLink(ctx context.Context, req *wire.AddLinkRequest) (*wire.AddLinkResponse, error) {
	id := oid.ID(req.Id)
	now := time.Now().UnixNano()
	// The source decided who counts the link from its slice table; if
	// this server is not (or no longer) the object's primary it must
	// refuse, or the link would be counted nowhere.
	if req.Count {
		if err := s.primary(id); err != nil {
			return nil, err
		}
	}
	if req.Dir == 0 {
		if !req.Count {
			return nil, fmt.Errorf("add link: nothing to do: %w", fserr.ErrInvalid)
		}
		return &wire.AddLinkResponse{}, s.update(ctx, req.SyncLevel, func(tx *store.Tx) error { return addNlink(tx, id, now) })
	}
	dir := oid.ID(req.Dir)
	if err := s.primary(dir); err != nil {
		return nil, err
	}
	if req.Object == nil || req.Object.Id != req.Id || isDir(req.Object) {
		return nil, fmt.Errorf("add link: bad object: %w", fserr.ErrInvalid)
	}
	c := cred(req.Caller)
	// A name to be replaced whose object is elsewhere: its meta-data for
	// the permission check, and its link dropped there afterwards.
	var remote *wire.Meta
	var remoteOwner string
	var existing *wire.Entry
	_ = s.store.View(func(tx *store.Tx) error {
		existing, _ = tx.Entry(dir, req.Name)
		return nil
	})
	if existing != nil && existing.Id != req.Id && existing.Type != wire.Type_TYPE_DIR &&
		req.Flags&wire.RenameNoReplace == 0 && s.primary(oid.ID(existing.Id)) != nil {
		var err error
		if remote, remoteOwner, err = s.remoteMeta(ctx, oid.ID(existing.Id)); err != nil {
			return nil, err
		}
	}
	resp := &wire.AddLinkResponse{}
	var dying, spared []oid.ID
	defer func() { s.buried(dying); s.files.unspared(spared) }()
	dropRemote := false
	err := s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
		resp.Replaced, resp.Same, dropRemote = nil, false, false
		dd, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		de, err := entryIfAny(tx, dir, req.Name)
		if err != nil {
			return err
		}
		var target *wire.Meta
		if de != nil {
			if de.Id == req.Id {
				resp.Same = true
				return nil
			}
			if req.Flags&wire.RenameNoReplace != 0 {
				return fmt.Errorf("%q: %w", req.Name, fserr.ErrExist)
			}
			if de.Type == wire.Type_TYPE_DIR {
				return fmt.Errorf("rename non-directory over directory %q: %w", req.Name, fserr.ErrIsDir)
			}
			switch {
			case s.primary(oid.ID(de.Id)) == nil:
				if target, err = tx.Meta(oid.ID(de.Id)); err != nil {
					return err
				}
			case remote != nil && remote.Id == de.Id:
				target, dropRemote = proto.Clone(remote).(*wire.Meta), true
			default:
				return fmt.Errorf("%q changed meanwhile: %w", req.Name, fserr.ErrNotPrimary)
			}
			if err := perm.MayRemove(c, attr(dd), attr(target)); err != nil {
				return err
			}
		} else if err := perm.MayCreate(c, attr(dd)); err != nil {
			return err
		}
		if req.Count {
			if err := addNlink(tx, id, now); err != nil {
				return err
			}
		}
		if target != nil {
			if !dropRemote {
				if err := s.unlinkReplaced(tx, target, now, &dying, &spared); err != nil {
					return err
				}
			}
			resp.Replaced = target
		}
		ne := &wire.Entry{Name: req.Name, Id: req.Id, Type: req.Object.Type, Version: 1}
		if de != nil {
			ne.Version = de.Version + 1
		}
		if err := tx.PutEntry(dir, ne); err != nil {
			return err
		}
		touch(dd, now, true)
		return tx.PutMeta(dd)
	})
	if err != nil {
		return nil, err
	}
	if dropRemote {
		if err := s.dropLink(ctx, remoteOwner, oid.ID(resp.Replaced.Id), true); err != nil {
			s.log.Warn("could not unlink a replaced file on its server", "id", oid.ID(resp.Replaced.Id), "err", err)
		}
	}
	return resp, nil
}

// addNlink counts one more link to id, which must still have one.
func addNlink(tx *store.Tx, id oid.ID, now int64) error {
	m, err := tx.Meta(id)
	if err != nil {
		return err
	}
	if m.Nlink == 0 {
		return fmt.Errorf("link to removed object %v: %w", id, fserr.ErrNotExist)
	}
	m.Nlink++
	touch(m, now, false)
	return tx.PutMeta(m)
}

// dropLinkHere removes a link to an object of this server on behalf of
// the server that removed its name (Peer.DropLink).
func (s *Server) dropLinkHere(ctx context.Context, req *wire.DropLinkRequest) (*wire.DropLinkResponse, error) {
	id := oid.ID(req.Id)
	if err := s.primary(id); err != nil {
		return nil, err
	}
	if req.Handle != nil {
		s.files.unopen(req.Handle, id)
	}
	now := time.Now().UnixNano()
	var out *wire.Meta
	var dying, spared []oid.ID
	defer func() { s.buried(dying); s.files.unspared(spared) }()
	err := s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := unlinkKind(m, req.DirOnly, req.FileOnly); err != nil {
			return err
		}
		if req.Caller != nil && req.Dir != nil {
			if err := perm.MayRemove(cred(req.Caller), attr(req.Dir), attr(m)); err != nil {
				return err
			}
		}
		if err := emptyDir(tx, m); err != nil {
			return err
		}
		out = m
		if req.Replaced {
			return s.unlinkReplaced(tx, m, now, &dying, &spared)
		}
		return s.unlinkObject(tx, m, now, &dying)
	})
	if err != nil {
		return nil, fmt.Errorf("drop link to %v: %w", id, err)
	}
	return &wire.DropLinkResponse{Meta: out}, nil
}
