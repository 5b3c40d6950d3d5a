package server

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// These tests run one server over a store in t.TempDir() and the
// in-memory configuration service: no etcd, no network.

var rootCaller = &wire.Caller{}

func newTestServer(t testing.TB) (*Server, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	st, err := store.Open(t.TempDir(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	conf := configsvc.NewMemory().Client(configsvc.Options{LockTTL: 10 * time.Second})
	s := New(Config{
		ID: "s1", Site: "site1", Addr: "in-process", LeaseTTL: -1,
		Peers: func(context.Context, string) (wire.PeerClient, error) {
			return nil, errors.New("no peers in a unit test")
		},
	}, st, conf, 10*time.Second)
	if err := s.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		conf.Close()
		st.Close()
	})
	return s, ctx
}

func create(t testing.TB, s *Server, ctx context.Context, dir oid.ID, name string, typ wire.Type) *wire.Meta {
	t.Helper()
	resp, err := s.Create(ctx, &wire.CreateRequest{Caller: rootCaller, Dir: uint64(dir), Name: name, Type: typ, Mode: 0o755})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return resp.Meta
}

func meta(t *testing.T, s *Server, id uint64) *wire.Meta {
	t.Helper()
	m, err := s.primaryMeta(oid.ID(id))
	if err != nil {
		t.Fatalf("meta of %v: %v", oid.ID(id), err)
	}
	return m
}

func TestAdmission(t *testing.T) {
	s, ctx := newTestServer(t)
	if err := s.primary(oid.Root); err != nil {
		t.Fatalf("not primary of the root it created: %v", err)
	}
	elsewhere := oid.Make(oid.RootSlice+0x1234, 1)
	if err := s.primary(elsewhere); !errors.Is(err, fserr.ErrNotPrimary) {
		t.Fatalf("primary of a slice nobody holds: %v", err)
	}
	// Eventual callers may use a copy, but only of a slice this server keeps.
	if _, err := s.admit(ctx, &wire.Caller{Eventual: true}, elsewhere); !errors.Is(err, fserr.ErrNotPrimary) {
		t.Fatalf("eventual admit of a slice not kept here: %v", err)
	}
	ectx, err := s.admit(ctx, &wire.Caller{Eventual: true}, oid.Root)
	if err != nil || !isEventual(ectx) || !s.local(ectx, oid.Root) {
		t.Fatalf("eventual admit of root: eventual=%v err=%v", isEventual(ectx), err)
	}
	if pctx, _ := s.admit(ctx, rootCaller, oid.Root); isEventual(pctx) {
		t.Fatal("a strict caller's context is marked eventual")
	}
	// Losing the lock ends admission and the lock's validity at once.
	l, ok := s.owned.lock(oid.RootSlice)
	if !ok {
		t.Fatal("root lock not held")
	}
	s.lostSlice(oid.RootSlice, l.Epoch+1, "stale epoch: ignored")
	if err := s.primary(oid.Root); err != nil {
		t.Fatalf("a stale lostSlice dropped the lock: %v", err)
	}
	s.lostSlice(oid.RootSlice, l.Epoch, "test")
	if err := s.primary(oid.Root); !errors.Is(err, fserr.ErrNotPrimary) {
		t.Fatalf("still primary after losing the lock: %v", err)
	}
	if !s.lockValidity(oid.RootSlice).IsZero() || s.owned.repl(oid.RootSlice) != nil {
		t.Fatal("lost slice keeps validity or replication state")
	}
}

func TestHandOverStopsAdmission(t *testing.T) {
	s, _ := newTestServer(t)
	s.owned.setMoving(oid.RootSlice, true)
	if err := s.primary(oid.Root); !errors.Is(err, fserr.ErrNotPrimary) {
		t.Fatalf("a moving slice is still served: %v", err)
	}
	s.owned.setMoving(oid.RootSlice, false)
	if err := s.primary(oid.Root); err != nil {
		t.Fatalf("after the hand-over was undone: %v", err)
	}
}

// Moving and exchanging directories keeps link counts and parent
// pointers right (the bookkeeping rename and exchange share).
func TestRenameAndExchangeBookkeeping(t *testing.T) {
	s, ctx := newTestServer(t)
	rootLinks := meta(t, s, uint64(oid.Root)).Nlink
	a := create(t, s, ctx, oid.Root, "a", wire.Type_TYPE_DIR)
	b := create(t, s, ctx, oid.Root, "b", wire.Type_TYPE_DIR)
	d := create(t, s, ctx, oid.ID(a.Id), "d", wire.Type_TYPE_DIR)
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	if got := meta(t, s, uint64(oid.Root)).Nlink; got != rootLinks+2 {
		t.Fatalf("root nlink %d after two subdirectories, want %d", got, rootLinks+2)
	}
	if _, err := s.Rename(ctx, &wire.RenameRequest{Caller: rootCaller, SrcDir: a.Id, SrcName: "d", DstDir: b.Id, DstName: "d"}); err != nil {
		t.Fatal(err)
	}
	if got := meta(t, s, a.Id).Nlink; got != 2 {
		t.Errorf("source nlink %d, want 2", got)
	}
	if got := meta(t, s, b.Id).Nlink; got != 3 {
		t.Errorf("destination nlink %d, want 3", got)
	}
	if got := meta(t, s, d.Id).Parent; got != b.Id {
		t.Errorf("moved directory's parent %v, want %v", oid.ID(got), oid.ID(b.Id))
	}
	// Exchange the directory b/d with the file f: d's parent is the root.
	if _, err := s.Rename(ctx, &wire.RenameRequest{Caller: rootCaller, SrcDir: b.Id, SrcName: "d", DstDir: uint64(oid.Root), DstName: "f", Flags: wire.RenameExchange}); err != nil {
		t.Fatal(err)
	}
	if got := meta(t, s, d.Id).Parent; got != uint64(oid.Root) {
		t.Errorf("exchanged directory's parent %v, want the root", oid.ID(got))
	}
	if got := meta(t, s, b.Id).Nlink; got != 2 {
		t.Errorf("b nlink %d after its subdirectory left, want 2", got)
	}
	if got := meta(t, s, uint64(oid.Root)).Nlink; got != rootLinks+3 {
		t.Errorf("root nlink %d, want %d", got, rootLinks+3)
	}
	lk, err := s.Lookup(ctx, &wire.LookupRequest{Caller: rootCaller, Dir: b.Id, Name: "d"})
	if err != nil || lk.Meta.GetId() != f.Id {
		t.Fatalf("b/d after the exchange: %v, %v; want the file", lk, err)
	}
	// A directory cannot move below itself.
	_, err = s.Rename(ctx, &wire.RenameRequest{Caller: rootCaller, SrcDir: uint64(oid.Root), SrcName: "b", DstDir: b.Id, DstName: "x"})
	if fserr.Errno(err) != syscall.EINVAL {
		t.Fatalf("rename into own subtree: %v, want EINVAL", err)
	}
}

// A file unlinked while open lives on as an orphan until its last
// release (opens.go).
func TestOrphanLivesUntilRelease(t *testing.T) {
	s, ctx := newTestServer(t)
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	if _, err := s.Open(ctx, &wire.OpenRequest{Caller: rootCaller, Id: f.Id, Flags: syscall.O_RDONLY}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: rootCaller, Dir: uint64(oid.Root), Name: "f"}); err != nil {
		t.Fatal(err)
	}
	if m := meta(t, s, f.Id); m.Nlink != 0 {
		t.Fatalf("orphan nlink %d, want 0", m.Nlink)
	}
	if _, err := s.Release(ctx, &wire.ReleaseRequest{Id: f.Id}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.primaryMeta(oid.ID(f.Id)); fserr.Errno(err) != syscall.ENOENT {
		t.Fatalf("orphan after its last release: %v, want ENOENT", err)
	}
	if len(s.files.dying) != 0 || len(s.files.opens) != 0 || len(s.files.grants) != 0 {
		t.Fatalf("open-file state left behind: opens %v grants %v dying %v", s.files.opens, s.files.grants, s.files.dying)
	}
}

func TestPlaceKeepTogether(t *testing.T) {
	s, _ := newTestServer(t)
	pol, at := s.place(&wire.CreateRequest{Cues: &wire.Cues{KeepTogether: true}}, oid.Root)
	if !pol.KeepTogether || at != s.cfg.ID {
		t.Fatalf("keep-together placement %+v on %q, want the directory's own slice here", pol, at)
	}
	pol, at = s.place(&wire.CreateRequest{}, oid.Root)
	if pol.KeepTogether || pol.Site != s.cfg.Site || at != s.cfg.ID {
		t.Fatalf("default placement %+v on %q", pol, at)
	}
}

func TestMergeKeepsNewerAndConflicts(t *testing.T) {
	cur := &wire.Entry{Name: "n", Id: 1, Version: 3}
	in := &wire.Entry{Name: "n", Id: 2, Version: 4}
	if out := resolveEntry(false, cur, in); out.put.GetId() != 2 || out.unlinked.GetId() != 1 {
		t.Fatalf("last writer wins: put %v unlinked %v, want 2 and 1", out.put, out.unlinked)
	}
	if got := conflictName("n", 2); got == "n" {
		t.Fatalf("conflict name %q equals the name", got)
	}
	if !newer(&wire.Meta{Version: 5}, &wire.Meta{Version: 4}) || newer(&wire.Meta{Version: 4}, &wire.Meta{Version: 5}) {
		t.Fatal("newer does not prefer the higher version")
	}
}

// TestXattrSummaryBounds checks what the summary leased with meta-data
// carries: every visible name, small readable values, no hidden names,
// and nothing at all when the names alone are too many.
func TestXattrSummaryBounds(t *testing.T) {
	s, ctx := newTestServer(t)
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	set := func(id uint64, name string, v []byte) {
		t.Helper()
		if _, err := s.SetXattr(ctx, &wire.XattrRequest{Caller: rootCaller, Id: id, Name: name, Value: v}); err != nil {
			t.Fatalf("setxattr %s: %v", name, err)
		}
	}
	set(f.Id, "user.small", []byte("s"))
	set(f.Id, "user.big", make([]byte, summaryValueMax+1))
	set(f.Id, "trusted.t", []byte("t"))
	// Values that together pass the total: the later ones are omitted.
	for i := range summaryValuesMax / summaryValueMax {
		set(f.Id, fmt.Sprintf("user.v%02d", i), make([]byte, summaryValueMax))
	}
	summary := func(c *wire.Caller, id uint64) *wire.XattrSummary {
		var sum *wire.XattrSummary
		err := s.store.View(func(tx *store.Tx) error {
			m, err := tx.Meta(oid.ID(id))
			if err == nil {
				sum = xattrSummary(tx, c, m)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	sum := summary(rootCaller, f.Id)
	if sum == nil || sum.Version != meta(t, s, f.Id).Version {
		t.Fatalf("summary %v, want one at version %d", sum, meta(t, s, f.Id).Version)
	}
	values, omitted := 0, map[string]bool{}
	for _, x := range sum.Attrs {
		if x.Omitted {
			omitted[x.Name] = true
		} else {
			values += len(x.Value)
		}
	}
	if len(sum.Attrs) != 3+summaryValuesMax/summaryValueMax || !omitted["user.big"] || omitted["user.small"] ||
		omitted["trusted.t"] || values > summaryValuesMax || !omitted[fmt.Sprintf("user.v%02d", summaryValuesMax/summaryValueMax-1)] {
		t.Errorf("root's summary: %d names, omitted %v, %d bytes of values", len(sum.Attrs), omitted, values)
	}
	// Another user: trusted.* is listed (the client hides it) but its
	// value does not travel.
	for _, x := range summary(&wire.Caller{Uid: 1000, Gid: 1000}, f.Id).Attrs {
		if x.Name == "trusted.t" && !x.Omitted {
			t.Error("a trusted.* value travelled in a summary for an unprivileged caller")
		}
	}
	// A directory with removed entries has hidden tombstone attributes.
	d := create(t, s, ctx, oid.Root, "d", wire.Type_TYPE_DIR)
	create(t, s, ctx, oid.ID(d.Id), "gone", wire.Type_TYPE_FILE)
	if _, err := s.Remove(ctx, &wire.RemoveRequest{Caller: rootCaller, Dir: d.Id, Name: "gone", FileOnly: true}); err != nil {
		t.Fatal(err)
	}
	s.store.View(func(tx *store.Tx) error {
		if names, _ := tx.Xattrs(oid.ID(d.Id)); len(names) == 0 {
			t.Error("no tombstone after a remove: the check below checks nothing")
		}
		return nil
	})
	if sum := summary(rootCaller, d.Id); sum == nil || len(sum.Attrs) != 0 {
		t.Errorf("summary of a directory with a tombstone: %v, want no names", sum)
	}
	// Names beyond the bound: no summary.
	g := create(t, s, ctx, oid.Root, "g", wire.Type_TYPE_FILE)
	n := 0
	for ; n*200 <= summaryNamesMax; n++ { // names of 200 bytes
		set(g.Id, fmt.Sprintf("user.%03d%s", n, strings.Repeat("n", 192)), nil)
	}
	if sum := summary(rootCaller, g.Id); sum != nil {
		t.Errorf("summary of %d bytes of names: %d names, want none", n*200, len(sum.Attrs))
	}
}

// TestRegisteredServerBeforeItsWatch: a server registered moments ago,
// whose registration this server's watch has not brought yet, is found by
// a fresh read when its certificate has the server role (and only then),
// also when it registered just after such a read found nothing.
func TestRegisteredServerBeforeItsWatch(t *testing.T) {
	s, ctx := newTestServer(t)
	if err := s.conf.Register(ctx, configsvc.ServerInfo{ID: "s2", Site: "site2", Addr: "elsewhere"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := s.table.Load().Servers["s2"]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch never brought s2's registration")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The table as it was before s2 registered.
	stale := *s.table.Load()
	stale.Servers = maps.Clone(stale.Servers)
	delete(stale.Servers, "s2")
	s.table.Store(&stale)

	if s.registeredNow(ctx, "s2", false) {
		t.Error("a node without the server role was looked up in a fresh table")
	}
	if !s.registeredNow(ctx, "s2", true) {
		t.Error("a registered server missing from this server's table was not found")
	}
	if s.registeredNow(ctx, "s3", true) {
		t.Error("an unregistered node was taken for a server")
	}
	began := time.Now()
	if !s.registeredNow(ctx, "s2", true) || time.Since(began) > freshTableEvery/2 {
		t.Errorf("s2, found by a fresh read a moment ago, took %v to be admitted again", time.Since(began))
	}
	// s3 registers (and calls) right after a read that did not find it:
	// the call waits for the next read instead of being refused.
	if err := s.conf.Register(ctx, configsvc.ServerInfo{ID: "s3", Site: "site2", Addr: "elsewhere"}); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	if !s.registeredNow(ctx, "s3", true) {
		t.Error("s3, registered since the last read, was refused")
	}
	if took := time.Since(began); took > 3*freshTableEvery {
		t.Errorf("s3 admitted after %v, want within about freshTableEvery (%v)", took, freshTableEvery)
	}
	// Calls from an unknown node share reads and are refused within
	// about freshTableEvery.
	var wg sync.WaitGroup
	began = time.Now()
	for range 8 {
		wg.Go(func() {
			if s.registeredNow(ctx, "s4", true) {
				t.Error("an unregistered node was taken for a server")
			}
		})
	}
	wg.Wait()
	if took := time.Since(began); took > 3*freshTableEvery {
		t.Errorf("8 calls from an unknown node took %v", took)
	}
}

func TestHolderKeyFormat(t *testing.T) {
	for _, c := range [][2]uint64{{0, 0}, {1, 0xabc}, {^uint64(0), 1 << 63}} {
		want := fmt.Sprintf("%s%016x/%016x", orphanPrefix, c[0], c[1])
		if got := holderKey(c[0], c[1]); got != want {
			t.Errorf("holderKey(%x, %x) = %q, want %q", c[0], c[1], got, want)
		}
		if s, h, ok := parseHolder(want); !ok || s != c[0] || h != c[1] {
			t.Errorf("parseHolder(%q) = %x, %x, %v", want, s, h, ok)
		}
	}
}

func TestMutatedObjectsSkipsHiddenAttributes(t *testing.T) {
	dir, file := oid.ID(7), oid.ID(9)
	muts := []*wire.Mutation{
		{Kind: wire.MutationKind_MUT_REMOVE_XATTR, Id: uint64(dir), Name: tombPrefix + "x"},
		{Kind: wire.MutationKind_MUT_SET_XATTR, Id: uint64(dir), Name: "\x00op/1"},
		{Kind: wire.MutationKind_MUT_SET_XATTR, Id: uint64(file), Name: "user.k"},
	}
	if got := mutatedObjects(muts); !slices.Equal(got, []oid.ID{file}) {
		t.Errorf("mutatedObjects = %v, want only %v (hidden attributes revoke nothing)", got, file)
	}
	if got := mutatedObjects(muts[:2]); len(got) != 0 {
		t.Errorf("a sweep of hidden attributes mutates %v, want nothing", got)
	}
}

// TestCommitOfLostUploadIsEIO: a commit naming a block this server does
// not have (uploaded before a restart or a takeover, or kept longer than
// store.PendingTTL) fails with EIO, the data's loss, not EINVAL, and
// changes nothing.
func TestCommitOfLostUploadIsEIO(t *testing.T) {
	s, ctx := newTestServer(t)
	f := create(t, s, ctx, oid.Root, "f", wire.Type_TYPE_FILE)
	lost := sha256.Sum256([]byte("uploaded to a server that restarted since"))
	_, err := s.Commit(ctx, &wire.CommitRequest{Caller: rootCaller, Id: f.Id, Size: 41,
		Blocks: []*wire.BlockRef{{Index: 0, Hash: lost[:], Len: 41}}})
	if fserr.Errno(err) != syscall.EIO {
		t.Fatalf("commit of a lost upload: %v, want EIO", err)
	}
	if m := meta(t, s, f.Id); m.Size != 0 || m.Version != f.Version {
		t.Fatalf("after the failed commit: size %d version %d, want 0 and %d", m.Size, m.Version, f.Version)
	}
}
