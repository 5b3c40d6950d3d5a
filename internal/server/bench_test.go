package server

import (
	"fmt"
	"testing"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// BenchmarkRemove measures the server's side of an unlink by an
// in-process client (lazily durable, exactly-once): the files are
// created untimed, then removed one by one.
func BenchmarkRemove(b *testing.B) {
	s, ctx := newTestServer(b)
	dir := create(b, s, ctx, oid.Root, "d", wire.Type_TYPE_DIR)
	names := make([]string, b.N)
	for i := range names {
		names[i] = fmt.Sprintf("f%07d", i)
		req := &wire.CreateRequest{Caller: opCaller(uint64(2*i + 1)), Dir: dir.Id, Name: names[i], Type: wire.Type_TYPE_FILE, Mode: 0o644}
		if _, err := s.Create(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i, name := range names {
		if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: opCaller(uint64(2*i + 2)), Dir: dir.Id, Name: name}); err != nil {
			b.Fatal(err)
		}
	}
}

// opCaller is root calling as a client core does: with an operation
// number, so that the server keeps the change's outcome.
func opCaller(seq uint64) *wire.Caller {
	return &wire.Caller{Op: &wire.OpRef{Session: 7, Seq: seq, DoneBelow: seq}}
}
