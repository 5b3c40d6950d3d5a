package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// blockSize is the file block size (DESIGN.md: 64 KiB).
const blockSize = 64 << 10

// truncate changes a file's size, trimming the block that holds the new end.
// Through a handle (ftruncate) what its open granted decides (mayData).
func (s *Server) truncate(tx *store.Tx, c perm.Cred, m *wire.Meta, req *wire.SetAttrRequest) error {
	switch {
	case isDir(m):
		return fserr.ErrIsDir
	case m.Type != wire.Type_TYPE_FILE:
		return fserr.ErrInvalid
	}
	if err := s.mayData(req.Caller, m, perm.W); err != nil {
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

// GetBlocks implements wire.StorageServer.
func (s *Server) GetBlocks(ctx context.Context, req *wire.GetBlocksRequest) (*wire.GetBlocksResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	resp := &wire.GetBlocksResponse{}
	// A reader at another site may read the blocks from a replica nearer
	// to it, with a grant (issue 12 item 5; it asks only when it has one).
	asker, perr := pki.PeerName(ctx)
	grant := perr == nil && req.Site != "" && req.Site != s.cfg.Site && s.cfg.Grants != nil && s.replicaFor(id.Slice(), req.Site)
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
		grant = grant && len(refs) > 0 && s.mayData(req.Caller, m, perm.R) == nil
		return nil
	})
	err = s.settled(ctx, err, id)
	if err != nil {
		return nil, fmt.Errorf("blocks of %v: %w", id, err)
	}
	if grant {
		hashes := make([][]byte, 0, min(len(resp.Blocks), maxGrantBlocks))
		for _, b := range resp.Blocks[:min(len(resp.Blocks), maxGrantBlocks)] {
			hashes = append(hashes, b.Hash)
		}
		g, err := s.sign(req.Id, resp.Meta.Version, asker, req.Caller.GetUid(), nil, hashes, req.HaveCert)
		if err != nil {
			s.log.Warn("cannot sign a grant for a replica nearer to the reader", "id", id.String(), "err", err)
		}
		resp.Grant = g
	}
	return resp, nil
}

// ReadBlocks implements wire.StorageServer.
func (s *Server) ReadBlocks(ctx context.Context, req *wire.ReadBlocksRequest) (*wire.ReadBlocksResponse, error) {
	id := oid.ID(req.Id)
	if req.Grant != nil && s.primary(id) != nil {
		if err := s.checkGrant(ctx, req); err != nil { // a replica serving a .Hotspot reader
			return nil, err
		}
	} else if err := s.checkData(ctx, req.Caller, id, perm.R); err != nil {
		return nil, err
	}
	hs, err := blockHashes(req.Hashes)
	if err != nil {
		return nil, err
	}
	data, err := s.store.ReadBlocks(hs)
	if err != nil {
		return nil, fmt.Errorf("read blocks of %v: %w", id, err)
	}
	for _, d := range data {
		s.blockBytes.Add(int64(len(d)))
	}
	return &wire.ReadBlocksResponse{Data: data}, nil
}

// readBlocksInto is ReadBlocks for the client in this process, into its
// buffer (store.ReadBlocksInto): the primary's own reader, so no grant.
func (s *Server) readBlocksInto(ctx context.Context, req *wire.ReadBlocksRequest, dst []byte) error {
	id := oid.ID(req.Id)
	if err := s.checkData(ctx, req.Caller, id, perm.R); err != nil {
		return err
	}
	hs, err := blockHashes(req.Hashes)
	if err != nil {
		return err
	}
	if err := s.store.ReadBlocksInto(hs, dst); err != nil {
		return fmt.Errorf("read blocks of %v: %w", id, err)
	}
	s.blockBytes.Add(int64(len(dst)))
	return nil
}

// blockHashes converts a request's block hashes.
func blockHashes(in [][]byte) ([][32]byte, error) {
	hs := make([][32]byte, len(in))
	for i, h := range in {
		if len(h) != 32 {
			return nil, fmt.Errorf("block hash of %d bytes: %w", len(h), fserr.ErrInvalid)
		}
		hs[i] = [32]byte(h)
	}
	return hs, nil
}

// checkData allows block transfers for a file the caller may access
// (mayData).
func (s *Server) checkData(ctx context.Context, caller *wire.Caller, id oid.ID, want uint32) error {
	if _, err := s.admit(ctx, caller, id); err != nil {
		return err
	}
	return s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := s.mayData(caller, m, want); err != nil {
			return fmt.Errorf("data of %v: %w", id, err)
		}
		return nil
	})
}

// PutBlocks implements wire.StorageServer. Blocks become part of a file
// only when a Commit names them.
func (s *Server) PutBlocks(ctx context.Context, req *wire.PutBlocksRequest) (*wire.PutBlocksResponse, error) {
	id := oid.ID(req.Id)
	if err := s.checkData(ctx, req.Caller, id, perm.W); err != nil {
		return nil, err
	}
	for _, d := range req.Data {
		if len(d) > blockSize {
			return nil, fmt.Errorf("block of %d bytes: %w", len(d), fserr.ErrInvalid)
		}
	}
	hs, err := s.store.PutBlocks(req.Data)
	if err != nil {
		return nil, fmt.Errorf("store blocks of %v: %w", id, err)
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
		return nil, aerr
	}
	resp := &wire.CommitResponse{}
	op := s.once(ctx, req.Caller, id, resp)
	c := cred(req.Caller)
	now := time.Now().UnixNano()
	blocks := req.Blocks
	if len(req.Inline) > 0 {
		// A small write sends its blocks with the commit: stored first,
		// as PutBlocks would, and named by the commit below.
		if err := s.checkData(ctx, req.Caller, id, perm.W); err != nil {
			return nil, err
		}
		datas := make([][]byte, len(req.Inline))
		for i, b := range req.Inline {
			if len(b.Data) > blockSize {
				return nil, fmt.Errorf("block of %d bytes: %w", len(b.Data), fserr.ErrInvalid)
			}
			datas[i] = b.Data
		}
		hs, err := s.store.PutBlocks(datas)
		if err != nil {
			return nil, fmt.Errorf("store blocks of %v: %w", id, err)
		}
		blocks = slices.Clone(blocks)
		for i, b := range req.Inline {
			resp.Hashes = append(resp.Hashes, hs[i][:])
			blocks = append(blocks, &wire.BlockRef{Index: b.Index, Hash: hs[i][:], Len: uint32(len(b.Data))})
		}
	}
	err := s.update(ctx, req.SyncLevel, op.wrap(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if m.Type != wire.Type_TYPE_FILE {
			return fserr.ErrInvalid
		}
		if err := s.mayData(req.Caller, m, perm.W); err != nil {
			return err
		}
		if req.Size < m.Size {
			if err := tx.TruncateBlocks(id, (req.Size+blockSize-1)/blockSize); err != nil {
				return err
			}
		}
		for _, b := range blocks {
			if len(b.Hash) != 32 || b.Index*blockSize >= req.Size {
				continue
			}
			if err := tx.SetBlock(id, b.Index, [32]byte(b.Hash)); errors.Is(err, store.ErrUnknownBlock) {
				// Uploaded, then lost: this server restarted or took
				// the file over since, or the upload waited longer
				// than store.PendingTTL. The data is gone, not the
				// request malformed.
				return fmt.Errorf("block %d: uploaded data no longer stored here: %w", b.Index, fserr.ErrIO)
			} else if err != nil {
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
		resp.Meta = m
		return tx.PutMeta(m)
	}))
	if err == nil {
		err = op.settle(ctx, req.SyncLevel)
	}
	if err != nil {
		return nil, fmt.Errorf("commit %v: %w", id, err)
	}
	return resp, nil
}

// StatFS implements wire.StorageServer.
func (s *Server) StatFS(ctx context.Context, req *wire.StatFSRequest) (*wire.StatFSResponse, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.store.Dir(), &st); err != nil {
		return nil, fmt.Errorf("statfs: %w", err)
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

// StoreUsage reports the local store's usage (tests check what it holds
// pending, uploaded but not yet committed).
func (s *Server) StoreUsage() (store.Usage, error) { return s.store.Usage() }
