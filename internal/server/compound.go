package server

import (
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Compound answers (issue 11): what a reader needs next travels with the
// answer that tells it which version to read, so a cold read of a small
// file is one round trip.
const (
	// refsPerOpen is how many block references an open or a lookup
	// brings (the client's GetBlocks chunk).
	refsPerOpen = 1024
	// openInlineMax and lookupInlineMax bound the files whose contents
	// come with an open and with a lookup: a lookup may be a stat that
	// never reads, so it carries only a one-block file.
	openInlineMax   = 256 << 10
	lookupInlineMax = blockSize
	// plusPageMax bounds the entries of a readdir-plus page whose
	// meta-data is leased with the listing; plusDataMax the small files'
	// contents a .WholeFile page carries.
	plusPageMax = 1024
	plusDataMax = 4 << 20
)

// fileData describes file m, read in tx, for caller c about to read it:
// the references of its first blocks. Nil when m is not a file c may
// read.
func fileData(tx *store.Tx, c *wire.Caller, m *wire.Meta) (*wire.FileData, error) {
	if m.Type != wire.Type_TYPE_FILE || perm.Access(cred(c), attr(m), perm.R) != nil {
		return nil, nil
	}
	refs, err := tx.Blocks(oid.ID(m.Id), 0, refsPerOpen)
	if err != nil {
		return nil, err
	}
	fd := &wire.FileData{Version: m.Version, Blocks: make([]*wire.BlockRef, len(refs))}
	for i, r := range refs {
		fd.Blocks[i] = &wire.BlockRef{Index: r.Index, Hash: r.Hash[:], Len: r.Len}
	}
	return fd, nil
}

// inline adds the contents of fd's blocks when the file (of size) is at
// most max bytes. Blocks are named by their hash, so reading them after
// the transaction is safe; one freed meanwhile (the file was rewritten)
// only means no inline data.
func (s *Server) inline(fd *wire.FileData, size, max uint64) {
	if fd == nil || size > max || len(fd.Blocks) == 0 {
		return
	}
	hs := make([][32]byte, len(fd.Blocks))
	for i, b := range fd.Blocks {
		hs[i] = [32]byte(b.Hash)
	}
	if data, err := s.store.ReadBlocks(hs); err == nil {
		fd.Data = data
	}
}
