package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// peer returns a client for server id's Peer service.
func (s *Server) peer(ctx context.Context, id string) (wire.PeerClient, error) {
	if s.cfg.Peers == nil {
		return nil, fmt.Errorf("no way to reach server %s: %w", id, fserr.ErrIO)
	}
	return s.cfg.Peers(ctx, id)
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

// createAt asks server target to store a new object.
// With access, the object is also opened for the creating client's handle h.
func (s *Server) createAt(ctx context.Context, target string, pol configsvc.Policy, tmpl *wire.Meta, sync uint32, h *wire.HandleRef, access uint32) (*wire.Meta, error) {
	p, err := s.peer(ctx, target)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	// The open's session is bound there to the same node as here.
	node, _ := pki.PeerName(ctx)
	resp, err := p.CreateObject(cctx, &wire.CreateObjectRequest{Meta: tmpl, Policy: cuesFromPolicy(pol), SyncLevel: sync,
		Handle: h, OpenAccess: access, ClientNode: node})
	if err != nil {
		return nil, err
	}
	return resp.Meta, nil
}

// dropRemote deletes, in the background, an object another server
// created for a name that was not added, ending first the open h that
// the create made there (nil: none).
func (s *Server) dropRemote(target string, id oid.ID, h *wire.HandleRef) {
	go func() {
		ctx, cancel := context.WithTimeout(s.bg, s.cfg.PeerTimeout)
		defer cancel()
		p, err := s.peer(ctx, target)
		if err == nil {
			_, err = p.DropLink(ctx, &wire.DropLinkRequest{Id: uint64(id), Handle: h})
			err = fserr.FromStatus(err)
		}
		if err != nil {
			s.log.Warn("could not delete an object created for a name that was not added", "id", id, "server", target, "err", err)
		}
	}()
}

// dropLink removes one link to object id at its primary, server owner;
// replaced says a rename over the name took it (unlinkReplaced).
func (s *Server) dropLink(ctx context.Context, owner string, id oid.ID, replaced bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	p, err := s.peer(ctx, owner)
	if err != nil {
		return err
	}
	_, err = p.DropLink(ctx, &wire.DropLinkRequest{Id: uint64(id), Replaced: replaced})
	return fserr.FromStatus(err)
}

// countLink adds one to the link count of id at its primary owner ("":
// this server).
func (s *Server) countLink(ctx context.Context, owner string, id oid.ID) error {
	if owner == "" {
		return s.update(ctx, 0, func(tx *store.Tx) error { return addNlink(tx, id, time.Now().UnixNano()) })
	}
	p, err := s.peer(ctx, owner)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	_, err = p.AddLink(cctx, &wire.AddLinkRequest{Id: uint64(id), Count: true})
	return fserr.FromStatus(err)
}

// uncountLink takes back a link counted by countLink.
func (s *Server) uncountLink(ctx context.Context, owner string, id oid.ID) error {
	if owner != "" {
		return s.dropLink(ctx, owner, id, false)
	}
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	return s.update(ctx, 0, func(tx *store.Tx) error {
		s.buried(dying) // an attempt undone to revoke leases
		dying = nil
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		return s.unlinkObject(tx, m, time.Now().UnixNano(), &dying)
	})
}

// refused reports whether a peer call's error is the peer's own answer
// (it ran and changed nothing), not a transport failure.
func refused(err error) bool {
	st, ok := status.FromError(err)
	return ok && (st.Code() == codes.FailedPrecondition || errors.Is(fserr.FromStatus(err), fserr.ErrNotPrimary))
}

func (s *Server) sendPush(ctx context.Context, to string, req *wire.ReconcileRequest) error {
	pc, err := s.peer(ctx, to)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.InstallTimeout)
	defer cancel()
	resp, err := pc.Reconcile(cctx, req)
	if err != nil {
		return fserr.FromStatus(err)
	}
	if resp.Status != wire.ReplStatus_REPL_OK {
		return fmt.Errorf("primary answered %v", resp.Status)
	}
	return nil
}

// fetchMissing fetches from source the blocks that objects reference and
// this server lacks.
func (s *Server) fetchMissing(ctx context.Context, source string, objects []*wire.ObjectState) error {
	return s.fetchBlocks(ctx, source, s.retainBlocks(objects))
}

// retainBlocks keeps the blocks that objects reference and this server
// has referenceable for a while (store.Retain), and returns the others.
// Installing or merging one object may free a block that a later one
// references.
func (s *Server) retainBlocks(objects []*wire.ObjectState) (missing [][32]byte) {
	for _, o := range objects {
		for _, b := range o.Blocks {
			if len(b.Hash) == 32 && !s.store.Retain([32]byte(b.Hash)) {
				missing = append(missing, [32]byte(b.Hash))
			}
		}
	}
	return missing
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
	for len(hs) > 0 {
		n := min(s.xfer.blocks(src), len(hs))
		req := &wire.FetchBlocksRequest{}
		for _, h := range hs[:n] {
			req.Hashes = append(req.Hashes, h[:])
		}
		hs = hs[n:]
		fctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
		start := time.Now()
		resp, err := p.FetchBlocks(fctx, req)
		s.xfer.done(src, blockBytes(resp.GetData()), time.Since(start), err != nil && fctx.Err() != nil && ctx.Err() == nil)
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
