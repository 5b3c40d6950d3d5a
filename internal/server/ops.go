package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/protobuf/proto"
)

// blockSize is the file block size (DESIGN.md: 64 KiB).
const blockSize = 64 << 10

var (
	cred = attrs.Cred
	attr = attrs.Of
)

func isDir(m *wire.Meta) bool { return m.Type == wire.Type_TYPE_DIR }

// ownerOrAccess allows operations on a file the caller has open: the
// kernel checked permission at open, so the owner keeps access even
// after a chmod, as with an open descriptor on a local file system.
func ownerOrAccess(c perm.Cred, m *wire.Meta, want uint32) error {
	if c.IsRoot() || c.Uid == m.Uid {
		return nil
	}
	return perm.Access(c, attr(m), want)
}

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
		return nil, fserr.ToStatus(aerr)
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
		return nil, fserr.ToStatus(fmt.Errorf("lookup %q: %w", req.Name, err))
	}
	if resp.Meta != nil && resp.LeaseMs > 0 {
		// The child's lease is granted only now, so read its meta again:
		// a change between the two reads would not have revoked it.
		id := oid.ID(resp.Meta.Id)
		if ms := s.leases.grant(req.Caller, id); ms > 0 {
			if m, err := s.primaryMeta(id); err == nil {
				resp.Meta = m
				resp.LeaseMs = min(resp.LeaseMs, ms)
			} else {
				resp.LeaseMs = 0
			}
		} else {
			resp.LeaseMs = 0
		}
	}
	return resp, nil
}

// GetAttr implements wire.StorageServer.
func (s *Server) GetAttr(ctx context.Context, req *wire.GetAttrRequest) (*wire.GetAttrResponse, error) {
	id := oid.ID(req.Id)
	if _, err := s.admit(ctx, req.Caller, id); err != nil {
		return nil, fserr.ToStatus(err)
	}
	ms := s.leases.grant(req.Caller, id)
	m, err := s.localMeta(id)
	if err != nil {
		return nil, fserr.ToStatus(err)
	}
	return &wire.GetAttrResponse{Meta: m, LeaseMs: ms}, nil
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

func policyOf(c *wire.Cues, parent configsvc.Policy, site string) configsvc.Policy {
	p := configsvc.Policy{Site: site, RepLevel: DefaultRepLevel}
	if c == nil {
		return p
	}
	if c.KeepTogether {
		p = parent
		p.KeepTogether = true
	}
	if c.Site != "" {
		p.Site = c.Site
	}
	if c.RepLevel > 0 {
		p.RepLevel = int(c.RepLevel)
	}
	if c.RepSites > 0 {
		p.RepSites = int(c.RepSites)
	}
	p.EventualDirs = c.Eventual
	return p
}

// Create implements wire.StorageServer. The directory's primary places
// the new object (paper §5.2.2): in its own slice of the object's policy,
// in the directory's slice for .KeepTogether, or — two-step create — at
// the creating client's local server (write-local) or a server at the
// .Site, which stores the object before this server adds the name. If
// that server cannot be reached the object is created here and
// maintenance moves its slice home later.
func (s *Server) Create(ctx context.Context, req *wire.CreateRequest) (*wire.CreateResponse, error) {
	dir := oid.ID(req.Dir)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	bits := attrs.TypeBits(req.Type)
	if bits == 0 {
		return nil, fserr.ToStatus(fmt.Errorf("create type %v: %w", req.Type, fserr.ErrInvalid))
	}
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	pol, target := s.place(req, dir)
	var remote *wire.Meta // the object, when another server stored it
	exists := false       // the name existed when placement looked
	if target != s.cfg.ID {
		var tmpl *wire.Meta
		err := s.store.View(func(tx *store.Tx) error {
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
			return nil, fserr.ToStatus(fmt.Errorf("create %q: %w", req.Name, err))
		}
		// Try the placement target, then (suspecting it) the next choice.
		for attempt := 0; tmpl != nil && target != s.cfg.ID && attempt < 3; attempt++ {
			remote, err = s.createAt(ctx, target, pol, tmpl, req.SyncLevel)
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
			return nil, fserr.ToStatus(err)
		}
	}
	resp := &wire.CreateResponse{}
	err := s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
		d, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		if d.Nlink == 0 {
			return fmt.Errorf("directory removed: %w", fserr.ErrNotExist)
		}
		if e, err := tx.Entry(dir, req.Name); err == nil {
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
		}
		if m.Type == wire.Type_TYPE_DIR {
			d.Nlink++
		}
		e := &wire.Entry{Name: req.Name, Id: m.Id, Type: m.Type, Version: 1}
		if err := tx.PutEntry(dir, e); err != nil {
			return err
		}
		touch(d, now, true)
		resp.Entry, resp.Meta, resp.Dir = e, m, d
		return tx.PutMeta(d)
	})
	if remote != nil && (err != nil || resp.Existed) {
		s.dropRemote(target, oid.ID(remote.Id)) // the name went elsewhere: no link to it
	}
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("create %q: %w", req.Name, err))
	}
	return resp, nil
}

// newMeta returns the meta-data of a new object (without its ID) that c
// creates in directory d.
func newMeta(c perm.Cred, d *wire.Meta, req *wire.CreateRequest, bits uint32, now int64) *wire.Meta {
	mode, uid, gid := perm.NewObject(c, attr(d), bits|req.Mode&0o7777)
	m := &wire.Meta{
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

// place decides the new object's slice policy and the server to store it.
func (s *Server) place(req *wire.CreateRequest, dir oid.ID) (configsvc.Policy, string) {
	s.mu.Lock()
	parent, ok := s.policies[dir.Slice()]
	s.mu.Unlock()
	if !ok {
		parent = s.defaultPolicy()
	}
	pol := policyOf(req.Cues, parent, s.cfg.Site)
	cues := req.GetCues()
	switch {
	case cues.GetKeepTogether():
		parent.KeepTogether = true
		return parent, s.cfg.ID // the directory's own slice
	case cues.GetSite() == cue.SiteRandom:
		if t := s.table.Load(); t != nil {
			ids := make([]string, 0, len(t.Servers))
			for id := range t.Servers {
				if !s.suspected(id) {
					ids = append(ids, id)
				}
			}
			if len(ids) > 0 {
				id := ids[rand.IntN(len(ids))]
				pol.Site = t.Servers[id].Site
				return pol, id
			}
		}
		pol.Site = s.cfg.Site
		return pol, s.cfg.ID
	case cues.GetSite() != "":
		if pol.Site == s.cfg.Site {
			return pol, s.cfg.ID
		}
		if ids := s.siteServers(pol.Site, req.Name); len(ids) > 0 {
			return pol, ids[0]
		}
		return pol, s.cfg.ID // nobody there: here for now, home later
	}
	// Write-local: the creating client's own server, else a server at
	// the client's site.
	if o := req.Origin; o != "" && o != s.cfg.ID && s.registered(o) && !s.suspected(o) {
		if t := s.table.Load(); t != nil {
			pol.Site = t.Servers[o].Site
			return pol, o
		}
	}
	if cs := req.ClientSite; req.Origin == "" && cs != "" && cs != s.cfg.Site {
		if ids := s.siteServers(cs, req.Name); len(ids) > 0 {
			pol.Site = cs
			return pol, ids[0]
		}
	}
	return pol, s.cfg.ID
}

// createAt asks server target to store a new object.
func (s *Server) createAt(ctx context.Context, target string, pol configsvc.Policy, tmpl *wire.Meta, sync uint32) (*wire.Meta, error) {
	p, err := s.peer(ctx, target)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	resp, err := p.CreateObject(cctx, &wire.CreateObjectRequest{Meta: tmpl, Policy: cuesFromPolicy(pol), SyncLevel: sync})
	if err != nil {
		return nil, err
	}
	return resp.Meta, nil
}

// dropRemote deletes, in the background, an object another server
// created for a name that was not added.
func (s *Server) dropRemote(target string, id oid.ID) {
	go func() {
		if err := s.dropLink(s.bg, target, id); err != nil {
			s.log.Warn("could not delete an object created for a name that was not added", "id", id, "server", target, "err", err)
		}
	}()
}

// dropLink removes one link to object id at its primary, server owner.
func (s *Server) dropLink(ctx context.Context, owner string, id oid.ID) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	p, err := s.peer(ctx, owner)
	if err != nil {
		return err
	}
	_, err = p.DropLink(ctx, &wire.DropLinkRequest{Id: uint64(id)})
	return fserr.FromStatus(err)
}

// Link implements wire.StorageServer.
func (s *Server) Link(ctx context.Context, req *wire.LinkRequest) (*wire.LinkResponse, error) {
	dir, id := oid.ID(req.Dir), oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	if !s.local(ctx, id) {
		return nil, fserr.ToStatus(fmt.Errorf("link across servers: %w", fserr.ErrCrossDevice))
	}
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	var out *wire.Meta
	err := s.update(ctx, 0, func(tx *store.Tx) error {
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
		out = m
		return tx.PutMeta(d)
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("link %q: %w", req.Name, err))
	}
	return &wire.LinkResponse{Meta: out}, nil
}

// unlinkObject drops one link to m (already removed from its directory)
// and deletes the object when no link and no open handle remain. A deleted
// object is marked dying (and appended to dying) until the caller's Update
// has committed, so that an Open racing with it fails instead of counting a
// handle on an object about to vanish.
func (s *Server) unlinkObject(tx *store.Tx, m *wire.Meta, now int64, dying *[]oid.ID) error {
	if isDir(m) {
		m.Nlink = 0
	} else if m.Nlink > 0 {
		m.Nlink--
	}
	touch(m, now, false)
	if m.Nlink > 0 {
		return tx.PutMeta(m)
	}
	id := oid.ID(m.Id)
	if err := s.mustRevoke(id); err != nil {
		return err
	}
	s.mu.Lock()
	open := s.opens[id] > 0
	if !open {
		s.dying[id]++
		*dying = append(*dying, id)
	}
	s.mu.Unlock()
	if open {
		// Unlinked while open: keep the data until the last release.
		if err := tx.PutSys(orphanKey(oid.ID(m.Id)), nil); err != nil {
			return err
		}
		s.mu.Lock()
		s.orphans[oid.ID(m.Id)] = true
		s.mu.Unlock()
		return tx.PutMeta(m)
	}
	return tx.DeleteObject(id)
}

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

func orphanKey(id oid.ID) string { return fmt.Sprintf("orphan/%016x", uint64(id)) }

// Remove implements wire.StorageServer.
func (s *Server) Remove(ctx context.Context, req *wire.RemoveRequest) (*wire.RemoveResponse, error) {
	dir := oid.ID(req.Dir)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	defer s.names.lock(nameKey(dir, req.Name))()
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	if out, done, err := s.removeRemote(ctx, req); done {
		if err != nil {
			return nil, fserr.ToStatus(fmt.Errorf("remove %q: %w", req.Name, err))
		}
		return &wire.RemoveResponse{Meta: out}, nil
	}
	var out *wire.Meta
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	err := s.updateUndo(ctx, req.SyncLevel, func(tx *store.Tx) error {
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
		if !s.local(ctx, oid.ID(e.Id)) {
			return fmt.Errorf("the object moved to another server meanwhile: %w", fserr.ErrNotPrimary)
		}
		m, err := tx.Meta(oid.ID(e.Id))
		if err != nil {
			return err
		}
		switch {
		case req.DirOnly && !isDir(m):
			return fserr.ErrNotDir
		case req.FileOnly && isDir(m):
			return fserr.ErrIsDir
		}
		if err := perm.MayRemove(c, attr(d), attr(m)); err != nil {
			return err
		}
		if isDir(m) {
			if full, err := tx.HasEntries(oid.ID(m.Id)); err != nil {
				return err
			} else if full {
				return fserr.ErrNotEmpty
			}
			d.Nlink--
		}
		if err := tx.DeleteEntry(dir, req.Name); err != nil {
			return err
		}
		if err := s.unlinkObject(tx, m, now, &dying); err != nil {
			return err
		}
		touch(d, now, true)
		out = m
		return tx.PutMeta(d)
	}, func() { s.buried(dying); dying = nil })
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("remove %q: %w", req.Name, err))
	}
	return &wire.RemoveResponse{Meta: out}, nil
}

// removeRemote removes a name whose object another server is primary
// for: that server drops the link (checking permissions and emptiness),
// then the name goes. done is false when the object is local.
func (s *Server) removeRemote(ctx context.Context, req *wire.RemoveRequest) (out *wire.Meta, done bool, err error) {
	dir := oid.ID(req.Dir)
	var e *wire.Entry
	var d *wire.Meta
	err = s.store.View(func(tx *store.Tx) error {
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
		return nil, true, err
	}
	id := oid.ID(e.Id)
	if s.local(ctx, id) {
		return nil, false, nil
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
	err = s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
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
	})
	if resp != nil {
		out = resp.Meta
	}
	return out, true, err
}

// primaryOf returns the server the slice table names as sl's primary.
func (s *Server) primaryOf(sl oid.Slice) string {
	t := s.table.Load()
	if t == nil {
		return ""
	}
	if x, ok := t.Slices[sl]; ok && len(x.Replicas) > 0 {
		return x.Replicas[0]
	}
	return ""
}

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
	ctx, aerr := s.admit(ctx, req.Caller, src)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	defer s.names.lock(nameKey(src, req.SrcName), nameKey(dst, req.DstName))()
	if !s.local(ctx, dst) {
		if s.primary(src) != nil {
			// Backup mode cannot coordinate with another server.
			return nil, fserr.ToStatus(fmt.Errorf("rename across servers: %w", fserr.ErrCrossDevice))
		}
		return s.renameAcross(ctx, req) // xrename.go
	}
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	resp := &wire.RenameResponse{}
	var dying []oid.ID
	defer func() { s.buried(dying) }()
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
			return nil, fserr.ToStatus(fmt.Errorf("rename involving a directory on another server: %w", fserr.ErrCrossDevice))
		}
		m, owner, err := s.remoteMeta(ctx, oid.ID(e.Id))
		if err != nil {
			return nil, fserr.ToStatus(fmt.Errorf("rename %q: %w", req.SrcName, err))
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
	err := s.updateUndo(ctx, 0, func(tx *store.Tx) error {
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
		de, err := tx.Entry(dst, req.DstName)
		if err != nil && fserr.Errno(err) != syscall.ENOENT {
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
			switch {
			case isDir(child) && !isDir(target):
				return fserr.ErrNotDir
			case !isDir(child) && isDir(target):
				return fserr.ErrIsDir
			case isDir(target):
				if full, err := tx.HasEntries(oid.ID(target.Id)); err != nil {
					return err
				} else if full {
					return fserr.ErrNotEmpty
				}
				dd.Nlink--
			}
			if _, ok := remote[target.Id]; ok {
				dropRemote = target.Id
			} else if err := s.unlinkObject(tx, target, now, &dying); err != nil {
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
		if isDir(child) && src != dst {
			child.Parent = uint64(dst)
			sd.Nlink--
			dd.Nlink++
		}
		if _, ok := remote[child.Id]; !ok {
			touch(child, now, false)
			if err := tx.PutMeta(child); err != nil {
				return err
			}
		}
		touch(sd, now, true)
		if err := tx.PutMeta(sd); err != nil {
			return err
		}
		if dst != src {
			touch(dd, now, true)
			return tx.PutMeta(dd)
		}
		return nil
	}, func() { s.buried(dying); dying = nil })
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("rename %q to %q: %w", req.SrcName, req.DstName, err))
	}
	if dropRemote != 0 {
		if err := s.dropLink(ctx, owners[dropRemote], oid.ID(dropRemote)); err != nil {
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
	if src != dst {
		if isDir(a) {
			a.Parent = uint64(dst)
			sd.Nlink--
			dd.Nlink++
		}
		if isDir(b) {
			b.Parent = uint64(src)
			dd.Nlink--
			sd.Nlink++
		}
	}
	for _, m := range []*wire.Meta{a, b} {
		touch(m, now, false)
		if err := tx.PutMeta(m); err != nil {
			return err
		}
	}
	touch(sd, now, true)
	if err := tx.PutMeta(sd); err != nil {
		return err
	}
	if src != dst {
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

// SetAttr implements wire.StorageServer.
func (s *Server) SetAttr(ctx context.Context, req *wire.SetAttrRequest) (*wire.SetAttrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	var out *wire.Meta
	err := s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
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
		out = m
		return tx.PutMeta(m)
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("setattr %v: %w", id, err))
	}
	return &wire.SetAttrResponse{Meta: out}, nil
}

// truncate changes a file's size, trimming the block that holds the new end.
func (s *Server) truncate(tx *store.Tx, c perm.Cred, m *wire.Meta, req *wire.SetAttrRequest) error {
	switch {
	case isDir(m):
		return fserr.ErrIsDir
	case m.Type != wire.Type_TYPE_FILE:
		return fserr.ErrInvalid
	}
	if req.ViaHandle {
		if err := ownerOrAccess(c, m, perm.W); err != nil {
			return err
		}
	} else if err := perm.Access(c, attr(m), perm.W); err != nil {
		return err
	}
	size := req.Size
	if size < m.Size {
		keep := (size + blockSize - 1) / blockSize
		if err := tx.TruncateBlocks(oid.ID(m.Id), keep); err != nil {
			return err
		}
		if tail := size % blockSize; tail != 0 {
			if err := s.trimBlock(tx, oid.ID(m.Id), size/blockSize, tail); err != nil {
				return err
			}
		}
	}
	if size != m.Size {
		m.Size = size
		m.MtimeNs = time.Now().UnixNano()
		m.Mode = perm.KillSUID(c, attr(m)) & 0o7777
	}
	return nil
}

// trimBlock cuts block idx to n bytes, so that growing the file later
// reads zeros past the old end rather than stale data.
func (s *Server) trimBlock(tx *store.Tx, id oid.ID, idx uint64, n uint64) error {
	h, ok, err := tx.Block(id, idx)
	if err != nil || !ok {
		return err
	}
	data, err := s.store.ReadBlock(h)
	if err != nil {
		return err
	}
	if uint64(len(data)) <= n {
		return nil
	}
	nh, err := s.store.PutBlock(data[:n])
	if err != nil {
		return err
	}
	return tx.SetBlock(id, idx, nh)
}

// ReadDir implements wire.StorageServer.
func (s *Server) ReadDir(ctx context.Context, req *wire.ReadDirRequest) (*wire.ReadDirResponse, error) {
	dir := oid.ID(req.Dir)
	ctx, aerr := s.admit(ctx, req.Caller, dir)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	limit := int(req.Limit)
	if limit <= 0 || limit > 4096 {
		limit = 4096
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
		return nil, fserr.ToStatus(fmt.Errorf("readdir %v: %w", dir, err))
	}
	return resp, nil
}

// GetBlocks implements wire.StorageServer.
func (s *Server) GetBlocks(ctx context.Context, req *wire.GetBlocksRequest) (*wire.GetBlocksResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	resp := &wire.GetBlocksResponse{}
	err := s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		resp.Meta = m
		refs, err := tx.Blocks(id, req.First, req.Count)
		if err != nil {
			return err
		}
		resp.Blocks = make([]*wire.BlockRef, len(refs))
		for i, r := range refs {
			resp.Blocks[i] = &wire.BlockRef{Index: r.Index, Hash: r.Hash[:], Len: r.Len}
		}
		return nil
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("blocks of %v: %w", id, err))
	}
	return resp, nil
}

// ReadBlocks implements wire.StorageServer.
func (s *Server) ReadBlocks(ctx context.Context, req *wire.ReadBlocksRequest) (*wire.ReadBlocksResponse, error) {
	id := oid.ID(req.Id)
	if err := s.checkData(ctx, req.Caller, id, perm.R); err != nil {
		return nil, fserr.ToStatus(err)
	}
	hs := make([][32]byte, len(req.Hashes))
	for i, h := range req.Hashes {
		if len(h) != 32 {
			return nil, fserr.ToStatus(fmt.Errorf("block hash of %d bytes: %w", len(h), fserr.ErrInvalid))
		}
		hs[i] = [32]byte(h)
	}
	data, err := s.store.ReadBlocks(hs)
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("read blocks of %v: %w", id, err))
	}
	return &wire.ReadBlocksResponse{Data: data}, nil
}

// checkData allows block transfers for a file the caller may access.
func (s *Server) checkData(ctx context.Context, caller *wire.Caller, id oid.ID, want uint32) error {
	if _, err := s.admit(ctx, caller, id); err != nil {
		return err
	}
	c := cred(caller)
	return s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if ownerOrAccess(c, m, want) != nil && ownerOrAccess(c, m, perm.W) != nil {
			return fmt.Errorf("data of %v: %w", id, fserr.ErrAccess)
		}
		return nil
	})
}

// PutBlocks implements wire.StorageServer. Blocks become part of a file
// only when a Commit names them.
func (s *Server) PutBlocks(ctx context.Context, req *wire.PutBlocksRequest) (*wire.PutBlocksResponse, error) {
	id := oid.ID(req.Id)
	if err := s.checkData(ctx, req.Caller, id, perm.W); err != nil {
		return nil, fserr.ToStatus(err)
	}
	for _, d := range req.Data {
		if len(d) > blockSize {
			return nil, fserr.ToStatus(fmt.Errorf("block of %d bytes: %w", len(d), fserr.ErrInvalid))
		}
	}
	hs, err := s.store.PutBlocks(req.Data)
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("store blocks of %v: %w", id, err))
	}
	resp := &wire.PutBlocksResponse{Hashes: make([][]byte, len(hs))}
	for i := range hs {
		resp.Hashes[i] = hs[i][:]
	}
	return resp, nil
}

// Commit implements wire.StorageServer: a new version of a file whose
// listed blocks changed. It answers once the version is durable.
func (s *Server) Commit(ctx context.Context, req *wire.CommitRequest) (*wire.CommitResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	var out *wire.Meta
	err := s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if m.Type != wire.Type_TYPE_FILE {
			return fserr.ErrInvalid
		}
		if err := ownerOrAccess(c, m, perm.W); err != nil {
			return err
		}
		if req.Size < m.Size {
			if err := tx.TruncateBlocks(id, (req.Size+blockSize-1)/blockSize); err != nil {
				return err
			}
		}
		for _, b := range req.Blocks {
			if len(b.Hash) != 32 || b.Index*blockSize >= req.Size {
				continue
			}
			if err := tx.SetBlock(id, b.Index, [32]byte(b.Hash)); err != nil {
				return err
			}
		}
		m.Size = req.Size
		m.MtimeNs = now
		if req.MtimeNs != 0 {
			m.MtimeNs = req.MtimeNs
		}
		m.Mode = perm.KillSUID(c, attr(m)) & 0o7777
		for _, a := range req.Attrs {
			// The client checked these already; a race with another
			// client's change may refuse one now, which must not cost
			// the data its commit.
			if err := attrs.Apply(cred(a.Caller), m, a, now); err != nil {
				s.log.Warn("deferred setattr refused at commit", "id", id, "err", err)
			}
		}
		touch(m, now, false)
		out = m
		return tx.PutMeta(m)
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("commit %v: %w", id, err))
	}
	return &wire.CommitResponse{Meta: out}, nil
}

// xattrFlags as in setxattr(2).
const (
	xattrCreate  = 1
	xattrReplace = 2
)

// GetXattr implements wire.StorageServer.
func (s *Server) GetXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	resp := &wire.XattrResponse{}
	err := s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := perm.MayGetXattr(cred(req.Caller), attr(m), req.Name); err != nil {
			return err
		}
		if hidden(req.Name) {
			return fserr.ErrNoAttr
		}
		resp.Value, err = tx.Xattr(id, req.Name)
		return err
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("getxattr %q: %w", req.Name, err))
	}
	return resp, nil
}

// ListXattr implements wire.StorageServer.
func (s *Server) ListXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	resp := &wire.XattrResponse{}
	c := cred(req.Caller)
	err := s.store.View(func(tx *store.Tx) error {
		if _, err := tx.Meta(id); err != nil {
			return err
		}
		names, err := tx.Xattrs(id)
		for _, n := range names {
			if perm.ListXattrVisible(c, n) && !hidden(n) {
				resp.Names = append(resp.Names, n)
			}
		}
		return err
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("listxattr: %w", err))
	}
	return resp, nil
}

// SetXattr implements wire.StorageServer.
func (s *Server) SetXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	return s.changeXattr(ctx, req, false)
}

// RemoveXattr implements wire.StorageServer.
func (s *Server) RemoveXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	return s.changeXattr(ctx, req, true)
}

func (s *Server) changeXattr(ctx context.Context, req *wire.XattrRequest, remove bool) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, fserr.ToStatus(aerr)
	}
	if req.Name == "" || len(req.Name) > 255 || hidden(req.Name) {
		return nil, fserr.ToStatus(fmt.Errorf("xattr name: %w", fserr.ErrRange))
	}
	if len(req.Value) > 64<<10 {
		return nil, fserr.ToStatus(fmt.Errorf("xattr value of %d bytes: %w", len(req.Value), fserr.ErrTooBig))
	}
	now := time.Now().UnixNano()
	err := s.update(ctx, 0, func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := perm.MaySetXattr(cred(req.Caller), attr(m), req.Name); err != nil {
			return err
		}
		_, getErr := tx.Xattr(id, req.Name)
		exists := getErr == nil
		switch {
		case remove && !exists, req.Flags&xattrReplace != 0 && !exists:
			return fserr.ErrNoAttr
		case req.Flags&xattrCreate != 0 && exists:
			return fserr.ErrExist
		}
		if remove {
			err = tx.RemoveXattr(id, req.Name)
		} else {
			err = tx.SetXattr(id, req.Name, req.Value)
		}
		if err != nil {
			return err
		}
		touch(m, now, false)
		return tx.PutMeta(m)
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("xattr %q: %w", req.Name, err))
	}
	return &wire.XattrResponse{}, nil
}

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

// StatFS implements wire.StorageServer.
func (s *Server) StatFS(ctx context.Context, req *wire.StatFSRequest) (*wire.StatFSResponse, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.store.Dir(), &st); err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("statfs: %w", err))
	}
	var objects uint64
	_ = s.store.View(func(tx *store.Tx) error {
		objects = uint64(tx.ObjectCount())
		return nil
	})
	const files = 1 << 40
	return &wire.StatFSResponse{
		Blocks: st.Blocks * uint64(st.Bsize) / 4096, Bfree: st.Bfree * uint64(st.Bsize) / 4096,
		Bavail: st.Bavail * uint64(st.Bsize) / 4096, Bsize: 4096,
		Files: files, Ffree: files - objects, NameLen: 255,
	}, nil
}
