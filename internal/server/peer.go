package server

import (
	"context"
	"fmt"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// The Peer service: what a backup does for its primary, and the
// server-to-server steps of two-step create and remove.

// peerServer adapts Server to wire.PeerServer (its method names clash
// with the Storage service's).
type peerServer struct {
	wire.UnimplementedPeerServer
	s *Server
}

// PeerService returns the server's Peer service for registration.
func (s *Server) PeerService() wire.PeerServer { return &peerServer{s: s} }

// authPeer admits only callers whose certificate names a registered
// server. In-process calls (no TLS peer) come from this process.
func (s *Server) authPeer(ctx context.Context) error {
	name, err := pki.PeerName(ctx)
	if err != nil {
		return nil // in-process
	}
	if name == s.cfg.ID {
		return nil
	}
	t := s.table.Load()
	if t != nil {
		if _, ok := t.Servers[name]; ok {
			return nil
		}
	}
	return fmt.Errorf("peer call from %q, which is not a registered server: %w", name, fserr.ErrPerm)
}

// Replicate implements wire.PeerServer: apply the primary's next batches.
func (p *peerServer) Replicate(ctx context.Context, req *wire.ReplicateRequest) (*wire.ReplicateResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	sl := oid.Slice(req.Slice)
	if !s.fence(sl, req.Epoch) {
		return &wire.ReplicateResponse{Status: wire.ReplStatus_REPL_STALE_EPOCH}, nil
	}
	if len(req.Blocks) > 0 {
		for _, b := range req.Blocks {
			if len(b) > blockSize {
				return nil, fserr.ToStatus(fmt.Errorf("block of %d bytes: %w", len(b), fserr.ErrInvalid))
			}
		}
		if _, err := s.store.PutBlocks(req.Blocks); err != nil {
			return nil, fserr.ToStatus(err)
		}
	}
	// A block that a later mutation of this request overwrites may be
	// gone at the primary already: such a SetBlock is skipped.
	skip := supersededBlocks(req.Batches, s.store.HasBlock)
	var missing [][]byte
	for bi, b := range req.Batches {
		for mi, m := range b.Mutations {
			if m.Kind == wire.MutationKind_MUT_SET_BLOCK && len(m.Data) == 32 &&
				!skip[[2]int{bi, mi}] && !s.store.HasBlock([32]byte(m.Data)) {
				missing = append(missing, m.Data)
			}
		}
	}
	if len(missing) > 0 {
		return &wire.ReplicateResponse{Status: wire.ReplStatus_REPL_MISSING_BLOCKS, Missing: missing}, nil
	}
	resp := &wire.ReplicateResponse{}
	err := s.store.Update(ctx, func(tx *store.Tx) error {
		at := readPos(tx, sl)
		resp.Status, resp.Seq, resp.Epoch = wire.ReplStatus_REPL_OK, at.seq, at.epoch
		switch {
		case req.Epoch < at.epoch:
			resp.Status = wire.ReplStatus_REPL_STALE_EPOCH
			return nil
		case req.Epoch > at.epoch:
			resp.Status = wire.ReplStatus_REPL_NEED_SYNC
			return nil
		case len(req.Batches) > 0 && diverged(tx, sl):
			// Eventual changes here would be overwritten: push them first.
			resp.Status = wire.ReplStatus_REPL_BUSY
			return nil
		}
		for bi, b := range req.Batches {
			if b.Seq <= at.seq {
				continue // already have it
			}
			if b.Seq != at.seq+1 {
				resp.Status = wire.ReplStatus_REPL_NEED_SYNC
				break
			}
			for mi, m := range b.Mutations {
				if skip[[2]int{bi, mi}] {
					continue
				}
				if store.MutationSlice(m) != sl {
					return fmt.Errorf("batch %d of slice %d changes slice %d: %w", b.Seq, sl, store.MutationSlice(m), fserr.ErrInvalid)
				}
				if err := tx.Apply(m); err != nil {
					return err
				}
			}
			at.seq = b.Seq
		}
		resp.Seq = at.seq
		return writePos(tx, sl, at)
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("replicate slice %d: %w", sl, err))
	}
	return resp, nil
}

// Digest implements wire.PeerServer.
func (p *peerServer) Digest(ctx context.Context, req *wire.DigestRequest) (*wire.DigestResponse, error) {
	if err := p.s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	d, err := p.s.digest(oid.Slice(req.Slice))
	if err != nil {
		return nil, fserr.ToStatus(err)
	}
	return d, nil
}

// Diff implements wire.PeerServer: what a replica with the given digest
// lacks (a new primary collecting newer versions from a backup). Only one
// message: the caller asks again if More is set.
func (p *peerServer) Diff(ctx context.Context, req *wire.DiffRequest) (*wire.InstallRequest, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	var at pos
	sl := oid.Slice(req.Slice)
	_ = s.store.View(func(tx *store.Tx) error { at = readPos(tx, sl); return nil })
	reqs, err := s.diff(sl, req.Digest, at.epoch)
	if err != nil {
		return nil, fserr.ToStatus(err)
	}
	return reqs[0], nil
}

// Install implements wire.PeerServer.
func (p *peerServer) Install(ctx context.Context, req *wire.InstallRequest) (*wire.InstallResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	sl := oid.Slice(req.Slice)
	if !s.fence(sl, req.Epoch) {
		return &wire.InstallResponse{Status: wire.ReplStatus_REPL_STALE_EPOCH}, nil
	}
	stale, busy, err := s.install(ctx, req, true)
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("install slice %d: %w", sl, err))
	}
	if stale {
		return &wire.InstallResponse{Status: wire.ReplStatus_REPL_STALE_EPOCH}, nil
	}
	if busy {
		return &wire.InstallResponse{Status: wire.ReplStatus_REPL_BUSY}, nil
	}
	return &wire.InstallResponse{}, nil
}

// FetchBlocks implements wire.PeerServer.
func (p *peerServer) FetchBlocks(ctx context.Context, req *wire.FetchBlocksRequest) (*wire.FetchBlocksResponse, error) {
	if err := p.s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	hs := make([][32]byte, 0, len(req.Hashes))
	for _, h := range req.Hashes {
		if len(h) != 32 {
			return nil, fserr.ToStatus(fmt.Errorf("block hash of %d bytes: %w", len(h), fserr.ErrInvalid))
		}
		hs = append(hs, [32]byte(h))
	}
	data, err := p.s.store.ReadBlocks(hs)
	if err != nil {
		return nil, fserr.ToStatus(err)
	}
	return &wire.FetchBlocksResponse{Data: data}, nil
}

// Ping implements wire.PeerServer.
func (p *peerServer) Ping(ctx context.Context, req *wire.PingRequest) (*wire.PingResponse, error) {
	if err := p.s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	return &wire.PingResponse{Id: p.s.cfg.ID}, nil
}

// CreateObject implements wire.PeerServer: the object half of a two-step
// create (paper §5.2.2). The directory's primary checked permissions and
// computed the new object's attributes; this server picks a slice of the
// object's policy that it is primary for and stores the object there.
func (p *peerServer) CreateObject(ctx context.Context, req *wire.CreateObjectRequest) (*wire.CreateObjectResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	if req.Meta == nil {
		return nil, fserr.ToStatus(fmt.Errorf("create object without meta-data: %w", fserr.ErrInvalid))
	}
	m, err := s.createObject(ctx, policyFromCues(req.Policy), req.Meta, req.SyncLevel)
	if err != nil {
		return nil, fserr.ToStatus(err)
	}
	return &wire.CreateObjectResponse{Meta: m}, nil
}

// DropLink implements wire.PeerServer: the object half of removing a
// name whose object lives here.
func (p *peerServer) DropLink(ctx context.Context, req *wire.DropLinkRequest) (*wire.DropLinkResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	id := oid.ID(req.Id)
	if err := s.primary(id); err != nil {
		return nil, fserr.ToStatus(err)
	}
	now := time.Now().UnixNano()
	var out *wire.Meta
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	err := s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if req.DirOnly && !isDir(m) {
			return fserr.ErrNotDir
		}
		if req.FileOnly && isDir(m) {
			return fserr.ErrIsDir
		}
		if req.Caller != nil && req.Dir != nil {
			if err := perm.MayRemove(cred(req.Caller), attr(req.Dir), attr(m)); err != nil {
				return err
			}
		}
		if isDir(m) {
			if has, err := tx.HasEntries(id); err != nil {
				return err
			} else if has {
				return fserr.ErrNotEmpty
			}
		}
		out = m
		return s.unlinkObject(tx, m, now, &dying)
	})
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("drop link to %v: %w", id, err))
	}
	return &wire.DropLinkResponse{Meta: out}, nil
}

// Stat implements wire.PeerServer: an object's meta-data from its primary
// (a rename on another server checks permissions with it).
func (p *peerServer) Stat(ctx context.Context, req *wire.StatRequest) (*wire.StatResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	m, err := s.primaryMeta(oid.ID(req.Id))
	if err != nil {
		return nil, fserr.ToStatus(err)
	}
	return &wire.StatResponse{Meta: m}, nil
}

// supersededBlocks returns the positions of SetBlock mutations whose block
// is absent (has reports false) and whose (file, index) a later mutation
// of the same batches sets again, clears, truncates or deletes.
func supersededBlocks(batches []*wire.Batch, has func([32]byte) bool) map[[2]int]bool {
	type pos2 struct{ b, m int }
	var absent []pos2
	for bi, b := range batches {
		for mi, m := range b.Mutations {
			if m.Kind == wire.MutationKind_MUT_SET_BLOCK && len(m.Data) == 32 && !has([32]byte(m.Data)) {
				absent = append(absent, pos2{bi, mi})
			}
		}
	}
	out := map[[2]int]bool{}
	for _, p := range absent {
		m := batches[p.b].Mutations[p.m]
		later := func(bi, mi int) bool { return bi > p.b || bi == p.b && mi > p.m }
	search:
		for bi := p.b; bi < len(batches); bi++ {
			for mi, n := range batches[bi].Mutations {
				if !later(bi, mi) || n.Id != m.Id {
					continue
				}
				switch n.Kind {
				case wire.MutationKind_MUT_SET_BLOCK, wire.MutationKind_MUT_CLEAR_BLOCK:
					if n.Index != m.Index {
						continue
					}
				case wire.MutationKind_MUT_TRUNCATE_BLOCKS:
					if n.Index > m.Index {
						continue
					}
				case wire.MutationKind_MUT_DELETE_OBJECT:
				default:
					continue
				}
				out[[2]int{p.b, p.m}] = true
				break search
			}
		}
	}
	return out
}

// Reconcile implements wire.PeerServer: merge what a replica changed
// without the primary.
func (p *peerServer) Reconcile(ctx context.Context, req *wire.ReconcileRequest) (*wire.ReconcileResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	sl := oid.Slice(req.Slice)
	if err := s.primary(oid.Make(sl, 0)); err != nil {
		return nil, fserr.ToStatus(err)
	}
	if err := s.fetchMissing(ctx, req.Source, req.Objects); err != nil {
		return nil, fserr.ToStatus(err)
	}
	if err := s.mergePush(ctx, req); err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("reconcile slice %d from %s: %w", sl, req.Source, err))
	}
	r := s.owned.repl(sl)
	if r != nil {
		r.resync(req.Source) // its copy still has its own versions
	}
	return &wire.ReconcileResponse{}, nil
}

// AddLink implements wire.PeerServer: the destination's half of a rename
// between servers (see renameAcross), or, without a directory, counting a
// link to an object of this server.
func (p *peerServer) AddLink(ctx context.Context, req *wire.AddLinkRequest) (*wire.AddLinkResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	resp, err := s.addLink(ctx, req)
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("add link %q to %v: %w", req.Name, oid.ID(req.Id), err))
	}
	return resp, nil
}
