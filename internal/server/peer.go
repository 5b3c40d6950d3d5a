package server

import (
	"context"
	"fmt"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
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

// Replicate implements wire.PeerServer: apply the primary's next batches.
func (p *peerServer) Replicate(ctx context.Context, req *wire.ReplicateRequest) (*wire.ReplicateResponse, error) {
	return p.s.applyReplicate(ctx, req)
}

// Digest implements wire.PeerServer.
func (p *peerServer) Digest(ctx context.Context, req *wire.DigestRequest) (*wire.DigestResponse, error) {
	d, err := p.s.digest(oid.Slice(req.Slice))
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Diff implements wire.PeerServer: what a replica with the given digest
// lacks (a new primary collecting newer versions from a backup). Only one
// message: the caller asks again if More is set.
func (p *peerServer) Diff(ctx context.Context, req *wire.DiffRequest) (*wire.InstallRequest, error) {
	s := p.s
	var at pos
	sl := oid.Slice(req.Slice)
	_ = s.store.View(func(tx *store.Tx) error { at = readPos(tx, sl); return nil })
	reqs, err := s.diff(sl, req.Digest, at.epoch)
	if err != nil {
		return nil, err
	}
	return reqs[0], nil
}

// Install implements wire.PeerServer.
func (p *peerServer) Install(ctx context.Context, req *wire.InstallRequest) (*wire.InstallResponse, error) {
	s := p.s
	sl := oid.Slice(req.Slice)
	if !s.fence(sl, req.Epoch) {
		return &wire.InstallResponse{Status: wire.ReplStatus_REPL_STALE_EPOCH}, nil
	}
	stale, busy, err := s.install(ctx, req, true)
	if err != nil {
		return nil, fmt.Errorf("install slice %d: %w", sl, err)
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
	hs := make([][32]byte, 0, len(req.Hashes))
	for _, h := range req.Hashes {
		if len(h) != 32 {
			return nil, fmt.Errorf("block hash of %d bytes: %w", len(h), fserr.ErrInvalid)
		}
		hs = append(hs, [32]byte(h))
	}
	data, err := p.s.store.ReadBlocks(hs)
	if err != nil {
		return nil, err
	}
	return &wire.FetchBlocksResponse{Data: data}, nil
}

// Ping implements wire.PeerServer.
func (p *peerServer) Ping(ctx context.Context, req *wire.PingRequest) (*wire.PingResponse, error) {
	return &wire.PingResponse{Id: p.s.cfg.ID}, nil
}

// CreateObject implements wire.PeerServer: the object half of a two-step
// create (paper §5.2.2). The directory's primary checked permissions and
// computed the new object's attributes; this server picks a slice of the
// object's policy that it is primary for and stores the object there.
func (p *peerServer) CreateObject(ctx context.Context, req *wire.CreateObjectRequest) (*wire.CreateObjectResponse, error) {
	s := p.s
	if req.Meta == nil {
		return nil, fmt.Errorf("create object without meta-data: %w", fserr.ErrInvalid)
	}
	if req.OpenAccess != 0 && req.Handle.GetSession() != 0 {
		// The client's later calls here come from its node, or, for the
		// asking server's own client, from that server.
		node := req.ClientNode
		if node == "" {
			node, _ = pki.PeerName(ctx)
		}
		if err := s.owners.claim(s.sessionNode(node), req.Handle.GetSession()); err != nil {
			s.log.Warn("create names another node's client session", "node", node)
			return nil, err
		}
	}
	m, err := s.createObject(ctx, policyFromCues(req.Policy), req.Meta, req.SyncLevel, req.Handle, req.OpenAccess)
	if err != nil {
		return nil, err
	}
	return &wire.CreateObjectResponse{Meta: m}, nil
}

// DropLink implements wire.PeerServer: the object half of removing a
// name whose object lives here.
func (p *peerServer) DropLink(ctx context.Context, req *wire.DropLinkRequest) (*wire.DropLinkResponse, error) {
	return p.s.dropLinkHere(ctx, req)
}

// Stat implements wire.PeerServer: an object's meta-data from its primary
// (a rename on another server checks permissions with it).
func (p *peerServer) Stat(ctx context.Context, req *wire.StatRequest) (*wire.StatResponse, error) {
	s := p.s
	m, err := s.primaryMeta(oid.ID(req.Id))
	err = s.settled(ctx, err, oid.ID(req.Id))
	if err != nil {
		return nil, err
	}
	return &wire.StatResponse{Meta: m}, nil
}

// Reconcile implements wire.PeerServer: merge what a replica changed
// without the primary.
func (p *peerServer) Reconcile(ctx context.Context, req *wire.ReconcileRequest) (*wire.ReconcileResponse, error) {
	return p.s.reconciled(ctx, req)
}

// AddLink implements wire.PeerServer: the destination's half of a rename
// between servers (see renameAcross), or, without a directory, counting a
// link to an object of this server.
func (p *peerServer) AddLink(ctx context.Context, req *wire.AddLinkRequest) (*wire.AddLinkResponse, error) {
	s := p.s
	resp, err := s.addLink(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("add link %q to %v: %w", req.Name, oid.ID(req.Id), err)
	}
	return resp, nil
}
