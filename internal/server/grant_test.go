package server

import (
	"context"
	"syscall"
	"testing"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Permission belongs to the open (opens.go mayData): data calls through
// a handle are checked against what its open was granted, calls without
// one (or through an open this server does not know) against the mode.

// as returns a caller uid:gid acting through handle h (0: none).
func as(uid uint32, h uint64) *wire.Caller {
	c := &wire.Caller{Uid: uid, Gid: uid}
	if h != 0 {
		c.Handle = &wire.HandleRef{Session: 0xabc, Id: h}
	}
	return c
}

// dataOps runs PutBlocks, Commit, ftruncate and ReadBlocks on id as c and
// returns their errnos in that order.
func dataOps(t *testing.T, s *Server, ctx context.Context, c *wire.Caller, id uint64) [4]syscall.Errno {
	t.Helper()
	var out [4]syscall.Errno
	put, err := s.PutBlocks(ctx, &wire.PutBlocksRequest{Caller: c, Id: id, Data: [][]byte{[]byte("data")}})
	out[0] = fserr.Errno(err)
	var blocks []*wire.BlockRef
	if err == nil {
		blocks = []*wire.BlockRef{{Index: 0, Hash: put.Hashes[0], Len: 4}}
	}
	_, err = s.Commit(ctx, &wire.CommitRequest{Caller: c, Id: id, Size: 4, Blocks: blocks})
	out[1] = fserr.Errno(err)
	_, err = s.SetAttr(ctx, &wire.SetAttrRequest{Caller: c, Id: id, Valid: wire.SetSize, Size: 4, ViaHandle: c.Handle != nil})
	out[2] = fserr.Errno(err)
	var hs [][]byte
	if put != nil {
		hs = put.Hashes
	}
	_, err = s.ReadBlocks(ctx, &wire.ReadBlocksRequest{Caller: c, Id: id, Hashes: hs})
	out[3] = fserr.Errno(err)
	return out
}

func TestCreateOpenGrantsWhatItAsked(t *testing.T) {
	s, ctx := newTestServer(t)
	dir := create(t, s, ctx, oid.Root, "d", wire.Type_TYPE_DIR)
	if _, err := s.SetAttr(ctx, &wire.SetAttrRequest{Caller: rootCaller, Id: dir.Id, Valid: wire.SetMode, Mode: 0o777}); err != nil {
		t.Fatal(err)
	}
	// open("d/f", O_CREAT|O_RDWR, 0) by uid 1000, as the client's
	// operation 1 (its retries carry the same op).
	creator := as(1000, 1)
	creator.Op = &wire.OpRef{Session: 7, Seq: 1, DoneBelow: 1}
	req := &wire.CreateRequest{Caller: creator, Dir: dir.Id, Name: "f", Type: wire.Type_TYPE_FILE,
		Mode: 0, Exclusive: true, OpenAccess: perm.R | perm.W}
	resp, err := s.Create(ctx, req)
	if err != nil {
		t.Fatalf("create+open with mode 0: %v", err)
	}
	if !resp.Opened || resp.Meta.Mode != 0 || resp.Meta.Uid != 1000 {
		t.Fatalf("create+open: opened %v, mode %o, uid %d; want opened, 0, 1000", resp.Opened, resp.Meta.Mode, resp.Meta.Uid)
	}
	f := resp.Meta.Id
	// The answer was lost and the client asks again: the same open, not EEXIST.
	again, err := s.Create(ctx, req)
	if err != nil || !again.Opened || again.Meta.Id != f {
		t.Fatalf("retried create+open: %v, opened %v, id %v; want the same open of %v", err, again.GetOpened(), oid.ID(again.GetMeta().GetId()), oid.ID(f))
	}

	tests := []struct {
		name   string
		caller *wire.Caller
		want   [4]syscall.Errno // PutBlocks, Commit, ftruncate, ReadBlocks
	}{
		{"the creating open", as(1000, 1), [4]syscall.Errno{}},
		{"the owner without a handle", as(1000, 0), [4]syscall.Errno{syscall.EACCES, syscall.EACCES, syscall.EACCES, syscall.EACCES}},
		{"an open this server does not know", as(1000, 99), [4]syscall.Errno{syscall.EACCES, syscall.EACCES, syscall.EACCES, syscall.EACCES}},
		{"another user through the open", as(2000, 1), [4]syscall.Errno{}},
		{"root without a handle", as(0, 0), [4]syscall.Errno{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := dataOps(t, s, ctx, tc.caller, f); got != tc.want {
				t.Errorf("PutBlocks, Commit, ftruncate, ReadBlocks = %v, want %v", got, tc.want)
			}
		})
	}

	// Released, the handle is unknown: the mode decides again.
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: f, Handle: as(1000, 1).Handle}); err != nil {
		t.Fatal(err)
	}
	if got := dataOps(t, s, ctx, as(1000, 1), f); got[1] != syscall.EACCES {
		t.Errorf("commit through a released handle: %v, want EACCES", got[1])
	}
	if len(s.files.grants) != 0 || len(s.files.opens) != 0 {
		t.Errorf("open state left after release: grants %v, opens %v", s.files.grants, s.files.opens)
	}
}

func TestOpenGrantOutlivesChmod(t *testing.T) {
	s, ctx := newTestServer(t)
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	if _, err := s.SetAttr(ctx, &wire.SetAttrRequest{Caller: rootCaller, Id: f.Id, Valid: wire.SetMode | wire.SetUID | wire.SetGID,
		Mode: 0o644, Uid: 1000, Gid: 1000}); err != nil {
		t.Fatal(err)
	}
	open := func(c *wire.Caller, flags uint32) error {
		_, err := s.Open(ctx, &wire.OpenRequest{Caller: c, Id: f.Id, Flags: flags})
		return err
	}
	if err := open(as(1000, 1), syscall.O_RDWR); err != nil {
		t.Fatal(err)
	}
	if err := open(as(2000, 2), syscall.O_RDONLY); err != nil {
		t.Fatal(err)
	}
	if err := open(as(2000, 3), syscall.O_WRONLY); fserr.Errno(err) != syscall.EACCES {
		t.Fatalf("open for writing by another user of a 0644 file: %v, want EACCES", err)
	}
	// The owner makes the file read-only: its open for writing still writes.
	if _, err := s.SetAttr(ctx, &wire.SetAttrRequest{Caller: as(1000, 0), Id: f.Id, Valid: wire.SetMode, Mode: 0o444}); err != nil {
		t.Fatal(err)
	}
	if got := dataOps(t, s, ctx, as(1000, 1), f.Id); got != [4]syscall.Errno{} {
		t.Errorf("through the owner's open for writing after chmod 444: %v, want all allowed", got)
	}
	// No longer the "owner or has access" shortcut: the owner without a
	// handle is checked against 0444.
	if got := dataOps(t, s, ctx, as(1000, 0), f.Id); got[1] != syscall.EACCES || got[3] != 0 {
		t.Errorf("the owner without a handle after chmod 444: %v, want commit EACCES, read allowed", got)
	}
	// A read-only open reads but never writes, whatever the mode allows.
	got := dataOps(t, s, ctx, as(2000, 2), f.Id)
	if got[0] != syscall.EBADF || got[1] != syscall.EBADF || got[2] != syscall.EBADF || got[3] != 0 {
		t.Errorf("through a read-only open: %v, want EBADF for the writes, read allowed", got)
	}
	// The mode 0444 would not let uid 2000 write either; root's read-only
	// open does not write though root may write anything.
	if err := open(as(0, 4), syscall.O_RDONLY); err != nil {
		t.Fatal(err)
	}
	if got := dataOps(t, s, ctx, as(0, 4), f.Id); got[1] != syscall.EBADF {
		t.Errorf("root through its read-only open: commit %v, want EBADF", got[1])
	}
	// An open of another object does not reach this one: the mode decides.
	g := create(t, s, ctx, oid.Root, "g", wire.Type_TYPE_FILE)
	if got := dataOps(t, s, ctx, as(1000, 1), g.Id); got[1] != syscall.EACCES {
		t.Errorf("commit to another file through f's open: %v, want EACCES", got[1])
	}
}

// A create+open of a name that exists opens nothing: the client then
// opens with the usual check. Nothing is counted, so an unlink deletes.
func TestCreateOpenOfExistingNameOpensNothing(t *testing.T) {
	s, ctx := newTestServer(t)
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	resp, err := s.Create(ctx, &wire.CreateRequest{Caller: as(0, 7), Dir: uint64(oid.Root), Name: "f",
		Type: wire.Type_TYPE_FILE, OpenAccess: perm.W})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Opened || !resp.Existed || resp.Meta.Id != f.Id {
		t.Fatalf("create+open of an existing name: opened %v existed %v", resp.Opened, resp.Existed)
	}
	if _, err := s.Create(ctx, &wire.CreateRequest{Caller: as(0, 7), Dir: uint64(oid.Root), Name: "f",
		Type: wire.Type_TYPE_FILE, OpenAccess: perm.W, Exclusive: true}); fserr.Errno(err) != syscall.EEXIST {
		t.Fatalf("exclusive create+open of an existing name: %v, want EEXIST", err)
	}
	if len(s.files.grants) != 0 || len(s.files.opens) != 0 {
		t.Fatalf("open state after create+open of an existing name: grants %v, opens %v", s.files.grants, s.files.opens)
	}
	// The created-and-opened file stays as an orphan when unlinked open.
	resp, err = s.Create(ctx, &wire.CreateRequest{Caller: as(0, 8), Dir: uint64(oid.Root), Name: "g",
		Type: wire.Type_TYPE_FILE, OpenAccess: perm.R | perm.W})
	if err != nil || !resp.Opened {
		t.Fatalf("create+open g: %v", err)
	}
	if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: "g"}); err != nil {
		t.Fatal(err)
	}
	if got := dataOps(t, s, ctx, as(0, 8), resp.Meta.Id); got != [4]syscall.Errno{} {
		t.Fatalf("writing the unlinked file through its open: %v", got)
	}
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: resp.Meta.Id, Handle: as(0, 8).Handle}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.primaryMeta(oid.ID(resp.Meta.Id)); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("orphan after its release: %v, want ENOENT", err)
	}
}

// The FUSE adapter passes renameat2 flags through; a flag WheelFS does
// not implement is refused, never accepted silently.
func TestRenameRefusesUnknownFlags(t *testing.T) {
	s, ctx := newTestServer(t)
	create(t, s, ctx, oid.Root, "a", wire.Type_TYPE_FILE)
	create(t, s, ctx, oid.Root, "b", wire.Type_TYPE_FILE)
	for _, flags := range []uint32{wire.RenameWhiteout, wire.RenameWhiteout | wire.RenameNoReplace,
		wire.RenameNoReplace | wire.RenameExchange, 1 << 7} {
		_, err := s.Rename(ctx, &wire.RenameRequest{Caller: rootCaller, SrcDir: uint64(oid.Root), SrcName: "a",
			DstDir: uint64(oid.Root), DstName: "c", Flags: flags})
		if fserr.Errno(err) != syscall.EINVAL {
			t.Errorf("rename with flags %#x: %v, want EINVAL", flags, err)
		}
	}
	resp, err := s.Lookup(ctx, &wire.LookupRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: "a"})
	if err != nil || resp.Entry.Name != "a" {
		t.Fatalf("source after refused renames: %v", err)
	}
	if _, err := s.Lookup(ctx, &wire.LookupRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: "c"}); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("destination after refused renames: %v, want ENOENT", err)
	}
	// The flags it implements still work.
	if _, err := s.Rename(ctx, &wire.RenameRequest{Caller: rootCaller, SrcDir: uint64(oid.Root), SrcName: "a",
		DstDir: uint64(oid.Root), DstName: "b", Flags: wire.RenameExchange}); err != nil {
		t.Fatalf("RENAME_EXCHANGE: %v", err)
	}
}

// The open count is per handle: a retried open counts once, and the
// release of an open this server never counted (made at a previous
// primary) takes nothing from the opens it did count.
func TestOpenCountPerHandle(t *testing.T) {
	s, ctx := newTestServer(t)
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	for range 2 { // the second is a retry of the first
		if _, err := s.Open(ctx, &wire.OpenRequest{Caller: as(0, 1), Id: f.Id, Flags: syscall.O_RDONLY}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: f.Id, Handle: as(0, 99).Handle}); err != nil {
		t.Fatal(err)
	}
	if n := s.files.opens[oid.ID(f.Id)]; n != 1 {
		t.Fatalf("opens of f = %d, want 1", n)
	}
	if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: "f"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.primaryMeta(oid.ID(f.Id)); err != nil {
		t.Fatalf("f unlinked while open: %v, want an orphan", err)
	}
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: f.Id, Handle: as(0, 1).Handle}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.primaryMeta(oid.ID(f.Id)); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("orphan after its one release: %v, want ENOENT", err)
	}
	if len(s.files.grants) != 0 || len(s.files.opens) != 0 {
		t.Fatalf("open state left: grants %v opens %v", s.files.grants, s.files.opens)
	}
}
