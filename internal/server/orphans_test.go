package server

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// orphanOf creates name, opens it through handles (session 0xabc), and
// unlinks it; it returns the orphan's ID.
func orphanOf(t *testing.T, s *Server, ctx context.Context, name string, handles ...uint64) oid.ID {
	t.Helper()
	f := create(t, s, ctx, oid.Root, name, wire.Type_TYPE_FILE)
	for _, h := range handles {
		if _, err := s.Open(ctx, &wire.OpenRequest{Caller: as(0, h), Id: f.Id, Flags: syscall.O_RDWR}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: name}); err != nil {
		t.Fatal(err)
	}
	id := oid.ID(f.Id)
	if exists, holders, err := s.Orphan(id); err != nil || !exists || holders != len(handles) {
		t.Fatalf("orphan %s: exists %v, holders %d (%v); want %d holders", name, exists, holders, err, len(handles))
	}
	return id
}

// An orphan's holders are on the object: a primary that counted none of
// its opens (a new one: its soft state is empty) ends a holder on its
// release and deletes the orphan with the last one.
func TestOrphanReleasedAtANewPrimary(t *testing.T) {
	s, ctx := newTestServer(t)
	id := orphanOf(t, s, ctx, "f", 1, 2)
	s.files = newOpenFiles() // as after a failover
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: uint64(id), Handle: as(0, 1).Handle}); err != nil {
		t.Fatal(err)
	}
	if exists, holders, _ := s.Orphan(id); !exists || holders != 1 {
		t.Fatalf("after one of two releases: exists %v, holders %d; want the orphan with one", exists, holders)
	}
	// A handle that never held it ends nothing.
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: uint64(id), Handle: as(0, 9).Handle}); err != nil {
		t.Fatal(err)
	}
	if exists, holders, _ := s.Orphan(id); !exists || holders != 1 {
		t.Fatalf("after a stranger's release: exists %v, holders %d; want the orphan with one", exists, holders)
	}
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: uint64(id), Handle: as(0, 2).Handle}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.primaryMeta(id); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("orphan after its last release: %v, want ENOENT", err)
	}
}

// A rename over a file keeps it for the rename grace: an open by id in
// the grace succeeds (a reader that resolved the name just before the
// rename reads the old file, never ENOENT), a handle open from before
// the rename holds it as for an unlink, and a handle opened in the grace
// is a holder at once (replicated: a primary after a failover keeps the
// file for it), which holds it past the grace. After the grace an open
// by id fails.
func TestOrphanOfRenameOver(t *testing.T) {
	s, ctx := newTestServer(t)
	s.cfg.RenameGrace = 300 * time.Millisecond
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	create(t, s, ctx, oid.Root, "g", wire.Type_TYPE_FILE)
	open := func(h uint64) error {
		_, err := s.Open(ctx, &wire.OpenRequest{Caller: as(0, h), Id: f.Id, Flags: syscall.O_RDONLY})
		return err
	}
	release := func(h uint64) {
		t.Helper()
		if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: f.Id, Handle: as(0, h).Handle}); err != nil {
			t.Fatal(err)
		}
	}
	id := oid.ID(f.Id)
	r := s.owned.repl(id.Slice())
	orphan := func() (bool, int) {
		t.Helper()
		if err := s.sweepOrphans(ctx, id.Slice(), r); err != nil {
			t.Fatal(err)
		}
		exists, holders, err := s.Orphan(id)
		if err != nil {
			t.Fatal(err)
		}
		return exists, holders
	}
	if err := open(1); err != nil {
		t.Fatal(err)
	}
	renamed := time.Now()
	_, err := s.Rename(ctx, &wire.RenameRequest{Caller: rootCaller, SrcDir: uint64(oid.Root), SrcName: "g", DstDir: uint64(oid.Root), DstName: "f"})
	if err != nil {
		t.Fatal(err)
	}
	if exists, holders := orphan(); !exists || holders != 2 {
		t.Fatalf("file renamed over while open: exists %v, holders %d; want an orphan with two (the handle, the grace)", exists, holders)
	}
	if err := open(2); err != nil {
		t.Fatalf("open by id in the rename grace: %v", err)
	}
	if exists, holders := orphan(); !exists || holders != 3 {
		t.Fatalf("opened in the grace: exists %v, holders %d; want three (two handles, the grace)", exists, holders)
	}
	release(1)
	if exists, holders := orphan(); !exists || holders != 2 {
		t.Fatalf("after the release in the grace: exists %v, holders %d; want the grace and the handle opened in it", exists, holders)
	}
	time.Sleep(time.Until(renamed.Add(s.cfg.RenameGrace + 50*time.Millisecond)))
	if exists, holders := orphan(); !exists || holders != 1 {
		t.Fatalf("after the grace: exists %v, holders %d; want the orphan held by the handle opened in the grace", exists, holders)
	}
	if err := open(3); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("open by id after the grace: %v, want ENOENT", err)
	}
	release(2)
	if _, err := s.primaryMeta(id); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("orphan after its last release: %v, want ENOENT", err)
	}

	// Nobody opens it: it goes with the grace.
	f = create(t, s, ctx, oid.Root, "f2", wire.Type_TYPE_FILE)
	id = oid.ID(f.Id)
	create(t, s, ctx, oid.Root, "g2", wire.Type_TYPE_FILE)
	renamed = time.Now()
	if _, err := s.Rename(ctx, &wire.RenameRequest{Caller: rootCaller, SrcDir: uint64(oid.Root), SrcName: "g2", DstDir: uint64(oid.Root), DstName: "f2"}); err != nil {
		t.Fatal(err)
	}
	if exists, holders := orphan(); !exists || holders != 1 {
		t.Fatalf("file renamed over: exists %v, holders %d; want an orphan with its grace", exists, holders)
	}
	time.Sleep(time.Until(renamed.Add(s.cfg.RenameGrace + 50*time.Millisecond)))
	if exists, _ := orphan(); exists {
		t.Fatal("a replaced file nobody opened outlived its rename grace")
	}
}

// A directory removed while open is an orphan too, until its release.
func TestOrphanDirectory(t *testing.T) {
	s, ctx := newTestServer(t)
	d := create(t, s, ctx, oid.Root, "d", wire.Type_TYPE_DIR)
	if _, err := s.Open(ctx, &wire.OpenRequest{Caller: as(0, 1), Id: d.Id, Flags: syscall.O_RDONLY}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: "d", DirOnly: true}); err != nil {
		t.Fatal(err)
	}
	id := oid.ID(d.Id)
	if exists, holders, err := s.Orphan(id); err != nil || !exists || holders != 1 {
		t.Fatalf("directory removed while open: exists %v, holders %d (%v); want an orphan with one", exists, holders, err)
	}
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: d.Id, Handle: as(0, 1).Handle}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.primaryMeta(id); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("removed directory after its release: %v, want ENOENT", err)
	}
}

// A holder's session ends its holds: by its bye at once, or after
// HolderIdle without a sign, counted from when the primary started
// serving the slice at the earliest. Anonymous opens die with the
// process that counted them.
func TestOrphanSweep(t *testing.T) {
	s, ctx := newTestServer(t)
	long := s.cfg.HolderIdle + time.Minute
	id := orphanOf(t, s, ctx, "f", 1)
	r := s.owned.repl(id.Slice())
	sweep := func() bool {
		t.Helper()
		if err := s.sweepOrphans(ctx, id.Slice(), r); err != nil {
			t.Fatal(err)
		}
		exists, _, err := s.Orphan(id)
		if err != nil {
			t.Fatal(err)
		}
		return exists
	}
	if !sweep() {
		t.Fatal("a new primary's sweep removed an orphan whose holder had no time to show up")
	}
	r.mu.Lock()
	r.since = time.Now().Add(-long)
	r.mu.Unlock()
	if err := s.owners.claim("", 0xabc); err != nil { // a request of the session now
		t.Fatal(err)
	}
	if !sweep() {
		t.Fatal("the sweep removed an orphan whose holder's session was just seen")
	}
	s.owners.end(0xabc)
	if sweep() {
		t.Fatal("the orphan outlived its holder's bye")
	}

	// Idle: the session was last seen long ago.
	id = orphanOf(t, s, ctx, "g", 2)
	s.owners.now = func() time.Time { return time.Now().Add(-long) }
	if err := s.owners.claim("", 0xabc); err != nil {
		t.Fatal(err)
	}
	s.owners.now = time.Now
	r.mu.Lock()
	r.since = time.Now().Add(-long)
	r.mu.Unlock()
	if sweep() {
		t.Fatal("the orphan outlived its holder's session by more than HolderIdle")
	}

	// Anonymous opens hold it while this process counts them.
	f := create(t, s, ctx, oid.Root, "h", wire.Type_TYPE_FILE)
	id = oid.ID(f.Id)
	if _, err := s.Open(ctx, &wire.OpenRequest{Caller: rootCaller, Id: f.Id, Flags: syscall.O_RDONLY}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: "h"}); err != nil {
		t.Fatal(err)
	}
	if !sweep() {
		t.Fatal("the sweep removed an orphan this process holds open")
	}
	// As after a restart: the holder is a previous process's, and this
	// one counts no open.
	s.files = newOpenFiles()
	err := s.update(ctx, 1, func(tx *store.Tx) error {
		if err := tx.RemoveXattr(id, holderKey(0, s.boot)); err != nil {
			return err
		}
		return tx.SetXattr(id, holderKey(0, s.boot+2), []byte(s.cfg.ID))
	})
	if err != nil {
		t.Fatal(err)
	}
	if sweep() {
		t.Fatal("the orphan outlived the process that held it")
	}
}
