package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// The server side of wheelfs fsck (internal/fsck): listings of this
// server's copies of slices, and repairs, each run through the update
// path of the primary concerned so that it replicates and revokes leases
// like any mutation.

// LostFound is the directory fsck moves leaked objects into.
const LostFound = "lost+found"

// isFsckMethod reports whether a Peer method is one of fsck's, which the
// deployment's administrator may call too.
func isFsckMethod(method string) bool {
	return strings.HasPrefix(method, peerMethods+"Fsck")
}

// authAdmin admits registered servers (authPeer) and the holder of the
// CA key, whose certificate alone may be named pki.ConfigRoot; an
// ordinary client node never.
func (s *Server) authAdmin(ctx context.Context) error {
	if name, err := pki.PeerName(ctx); err == nil && name == pki.ConfigRoot {
		return nil
	}
	return s.authPeer(ctx)
}

// FsckSlices implements wire.PeerServer.
func (p *peerServer) FsckSlices(ctx context.Context, req *wire.FsckSlicesRequest) (*wire.FsckSlicesResponse, error) {
	return p.s.fsckSlices()
}

// FsckList implements wire.PeerServer.
func (p *peerServer) FsckList(ctx context.Context, req *wire.FsckListRequest) (*wire.FsckListResponse, error) {
	return p.s.fsckList(req)
}

// FsckRepair implements wire.PeerServer.
func (p *peerServer) FsckRepair(ctx context.Context, req *wire.FsckRepairRequest) (*wire.FsckRepairResponse, error) {
	resp, err := p.s.fsckRepair(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("fsck repair %v: %w", req.Kind, err)
	}
	p.s.log.Info("fsck repair", "kind", req.Kind, "slice", req.Slice, "id", oid.ID(req.Id),
		"dir", oid.ID(req.Dir), "name", req.Name, "changed", resp.Changed)
	return resp, nil
}

// fsckSlices lists the slices this server keeps anything of: objects, or
// a stream position (a copy that is empty now).
func (s *Server) fsckSlices() (*wire.FsckSlicesResponse, error) {
	var out []uint32
	err := s.store.View(func(tx *store.Tx) error {
		for _, sl := range tx.ObjectSlices() {
			out = append(out, uint32(sl))
		}
		keys, err := tx.SysKeys("repl/")
		if err != nil {
			return err
		}
		for _, k := range keys {
			var sl uint32
			if _, err := fmt.Sscanf(k, "repl/%08x", &sl); err == nil {
				out = append(out, sl)
			}
		}
		return nil
	})
	slices.Sort(out)
	return &wire.FsckSlicesResponse{Slices: slices.Compact(out)}, err
}

// fsckList answers one page of this server's copy of a slice: at most
// wire.MaxListEntries objects and directory entries together, from one
// view (pages are not one view: fsck compares the positions they carry).
func (s *Server) fsckList(req *wire.FsckListRequest) (*wire.FsckListResponse, error) {
	sl := oid.Slice(req.Slice)
	after := oid.ID(req.AfterId)
	if after != 0 && after.Slice() != sl {
		return nil, fmt.Errorf("fsck list: %v is not in slice %d: %w", after, sl, fserr.ErrInvalid)
	}
	resp := &wire.FsckListResponse{}
	budget := wire.MaxListEntries
	err := s.store.View(func(tx *store.Tx) error {
		at := readPos(tx, sl)
		resp.Epoch, resp.Seq, resp.Diverged = at.epoch, at.seq, diverged(tx, sl)
		// entries adds o's entries after name within the budget; false:
		// the page ends inside o.
		entries := func(o *wire.FsckObject, name string) (bool, error) {
			es, err := tx.Entries(oid.ID(o.Id), name, budget+1)
			if err != nil {
				return false, err
			}
			if len(es) > budget {
				es = es[:budget]
				o.Entries, budget = es, 0
				resp.NextId, resp.NextName = o.Id, es[len(es)-1].Name
				return false, nil
			}
			o.Entries, budget = es, budget-len(es)
			return true, nil
		}
		if req.AfterName != "" && after != 0 {
			m, err := tx.Meta(after)
			switch {
			case errors.Is(err, fserr.ErrNotExist): // gone meanwhile
			case err != nil:
				return err
			default:
				o := fsckObject(tx, m)
				budget--
				resp.Objects = append(resp.Objects, o)
				if isDir(m) {
					if done, err := entries(o, req.AfterName); err != nil || !done {
						return err
					}
				}
			}
		}
		var metas []*wire.Meta
		if err := tx.SliceMetasAfter(sl, after, func(m *wire.Meta) bool {
			metas = append(metas, m)
			return len(metas) <= budget
		}); err != nil {
			return err
		}
		resp.Eof = len(metas) <= budget
		for _, m := range metas {
			if budget < 2 { // room for the object and one entry
				resp.Eof = false
				return nil
			}
			o := fsckObject(tx, m)
			budget--
			resp.Objects = append(resp.Objects, o)
			resp.NextId, resp.NextName = o.Id, ""
			if isDir(m) {
				if done, err := entries(o, ""); err != nil || !done {
					resp.Eof = false
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fsck list slice %d: %w", sl, err)
	}
	return resp, nil
}

// fsckObject describes m; an object unlinked while open is an orphan
// while it has holders (orphans.go), replicated with it.
func fsckObject(tx *store.Tx, m *wire.Meta) *wire.FsckObject {
	held := false
	eachOutcome(tx, oid.ID(m.Id), orphanPrefix, func(string, []byte) bool {
		held = true
		return false
	})
	return &wire.FsckObject{Id: m.Id, Type: m.Type, Version: m.Version, Nlink: m.Nlink,
		Sum: store.MetaSum(m), Parent: m.Parent, CtimeNs: m.CtimeNs, Orphan: held}
}

// fsckRepair applies one repair. Each re-checks the state fsck reported
// and changes nothing (Changed false) if it moved on meanwhile.
func (s *Server) fsckRepair(ctx context.Context, req *wire.FsckRepairRequest) (*wire.FsckRepairResponse, error) {
	resp := &wire.FsckRepairResponse{}
	now := time.Now().UnixNano()
	switch req.Kind {
	case wire.FsckRepairKind_FSCK_DROP_ENTRY:
		dir := oid.ID(req.Dir)
		if err := s.primary(dir); err != nil {
			return nil, err
		}
		unlock, err := s.names.lock(ctx, nameKey(dir, req.Name))
		if err != nil {
			return nil, err
		}
		defer unlock()
		err = s.update(ctx, 0, func(tx *store.Tx) error {
			resp.Changed = false
			e, err := entryIfAny(tx, dir, req.Name)
			if err != nil || e == nil || e.Id != req.Id {
				return err
			}
			d, err := s.dirMeta(tx, dir)
			if err != nil {
				return err
			}
			if e.Type == wire.Type_TYPE_DIR && d.Nlink > 2 {
				d.Nlink-- // as rmdir would
			}
			if err := tx.DeleteEntry(dir, req.Name); err != nil {
				return err
			}
			touch(d, now, true)
			resp.Changed = true
			return tx.PutMeta(d)
		})
		return resp, err
	case wire.FsckRepairKind_FSCK_SET_LINKS:
		id := oid.ID(req.Id)
		if err := s.primary(id); err != nil {
			return nil, err
		}
		if req.Nlink == 0 {
			return nil, fmt.Errorf("link count 0 (a leaked object goes to %s): %w", LostFound, fserr.ErrInvalid)
		}
		err := s.update(ctx, 0, func(tx *store.Tx) error {
			resp.Changed = false
			m, err := tx.Meta(id)
			if err != nil || m.Version != req.Version {
				return err
			}
			m.Nlink = req.Nlink
			if req.Parent != 0 && isDir(m) {
				m.Parent = req.Parent
			}
			touch(m, now, false)
			resp.Changed = true
			return tx.PutMeta(m)
		})
		return resp, err
	case wire.FsckRepairKind_FSCK_ADD_ENTRY:
		dir := oid.ID(req.Dir)
		if err := s.primary(dir); err != nil {
			return nil, err
		}
		if err := checkName(req.Name); err != nil {
			return nil, err
		}
		unlock, err := s.names.lock(ctx, nameKey(dir, req.Name))
		if err != nil {
			return nil, err
		}
		defer unlock()
		err = s.update(ctx, 0, func(tx *store.Tx) error {
			resp.Changed = false
			d, err := s.dirMeta(tx, dir)
			if err != nil {
				return err
			}
			if e, err := entryIfAny(tx, dir, req.Name); err != nil || e != nil {
				return err
			}
			if err := tx.PutEntry(dir, &wire.Entry{Name: req.Name, Id: req.Id, Type: req.Type, Version: 1}); err != nil {
				return err
			}
			if req.Type == wire.Type_TYPE_DIR {
				d.Nlink++
			}
			touch(d, now, true)
			resp.Changed = true
			return tx.PutMeta(d)
		})
		return resp, err
	case wire.FsckRepairKind_FSCK_LOST_FOUND:
		return s.lostFound(ctx)
	case wire.FsckRepairKind_FSCK_RESYNC:
		r := s.owned.repl(oid.Slice(req.Slice))
		if r == nil {
			return nil, fmt.Errorf("slice %d: %w", req.Slice, fserr.ErrNotPrimary)
		}
		var extra []oid.ID
		for _, id := range req.Ids {
			if oid.ID(id).Slice() == oid.Slice(req.Slice) {
				extra = append(extra, oid.ID(id))
			}
		}
		resp.Changed = r.resync(req.Server, extra...)
		return resp, nil
	case wire.FsckRepairKind_FSCK_DROP_COPY:
		changed, err := s.dropCopy(ctx, oid.Slice(req.Slice))
		resp.Changed = changed
		return resp, err
	}
	return nil, fmt.Errorf("unknown repair %v: %w", req.Kind, fserr.ErrInvalid)
}

// lostFound makes /lost+found, owned by root with mode 0700, through the
// ordinary create (placement, replication), unless the name exists.
func (s *Server) lostFound(ctx context.Context) (*wire.FsckRepairResponse, error) {
	if err := s.primary(oid.Root); err != nil {
		return nil, err
	}
	root := &wire.Caller{}
	cr, err := s.Create(ctx, &wire.CreateRequest{Caller: root, Dir: uint64(oid.Root), Name: LostFound,
		Type: wire.Type_TYPE_DIR, Mode: 0o700})
	if err != nil {
		return nil, fmt.Errorf("make /%s: %w", LostFound, err)
	}
	if cr.Entry.GetType() != wire.Type_TYPE_DIR {
		return nil, fmt.Errorf("/%s is not a directory: %w", LostFound, fserr.ErrNotDir)
	}
	return &wire.FsckRepairResponse{Changed: !cr.Existed, Id: cr.Entry.Id}, nil
}

// dropCopy deletes this server's copy of a slice it no longer replicates,
// a chunk of objects per transaction (not replicated: the copy is this
// server's alone). It refuses while this server is in the slice's replica
// list or holds its lock, or holds eventual changes of it not yet pushed.
// changed: there was something to delete. The replica list is read
// from the configuration service first, not from the watched table, which
// may lag a recruitment whose snapshot is already arriving.
func (s *Server) dropCopy(ctx context.Context, sl oid.Slice) (changed bool, err error) {
	mine := func(t *configsvc.Table) error {
		if e, ok := t.Slices[sl]; ok && (slices.Contains(e.Replicas, s.cfg.ID) || e.Holder == s.cfg.ID) {
			return fmt.Errorf("slice %d is replicated here: %w", sl, fserr.ErrBusy)
		}
		return nil
	}
	t, err := s.conf.Table(ctx)
	if err != nil {
		return false, fmt.Errorf("read the slice table: %w", err)
	}
	if err := mine(t); err != nil {
		return false, err
	}
	for {
		if t := s.table.Load(); t == nil {
			return changed, fmt.Errorf("no slice table yet: %w", fserr.ErrAgain)
		} else if err := mine(t); err != nil {
			return changed, err
		}
		if s.owned.repl(sl) != nil {
			return changed, fmt.Errorf("slice %d is served here: %w", sl, fserr.ErrBusy)
		}
		done := false
		err := s.store.Update(ctx, func(tx *store.Tx) error {
			if diverged(tx, sl) {
				return fmt.Errorf("slice %d has eventual changes to push first: %w", sl, fserr.ErrBusy)
			}
			var ids []oid.ID
			if err := tx.SliceMetas(sl, func(m *wire.Meta) bool {
				ids = append(ids, oid.ID(m.Id))
				return len(ids) < installChunk
			}); err != nil {
				return err
			}
			for _, id := range ids {
				if err := tx.PurgeObject(id); err != nil {
					return err
				}
			}
			changed = changed || len(ids) > 0
			if len(ids) < installChunk {
				done = true
				if v, _ := tx.Sys(posKey(sl)); v != nil {
					changed = true
				}
				return tx.DeleteSys(posKey(sl))
			}
			return nil
		})
		if err != nil || done {
			if err == nil && changed {
				s.log.Info("fsck dropped a copy of a slice this server no longer replicates", "slice", sl)
			}
			return changed, err
		}
	}
}
