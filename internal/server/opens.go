package server

import (
	"context"
	"fmt"
	"syscall"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Open implements wire.StorageServer: it checks access for the open flags
// and counts the handle, so that an unlinked open file stays readable.
func (s *Server) Open(ctx context.Context, req *wire.OpenRequest) (*wire.OpenResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	var want uint32
	switch req.Flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		want = perm.R
	case syscall.O_WRONLY:
		want = perm.W
	default:
		want = perm.R | perm.W
	}
	if req.Flags&syscall.O_TRUNC != 0 {
		want |= perm.W
	}
	// Count the handle before looking: an unlink that commits after this
	// point keeps the object as an orphan instead of deleting it under us.
	// A backup (eventual open) counts nothing: releases go to the
	// primary, and an unlink in backup mode deletes at once.
	counted := s.primary(id) == nil
	s.mu.Lock()
	if counted {
		s.opens[id]++
	}
	dying := s.dying[id] > 0
	s.mu.Unlock()
	if dying && counted {
		s.Release(ctx, &wire.ReleaseRequest{Id: req.Id})
		return nil, fserr.ToStatus(fmt.Errorf("open %v: being deleted: %w", id, fserr.ErrNotExist))
	}
	ms := s.leases.grant(req.Caller, id)
	var m *wire.Meta
	err := s.store.View(func(tx *store.Tx) (err error) {
		if m, err = tx.Meta(id); err != nil {
			return err
		}
		if m.Nlink == 0 && !isDir(m) {
			return fmt.Errorf("open of unlinked file: %w", fserr.ErrNotExist)
		}
		return perm.Access(cred(req.Caller), attr(m), want)
	})
	if err != nil {
		if counted {
			s.Release(ctx, &wire.ReleaseRequest{Id: req.Id})
		}
		return nil, fserr.ToStatus(fmt.Errorf("open %v: %w", id, err))
	}
	return &wire.OpenResponse{Meta: m, LeaseMs: ms}, nil
}

// Release implements wire.StorageServer.
func (s *Server) Release(ctx context.Context, req *wire.ReleaseRequest) (*wire.ReleaseResponse, error) {
	id := oid.ID(req.Id)
	s.mu.Lock()
	s.opens[id]--
	last := s.opens[id] <= 0
	if last {
		delete(s.opens, id)
	}
	orphan := last && s.orphans[id]
	if orphan {
		delete(s.orphans, id)
		// An Open that comes in before the deletion commits may still
		// read the object: the dying mark makes it fail instead.
		s.dying[id]++
	}
	s.mu.Unlock()
	if !orphan {
		return &wire.ReleaseResponse{}, nil
	}
	defer s.buried([]oid.ID{id})
	err := s.update(ctx, 0, func(tx *store.Tx) error {
		if _, err := tx.Sys(orphanKey(id)); err != nil {
			return nil // not an orphan
		}
		if err := tx.DeleteSys(orphanKey(id)); err != nil {
			return err
		}
		return tx.DeleteObject(id)
	})
	return &wire.ReleaseResponse{}, fserr.ToStatus(err)
}

// cleanOrphans deletes files unlinked while open before a restart: their
// handles died with the old process.
func (s *Server) cleanOrphans(ctx context.Context) error {
	return s.update(ctx, 1, func(tx *store.Tx) error {
		keys, err := tx.SysKeys("orphan/")
		if err != nil {
			return err
		}
		for _, k := range keys {
			var id uint64
			if _, err := fmt.Sscanf(k, "orphan/%016x", &id); err != nil {
				continue
			}
			if s.primary(oid.ID(id)) != nil {
				continue // another server is its primary now
			}
			if err := tx.DeleteObject(oid.ID(id)); err != nil {
				return err
			}
			if err := tx.DeleteSys(k); err != nil {
				return err
			}
		}
		return nil
	})
}

func orphanKey(id oid.ID) string { return fmt.Sprintf("orphan/%016x", uint64(id)) }

// buried ends the dying marks of an Update that has finished.
func (s *Server) buried(ids []oid.ID) {
	if len(ids) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.dying[id]--; s.dying[id] <= 0 {
			delete(s.dying, id)
		}
	}
}
