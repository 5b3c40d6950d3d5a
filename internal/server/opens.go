package server

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Open implements wire.StorageServer: it checks access for the open flags,
// counts the handle, so that an unlinked open file stays readable, and
// records what the open granted for the caller's handle.
func (s *Server) Open(ctx context.Context, req *wire.OpenRequest) (*wire.OpenResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	access := perm.OpenAccess(req.Flags)
	want := access
	if req.Flags&syscall.O_TRUNC != 0 {
		want |= perm.W
	}
	// Count the handle before looking: an unlink that commits after this
	// point keeps the object as an orphan instead of deleting it under us.
	// A backup (eventual open) counts nothing: releases go to the
	// primary, and an unlink in backup mode deletes at once.
	// A remote node's open counts only under a named handle, which only
	// that node can release (checkSessions): an anonymous count could be
	// ended by anyone.
	h := req.Caller.GetHandle()
	_, perr := pki.PeerName(ctx)
	inProcess := perr != nil
	counted := s.primary(id) == nil && (h.GetId() != 0 || inProcess)
	dying := s.files.open(id, counted, h)
	// undo ends the count (and the grant of a retried open) of a failed one.
	undo := func() {
		if counted {
			s.files.forget(h, id)
			s.Release(ctx, &wire.ReleaseRequest{Id: req.Id})
		}
	}
	if dying && counted {
		undo()
		return nil, fmt.Errorf("open %v: being deleted: %w", id, fserr.ErrNotExist)
	}
	var ms uint32
	if !req.RegisterOnly {
		ms = s.leases.grant(req.Caller, id)
	}
	var m *wire.Meta
	var fd *wire.FileData
	err := s.store.View(func(tx *store.Tx) (err error) {
		if m, err = tx.Meta(id); err != nil {
			return err
		}
		if m.Nlink == 0 && !isDir(m) {
			return fmt.Errorf("open of unlinked file: %w", fserr.ErrNotExist)
		}
		if err := perm.Access(cred(req.Caller), attr(m), want); err != nil {
			return err
		}
		if req.WantData && access&perm.R != 0 {
			fd, err = fileData(tx, req.Caller, m)
		}
		return err
	})
	if err == nil && !req.RegisterOnly {
		// A registration answers nothing the client uses; the client
		// acknowledges a revocation only after it, so it must not wait.
		err = s.leases.settle(ctx, id)
	}
	if err != nil {
		undo()
		return nil, fmt.Errorf("open %v: %w", id, err)
	}
	if counted {
		s.files.grant(h, id, access)
	}
	if req.RegisterOnly {
		return &wire.OpenResponse{}, nil
	}
	s.inline(fd, m.Size, openInlineMax)
	return &wire.OpenResponse{Meta: m, LeaseMs: ms, Data: fd}, nil
}

// mayData checks a data operation on m (a block transfer, a commit, an
// ftruncate) by caller. Through an open this server recorded, what the
// open granted decides, whatever the mode is now (as for a descriptor on
// Linux: the open that created a file with mode 0 may still write it).
// Otherwise — no handle, or an open this server does not know (made at
// a previous primary, or at a backup under .EventualConsistency) — the
// mode decides, as for a call by path. want is perm.W, or perm.R for
// reading blocks, which an open for writing may do too (a partial block
// write reads the rest of the block first).
func (s *Server) mayData(caller *wire.Caller, m *wire.Meta, want uint32) error {
	id := oid.ID(m.Id)
	if access, ok := s.files.granted(caller.GetHandle(), id); ok {
		if access&want == 0 && (want != perm.R || access&perm.W == 0) {
			return fmt.Errorf("%v through a handle not open for it: %w", id, fserr.ErrBadFD)
		}
		return nil
	}
	c := cred(caller)
	err := perm.Access(c, attr(m), want)
	if err != nil && want == perm.R && perm.Access(c, attr(m), perm.W) == nil {
		return nil
	}
	return err
}

// Release implements wire.StorageServer.
func (s *Server) Release(ctx context.Context, req *wire.ReleaseRequest) (*wire.ReleaseResponse, error) {
	id := oid.ID(req.Id)
	orphan := s.files.release(id, req.Handle)
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
// lives on as an orphan until its last release, and remembers what each
// open granted. Both are this server's soft state, like the orphans: a
// new primary after a failover knows neither (see mayData).
type openFiles struct {
	mu      sync.Mutex
	opens   map[oid.ID]int  // open handles
	orphans map[oid.ID]bool // unlinked while open: delete on last release
	dying   map[oid.ID]int  // deletions decided but not yet committed
	grants  map[handleKey]grant
}

// handleKey names an open: the client core's session and its handle number.
type handleKey struct{ session, id uint64 }

// grant is what one open was allowed: its object and perm.R/perm.W bits.
type grant struct {
	obj    oid.ID
	access uint32
}

func keyOf(h *wire.HandleRef) (handleKey, bool) {
	if h.GetSession() == 0 || h.GetId() == 0 {
		return handleKey{}, false
	}
	return handleKey{h.Session, h.Id}, true
}

func newOpenFiles() openFiles {
	return openFiles{opens: map[oid.ID]int{}, orphans: map[oid.ID]bool{}, dying: map[oid.ID]int{},
		grants: map[handleKey]grant{}}
}

// grant records that the open h (counted by open) may use id with access.
func (f *openFiles) grant(h *wire.HandleRef, id oid.ID, access uint32) {
	k, ok := keyOf(h)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grants[k] = grant{obj: id, access: access}
}

// granted returns what the open h was granted on id; ok is false when
// this server knows no such open of id.
func (f *openFiles) granted(h *wire.HandleRef, id oid.ID) (access uint32, ok bool) {
	k, ok := keyOf(h)
	if !ok {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.grants[k]
	if !ok || g.obj != id {
		return 0, false
	}
	return g.access, true
}

// openNew counts an open of a new object, created in the transaction
// being built, and records its grant; unopen takes both back if that
// transaction does not commit. No one else can know the object yet, so
// nothing races with either. It reports false (and does nothing) for a
// request without a handle.
func (f *openFiles) openNew(h *wire.HandleRef, id oid.ID, access uint32) bool {
	k, ok := keyOf(h)
	if !ok {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opens[id]++
	f.grants[k] = grant{obj: id, access: access}
	return true
}

// handleSessions adds the sessions with an open recorded here to out.
func (f *openFiles) handleSessions(out map[uint64]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.grants {
		out[k.session] = true
	}
}

// forget drops the grant of h on id, if any (not the count).
func (f *openFiles) forget(h *wire.HandleRef, id oid.ID) {
	k, ok := keyOf(h)
	f.mu.Lock()
	defer f.mu.Unlock()
	if ok && f.grants[k].obj == id {
		delete(f.grants, k)
	}
}

// unopen takes back an open of id by h that openNew counted (or that
// the create made for a name it did not add); it never makes an orphan.
func (f *openFiles) unopen(h *wire.HandleRef, id oid.ID) {
	k, ok := keyOf(h)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !ok || f.grants[k].obj != id {
		return
	}
	delete(f.grants, k)
	if f.opens[id]--; f.opens[id] <= 0 {
		delete(f.opens, id)
	}
}

// open counts a handle (when counted; not again for a retried open of
// handle h) and reports whether id is being deleted.
func (f *openFiles) open(id oid.ID, counted bool, h *wire.HandleRef) (dying bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, named := keyOf(h)
	if counted && !(named && f.grants[k].obj == id) {
		f.opens[id]++
	}
	return f.dying[id] > 0
}

// release ends a handle and reports whether it was the last one of an
// orphan, which the caller then deletes (it is marked dying meanwhile).
// A named handle this server did not count (opened at a previous
// primary, or at a backup) is not subtracted from the opens counted here.
func (f *openFiles) release(id oid.ID, h *wire.HandleRef) (orphan bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if k, ok := keyOf(h); ok {
		if f.grants[k].obj != id {
			return false
		}
		delete(f.grants, k)
	}
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
