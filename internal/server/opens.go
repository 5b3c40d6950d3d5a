package server

import (
	"context"
	"fmt"
	"sync"
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
		return nil, aerr
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
	dying := s.files.open(id, counted)
	if dying && counted {
		s.Release(ctx, &wire.ReleaseRequest{Id: req.Id})
		return nil, fmt.Errorf("open %v: being deleted: %w", id, fserr.ErrNotExist)
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
		return nil, fmt.Errorf("open %v: %w", id, err)
	}
	return &wire.OpenResponse{Meta: m, LeaseMs: ms}, nil
}

// Release implements wire.StorageServer.
func (s *Server) Release(ctx context.Context, req *wire.ReleaseRequest) (*wire.ReleaseResponse, error) {
	id := oid.ID(req.Id)
	orphan := s.files.release(id)
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
	return &wire.ReleaseResponse{}, err
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
	s.files.buried(ids)
}

// openFiles counts open handles so that an object unlinked while open
// lives on as an orphan until its last release.
type openFiles struct {
	mu      sync.Mutex
	opens   map[oid.ID]int  // open handles
	orphans map[oid.ID]bool // unlinked while open: delete on last release
	dying   map[oid.ID]int  // deletions decided but not yet committed
}

func newOpenFiles() openFiles {
	return openFiles{opens: map[oid.ID]int{}, orphans: map[oid.ID]bool{}, dying: map[oid.ID]int{}}
}

// open counts a handle (when counted) and reports whether id is being
// deleted.
func (f *openFiles) open(id oid.ID, counted bool) (dying bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if counted {
		f.opens[id]++
	}
	return f.dying[id] > 0
}

// release ends a handle and reports whether it was the last one of an
// orphan, which the caller then deletes (it is marked dying meanwhile).
func (f *openFiles) release(id oid.ID) (orphan bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opens[id]--
	last := f.opens[id] <= 0
	if last {
		delete(f.opens, id)
	}
	orphan = last && f.orphans[id]
	if orphan {
		delete(f.orphans, id)
		// An Open that comes in before the deletion commits may still
		// read the object: the dying mark makes it fail instead.
		f.dying[id]++
	}
	return orphan
}

// unlinked is called when id loses its last link: it reports whether id
// is open, and otherwise marks it dying until buried.
func (f *openFiles) unlinked(id oid.ID) (open bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opens[id] > 0 {
		return true
	}
	f.dying[id]++
	return false
}

func (f *openFiles) orphan(id oid.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.orphans[id] = true
}

// buried ends the dying marks of ids.
func (f *openFiles) buried(ids []oid.ID) {
	if len(ids) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if f.dying[id]--; f.dying[id] <= 0 {
			delete(f.dying, id)
		}
	}
}
