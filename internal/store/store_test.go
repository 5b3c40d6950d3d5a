package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

func openT(t testing.TB, dir string, o Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func update(t testing.TB, s *Store, fn func(*Tx) error) {
	t.Helper()
	if err := s.Update(context.Background(), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func view(t testing.TB, s *Store, fn func(*Tx) error) {
	t.Helper()
	if err := s.View(fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

func randBlock(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	dirID  = oid.Make(3, 1)
	fileID = oid.Make(3, 2)
)

func TestMetaEntriesXattrs(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	ctx := context.Background()

	update(t, s, func(tx *Tx) error {
		if err := tx.PutMeta(&wire.Meta{Id: uint64(dirID), Type: wire.Type_TYPE_DIR, Mode: 0o755, Version: 1}); err != nil {
			return err
		}
		if got := tx.ObjectCount(); got != 1 {
			t.Errorf("ObjectCount in tx = %d, want 1", got)
		}
		// Reads see the function's own buffered writes.
		m, err := tx.Meta(dirID)
		if err != nil || m.Mode != 0o755 {
			t.Errorf("Meta in tx = %v, %v", m, err)
		}
		return tx.PutMeta(&wire.Meta{Id: uint64(fileID), Type: wire.Type_TYPE_FILE, Size: 42})
	})
	view(t, s, func(tx *Tx) error {
		m, err := tx.Meta(fileID)
		if err != nil {
			return err
		}
		if m.Size != 42 || m.Type != wire.Type_TYPE_FILE {
			t.Errorf("Meta = %v", m)
		}
		if _, err := tx.Meta(oid.Make(3, 99)); !errors.Is(err, fserr.ErrNotExist) {
			t.Errorf("Meta(missing) err = %v, want ErrNotExist", err)
		}
		if n := tx.ObjectCount(); n != 2 {
			t.Errorf("ObjectCount = %d, want 2", n)
		}
		if err := tx.PutMeta(&wire.Meta{Id: 5}); !errors.Is(err, ErrReadOnly) || !errors.Is(err, fserr.ErrInvalid) {
			t.Errorf("write in View err = %v", err)
		}
		return nil
	})

	// Entries: inserted out of order, read back sorted and paged.
	names := []string{"delta", "alpha", "echo", "charlie", "bravo", "foxtrot", "a", "zulu"}
	update(t, s, func(tx *Tx) error {
		for i, n := range names {
			if err := tx.PutEntry(dirID, &wire.Entry{Name: n, Id: uint64(oid.Make(3, uint64(100+i))), Type: wire.Type_TYPE_FILE}); err != nil {
				return err
			}
		}
		// An entry in another directory must not show up.
		return tx.PutEntry(fileID, &wire.Entry{Name: "other", Id: 7})
	})
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	view(t, s, func(tx *Tx) error {
		all, err := tx.Entries(dirID, "", 0)
		if err != nil {
			return err
		}
		if got := entryNames(all); !slices.Equal(got, sorted) {
			t.Errorf("Entries = %v, want %v", got, sorted)
		}
		var paged []string
		after := ""
		for {
			page, err := tx.Entries(dirID, after, 3)
			if err != nil {
				return err
			}
			if len(page) == 0 {
				break
			}
			if len(page) > 3 {
				t.Fatalf("page of %d > limit", len(page))
			}
			paged = append(paged, entryNames(page)...)
			after = page[len(page)-1].Name
		}
		if !slices.Equal(paged, sorted) {
			t.Errorf("paged = %v, want %v", paged, sorted)
		}
		page, _ := tx.Entries(dirID, "b", 2) // "b" is not an entry; names > "b"
		if got := entryNames(page); !slices.Equal(got, []string{"bravo", "charlie"}) {
			t.Errorf("after b = %v", got)
		}
		e, err := tx.Entry(dirID, "echo")
		if err != nil || e.Id != uint64(oid.Make(3, 102)) {
			t.Errorf("Entry(echo) = %v, %v", e, err)
		}
		if _, err := tx.Entry(dirID, "nope"); !errors.Is(err, fserr.ErrNotExist) {
			t.Errorf("Entry(nope) err = %v", err)
		}
		if has, _ := tx.HasEntries(dirID); !has {
			t.Error("HasEntries = false")
		}
		if has, _ := tx.HasEntries(oid.Make(3, 77)); has {
			t.Error("HasEntries(empty) = true")
		}
		return nil
	})

	// Buffered writes merge with committed ones in range reads.
	update(t, s, func(tx *Tx) error {
		if err := tx.DeleteEntry(dirID, "alpha"); err != nil {
			return err
		}
		if err := tx.PutEntry(dirID, &wire.Entry{Name: "beta", Id: 9}); err != nil {
			return err
		}
		if err := tx.PutEntry(dirID, &wire.Entry{Name: "bravo", Id: 10}); err != nil { // replace
			return err
		}
		if err := tx.DeleteEntry(dirID, "nope"); !errors.Is(err, fserr.ErrNotExist) {
			t.Errorf("DeleteEntry(nope) = %v", err)
		}
		got, err := tx.Entries(dirID, "", 4)
		if err != nil {
			return err
		}
		if n := entryNames(got); !slices.Equal(n, []string{"a", "beta", "bravo", "charlie"}) {
			t.Errorf("merged Entries = %v", n)
		}
		if got[2].Id != 10 {
			t.Errorf("bravo id = %d, want 10 (buffered replacement)", got[2].Id)
		}
		return nil
	})

	// Extended attributes.
	update(t, s, func(tx *Tx) error {
		for _, n := range []string{"user.b", "user.a", "user.empty"} {
			v := []byte("value-" + n)
			if n == "user.empty" {
				v = nil
			}
			if err := tx.SetXattr(fileID, n, v); err != nil {
				return err
			}
		}
		return tx.SetXattr(dirID, "user.dir", []byte("d"))
	})
	view(t, s, func(tx *Tx) error {
		v, err := tx.Xattr(fileID, "user.a")
		if err != nil || string(v) != "value-user.a" {
			t.Errorf("Xattr = %q, %v", v, err)
		}
		v, err = tx.Xattr(fileID, "user.empty")
		if err != nil || len(v) != 0 {
			t.Errorf("empty Xattr = %q, %v", v, err)
		}
		if _, err := tx.Xattr(fileID, "user.none"); !errors.Is(err, fserr.ErrNoAttr) {
			t.Errorf("missing Xattr err = %v", err)
		}
		names, _ := tx.Xattrs(fileID)
		if !slices.Equal(names, []string{"user.a", "user.b", "user.empty"}) {
			t.Errorf("Xattrs = %v", names)
		}
		var from []string
		tx.EachXattr(fileID, "user.b", func(n string, v []byte) bool {
			from = append(from, n+"="+string(v))
			return true
		})
		if !slices.Equal(from, []string{"user.b=value-user.b", "user.empty="}) {
			t.Errorf("EachXattr from user.b = %v", from)
		}
		return nil
	})
	update(t, s, func(tx *Tx) error {
		if err := tx.RemoveXattr(fileID, "user.b"); err != nil {
			return err
		}
		if err := tx.RemoveXattr(fileID, "user.b"); !errors.Is(err, fserr.ErrNoAttr) {
			t.Errorf("second RemoveXattr = %v", err)
		}
		names, _ := tx.Xattrs(fileID)
		if !slices.Equal(names, []string{"user.a", "user.empty"}) {
			t.Errorf("Xattrs after remove (buffered) = %v", names)
		}
		return nil
	})

	// Counters and system records survive a reopen.
	update(t, s, func(tx *Tx) error {
		for want := uint64(1); want <= 3; want++ {
			if n, err := tx.NextCounter(7); err != nil || n != want {
				t.Errorf("NextCounter = %d, %v, want %d", n, err, want)
			}
		}
		if err := tx.SetCounterFloor(8, 100); err != nil {
			return err
		}
		if err := tx.SetCounterFloor(7, 2); err != nil { // lower: no effect
			return err
		}
		for _, k := range []string{"orphan/2", "orphan/1", "other"} {
			if err := tx.PutSys(k, nil); err != nil {
				return err
			}
		}
		if err := tx.DeleteSys("orphan/2"); err != nil {
			return err
		}
		if keys, _ := tx.SysKeys("orphan/"); !slices.Equal(keys, []string{"orphan/1"}) {
			t.Errorf("SysKeys (buffered) = %v", keys)
		}
		return tx.PutSys("epoch", []byte{1, 2, 3})
	})
	view(t, s, func(tx *Tx) error {
		if keys, _ := tx.SysKeys(""); !slices.Equal(keys, []string{"epoch", "orphan/1", "other"}) {
			t.Errorf("SysKeys = %v", keys)
		}
		return nil
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(*Tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Update after Close = %v", err)
	}
	s = openT(t, dir, Options{})
	update(t, s, func(tx *Tx) error {
		if n, _ := tx.NextCounter(7); n != 4 {
			t.Errorf("NextCounter(7) after reopen = %d, want 4", n)
		}
		if n, _ := tx.NextCounter(8); n != 100 {
			t.Errorf("NextCounter(8) = %d, want 100", n)
		}
		if v, err := tx.Sys("epoch"); err != nil || !bytes.Equal(v, []byte{1, 2, 3}) {
			t.Errorf("Sys = %v, %v", v, err)
		}
		if _, err := tx.Sys("nothing"); !errors.Is(err, fserr.ErrNotExist) {
			t.Errorf("Sys(missing) = %v", err)
		}
		if n := tx.ObjectCount(); n != 2 {
			t.Errorf("ObjectCount after reopen = %d", n)
		}
		return nil
	})
}

func entryNames(es []*wire.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name)
	}
	return out
}

func indexRefs(t *testing.T, s *Store, h [32]byte) (uint32, bool) {
	t.Helper()
	var refs uint32
	var ok bool
	view(t, s, func(tx *Tx) error {
		_, refs, ok = tx.blockLoc(h[:])
		return nil
	})
	return refs, ok
}

func TestBlocksRefcountDedup(t *testing.T) {
	s := openT(t, t.TempDir(), Options{})
	data := randBlock(t, 64<<10)
	h1, err := s.PutBlock(data)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := s.PutBlock(bytes.Clone(data))
	if err != nil || h2 != h1 {
		t.Fatalf("second PutBlock = %x, %v", h2, err)
	}
	u, _ := s.Usage()
	if u.SegmentBytes != int64(len(data)) || u.PendingBlocks != 1 || u.LiveBytes != 0 {
		t.Fatalf("usage after dedup put = %+v", u)
	}
	if !s.HasBlock(h1) {
		t.Fatal("pending block not found")
	}
	if got, err := s.ReadBlock(h1); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadBlock pending: %v", err)
	}
	if _, err := s.PutBlock(make([]byte, MaxBlockSize+1)); !errors.Is(err, fserr.ErrInvalid) {
		t.Fatalf("oversized PutBlock err = %v", err)
	}

	other := oid.Make(3, 3)
	update(t, s, func(tx *Tx) error {
		if err := tx.SetBlock(fileID, 0, h1); err != nil {
			return err
		}
		if err := tx.SetBlock(fileID, 0, h1); err != nil { // idempotent
			return err
		}
		if err := tx.SetBlock(fileID, 5, h1); err != nil {
			return err
		}
		return tx.SetBlock(other, 0, h1)
	})
	if refs, ok := indexRefs(t, s, h1); !ok || refs != 3 {
		t.Fatalf("refs = %d, %v; want 3", refs, ok)
	}
	u, _ = s.Usage()
	if u.LiveBytes != int64(len(data)) || u.PendingBlocks != 0 {
		t.Fatalf("usage after SetBlock = %+v", u)
	}
	// A second PutBlock of indexed data writes nothing.
	if _, err := s.PutBlock(data); err != nil {
		t.Fatal(err)
	}
	if u2, _ := s.Usage(); u2.SegmentBytes != u.SegmentBytes {
		t.Fatalf("indexed block rewritten: %d → %d", u.SegmentBytes, u2.SegmentBytes)
	}

	var zero [32]byte
	if err := s.Update(context.Background(), func(tx *Tx) error { return tx.SetBlock(fileID, 1, zero) }); !errors.Is(err, fserr.ErrInvalid) ||
		!strings.Contains(err.Error(), "unknown block") {
		t.Fatalf("SetBlock(unknown) = %v", err)
	}

	view(t, s, func(tx *Tx) error {
		refs, err := tx.Blocks(fileID, 0, 10)
		if err != nil {
			return err
		}
		if len(refs) != 2 || refs[0].Index != 0 || refs[1].Index != 5 || refs[1].Hash != h1 || refs[1].Len != uint32(len(data)) {
			t.Errorf("Blocks = %+v", refs)
		}
		if refs, _ := tx.Blocks(fileID, 1, 4); len(refs) != 0 {
			t.Errorf("Blocks(1,4) = %+v", refs)
		}
		if h, ok, err := tx.Block(fileID, 5); !ok || err != nil || h != h1 {
			t.Errorf("Block(5) = %x %v %v", h, ok, err)
		}
		if _, ok, _ := tx.Block(fileID, 3); ok {
			t.Error("hole reported present")
		}
		return nil
	})

	// Replace block 5 with new data: old refcount drops.
	data2 := randBlock(t, 1000)
	h3, _ := s.PutBlock(data2)
	update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, 5, h3) })
	if refs, _ := indexRefs(t, s, h1); refs != 2 {
		t.Fatalf("refs after replace = %d, want 2", refs)
	}
	update(t, s, func(tx *Tx) error { return tx.ClearBlock(fileID, 0) })
	update(t, s, func(tx *Tx) error { return tx.TruncateBlocks(fileID, 0) })
	if refs, ok := indexRefs(t, s, h1); !ok || refs != 1 {
		t.Fatalf("refs = %d %v, want 1", refs, ok)
	}
	if _, ok := indexRefs(t, s, h3); ok {
		t.Fatal("h3 not freed by TruncateBlocks")
	}
	update(t, s, func(tx *Tx) error { return tx.ClearBlock(other, 0) })
	if _, ok := indexRefs(t, s, h1); ok {
		t.Fatal("block not freed at refcount 0")
	}
	if s.HasBlock(h1) {
		// PutBlock above left it pending (indexed path); that is allowed
		// until it expires, but its bytes are still readable.
		if got, err := s.ReadBlock(h1); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("pending re-put not readable: %v", err)
		}
	}
	u, _ = s.Usage()
	if u.LiveBytes != 0 {
		t.Fatalf("live bytes after freeing everything = %d", u.LiveBytes)
	}
}

// TestFreedBlockReput checks that data put while indexed, then freed by
// someone else, can still be referenced.
func TestFreedBlockReput(t *testing.T) {
	s := openT(t, t.TempDir(), Options{NoSync: true})
	data := randBlock(t, 4096)
	h, _ := s.PutBlock(data)
	update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, 0, h) })
	if _, err := s.PutBlock(data); err != nil { // indexed: nothing written
		t.Fatal(err)
	}
	update(t, s, func(tx *Tx) error { return tx.ClearBlock(fileID, 0) }) // freed
	update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, 1, h) })
	if got, err := s.ReadBlock(h); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadBlock: %v", err)
	}
}

// TestRetainKeepsAFreedBlock: a block held with Retain can be set again
// after its last reference is dropped, in the same update or a later one,
// as one that was put again can (TestFreedBlockReput).
func TestRetainKeepsAFreedBlock(t *testing.T) {
	s := openT(t, t.TempDir(), Options{NoSync: true})
	data := randBlock(t, 4096)
	h, _ := s.PutBlock(data)
	if s.Retain(sha256.Sum256([]byte("never stored"))) {
		t.Fatal("Retain of a block never stored reports it held")
	}
	update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, 0, h) })
	if !s.Retain(h) {
		t.Fatal("Retain of an indexed block reports it missing")
	}
	update(t, s, func(tx *Tx) error {
		if err := tx.ClearBlock(fileID, 0); err != nil { // its last reference
			return err
		}
		return tx.SetBlock(dirID, 0, h)
	})
	if got, err := s.ReadBlock(h); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadBlock after it was freed and set again: %v", err)
	}
}

func TestDeleteObject(t *testing.T) {
	s := openT(t, t.TempDir(), Options{NoSync: true})
	var hs [][32]byte
	for i := 0; i < 4; i++ {
		h, _ := s.PutBlock(randBlock(t, 8192))
		hs = append(hs, h)
	}
	shared := hs[0]
	update(t, s, func(tx *Tx) error {
		for _, id := range []oid.ID{dirID, fileID, oid.Make(3, 3)} {
			if err := tx.PutMeta(&wire.Meta{Id: uint64(id)}); err != nil {
				return err
			}
		}
		for i, h := range hs {
			if err := tx.SetBlock(fileID, uint64(i), h); err != nil {
				return err
			}
		}
		if err := tx.SetBlock(oid.Make(3, 3), 0, shared); err != nil {
			return err
		}
		if err := tx.SetXattr(fileID, "user.x", []byte("1")); err != nil {
			return err
		}
		return tx.PutEntry(dirID, &wire.Entry{Name: "f", Id: uint64(fileID)})
	})
	err := s.Update(context.Background(), func(tx *Tx) error { return tx.DeleteObject(dirID) })
	if !errors.Is(err, fserr.ErrNotEmpty) {
		t.Fatalf("DeleteObject(non-empty dir) = %v", err)
	}
	update(t, s, func(tx *Tx) error {
		if err := tx.DeleteObject(fileID); err != nil {
			return err
		}
		if tx.ObjectCount() != 2 {
			t.Errorf("ObjectCount in tx = %d", tx.ObjectCount())
		}
		return tx.DeleteEntry(dirID, "f")
	})
	update(t, s, func(tx *Tx) error { return tx.DeleteObject(dirID) })
	view(t, s, func(tx *Tx) error {
		if _, err := tx.Meta(fileID); !errors.Is(err, fserr.ErrNotExist) {
			t.Errorf("meta survived: %v", err)
		}
		if names, _ := tx.Xattrs(fileID); len(names) != 0 {
			t.Errorf("xattrs survived: %v", names)
		}
		if refs, _ := tx.Blocks(fileID, 0, 100); len(refs) != 0 {
			t.Errorf("block map survived: %v", refs)
		}
		if tx.ObjectCount() != 1 {
			t.Errorf("ObjectCount = %d", tx.ObjectCount())
		}
		return nil
	})
	if refs, ok := indexRefs(t, s, shared); !ok || refs != 1 {
		t.Fatalf("shared block refs = %d %v, want 1", refs, ok)
	}
	for _, h := range hs[1:] {
		if _, ok := indexRefs(t, s, h); ok {
			t.Fatalf("block %x still indexed", h[:4])
		}
	}
	if err := s.Update(context.Background(), func(tx *Tx) error { return tx.DeleteObject(fileID) }); !errors.Is(err, fserr.ErrNotExist) {
		t.Fatalf("DeleteObject(gone) = %v", err)
	}
}

// holdCommitter blocks the committer inside an Update until release is
// called, so that requests queued meanwhile form one batch.
func holdCommitter(t *testing.T, s *Store) (release func()) {
	started := make(chan struct{})
	gate := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- s.Update(context.Background(), func(*Tx) error {
			close(started)
			<-gate
			return nil
		})
	}()
	<-started
	return func() {
		close(gate)
		if err := <-done; err != nil {
			t.Errorf("holder: %v", err)
		}
	}
}

func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.qmu.Lock()
		q := len(s.queue)
		s.qmu.Unlock()
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBatchIsolation: a failing function in a batch rolls back only its own
// writes, and later functions see earlier successful ones.
func TestBatchIsolation(t *testing.T) {
	s := openT(t, t.TempDir(), Options{})
	ctx := context.Background()
	release := holdCommitter(t, s)
	batchesBefore := s.batches.Load()

	errBoom := errors.New("boom")
	type result struct {
		name string
		err  error
	}
	results := make(chan result, 3)
	run := func(name string, fn func(*Tx) error) {
		go func() { results <- result{name, s.Update(ctx, fn)} }()
	}
	run("A", func(tx *Tx) error {
		if err := tx.PutSys("x", []byte("A")); err != nil {
			return err
		}
		return tx.PutEntry(dirID, &wire.Entry{Name: "a", Id: 1})
	})
	waitQueued(t, s, 1)
	run("B", func(tx *Tx) error {
		if err := tx.PutSys("x", []byte("B")); err != nil {
			return err
		}
		if err := tx.PutSys("y", []byte("B")); err != nil {
			return err
		}
		if err := tx.DeleteEntry(dirID, "a"); err != nil {
			t.Errorf("B: A's entry not visible: %v", err)
		}
		return errBoom
	})
	waitQueued(t, s, 2)
	run("C", func(tx *Tx) error {
		if v, err := tx.Sys("x"); err != nil || string(v) != "A" {
			t.Errorf("C sees x = %q, %v; want A", v, err)
		}
		if _, err := tx.Sys("y"); err == nil {
			t.Error("C sees the failed function's write")
		}
		es, _ := tx.Entries(dirID, "", 0)
		if len(es) != 1 || es[0].Name != "a" {
			t.Errorf("C sees entries %v", entryNames(es))
		}
		return tx.PutSys("z", []byte("C"))
	})
	waitQueued(t, s, 3)
	release()
	for range 3 {
		r := <-results
		switch {
		case r.name == "B" && !errors.Is(r.err, errBoom):
			t.Errorf("B = %v, want boom", r.err)
		case r.name != "B" && r.err != nil:
			t.Errorf("%s = %v", r.name, r.err)
		}
	}
	if got := s.batches.Load() - batchesBefore; got != 2 { // holder's batch + A,B,C
		t.Errorf("%d batches, want 2", got)
	}
	view(t, s, func(tx *Tx) error {
		x, _ := tx.Sys("x")
		z, _ := tx.Sys("z")
		_, errY := tx.Sys("y")
		if string(x) != "A" || string(z) != "C" || errY == nil {
			t.Errorf("x=%q z=%q y err=%v", x, z, errY)
		}
		return nil
	})

	// Many goroutines: every odd one fails; the even ones all land.
	const n = 200
	var wg sync.WaitGroup
	var failed atomic.Int32
	batchesBefore = s.batches.Load()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Update(ctx, func(tx *Tx) error {
				id := oid.Make(4, uint64(i+1))
				if err := tx.PutMeta(&wire.Meta{Id: uint64(id), Size: uint64(i)}); err != nil {
					return err
				}
				if err := tx.PutEntry(dirID, &wire.Entry{Name: fmt.Sprintf("n%03d", i), Id: uint64(id)}); err != nil {
					return err
				}
				if i%2 == 1 {
					return errBoom
				}
				return nil
			})
			if (err != nil) != (i%2 == 1) {
				t.Errorf("update %d: %v", i, err)
			}
			if err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != n/2 {
		t.Errorf("%d failed, want %d", failed.Load(), n/2)
	}
	t.Logf("%d updates in %d batches", n, s.batches.Load()-batchesBefore)
	view(t, s, func(tx *Tx) error {
		for i := range n {
			_, err := tx.Meta(oid.Make(4, uint64(i+1)))
			_, errE := tx.Entry(dirID, fmt.Sprintf("n%03d", i))
			if want := i%2 == 0; (err == nil) != want || (errE == nil) != want {
				t.Errorf("object %d: meta err %v, entry err %v", i, err, errE)
			}
		}
		return nil
	})
}

func TestUpdateContextAndPanic(t *testing.T) {
	s := openT(t, t.TempDir(), Options{NoSync: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := s.Update(ctx, func(*Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("cancelled Update = %v, ran %v", err, ran)
	}
	// Cancelled while queued behind a long commit: fn never runs.
	release := holdCommitter(t, s)
	ctx, cancel = context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		errc <- s.Update(ctx, func(tx *Tx) error { ran = true; return tx.PutSys("k", []byte("v")) })
	}()
	waitQueued(t, s, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued cancelled Update = %v", err)
	}
	release()
	update(t, s, func(tx *Tx) error {
		if _, err := tx.Sys("k"); err == nil || ran {
			t.Error("cancelled function ran")
		}
		return nil
	})

	func() {
		defer func() {
			if p := recover(); p != "kaboom" {
				t.Errorf("recovered %v", p)
			}
		}()
		_ = s.Update(context.Background(), func(tx *Tx) error {
			_ = tx.PutSys("p", []byte("x"))
			panic("kaboom")
		})
	}()
	view(t, s, func(tx *Tx) error {
		if _, err := tx.Sys("p"); err == nil {
			t.Error("panicking function's write committed")
		}
		return nil
	})
}

// crashCopy copies s's files to dst as a crash would leave them (the store
// stays open; what is on disk is all a restarted process gets). No
// checkpoint runs meanwhile, and the log is copied before the segments, so
// that every block a copied record references is in the copy even while
// updates go on. It returns how much of each segment was known durable
// (fdatasynced) once the log had been copied: a power failure may lose
// the rest (see loseUnsynced).
func crashCopy(t *testing.T, s *Store, dst string) (synced map[uint32]int64) {
	t.Helper()
	s.ckMu.Lock()
	defer s.ckMu.Unlock()
	if err := os.MkdirAll(filepath.Join(dst, blocksDir), 0o755); err != nil {
		t.Fatal(err)
	}
	copyAll := func(dir string, keep func(string) bool) {
		ents, err := os.ReadDir(filepath.Join(s.dir, dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if name := filepath.Join(dir, e.Name()); keep(e.Name()) {
				copyFile(t, filepath.Join(s.dir, name), filepath.Join(dst, name))
			}
		}
	}
	copyAll(".", func(n string) bool { return strings.HasPrefix(n, walPrefix) })
	copyAll(".", func(n string) bool { return n == metaFile })
	synced = map[uint32]int64{}
	s.segMu.RLock()
	for id, seg := range s.segs {
		synced[id] = seg.synced.Load()
	}
	s.segMu.RUnlock()
	copyAll(blocksDir, func(string) bool { return true }) // listed after the log was copied
	return synced
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestDurabilityAfterCrash(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentSize: 1 << 20})
	ctx := context.Background()
	type obj struct {
		id   oid.ID
		name string
		data []byte
		hash [32]byte
	}
	var (
		mu    sync.Mutex
		acked []obj
		wg    sync.WaitGroup
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				o := obj{id: oid.Make(5, uint64(w*1000+i+1)), name: fmt.Sprintf("w%d-%d", w, i), data: randBlock(t, 16<<10+i)}
				h, err := s.PutBlock(o.data)
				if err != nil {
					t.Error(err)
					return
				}
				o.hash = h
				err = s.Update(ctx, func(tx *Tx) error {
					if err := tx.PutMeta(&wire.Meta{Id: uint64(o.id), Size: uint64(len(o.data))}); err != nil {
						return err
					}
					if err := tx.SetBlock(o.id, 0, h); err != nil {
						return err
					}
					return tx.PutEntry(dirID, &wire.Entry{Name: o.name, Id: uint64(o.id)})
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked = append(acked, o)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Unacknowledged garbage at the tail (a block nobody committed).
	if _, err := s.PutBlock(randBlock(t, 5000)); err != nil {
		t.Fatal(err)
	}

	crash := t.TempDir()
	crashCopy(t, s, crash)
	s2 := openT(t, crash, Options{SegmentSize: 1 << 20})
	view(t, s2, func(tx *Tx) error {
		for _, o := range acked {
			m, err := tx.Meta(o.id)
			if err != nil || m.Size != uint64(len(o.data)) {
				t.Errorf("%s: meta %v %v", o.name, m, err)
			}
			if e, err := tx.Entry(dirID, o.name); err != nil || e.Id != uint64(o.id) {
				t.Errorf("%s: entry %v %v", o.name, e, err)
			}
			if h, ok, _ := tx.Block(o.id, 0); !ok || h != o.hash {
				t.Errorf("%s: block map lost", o.name)
			}
		}
		if tx.ObjectCount() != len(acked) {
			t.Errorf("ObjectCount = %d, want %d", tx.ObjectCount(), len(acked))
		}
		return nil
	})
	for _, o := range acked {
		if got, err := s2.ReadBlock(o.hash); err != nil || !bytes.Equal(got, o.data) {
			t.Fatalf("%s: ReadBlock after crash: %v", o.name, err)
		}
	}
}

func TestRecoveryTruncatesTail(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	committed := randBlock(t, 10000)
	h, _ := s.PutBlock(committed)
	update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, 0, h) })
	lost := randBlock(t, 7777)
	hl, _ := s.PutBlock(lost)

	crash := t.TempDir()
	crashCopy(t, s, crash)
	seg := filepath.Join(crash, blocksDir, segName(1))
	if st, _ := os.Stat(seg); st.Size() != 10000+7777 {
		t.Fatalf("segment before recovery = %d bytes", st.Size())
	}
	s2 := openT(t, crash, Options{})
	if st, _ := os.Stat(seg); st.Size() != 10000 {
		t.Fatalf("segment after recovery = %d bytes, want 10000", st.Size())
	}
	if s2.HasBlock(hl) {
		t.Fatal("unacknowledged pending block survived restart")
	}
	if got, err := s2.ReadBlock(h); err != nil || !bytes.Equal(got, committed) {
		t.Fatalf("committed block: %v", err)
	}
	update(t, s2, func(tx *Tx) error {
		if err := tx.SetBlock(fileID, 1, hl); !errors.Is(err, fserr.ErrInvalid) {
			t.Errorf("SetBlock(forgotten) = %v", err)
		}
		return nil
	})
	// New writes append right after the committed data.
	h3, _ := s2.PutBlock(lost)
	update(t, s2, func(tx *Tx) error { return tx.SetBlock(fileID, 1, h3) })
	if got, err := s2.ReadBlock(h3); err != nil || !bytes.Equal(got, lost) {
		t.Fatalf("rewritten block: %v", err)
	}
}

func TestPendingExpiry(t *testing.T) {
	s := openT(t, t.TempDir(), Options{NoSync: true})
	s.pendMu.Lock()
	s.pendingTTL = 20 * time.Millisecond
	s.pendMu.Unlock()
	h, _ := s.PutBlock([]byte("short-lived"))
	time.Sleep(50 * time.Millisecond)
	_, _ = s.PutBlock([]byte("trigger a sweep"))
	if s.HasBlock(h) {
		t.Fatal("expired pending block still present")
	}
	err := s.Update(context.Background(), func(tx *Tx) error { return tx.SetBlock(fileID, 0, h) })
	if !errors.Is(err, fserr.ErrInvalid) {
		t.Fatalf("SetBlock(expired) = %v", err)
	}
}

func TestLockExclusive(t *testing.T) {
	dir := t.TempDir()
	openT(t, dir, Options{NoSync: true})
	_, err := Open(dir, Options{NoSync: true})
	if err == nil || !strings.Contains(err.Error(), dir) || !errors.Is(err, fserr.ErrBusy) {
		t.Fatalf("second Open = %v", err)
	}
}

func TestReadBlockDetectsCorruption(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{})
	a, b := randBlock(t, 4096), randBlock(t, 4096)
	ha, _ := s.PutBlock(a)
	hb, _ := s.PutBlock(b)
	update(t, s, func(tx *Tx) error {
		if err := tx.SetBlock(fileID, 0, ha); err != nil {
			return err
		}
		return tx.SetBlock(fileID, 1, hb)
	})
	f, err := os.OpenFile(filepath.Join(dir, blocksDir, segName(1)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var one [1]byte
	f.ReadAt(one[:], 4096+100) // inside b
	one[0] ^= 0x40
	if _, err := f.WriteAt(one[:], 4096+100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.ReadBlock(hb); !errors.Is(err, fserr.ErrIO) {
		t.Fatalf("ReadBlock(corrupt) = %v, want ErrIO", err)
	}
	if got, err := s.ReadBlock(ha); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("ReadBlock(intact) = %v", err)
	}
	var missing [32]byte
	if _, err := s.ReadBlock(missing); !errors.Is(err, fserr.ErrNotExist) {
		t.Fatalf("ReadBlock(missing) = %v", err)
	}
}

func TestCompact(t *testing.T) {
	dir := t.TempDir()
	const bs = 32 << 10
	o := Options{SegmentSize: 8 * bs}
	s := openT(t, dir, o)
	ctx := context.Background()

	// 64 blocks over 8 segments; keep every 4th. A pending block goes
	// into the last of them, which will be compacted: it must move.
	datas := map[uint64][]byte{}
	update(t, s, func(tx *Tx) error { return nil })
	pendData := randBlock(t, 1000)
	var hp [32]byte
	for i := range uint64(64) {
		if i == 60 {
			hp, _ = s.PutBlock(pendData)
		}
		d := randBlock(t, bs)
		h, err := s.PutBlock(d)
		if err != nil {
			t.Fatal(err)
		}
		datas[i] = d
		update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, i, h) })
	}
	// A second file sharing a kept block.
	update(t, s, func(tx *Tx) error {
		h, _, _ := tx.Block(fileID, 8)
		return tx.SetBlock(oid.Make(3, 3), 0, h)
	})
	update(t, s, func(tx *Tx) error {
		for i := range uint64(64) {
			if i%4 != 0 {
				if err := tx.ClearBlock(fileID, i); err != nil {
					return err
				}
				delete(datas, i)
			}
		}
		return nil
	})
	// Pending blocks are not dead space: their segment (9) stays.
	for range 8 {
		if _, err := s.PutBlock(randBlock(t, bs)); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := s.Usage()

	// Readers and writers run alongside compaction.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				var refs []BlockRef
				_ = s.View(func(tx *Tx) error { refs, _ = tx.Blocks(fileID, 0, 64); return nil })
				for _, r := range refs {
					got, err := s.ReadBlock(r.Hash)
					if err != nil || !bytes.Equal(got, datas[r.Index]) {
						t.Errorf("concurrent read of block %d: %v", r.Index, err)
						return
					}
					reads.Add(1)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := uint64(1); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			h, err := s.PutBlock(randBlock(t, 4096))
			if err == nil {
				err = s.Update(ctx, func(tx *Tx) error { return tx.SetBlock(oid.Make(3, 4), i, h) })
			}
			if err != nil {
				t.Errorf("concurrent writer: %v", err)
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	if err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	after, _ := s.Usage()
	t.Logf("before %+v after %+v, %d concurrent reads", before, after, reads.Load())
	if after.Segments >= before.Segments {
		t.Errorf("segments %d → %d", before.Segments, after.Segments)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, blocksDir)); len(ents) != after.Segments {
		t.Errorf("%d segment files, Usage says %d", len(ents), after.Segments)
	}
	for id := uint32(1); id <= 8; id++ { // >50 % dead
		if _, err := os.Stat(filepath.Join(dir, blocksDir, segName(id))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("segment %d not deleted: %v", id, err)
		}
	}

	check := func(s *Store) {
		t.Helper()
		for i, d := range datas {
			var h [32]byte
			view(t, s, func(tx *Tx) error { h, _, _ = tx.Block(fileID, i); return nil })
			if got, err := s.ReadBlock(h); err != nil || !bytes.Equal(got, d) {
				t.Fatalf("block %d after compaction: %v", i, err)
			}
		}
	}
	check(s)
	// The relocated pending block can still be referenced.
	update(t, s, func(tx *Tx) error { return tx.SetBlock(oid.Make(3, 5), 0, hp) })
	if got, err := s.ReadBlock(hp); err != nil || !bytes.Equal(got, pendData) {
		t.Fatalf("pending block after compaction: %v", err)
	}
	// Compacting again is a no-op-or-progress, never an error.
	if err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, o)
	check(s)
	if got, err := s.ReadBlock(hp); err != nil || !bytes.Equal(got, pendData) {
		t.Fatalf("pending block after reopen: %v", err)
	}
	if u, _ := s.Usage(); u.LiveBytes != after.LiveBytes+int64(len(pendData)) {
		t.Errorf("live bytes after reopen: %+v", u)
	}
}

func TestEncodingIsProto(t *testing.T) {
	s := openT(t, t.TempDir(), Options{NoSync: true})
	m := &wire.Meta{Id: uint64(fileID), Target: "x", Cues: &wire.Cues{Site: "s"}}
	update(t, s, func(tx *Tx) error { return tx.PutMeta(m) })
	view(t, s, func(tx *Tx) error {
		k := idKey(fileID)
		v, _ := tx.get(bObjects, k[:])
		var got wire.Meta
		if err := proto.Unmarshal(v, &got); err != nil || !proto.Equal(&got, m) {
			t.Errorf("stored %v, %v", &got, err)
		}
		return nil
	})
}

// TestLargeFunction exercises the indexed overlay (many buffered writes).
func TestLargeFunction(t *testing.T) {
	s := openT(t, t.TempDir(), Options{NoSync: true})
	const n = 500
	var hs [][32]byte
	for i := range n {
		h, _ := s.PutBlock([]byte(fmt.Sprint("block", i%50)))
		hs = append(hs, h)
	}
	update(t, s, func(tx *Tx) error {
		for i, h := range hs {
			if err := tx.SetBlock(fileID, uint64(i), h); err != nil {
				return err
			}
		}
		refs, err := tx.Blocks(fileID, 100, 50)
		if err != nil || len(refs) != 50 || refs[0].Index != 100 {
			t.Errorf("Blocks in tx = %d refs, %v", len(refs), err)
		}
		return tx.TruncateBlocks(fileID, 250)
	})
	if refs, _ := indexRefs(t, s, hs[0]); refs != 5 {
		t.Fatalf("refs = %d, want 5", refs)
	}
	view(t, s, func(tx *Tx) error {
		refs, _ := tx.Blocks(fileID, 0, 1000)
		if len(refs) != 250 {
			t.Errorf("%d blocks, want 250", len(refs))
		}
		return nil
	})
	// Random order entries in one function, read back sorted within it.
	update(t, s, func(tx *Tx) error {
		var want []string
		for range 100 {
			r, _ := rand.Int(rand.Reader, big.NewInt(1e9))
			name := fmt.Sprintf("e%09d", r.Int64())
			want = append(want, name)
			if err := tx.PutEntry(dirID, &wire.Entry{Name: name, Id: 1}); err != nil {
				return err
			}
		}
		slices.Sort(want)
		want = slices.Compact(want)
		es, _ := tx.Entries(dirID, "", 0)
		if got := entryNames(es); !slices.Equal(got, want) {
			t.Errorf("buffered Entries unsorted or wrong: %d vs %d", len(got), len(want))
		}
		return nil
	})
}

func TestCompactActiveSegment(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{SegmentSize: 1 << 20})
	var keep []byte
	var hk [32]byte
	for i := range uint64(8) {
		d := randBlock(t, 64<<10)
		h, _ := s.PutBlock(d)
		update(t, s, func(tx *Tx) error { return tx.SetBlock(fileID, i, h) })
		if i == 3 {
			keep, hk = d, h
		}
	}
	update(t, s, func(tx *Tx) error {
		for i := range uint64(8) {
			if i != 3 {
				if err := tx.ClearBlock(fileID, i); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err := s.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	u, _ := s.Usage()
	// Left: the kept block in the compaction target, and a new, empty
	// active segment.
	if u.SegmentBytes != int64(len(keep)) || u.LiveBytes != int64(len(keep)) || u.Segments != 2 {
		t.Fatalf("after compacting the active segment: %+v", u)
	}
	if got, err := s.ReadBlock(hk); err != nil || !bytes.Equal(got, keep) {
		t.Fatalf("kept block: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, blocksDir, segName(1))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("old active segment not deleted: %v", err)
	}
}

// TestCompactStress churns shared (deduplicated) blocks from several
// writers while Compact runs repeatedly, then checks that every referenced
// block is readable and that the space accounting matches the index.
func TestCompactStress(t *testing.T) {
	dir := t.TempDir()
	o := Options{SegmentSize: 128 << 10, NoSync: true}
	s := openT(t, dir, o)
	ctx := context.Background()
	const contents = 24
	datas := make([][]byte, contents)
	byHash := map[[32]byte][]byte{}
	for i := range datas {
		datas[i] = randBlock(t, 8<<10+i*512)
		byHash[sha256Sum(datas[i])] = datas[i]
	}
	s.pendMu.Lock()
	s.pendingTTL = 5 * time.Millisecond // freed blocks get rewritten
	s.pendMu.Unlock()
	var hashMu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			file := oid.Make(6, uint64(w+1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, _ := rand.Int(rand.Reader, big.NewInt(contents))
				slot := uint64(i % 16)
				data := datas[k.Int64()]
				if i%3 == 0 { // fresh content
					data = randBlock(t, 4<<10)
					hashMu.Lock()
					byHash[sha256Sum(data)] = data
					hashMu.Unlock()
				}
				// The 5 ms lease can run out between PutBlock and the
				// Update on a busy machine: put the block again.
				var h [32]byte
				var err error
				for try := 0; try == 0 || (try < 10 && errors.Is(err, fserr.ErrInvalid)); try++ {
					if h, err = s.PutBlock(data); err != nil {
						t.Error(err)
						return
					}
					err = s.Update(ctx, func(tx *Tx) error {
						if i%5 == 4 {
							return tx.ClearBlock(file, slot)
						}
						return tx.SetBlock(file, slot, h)
					})
				}
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				if i%7 == 0 && i%5 != 4 { // only a referenced block must stay readable
					if got, err := s.ReadBlock(h); err != nil || !bytes.Equal(got, data) {
						t.Errorf("writer %d read: %v", w, err)
						return
					}
				}
			}
		}()
	}
	for range 30 {
		if err := s.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if err := s.Compact(ctx); err != nil {
		t.Fatal(err)
	}

	verify := func(s *Store) {
		t.Helper()
		perSeg := map[uint32]int64{}
		view(t, s, func(tx *Tx) error {
			for w := range 4 {
				refs, err := tx.Blocks(oid.Make(6, uint64(w+1)), 0, 16)
				if err != nil {
					return err
				}
				for _, r := range refs {
					got, err := s.ReadBlock(r.Hash)
					if err != nil || !bytes.Equal(got, byHash[r.Hash]) {
						t.Errorf("file %d block %d: %v", w, r.Index, err)
					}
				}
			}
			tx.scan(bBlockidx, nil, 0, func(k, v []byte) bool {
				l, _, _ := getIdx(v)
				perSeg[l.seg] += int64(l.n)
				return true
			})
			return nil
		})
		s.segMu.RLock()
		defer s.segMu.RUnlock()
		for id, n := range perSeg {
			if s.live[id] != n {
				t.Errorf("segment %d: live accounting %d, index says %d", id, s.live[id], n)
			}
			if s.segs[id] == nil {
				t.Errorf("index references deleted segment %d", id)
			}
		}
	}
	verify(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	verify(openT(t, dir, o))
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }

// TestCrashKill runs a writer in a child process, SIGKILLs it mid-stream and
// checks that every write it acknowledged is there after reopening (and that
// the dead process's lock does not block the restart).
func TestCrashKill(t *testing.T) {
	if dir := os.Getenv("WHEELFS_STORE_CRASH_DIR"); dir != "" {
		crashChild(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashKill$")
	cmd.Env = append(os.Environ(), "WHEELFS_STORE_CRASH_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	acked := -1
	for sc.Scan() {
		var n int
		if _, err := fmt.Sscanf(sc.Text(), "ack %d", &n); err == nil {
			acked = n
			if n == 150 {
				_ = cmd.Process.Kill()
			}
		}
	}
	_ = cmd.Wait()
	if acked < 150 {
		t.Fatalf("child acknowledged only %d writes", acked)
	}
	s := openT(t, dir, Options{SegmentSize: 256 << 10})
	for i := 0; i <= acked; i++ {
		id := oid.Make(7, uint64(i+1))
		var h [32]byte
		view(t, s, func(tx *Tx) error {
			if _, err := tx.Entry(dirID, fmt.Sprint("c", i)); err != nil {
				t.Errorf("write %d: entry: %v", i, err)
			}
			var ok bool
			h, ok, _ = tx.Block(id, 0)
			if !ok {
				t.Errorf("write %d: block map lost", i)
			}
			return nil
		})
		got, err := s.ReadBlock(h)
		if err != nil || !bytes.Equal(got, crashData(i)) {
			t.Fatalf("write %d: block: %v", i, err)
		}
	}
	t.Logf("%d acknowledged writes survived SIGKILL", acked+1)
}

func crashData(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("crash block %d|", i)), 2000)
}

func crashChild(dir string) {
	s, err := Open(dir, Options{SegmentSize: 256 << 10})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	for i := 0; ; i++ {
		id := oid.Make(7, uint64(i+1))
		h, err := s.PutBlock(crashData(i))
		if err == nil {
			_, err = s.PutBlock(crashData(i + 1_000_000)) // never referenced
		}
		if err == nil {
			err = s.Update(context.Background(), func(tx *Tx) error {
				if err := tx.PutMeta(&wire.Meta{Id: uint64(id)}); err != nil {
					return err
				}
				if err := tx.SetBlock(id, 0, h); err != nil {
					return err
				}
				return tx.PutEntry(dirID, &wire.Entry{Name: fmt.Sprint("c", i), Id: uint64(id)})
			})
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Printf("ack %d\n", i) // stdout is unbuffered
	}
}

// TestReadBlocksCoalesces checks the batched read: neighbours, blocks from
// other places, a duplicate, and corruption caught by the CRC.
func TestReadBlocksCoalesces(t *testing.T) {
	s, err := Open(t.TempDir(), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hs, want := putBlocks(t, s, 5, func(i int) []byte { return bytes.Repeat([]byte{byte(i + 1)}, 1000+i) })
	order := []int{0, 1, 2, 4, 3, 3}
	var ask [][32]byte
	for _, i := range order {
		ask = append(ask, hs[i])
	}
	got, err := s.ReadBlocks(ask)
	if err != nil {
		t.Fatal(err)
	}
	for k, i := range order {
		if !bytes.Equal(got[k], want[i]) {
			t.Fatalf("block %d (of %d) differs", k, i)
		}
	}
	if _, err := s.ReadBlocks([][32]byte{{9}}); err == nil {
		t.Fatal("unknown block read without error")
	}
}

// putBlocks stores n blocks, block(i) for each i, and returns their hashes
// and contents.
func putBlocks(t *testing.T, s *Store, n int, block func(i int) []byte) (hs [][32]byte, data [][]byte) {
	t.Helper()
	for i := range n {
		b := block(i)
		h, err := s.PutBlock(b)
		if err != nil {
			t.Fatal(err)
		}
		hs, data = append(hs, h), append(data, b)
	}
	return hs, data
}

// TestReadBlocksInto checks the read into the caller's buffer: blocks back
// to back in the order asked (neighbours, a block from elsewhere, a
// duplicate), a buffer of the wrong length refused, and bit rot caught by
// the CRC.
func TestReadBlocksInto(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{NoSync: true})
	hs, want := putBlocks(t, s, 5, func(i int) []byte { return randBlock(t, 1000+i) })
	order := []int{0, 1, 2, 4, 3, 3}
	var ask [][32]byte
	var expect []byte
	for _, i := range order {
		ask = append(ask, hs[i])
		expect = append(expect, want[i]...)
	}
	buf := make([]byte, len(expect))
	if err := s.ReadBlocksInto(ask, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, expect) {
		t.Fatal("blocks read into the buffer differ")
	}
	if err := s.ReadBlocksInto(ask, buf[1:]); !errors.Is(err, fserr.ErrInvalid) {
		t.Fatalf("short buffer: %v, want ErrInvalid", err)
	}
	if err := s.ReadBlocksInto([][32]byte{{9}}, buf); !errors.Is(err, fserr.ErrNotExist) {
		t.Fatalf("unknown block: %v, want ErrNotExist", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, blocksDir, segName(1)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var one [1]byte
	f.ReadAt(one[:], 1000+500) // inside block 1
	one[0] ^= 0x40
	if _, err := f.WriteAt(one[:], 1000+500); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := s.ReadBlocksInto(ask[:3], buf[:3003]); !errors.Is(err, fserr.ErrIO) {
		t.Fatalf("corrupt block: %v, want ErrIO", err)
	}
	if err := s.ReadBlocksInto(ask[3:5], buf[:1004+1003]); err != nil {
		t.Fatalf("intact blocks: %v", err)
	}
}
