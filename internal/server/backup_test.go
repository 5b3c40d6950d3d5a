package server

import (
	"crypto/sha256"
	"fmt"
	"testing"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// setBlock is the mutation that points block index of file id at data.
func setBlock(id oid.ID, index uint64, data []byte) *wire.Mutation {
	h := sha256.Sum256(data)
	return &wire.Mutation{Kind: wire.MutationKind_MUT_SET_BLOCK, Id: uint64(id), Data: h[:], Index: index}
}

// TestReplicateReusesAFreedBlock: two files written with the same bytes
// and then truncated (cluster.TestGrantsAfterFailover does this). The
// backup holds the shared block for the first file when one request
// brings the first file's truncation, which frees it, and the second
// file's write of it, which the primary's own later truncation has freed
// there too, so the request cannot carry it. The backup must keep the
// block it holds until the request is applied: it used to fail the
// request with "unknown block" at every retry, and the slice's
// replication stopped for good.
func TestReplicateReusesAFreedBlock(t *testing.T) {
	s, ctx := newTestServer(t)
	sl := oid.Slice(7)
	first, second := oid.Make(sl, 1), oid.Make(sl, 2)
	shared, short := []byte("v1tail"), []byte("v1")
	apply := func(req *wire.ReplicateRequest) {
		t.Helper()
		req.Slice = uint32(sl)
		resp, err := s.applyReplicate(ctx, req)
		if err != nil {
			t.Fatalf("replicate up to batch %d: %v", req.Batches[len(req.Batches)-1].Seq, err)
		}
		last := req.Batches[len(req.Batches)-1].Seq
		if resp.Status != wire.ReplStatus_REPL_OK || resp.Seq != last {
			t.Fatalf("replicate up to batch %d: status %v at %d", last, resp.Status, resp.Seq)
		}
	}
	apply(&wire.ReplicateRequest{
		Batches: []*wire.Batch{{Seq: 1, Mutations: []*wire.Mutation{setBlock(first, 0, shared)}}},
		Blocks:  [][]byte{shared},
	})
	apply(&wire.ReplicateRequest{
		Batches: []*wire.Batch{
			{Seq: 2, Mutations: []*wire.Mutation{setBlock(first, 0, short)}},
			{Seq: 3, Mutations: []*wire.Mutation{setBlock(second, 0, shared)}},
			{Seq: 4, Mutations: []*wire.Mutation{setBlock(second, 0, short)}},
		},
		Blocks: [][]byte{short},
	})
	for _, id := range []oid.ID{first, second} {
		var got []byte
		err := s.store.View(func(tx *store.Tx) error {
			h, ok, err := tx.Block(id, 0)
			if err != nil || !ok {
				return fmt.Errorf("no block 0 (%v)", err)
			}
			got, err = s.store.ReadBlock(h)
			return err
		})
		if err != nil || string(got) != string(short) {
			t.Errorf("block 0 of %v at the backup: %q, %v; want %q", id, got, err, short)
		}
	}
}

// TestInstallReusesAFreedBlock: a snapshot chunk that rewrites one file
// away from a block this server holds only for it, and then installs
// another file with that block. The server holds the block, so it
// fetches nothing; the block must still be there for the second file.
func TestInstallReusesAFreedBlock(t *testing.T) {
	s, ctx := newTestServer(t)
	sl := oid.Slice(7)
	first, second := oid.Make(sl, 1), oid.Make(sl, 2)
	shared, short := []byte("v1tail"), []byte("v1")
	hShared, hShort := sha256.Sum256(shared), sha256.Sum256(short)
	file := func(id oid.ID, h [32]byte) *wire.ObjectState {
		return &wire.ObjectState{
			Meta:   &wire.Meta{Id: uint64(id), Type: wire.Type_TYPE_FILE, Mode: 0o644, Nlink: 1, Size: 2},
			Blocks: []*wire.BlockRef{{Index: 0, Hash: h[:]}},
		}
	}
	install := func(objects ...*wire.ObjectState) {
		t.Helper()
		req := &wire.InstallRequest{Slice: uint32(sl), Counter: 3, Objects: objects, Source: "no peer: nothing may be fetched"}
		if _, _, err := s.install(ctx, req, true); err != nil {
			t.Fatalf("install: %v", err)
		}
	}
	if _, err := s.store.PutBlocks([][]byte{shared, short}); err != nil {
		t.Fatal(err)
	}
	install(file(first, hShared))
	install(file(first, hShort), file(second, hShared))
	err := s.store.View(func(tx *store.Tx) error {
		h, ok, err := tx.Block(second, 0)
		if err != nil || !ok || h != hShared {
			return fmt.Errorf("block 0 of the second file: %x, %v, %v", h, ok, err)
		}
		_, err = s.store.ReadBlock(h)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
