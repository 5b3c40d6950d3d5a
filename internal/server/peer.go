package server

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/configsvc"
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

// knownEpoch is the newest epoch of slice s this server has seen in the
// slice table; no primary with an older one may change its copy.
func (s *Server) knownEpoch(sl oid.Slice) int64 {
	t := s.table.Load()
	if t == nil {
		return 0
	}
	return t.Slices[sl].Epoch
}

// fence handles a peer's epoch for slice sl: a newer one means this
// server's own lock (if any) is gone.
func (s *Server) fence(sl oid.Slice, epoch int64) bool {
	s.mu.Lock()
	l, held := s.locks[sl]
	s.mu.Unlock()
	if held && l.Epoch > epoch {
		return false
	}
	if held && l.Epoch < epoch {
		s.lostSlice(sl, l.Epoch, "another server replicates it with a newer epoch")
	}
	return epoch >= s.knownEpoch(sl)
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

// digest summarizes this server's copy of a slice.
func (s *Server) digest(sl oid.Slice) (*wire.DigestResponse, error) {
	resp := &wire.DigestResponse{}
	err := s.store.View(func(tx *store.Tx) error {
		at := readPos(tx, sl)
		resp.Epoch, resp.Seq = at.epoch, at.seq
		return tx.SliceMetas(sl, func(m *wire.Meta) bool {
			resp.Ids = append(resp.Ids, m.Id)
			resp.Versions = append(resp.Versions, m.Version)
			resp.Sums = append(resp.Sums, store.MetaSum(m))
			return true
		})
	})
	return resp, err
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

// fetchMissing fetches from source the blocks that objects reference and
// this server lacks.
func (s *Server) fetchMissing(ctx context.Context, source string, objects []*wire.ObjectState) error {
	var missing [][32]byte
	for _, o := range objects {
		for _, b := range o.Blocks {
			if len(b.Hash) == 32 && !s.store.HasBlock([32]byte(b.Hash)) {
				missing = append(missing, [32]byte(b.Hash))
			}
		}
	}
	return s.fetchBlocks(ctx, source, missing)
}

// install applies a snapshot chunk, fetching the blocks it references
// that this server lacks from req.Source. It reports stale if this
// server has already seen a newer epoch, and busy (applying nothing) if
// refuseDiverged is set and it holds eventual changes of the slice.
func (s *Server) install(ctx context.Context, req *wire.InstallRequest, refuseDiverged bool) (stale, busy bool, err error) {
	if err := s.fetchMissing(ctx, req.Source, req.Objects); err != nil {
		return false, false, err
	}
	sl := oid.Slice(req.Slice)
	err = s.store.Update(ctx, func(tx *store.Tx) error {
		at := readPos(tx, sl)
		if req.Epoch < at.epoch {
			stale = true
			return nil
		}
		if refuseDiverged && diverged(tx, sl) {
			busy = true
			return nil
		}
		for _, o := range req.Objects {
			if oid.ID(o.GetMeta().GetId()).Slice() != sl {
				return fmt.Errorf("object %x is not in slice %d: %w", o.GetMeta().GetId(), sl, fserr.ErrInvalid)
			}
			if err := tx.InstallObject(o); err != nil {
				return err
			}
		}
		for _, id := range req.Deleted {
			if oid.ID(id).Slice() != sl {
				continue
			}
			if err := tx.PurgeObject(oid.ID(id)); err != nil {
				return err
			}
		}
		if err := tx.SetCounterFloor(sl, req.Counter); err != nil {
			return err
		}
		if req.More {
			return nil
		}
		return writePos(tx, sl, pos{req.Epoch, req.Seq})
	})
	return stale, busy, err
}

// fetchBlocks copies blocks from server src into the local store.
func (s *Server) fetchBlocks(ctx context.Context, src string, hs [][32]byte) error {
	if len(hs) == 0 {
		return nil
	}
	p, err := s.peer(ctx, src)
	if err != nil {
		return err
	}
	per := maxInlineBlocks / blockSize
	for len(hs) > 0 {
		n := min(per, len(hs))
		req := &wire.FetchBlocksRequest{}
		for _, h := range hs[:n] {
			req.Hashes = append(req.Hashes, h[:])
		}
		hs = hs[n:]
		fctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
		resp, err := p.FetchBlocks(fctx, req)
		cancel()
		if err != nil {
			return fmt.Errorf("fetch blocks from %s: %w", src, err)
		}
		if _, err := s.store.PutBlocks(resp.Data); err != nil {
			return err
		}
	}
	return nil
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

// createObject stores a new object under policy pol.
func (s *Server) createObject(ctx context.Context, pol configsvc.Policy, tmpl *wire.Meta, sync uint32) (*wire.Meta, error) {
	slice, err := s.sliceFor(ctx, pol)
	if err != nil {
		return nil, err
	}
	m := proto.Clone(tmpl).(*wire.Meta)
	err = s.update(ctx, sync, func(tx *store.Tx) error {
		n, err := tx.NextCounter(slice)
		if err != nil {
			return err
		}
		m.Id = uint64(oid.Make(slice, n))
		return tx.PutMeta(m)
	})
	if err != nil {
		return nil, fmt.Errorf("create object: %w", err)
	}
	return m, nil
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

// remoteMeta returns the meta-data of id from its primary elsewhere.
func (s *Server) remoteMeta(ctx context.Context, id oid.ID) (*wire.Meta, string, error) {
	owner := s.primaryOf(id.Slice())
	if owner == "" || owner == s.cfg.ID {
		return nil, "", fmt.Errorf("no primary for %v: %w", id, fserr.ErrNotPrimary)
	}
	p, err := s.peer(ctx, owner)
	if err != nil {
		return nil, "", err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	resp, err := p.Stat(cctx, &wire.StatRequest{Id: uint64(id)})
	if err != nil {
		return nil, "", fserr.FromStatus(err)
	}
	return resp.Meta, owner, nil
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
