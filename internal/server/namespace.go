package server

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

var (
	cred = attrs.Cred
	attr = attrs.Of
)

func isDir(m *wire.Meta) bool { return m.Type == wire.Type_TYPE_DIR }

// touch records a change to m: new ctime (and mtime), next version.
func touch(m *wire.Meta, now int64, mtime bool) {
	m.CtimeNs = now
	if mtime {
		m.MtimeNs = now
	}
	m.Version++
}

func (s *Server) dirMeta(tx *store.Tx, dir oid.ID) (*wire.Meta, error) {
	m, err := tx.Meta(dir)
	if err != nil {
		return nil, err
	}
	if !isDir(m) {
		return nil, fmt.Errorf("%v: %w", dir, fserr.ErrNotDir)
	}
	return m, nil
}

// Lookup implements wire.StorageServer.
func (s *Server) Lookup(ctx context.Context, req *wire.LookupRequest) (*wire.LookupResponse, error) {
	dir := oid.ID(req.Dir)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, aerr
	}
	resp := &wire.LookupResponse{LeaseMs: s.leases.grant(req.Caller, dir)}
	err := s.store.View(func(tx *store.Tx) error {
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		if err := perm.MayLookup(cred(req.Caller), attr(d)); err != nil {
			return err
		}
		resp.Dir = d
		if req.Name == ".." {
			resp.Meta, err = tx.Meta(oid.ID(d.Parent))
			return err
		}
		e, err := tx.Entry(dir, req.Name)
		if err != nil {
			if req.AbsentOk && errors.Is(err, fserr.ErrNotExist) {
				// An answer the client may keep under the directory's
				// lease: any create, link or rename of the name revokes it.
				resp.Absent = true
				return nil
			}
			return err
		}
		resp.Entry = e
		// The child may live in another slice; this server has its meta
		// only when it is primary for it too.
		if s.local(ctx, oid.ID(e.Id)) {
			resp.Meta, err = tx.Meta(oid.ID(e.Id))
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("lookup %q: %w", req.Name, s.settled(ctx, err, dir))
	}
	if resp.Meta != nil && resp.LeaseMs > 0 {
		// The child's lease is granted only now, so read its meta again:
		// a change between the two reads would not have revoked it.
		id := oid.ID(resp.Meta.Id)
		dirMs := resp.LeaseMs
		resp.LeaseMs = 0
		var inlineMax uint64
		if req.WantData {
			inlineMax = lookupInlineMax
		}
		if ms := s.leases.grant(req.Caller, id); ms > 0 && s.primary(id) == nil {
			if m, sum, fd, err := s.leasedMetaData(req.Caller, id, ms, inlineMax); err == nil {
				resp.Meta, resp.Xattrs, resp.Data = m, sum, fd
				resp.LeaseMs = min(dirMs, ms)
			}
		}
	}
	if err := s.settle(ctx, dir, oid.ID(resp.GetMeta().GetId())); err != nil {
		return nil, fmt.Errorf("lookup %q: %w", req.Name, err)
	}
	return resp, nil
}

// GetAttr implements wire.StorageServer.
func (s *Server) GetAttr(ctx context.Context, req *wire.GetAttrRequest) (*wire.GetAttrResponse, error) {
	id := oid.ID(req.Id)
	ctx, err := s.admit(ctx, req.Caller, id)
	if err != nil {
		return nil, err
	}
	ms := s.leases.grant(req.Caller, id)
	m, sum, err := s.leasedMeta(req.Caller, id, ms)
	err = s.settled(ctx, err, id)
	if err != nil {
		return nil, err
	}
	return &wire.GetAttrResponse{Meta: m, LeaseMs: ms, Xattrs: sum}, nil
}

// primaryMeta returns the meta-data of an object this server is primary for.
func (s *Server) primaryMeta(id oid.ID) (m *wire.Meta, err error) {
	if err := s.primary(id); err != nil {
		return nil, err
	}
	return s.localMeta(id)
}

// localMeta returns this server's copy of id's meta-data.
func (s *Server) localMeta(id oid.ID) (m *wire.Meta, err error) {
	err = s.store.View(func(tx *store.Tx) (err error) {
		m, err = tx.Meta(id)
		return err
	})
	return m, err
}

// Create implements wire.StorageServer. The directory's primary places
// the new object (paper §5.2.2): in its own slice of the object's policy,
// in the directory's slice for .KeepTogether, or — two-step create — at
// the creating client's local server (write-local) or a server at the
// .Site, which stores the object before this server adds the name. If
// that server cannot be reached the object is created here and
// maintenance moves its slice home later.
//
// With open_access (open(2) with O_CREAT) a new file is also opened
// through the caller's handle, counted and granted by the object's
// primary in the transaction that creates it: the open gets the access
// it asked for whatever the new mode is, and no unlink can come between.
func (s *Server) Create(ctx context.Context, req *wire.CreateRequest) (*wire.CreateResponse, error) {
	dir := oid.ID(req.Dir)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, aerr
	}
	bits := attrs.TypeBits(req.Type)
	if bits == 0 {
		return nil, fmt.Errorf("create type %v: %w", req.Type, fserr.ErrInvalid)
	}
	resp := &wire.CreateResponse{}
	deferSync := req.DeferSync && !req.Caller.GetEventual()
	op := s.once(ctx, req.Caller, dir, resp)
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	hk := req.Caller.GetHandle()
	_, named := keyOf(hk)
	open := req.OpenAccess != 0 && req.Type == wire.Type_TYPE_FILE && named
	pol, target := s.place(req, dir)
	var remote *wire.Meta // the object, when another server stored it
	exists := false       // the name existed when placement looked
	if target != s.cfg.ID {
		var tmpl *wire.Meta
		err := s.store.View(func(tx *store.Tx) error {
			if op.lookup(tx) {
				return nil // done by an earlier attempt: not placed again
			}
			d, err := s.dirMeta(tx, dir)
			if err != nil {
				return err
			}
			if _, err := tx.Entry(dir, req.Name); err == nil {
				exists = true // settled below
				return nil
			}
			if err := perm.MayCreate(c, attr(d)); err != nil {
				return err
			}
			tmpl = newMeta(c, d, req, bits, now)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("create %q: %w", req.Name, s.settled(ctx, err, dir))
		}
		if op.replayed() {
			return s.createReplayed(ctx, op, req, deferSync)
		}
		// Try the placement target, then (suspecting it) the next choice.
		for attempt := 0; tmpl != nil && target != s.cfg.ID && attempt < 3; attempt++ {
			var access uint32
			if open {
				access = req.OpenAccess
			}
			remote, err = s.createAt(ctx, target, pol, tmpl, req.SyncLevel, hk, access)
			if err == nil || ctx.Err() != nil {
				break
			}
			s.log.Warn("placement target unreachable", "target", target, "err", err)
			s.suspect(target)
			pol, target = s.place(req, dir)
		}
		if remote == nil && tmpl != nil {
			s.log.Warn("creating the object here; maintenance moves it to its home site later", "name", req.Name, "site", pol.Site)
		}
	}
	slice := dir.Slice()
	if remote == nil && !pol.KeepTogether && !exists {
		var err error
		if slice, err = s.sliceFor(ctx, pol); err != nil {
			return nil, err
		}
	}
	uctx, deferred := ctx, (*deferral)(nil)
	lazy := false
	if deferSync {
		deferred = &deferral{}
		uctx = withDeferral(ctx, deferred)
		// open() promises nothing durable: close() and fsync() make the
		// create durable, with the file's commit when it wrote (one
		// fdatasync for create, write and close), else with a Sync.
		if lazy = s.mayBeLazy(ctx); lazy {
			uctx = store.Lazily(uctx)
		}
	}
	again := false    // a retry of this create, done by its first attempt
	var opened oid.ID // the new local object this attempt opened
	// linked: this attempt committed a name for remote. An error after
	// the commit (the slice lost while replicating) leaves it unknown
	// whether the name outlives a failover, and the client's retry may
	// be answered with it, so the object must stay: at worst it outlives
	// a lost name (space, not data) until an fsck.
	linked := false
	// A function run that does not commit undoes its open and its link
	// (OnAbort), whether it failed, was undone to revoke leases or its
	// batch failed.
	err := s.update(uctx, req.SyncLevel, op.wrap(func(tx *store.Tx) error {
		*resp = wire.CreateResponse{}
		again, linked = false, false
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		if d.Nlink == 0 {
			return fmt.Errorf("directory removed: %w", fserr.ErrNotExist)
		}
		if e, err := tx.Entry(dir, req.Name); err == nil {
			if sameCreate(e, req) {
				// This create, made here before (a retry whose answer was
				// lost, or a merged copy of its eventual fallback).
				resp.Entry, again = e, true
				resp.Meta, err = tx.Meta(oid.ID(e.Id))
				if errors.Is(err, fserr.ErrNotExist) {
					resp.Meta, err = nil, nil // at another server: the client asks it
				}
				return err
			}
			if req.Exclusive || req.Type != wire.Type_TYPE_FILE || e.Type != wire.Type_TYPE_FILE {
				return fmt.Errorf("%q: %w", req.Name, fserr.ErrExist)
			}
			if err := perm.MayLookup(c, attr(d)); err != nil {
				return err
			}
			resp.Entry, resp.Existed = e, true
			if s.local(ctx, oid.ID(e.Id)) {
				resp.Meta, err = tx.Meta(oid.ID(e.Id))
			}
			return err
		}
		if err := perm.MayCreate(c, attr(d)); err != nil {
			return err
		}
		m := remote
		if m == nil && exists {
			// Removed since placement looked: place again.
			return fmt.Errorf("%q changed meanwhile: %w", req.Name, fserr.ErrNotPrimary)
		}
		if m == nil {
			n, err := tx.NextCounter(slice)
			if err != nil {
				return err
			}
			m = newMeta(c, d, req, bits, now)
			m.Id = uint64(oid.Make(slice, n))
			if err := tx.PutMeta(m); err != nil {
				return err
			}
			if open && s.primary(oid.ID(m.Id)) == nil && s.files.openNew(hk, oid.ID(m.Id), req.OpenAccess) {
				opened = oid.ID(m.Id)
				// Kept once committed, as linked keeps a remote object:
				// a retry here is answered with this open.
				tx.OnAbort(func() {
					s.files.unopen(hk, opened)
					opened = 0
				})
			}
		}
		resp.Opened = open && (remote != nil || opened != 0)
		if m.Type == wire.Type_TYPE_DIR {
			d.Nlink++
		}
		e := &wire.Entry{Name: req.Name, Id: m.Id, Type: m.Type, Version: 1}
		if req.Caller.GetEventual() {
			// Only an eventual create may be made at two replicas.
			e.Op, e.Attempt = req.Op, req.Attempt
		}
		if err := tx.PutEntry(dir, e); err != nil {
			return err
		}
		if remote != nil {
			linked = true
			tx.OnAbort(func() { linked = false })
		}
		touch(d, now, true)
		resp.Entry, resp.Meta, resp.Dir = e, m, d
		return tx.PutMeta(d)
	}))
	if op.replayed() {
		again = true
		if err == nil && deferred == nil {
			err = op.settle(ctx, req.SyncLevel)
		}
	}
	if remote != nil && !linked {
		// The name went elsewhere, or no name was committed: no link to
		// it, nor the open made with it.
		var h *wire.HandleRef
		if open {
			h = hk
		}
		s.dropRemote(target, oid.ID(remote.Id), h)
	}
	if err == nil && resp.Existed {
		// Nothing changed: the existing file is shown as a read shows it.
		err = s.settle(ctx, oid.ID(resp.GetMeta().GetId()))
	}
	if err == nil && deferred != nil {
		if again {
			// The first attempt's replication may still be under way.
			s.addCommitted(deferred, dir.Slice())
			if id := oid.ID(resp.Entry.GetId()); id.Slice() != dir.Slice() {
				s.addCommitted(deferred, id.Slice())
			}
		}
		resp.Pending = deferred.pending
		resp.Lazy = lazy && !resp.Existed // an existing name: nothing made
	}
	if err != nil {
		return nil, fmt.Errorf("create %q: %w", req.Name, err)
	}
	if !again && !resp.Existed && adopterOf(ctx).skips(req.Caller.GetSession(), dir) {
		// The creator keeps its listing of dir current: its lease on dir
		// is renewed (a long tar -x keeps it), and it may keep what it
		// made too (a stat or open of it right after needs no request).
		resp.DirLeaseMs = s.grantCurrent(req.Caller, resp.Dir)
		resp.LeaseMs = s.grantCurrent(req.Caller, resp.Meta)
	}
	return resp, nil
}

// grantCurrent grants the caller a lease on the object m describes, if
// this server is its primary and m is still its current state (it is
// read again after the grant: a later change revokes the lease).
func (s *Server) grantCurrent(c *wire.Caller, m *wire.Meta) uint32 {
	id := oid.ID(m.GetId())
	if m == nil || s.primary(id) != nil {
		return 0
	}
	ms := s.leases.grant(c, id)
	if ms == 0 {
		return 0
	}
	now, known := s.store.RecentMeta(id) // just changed: no read transaction
	if !known {
		_ = s.store.View(func(tx *store.Tx) error {
			now, _ = tx.Meta(id)
			return nil
		})
	}
	current := now != nil && now.Version == m.Version
	if !current {
		return 0
	}
	return ms
}

// createReplayed answers a retried create whose first attempt's outcome
// is recorded (op.resp): as durable as that attempt promised, or with
// what is left to wait for when the create is deferred.
func (s *Server) createReplayed(ctx context.Context, op *onceOp, req *wire.CreateRequest, deferSync bool) (*wire.CreateResponse, error) {
	resp := op.resp.(*wire.CreateResponse)
	if !deferSync {
		if err := op.settle(ctx, req.SyncLevel); err != nil {
			return nil, fmt.Errorf("create %q: %w", req.Name, err)
		}
		return resp, nil
	}
	d := &deferral{}
	dir := oid.ID(req.Dir)
	s.addCommitted(d, dir.Slice())
	if id := oid.ID(resp.Entry.GetId()); id != 0 && id.Slice() != dir.Slice() {
		s.addCommitted(d, id.Slice())
	}
	resp.Pending = d.pending
	resp.Lazy = s.mayBeLazy(ctx) // the first attempt's record may not be synced yet
	return resp, nil
}

// sameCreate reports whether entry e was made by create request req.
func sameCreate(e *wire.Entry, req *wire.CreateRequest) bool {
	return e.Op != 0 && e.Op == req.Op
}

// newMeta returns the meta-data of a new object (without its ID) that c
// creates in directory d. A default ACL of d is inherited as Linux's
// posix_acl_create does, in place of the umask a FUSE_DONT_MASK client
// leaves to us.
func newMeta(c perm.Cred, d *wire.Meta, req *wire.CreateRequest, bits uint32, now int64) *wire.Meta {
	reqMode := req.Mode & 0o7777
	if req.Umask != nil && len(d.DefaultAcl) == 0 {
		reqMode &^= req.GetUmask() & 0o777
	}
	mode, uid, gid := perm.NewObject(c, attr(d), bits|reqMode)
	var access, dflt perm.ACL
	if len(d.DefaultAcl) > 0 {
		var full perm.ACL
		mode, full, dflt = perm.InheritACL(attrs.ACL(d.DefaultAcl), mode)
		access = full.Extended()
	}
	m := &wire.Meta{
		Acl: attrs.WireACL(access), DefaultAcl: attrs.WireACL(dflt),
		Type: req.Type, Mode: mode & 0o7777, Uid: uid, Gid: gid,
		Nlink: 1, AtimeNs: now, MtimeNs: now, CtimeNs: now, BtimeNs: now, Version: 1,
		Rdev: req.Rdev, Target: req.Target, Cues: req.Cues, BlockSize: blockSize,
	}
	if req.Type == wire.Type_TYPE_SYMLINK {
		m.Size = uint64(len(req.Target))
		m.Mode = 0o777
	}
	if req.Type == wire.Type_TYPE_DIR {
		m.Nlink = 2
		m.Parent = d.Id
	}
	return m
}

// Link implements wire.StorageServer.
func (s *Server) Link(ctx context.Context, req *wire.LinkRequest) (*wire.LinkResponse, error) {
	dir, id := oid.ID(req.Dir), oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, aerr
	}
	if !s.local(ctx, id) {
		return nil, fmt.Errorf("link across servers: %w", fserr.ErrCrossDevice)
	}
	resp := &wire.LinkResponse{}
	op := s.once(ctx, req.Caller, dir, resp)
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	err := s.update(ctx, 0, op.wrap(func(tx *store.Tx) error {
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := perm.MayLink(c, attr(d), attr(m)); err != nil {
			return err
		}
		if m.Nlink == 0 {
			return fmt.Errorf("link to removed file: %w", fserr.ErrNotExist)
		}
		if _, err := tx.Entry(dir, req.Name); err == nil {
			return fmt.Errorf("%q: %w", req.Name, fserr.ErrExist)
		}
		m.Nlink++
		touch(m, now, false)
		if err := tx.PutMeta(m); err != nil {
			return err
		}
		if err := tx.PutEntry(dir, &wire.Entry{Name: req.Name, Id: m.Id, Type: m.Type, Version: 1}); err != nil {
			return err
		}
		touch(d, now, true)
		resp.Meta = m
		return tx.PutMeta(d)
	}))
	if err == nil {
		err = op.settle(ctx, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("link %q: %w", req.Name, err)
	}
	return resp, nil
}

// unlinkObject drops one link to m (already removed from its directory)
// and deletes the object when no link and no open handle remain; an open
// one becomes an orphan, its handles recorded as its holders (orphans.go).
// Either way the object is marked dying (and appended to dying) until the
// caller's Update has committed, so that an Open racing with it fails
// instead of counting a handle on an object about to vanish, and a
// release racing with it ends its holder after the commit.
func (s *Server) unlinkObject(tx *store.Tx, m *wire.Meta, now int64, dying *[]oid.ID) error {
	return s.unlinkObjectFor(context.Background(), tx, m, now, dying, nil)
}

// unlinkReplaced is unlinkObject for m losing its name to a rename over
// it: a file losing its last link at its primary is spared for the rename
// grace (orphans.go) rather than deleted.
func (s *Server) unlinkReplaced(tx *store.Tx, m *wire.Meta, now int64, dying, spared *[]oid.ID) error {
	return s.unlinkObjectFor(context.Background(), tx, m, now, dying, spared)
}

// unlinkObjectFor is unlinkObject for a request admitted with ctx (whose
// adopter's own lease on m does not have to be revoked first). With
// spared non-nil, the link is lost to a rename over m: a file losing its
// last link at its primary becomes an orphan held by the grace as well as
// by its handles, and is marked spared (and appended to spared), not
// dying, until the caller's Update has committed, so that opens go on
// meanwhile. A backup deletes at once, as for any unlink there: it counts
// no opens, and only a primary sweeps orphans.
func (s *Server) unlinkObjectFor(ctx context.Context, tx *store.Tx, m *wire.Meta, now int64, dying, spared *[]oid.ID) error {
	id := oid.ID(m.Id)
	graced := spared != nil && !isDir(m) && m.Nlink == 1 && s.primary(id) == nil
	if isDir(m) {
		m.Nlink = 0
	} else if m.Nlink > 0 {
		m.Nlink--
	}
	touch(m, now, false)
	if m.Nlink > 0 {
		return tx.PutMeta(m)
	}
	if err := s.mustRevoke(ctx, id); err != nil {
		return err
	}
	var named []handleKey
	var anon int
	if graced {
		named, anon = s.files.replaced(id)
		*spared = append(*spared, id)
	} else {
		named, anon = s.files.unlinked(id)
		*dying = append(*dying, id)
		if len(named) == 0 && anon == 0 {
			return tx.DeleteObject(id)
		}
	}
	// Unlinked while open, or replaced: keep the data until the last
	// holder ends.
	if err := s.orphan(tx, id, named, anon); err != nil {
		return err
	}
	if graced {
		if err := tx.SetXattr(id, graceKey(time.Unix(0, now).Add(s.cfg.RenameGrace)), []byte(s.cfg.ID)); err != nil {
			return err
		}
	}
	return tx.PutMeta(m)
}

// Remove implements wire.StorageServer.
func (s *Server) Remove(ctx context.Context, req *wire.RemoveRequest) (*wire.RemoveResponse, error) {
	dir := oid.ID(req.Dir)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, aerr
	}
	unlock, err := s.names.lock(ctx, nameKey(dir, req.Name))
	if err != nil {
		return nil, fmt.Errorf("remove %q: %w", req.Name, err)
	}
	defer unlock()
	resp := &wire.RemoveResponse{}
	ctx = s.lazily(ctx)
	op := s.once(ctx, req.Caller, dir, resp)
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	// The object is looked up in the transaction that removes it, and
	// only one whose primary is another server goes the two-step way
	// (removeRemote): a remove that first read the name in a transaction
	// of its own spent a fifth of its CPU there (docs/BENCHMARKS.md).
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	var lookupRefused bool
	err = s.updateUndo(ctx, req.SyncLevel, op.wrap(func(tx *store.Tx) error {
		lookupRefused = true
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		if err := perm.MayLookup(c, attr(d)); err != nil {
			return err
		}
		e, err := tx.Entry(dir, req.Name)
		if err != nil {
			return err
		}
		lookupRefused = false
		if !s.local(ctx, oid.ID(e.Id)) {
			return errObjectElsewhere
		}
		m, err := tx.Meta(oid.ID(e.Id))
		if err != nil {
			return err
		}
		if err := unlinkKind(m, req.DirOnly, req.FileOnly); err != nil {
			return err
		}
		if err := perm.MayRemove(c, attr(d), attr(m)); err != nil {
			return err
		}
		if err := emptyDir(tx, m); err != nil {
			return err
		}
		if isDir(m) {
			d.Nlink--
		}
		if err := tx.DeleteEntry(dir, req.Name); err != nil {
			return err
		}
		if err := s.unlinkObjectFor(ctx, tx, m, now, &dying, nil); err != nil {
			return err
		}
		touch(d, now, true)
		resp.Meta, resp.Dir = m, d
		return tx.PutMeta(d)
	}), func() { s.buried(dying); dying = nil })
	switch {
	case errors.Is(err, errObjectElsewhere):
		return s.removeElsewhere(ctx, req, op, resp)
	case err != nil && lookupRefused:
		// A refusal of the name (ENOENT, EACCES) shows state, as an
		// answer does.
		err = s.settled(ctx, err, dir)
	case err == nil:
		err = op.settle(ctx, req.SyncLevel)
	}
	if err != nil {
		return nil, fmt.Errorf("remove %q: %w", req.Name, err)
	}
	if !op.replayed() && adopterOf(ctx).skips(req.Caller.GetSession(), dir) {
		resp.DirLeaseMs = s.grantCurrent(req.Caller, resp.Dir) // as Create
	}
	return resp, nil
}

// errObjectElsewhere aborts a remove's transaction whose object another
// server is primary for.
var errObjectElsewhere = errors.New("the object's primary is another server")

// removeElsewhere is Remove for a name whose object another server is
// primary for (removeRemote).
func (s *Server) removeElsewhere(ctx context.Context, req *wire.RemoveRequest, op *onceOp, resp *wire.RemoveResponse) (*wire.RemoveResponse, error) {
	dir := oid.ID(req.Dir)
	out, done, err := s.removeRemote(ctx, req, op)
	if !done {
		err = fmt.Errorf("the object moved to this server meanwhile: %w", fserr.ErrNotPrimary)
	}
	if err != nil {
		return nil, fmt.Errorf("remove %q: %w", req.Name, err)
	}
	if !op.replayed() {
		resp.Meta = out
		if adopterOf(ctx).skips(req.Caller.GetSession(), dir) {
			// Read after the change: an adopter takes it only if its
			// version is the one after what it holds (nothing else
			// came between).
			if d, err := s.primaryMeta(dir); err == nil {
				resp.Dir, resp.DirLeaseMs = d, s.grantCurrent(req.Caller, d)
			}
		}
	}
	return resp, nil
}

// removeRemote removes a name whose object another server is primary
// for: that server drops the link (checking permissions and emptiness),
// then the name goes. done is false when the object is local.
func (s *Server) removeRemote(ctx context.Context, req *wire.RemoveRequest, op *onceOp) (out *wire.Meta, done bool, err error) {
	dir := oid.ID(req.Dir)
	var e *wire.Entry
	var d *wire.Meta
	err = s.store.View(func(tx *store.Tx) error {
		if op.lookup(tx) {
			return nil // done by an earlier attempt: no link dropped again
		}
		if d, err = s.dirMeta(tx, dir); err != nil {
			return err
		}
		if err := perm.MayLookup(cred(req.Caller), attr(d)); err != nil {
			return err
		}
		e, err = tx.Entry(dir, req.Name)
		return err
	})
	if err != nil {
		return nil, true, s.settled(ctx, err, dir)
	}
	if op.replayed() {
		return nil, true, op.settle(ctx, req.SyncLevel)
	}
	id := oid.ID(e.Id)
	if s.local(ctx, id) {
		return nil, false, nil
	}
	if e.Type != wire.Type_TYPE_DIR {
		out, err = s.removeRemoteFile(ctx, req, d, e, op)
		return out, true, err
	}
	owner := s.primaryOf(id.Slice())
	if owner == "" {
		return nil, true, fmt.Errorf("no primary for %v: %w", id, fserr.ErrNotPrimary)
	}
	p, err := s.peer(ctx, owner)
	if err != nil {
		return nil, true, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	resp, err := p.DropLink(cctx, &wire.DropLinkRequest{Id: uint64(id), DirOnly: req.DirOnly, FileOnly: req.FileOnly,
		SyncLevel: req.SyncLevel, Caller: req.Caller, Dir: d})
	cancel()
	gone := fserr.Errno(fserr.FromStatus(err)) == syscall.ENOENT // a name left dangling by a crash
	if err != nil && isEventual(ctx) {
		// The name goes now; the object keeps a link until an fsck.
		s.log.Warn("eventual remove: object's primary unreachable", "id", id, "err", err)
		gone = true
	}
	if err != nil && !gone {
		return nil, true, fserr.FromStatus(err)
	}
	now := time.Now().UnixNano()
	if resp != nil {
		op.setAnswer(&wire.RemoveResponse{Meta: resp.Meta})
	}
	err = s.update(ctx, req.SyncLevel, op.wrap(func(tx *store.Tx) error {
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		cur, err := tx.Entry(dir, req.Name)
		if err != nil || cur.Id != e.Id {
			return nil // renamed or removed meanwhile
		}
		if err := tx.DeleteEntry(dir, req.Name); err != nil {
			return err
		}
		if e.Type == wire.Type_TYPE_DIR {
			d.Nlink--
		}
		touch(d, now, true)
		return tx.PutMeta(d)
	}))
	if err == nil {
		err = op.settle(ctx, req.SyncLevel)
	}
	if resp != nil {
		out = resp.Meta
	}
	return out, true, err
}

// removeRemoteFile is removeRemote for a name of a file (or symlink)
// that another server keeps: the name goes first, then that server drops
// the link. In the other order (as a directory must be removed, whose
// emptiness only its own primary can check) a name whose object was
// already gone could be seen in between — listed by a readdir, not found
// by a lookup, ENOENT for a rename — and a fault between the two steps
// (the directory's primary cut off or paused) stretched that to seconds
// (TestLinearizableUnderFaults, "spread"). A failure between them now
// leaves a file with a link and no name, as an eventual remove does.
func (s *Server) removeRemoteFile(ctx context.Context, req *wire.RemoveRequest, d *wire.Meta, e *wire.Entry, op *onceOp) (*wire.Meta, error) {
	dir, id := oid.ID(req.Dir), oid.ID(e.Id)
	if req.DirOnly {
		return nil, fserr.ErrNotDir
	}
	child := &wire.Meta{}
	if d.Mode&syscall.S_ISVTX != 0 { // the child's owner decides
		m, _, err := s.remoteMeta(ctx, id)
		if err != nil && !errors.Is(err, fserr.ErrNotExist) {
			return nil, err
		}
		if m != nil {
			child = m
		}
	}
	if err := perm.MayRemove(cred(req.Caller), attr(d), attr(child)); err != nil {
		return nil, err
	}
	now := time.Now().UnixNano()
	err := s.update(ctx, req.SyncLevel, op.wrap(func(tx *store.Tx) error {
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		cur, err := tx.Entry(dir, req.Name)
		if err != nil {
			return err
		}
		if cur.Id != e.Id {
			return fmt.Errorf("%q names another object now: %w", req.Name, fserr.ErrNotExist)
		}
		if err := tx.DeleteEntry(dir, req.Name); err != nil {
			return err
		}
		touch(d, now, true)
		return tx.PutMeta(d)
	}))
	if err == nil && op.replayed() {
		// Done by an earlier attempt, which dropped the link too.
		return nil, op.settle(ctx, req.SyncLevel)
	}
	if err != nil {
		return nil, err
	}
	out, err := s.dropLinkAt(ctx, id, req)
	if err != nil && !errors.Is(err, fserr.ErrNotExist) { // ENOENT: the name was dangling
		s.log.Warn("remove: the name is gone, the file keeps a link", "id", id, "err", err)
	}
	return out, nil
}

// dropLinkAt asks the primary of id to drop one link to it.
func (s *Server) dropLinkAt(ctx context.Context, id oid.ID, req *wire.RemoveRequest) (*wire.Meta, error) {
	owner := s.primaryOf(id.Slice())
	if owner == "" {
		return nil, fmt.Errorf("no primary for %v: %w", id, fserr.ErrNotPrimary)
	}
	p, err := s.peer(ctx, owner)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	resp, err := p.DropLink(cctx, &wire.DropLinkRequest{Id: uint64(id), FileOnly: req.FileOnly, SyncLevel: req.SyncLevel})
	if err != nil {
		return nil, fserr.FromStatus(err)
	}
	return resp.Meta, nil
}

// SetAttr implements wire.StorageServer.
func (s *Server) SetAttr(ctx context.Context, req *wire.SetAttrRequest) (*wire.SetAttrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	resp := &wire.SetAttrResponse{}
	if req.Valid&wire.SetSize == 0 { // a truncation is a write: durable now
		ctx = s.lazily(ctx)
	}
	op := s.once(ctx, req.Caller, id, resp)
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	err := s.update(ctx, req.SyncLevel, op.wrap(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := attrs.Apply(c, m, req, now); err != nil {
			return err
		}
		if req.Valid&wire.SetSize != 0 {
			if err := s.truncate(tx, c, m, req); err != nil {
				return err
			}
		}
		touch(m, now, false)
		resp.Meta = m
		return tx.PutMeta(m)
	}))
	if err == nil {
		err = op.settle(ctx, req.SyncLevel)
	}
	if err != nil {
		return nil, fmt.Errorf("setattr %v: %w", id, err)
	}
	return resp, nil
}

// ReadDir implements wire.StorageServer.
func (s *Server) ReadDir(ctx context.Context, req *wire.ReadDirRequest) (*wire.ReadDirResponse, error) {
	dir := oid.ID(req.Dir)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, aerr
	}
	limit := int(req.Limit)
	if limit <= 0 || limit > wire.MaxListEntries {
		limit = wire.MaxListEntries
	}
	resp := &wire.ReadDirResponse{LeaseMs: s.leases.grant(req.Caller, dir)}
	err := s.store.View(func(tx *store.Tx) error {
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		if err := perm.Access(cred(req.Caller), attr(d), perm.R); err != nil {
			return err
		}
		resp.Dir = d
		if resp.LeaseMs > 0 && req.After == "" {
			resp.DirXattrs = xattrSummary(tx, req.Caller, d)
		}
		if resp.Entries, err = tx.Entries(dir, req.After, limit); err != nil {
			return err
		}
		resp.Eof = len(resp.Entries) < limit
		if req.WithMeta {
			for _, e := range resp.Entries {
				if !s.local(ctx, oid.ID(e.Id)) {
					continue
				}
				m, err := tx.Meta(oid.ID(e.Id))
				if err != nil {
					return err
				}
				resp.Metas = append(resp.Metas, m)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("readdir %v: %w", dir, s.settled(ctx, err, dir))
	}
	if req.Plus && resp.LeaseMs > 0 && len(resp.Entries) <= plusPageMax {
		s.readDirPlus(ctx, req.Caller, resp, req.WithMeta)
	}
	boundListing(resp)
	ids := []oid.ID{dir}
	for _, m := range resp.Metas {
		ids = append(ids, oid.ID(m.Id))
	}
	if err := s.settle(ctx, ids...); err != nil {
		return nil, fmt.Errorf("readdir %v: %w", dir, err)
	}
	return resp, nil
}

// readDirPlus adds to a leased listing the meta-data and xattr summaries
// of the entries this server keeps, under one lease on all of them
// (granted before they are read, as every lease), so that the client
// answers the lookups, stats and getxattrs of `ls -l` itself. Without
// that lease (an entry being changed) the listing goes alone. With data
// (.WholeFile) small files' contents come too, up to plusDataMax bytes.
func (s *Server) readDirPlus(ctx context.Context, c *wire.Caller, resp *wire.ReadDirResponse, data bool) {
	var ids []oid.ID
	for _, e := range resp.Entries {
		if id := oid.ID(e.Id); s.local(ctx, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	ms := s.leases.grant(c, ids...)
	if ms == 0 {
		return
	}
	var metas []*wire.Meta
	var sums []*wire.XattrSummary
	var datas []*wire.FileData
	budget := uint64(plusDataMax)
	err := s.store.View(func(tx *store.Tx) error {
		for _, id := range ids {
			m, err := tx.Meta(id)
			if errors.Is(err, fserr.ErrNotExist) {
				continue // removed since the listing was read
			}
			if err != nil {
				return err
			}
			sum := xattrSummary(tx, c, m)
			if sum == nil {
				sum = &wire.XattrSummary{} // version 0: no summary
			}
			metas = append(metas, m)
			sums = append(sums, sum)
			if !data {
				continue
			}
			var fd *wire.FileData
			if m.Size <= lookupInlineMax && m.Size <= budget {
				if fd, err = fileData(tx, c, m); err != nil {
					return err
				}
			}
			if fd == nil {
				fd = &wire.FileData{} // version 0: none
			} else {
				budget -= m.Size
			}
			datas = append(datas, fd)
		}
		return nil
	})
	if err != nil {
		return
	}
	for i, fd := range datas {
		s.inline(fd, metas[i].Size, lookupInlineMax)
	}
	resp.Metas, resp.Xattrs, resp.Datas, resp.MetasLeaseMs = metas, sums, datas, min(ms, resp.LeaseMs)
}

// unlinkKind checks that m is of the kind a removal asks for: dirOnly
// (rmdir, or a directory renamed over it), fileOnly (unlink, or a file
// renamed over it).
func unlinkKind(m *wire.Meta, dirOnly, fileOnly bool) error {
	switch {
	case dirOnly && !isDir(m):
		return fserr.ErrNotDir
	case fileOnly && isDir(m):
		return fserr.ErrIsDir
	}
	return nil
}

// emptyDir refuses to unlink a directory that still has entries.
func emptyDir(tx *store.Tx, m *wire.Meta) error {
	if !isDir(m) {
		return nil
	}
	if full, err := tx.HasEntries(oid.ID(m.Id)); err != nil {
		return err
	} else if full {
		return fserr.ErrNotEmpty
	}
	return nil
}
