package server

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

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
	// undo ends the count (and the grant of a retried open) of a failed
	// one, as the handle's release would: an unlink that committed
	// meanwhile may have recorded it as a holder of the orphan.
	undo := func() {
		if counted {
			// Also when the open failed for its deadline.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.PeerTimeout)
			defer cancel()
			if h.GetId() == 0 {
				h = nil
			}
			if _, err := s.Release(rctx, &wire.ReleaseRequest{Id: req.Id, Handle: h}); err != nil {
				s.log.Warn("release of a failed open", "id", id, "err", err)
			}
		}
	}
	if dying && counted {
		undo()
		return nil, fmt.Errorf("open %v: being deleted: %w", id, fserr.ErrNotExist)
	}
	if _, known := s.files.granted(h, id); known && counted && req.RegisterOnly {
		// Registered again by a client that saw the primary change
		// (back to this one): it was not counted twice.
		return &wire.OpenResponse{}, nil
	}
	var ms uint32
	if !req.RegisterOnly {
		ms = s.leases.grant(req.Caller, id)
	}
	var m *wire.Meta
	var fd *wire.FileData
	spared := false // a file a rename replaced, in its grace
	err := s.store.View(func(tx *store.Tx) (err error) {
		if m, err = tx.Meta(id); err != nil {
			return err
		}
		if m.Nlink == 0 && !isDir(m) && !(req.RegisterOnly && s.isHolder(ctx, tx, id, h)) {
			// An orphan's holder registering at a new primary goes on, and
			// so does any open of a file a rename replaced a moment ago.
			if spared = inGrace(tx, id, time.Now()); !spared {
				return fmt.Errorf("open of unlinked file: %w", fserr.ErrNotExist)
			}
		}
		if err := perm.Access(cred(req.Caller), attr(m), want); err != nil {
			return err
		}
		if req.WantData && access&perm.R != 0 {
			fd, err = fileData(tx, req.Caller, m)
		}
		return err
	})
	if !req.RegisterOnly {
		// A registration answers nothing the client uses; the client
		// acknowledges a revocation only after it, so it must not wait.
		err = s.settled(ctx, err, id)
	}
	if err == nil && spared && counted {
		err = s.holdSpared(ctx, id, h)
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

// buried ends the dying marks of an Update that has finished.
func (s *Server) buried(ids []oid.ID) {
	s.files.buried(ids)
}

// openFiles counts open handles, so that an object losing its last link
// while open becomes an orphan, and remembers what each open granted.
// Both are this server's soft state: a new primary after a failover
// knows neither (see mayData). Only when an object becomes an orphan are
// its open handles written down, replicated, as its holders (orphans.go).
type openFiles struct {
	mu    sync.Mutex
	opens map[oid.ID]int // open handles, named and anonymous
	dying map[oid.ID]int // last links removed but not yet committed
	// spared are files losing their last link to a rename over it, not
	// yet committed: they stay for the rename grace, so opens go on.
	spared map[oid.ID]int
	grants map[handleKey]grant
	// released are orphans' holders whose release could not be made
	// durable (holder key → node): the orphan sweep ends them.
	released map[oid.ID]map[string]string
}

// handleKey names an open: the client core's session and its handle number.
type handleKey struct{ session, id uint64 }

// grant is what one open was allowed: its object and perm.R/perm.W bits.
// A counted open whose checks are still running is known (so that an
// unlink meanwhile records it as a holder) but grants nothing yet.
type grant struct {
	obj    oid.ID
	access uint32
	ready  bool
}

func keyOf(h *wire.HandleRef) (handleKey, bool) {
	if h.GetSession() == 0 || h.GetId() == 0 {
		return handleKey{}, false
	}
	return handleKey{h.Session, h.Id}, true
}

func newOpenFiles() openFiles {
	return openFiles{opens: map[oid.ID]int{}, dying: map[oid.ID]int{}, spared: map[oid.ID]int{},
		grants:   map[handleKey]grant{},
		released: map[oid.ID]map[string]string{}}
}

// grant records that the open h (counted by open) may use id with access.
func (f *openFiles) grant(h *wire.HandleRef, id oid.ID, access uint32) {
	k, ok := keyOf(h)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grants[k] = grant{obj: id, access: access, ready: true}
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
	if !ok || g.obj != id || !g.ready {
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
	f.grants[k] = grant{obj: id, access: access, ready: true}
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
		if named {
			f.grants[k] = grant{obj: id}
		}
	}
	return f.dying[id] > 0
}

// release ends a handle (a named one only if this server counted it:
// one opened at a previous primary, or at a backup, is not subtracted
// from the opens counted here). It reports whether id is losing its last
// link in a transaction not yet committed (the holders it records may
// include h), and, for an anonymous h, how many anonymous opens of id
// are left (a named release does not count them: it walks no grants).
func (f *openFiles) release(id oid.ID, h *wire.HandleRef) (pending bool, anon int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k, named := keyOf(h)
	if !named || f.grants[k].obj == id {
		if named {
			delete(f.grants, k)
		}
		if f.opens[id]--; f.opens[id] <= 0 {
			delete(f.opens, id)
		}
	}
	pending = f.dying[id] > 0 || f.spared[id] > 0
	if named {
		return pending, 0
	}
	return pending, f.anonLocked(id)
}

// releasedLate records that the holder key (of node) of orphan id was
// released but the release did not commit.
func (f *openFiles) releasedLate(id oid.ID, key, node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.released[id] == nil {
		f.released[id] = map[string]string{}
	}
	f.released[id][key] = node
}

// wasReleased reports whether releasedLate recorded holder key of node.
func (f *openFiles) wasReleased(id oid.ID, key, node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.released[id][key]
	return ok && n == node
}

// forgetReleased drops what releasedLate recorded of id.
func (f *openFiles) forgetReleased(id oid.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.released, id)
}

// anonLocked counts the anonymous (in-process, handle-less) opens of id.
func (f *openFiles) anonLocked(id oid.ID) int {
	n := f.opens[id]
	if n == 0 {
		return 0
	}
	for _, g := range f.grants {
		if g.obj == id {
			n--
		}
	}
	return max(n, 0)
}

// anonOpen reports whether id has anonymous opens counted here.
func (f *openFiles) anonOpen(id oid.ID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.anonLocked(id) > 0
}

// unlinked is called when id loses its last link: it marks id dying
// until buried and returns the handles open on it (their number, for the
// anonymous ones), which then hold it as an orphan. Marking and reading
// happen at once, so a release either comes before (and is not a
// holder) or sees the mark (and ends its holder after the commit).
func (f *openFiles) unlinked(id oid.ID) (named []handleKey, anon int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dying[id]++
	return f.holdersLocked(id)
}

// replaced is unlinked for a file a rename replaces: it is marked spared
// until unspared, not dying, since it stays (for the rename grace).
func (f *openFiles) replaced(id oid.ID) (named []handleKey, anon int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.spared[id]++
	return f.holdersLocked(id)
}

// unspared ends the marks of replaced.
func (f *openFiles) unspared(ids []oid.ID) { f.unmark(f.spared, ids) }

func (f *openFiles) holdersLocked(id oid.ID) (named []handleKey, anon int) {
	if f.opens[id] == 0 {
		return nil, 0
	}
	for k, g := range f.grants {
		if g.obj == id {
			named = append(named, k)
		}
	}
	return named, max(f.opens[id]-len(named), 0)
}

// buried ends the dying marks of ids.
func (f *openFiles) buried(ids []oid.ID) { f.unmark(f.dying, ids) }

// unmark takes one mark of each of ids from marks (dying or spared).
func (f *openFiles) unmark(marks map[oid.ID]int, ids []oid.ID) {
	if len(ids) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if marks[id]--; marks[id] <= 0 {
			delete(marks, id)
		}
	}
}
