package server

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/wheelfs/wheelfs/internal/blockgrant"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// maxGrantBlocks bounds the blocks one grant names (a reader asks per
// window of blocks, not per file).
const maxGrantBlocks = 1024

// signGrant returns a grant letting asker fetch the asked blocks of the
// file's current version from the given holders and from the slice's
// replicas. The caller has checked read permission and the version.
func (s *Server) signGrant(ctx context.Context, req *wire.HoldersRequest, asker string, hs []*wire.Holder) (*wire.Grant, error) {
	if s.cfg.Grants == nil {
		return nil, nil
	}
	var holders []string
	for _, h := range hs {
		holders = append(holders, h.Node)
	}
	var hashes [][]byte
	err := s.store.View(func(tx *store.Tx) error {
		for _, r := range req.Blocks {
			n := min(r.Count, maxGrantBlocks-uint64(len(hashes)))
			refs, err := tx.Blocks(oid.ID(req.Id), r.First, n)
			if err != nil {
				return err
			}
			for _, ref := range refs {
				hashes = append(hashes, ref.Hash[:])
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("grant for %v: %w", oid.ID(req.Id), err)
	}
	return s.sign(req.Id, req.Version, asker, req.GetCaller().GetUid(), holders, hashes, req.HaveCert)
}

// sign returns a grant letting asker, acting for uid, fetch the blocks
// hashes of version of file id from holders and from the slice's
// replicas; its signer's certificate is left out when haveCert is its
// SHA-256 (the asker holds it). The caller has checked read permission.
func (s *Server) sign(id, version uint64, asker string, uid uint32, holders []string, hashes [][]byte, haveCert []byte) (*wire.Grant, error) {
	if s.cfg.Grants == nil {
		return nil, nil
	}
	if asker == "" {
		return nil, fmt.Errorf("grant for an unnamed client: %w", fserr.ErrInvalid)
	}
	g, err := s.cfg.Grants.Sign(&wire.GrantBody{Id: id, Version: version, Asker: asker, Uid: uid,
		Holders: holders, Hashes: hashes, ExpiresUnixMs: time.Now().Add(blockgrant.DefaultTTL).UnixMilli()})
	if err == nil && g != nil && bytes.Equal(haveCert, certSum(s.cfg.Grants)) {
		g.Cert = nil // the asker puts back the one it has
	}
	return g, err
}

// checkGrant admits a ReadBlocks at a replica that is not the primary: the
// request carries a valid grant for this file, signed by a server of the
// file's slice, for the calling node, naming every asked block.
func (s *Server) checkGrant(ctx context.Context, req *wire.ReadBlocksRequest) error {
	if s.cfg.GrantCheck == nil {
		return fmt.Errorf("object %v: %w", oid.ID(req.Id), fserr.ErrNotPrimary)
	}
	b, err := s.cfg.GrantCheck.Check(req.Grant, time.Now())
	if err != nil {
		return fmt.Errorf("read blocks of %v: %v: %w", oid.ID(req.Id), err, fserr.ErrPerm)
	}
	asker, err := pki.PeerName(ctx)
	if err != nil {
		asker = s.cfg.ID // in-process: this host's own client
	}
	if b.Id != req.Id || b.Asker != asker || !s.servesSlice(b.Signer, oid.ID(req.Id).Slice()) {
		return fmt.Errorf("read blocks of %v: grant for %v by %s to %s: %w", oid.ID(req.Id), oid.ID(b.Id), b.Signer, b.Asker, fserr.ErrPerm)
	}
	ok := blockgrant.Hashes(b)
	for _, h := range req.Hashes {
		if len(h) != 32 || !ok[[32]byte(h)] {
			return fmt.Errorf("read blocks of %v: a block the grant does not name: %w", oid.ID(req.Id), fserr.ErrPerm)
		}
	}
	return nil
}

// servesSlice reports whether server keeps a replica of sl (its grants
// speak for the slice's files).
func (s *Server) servesSlice(server string, sl oid.Slice) bool {
	t := s.table.Load()
	if t == nil {
		return false
	}
	x, ok := t.Slices[sl]
	return ok && slices.Contains(x.Replicas, server)
}

// BlockBytesSent is how many block bytes this server has sent to
// clients' reads (the origin's load in the .Hotspot experiments).
func (s *Server) BlockBytesSent() int64 { return s.blockBytes.Load() }
