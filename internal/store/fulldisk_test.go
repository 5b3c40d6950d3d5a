package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/tmpfs"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestFullDisk fills a small tmpfs under a store: writes fail with
// ENOSPC at once, every failed batch runs its OnAbort functions, nothing
// acknowledged is lost, the store takes writes again once space is freed
// (no restart), and it opens again on a full disk.
func TestFullDisk(t *testing.T) {
	mnt := tmpfs.Mount(t, 64<<20)
	dir := filepath.Join(mnt, "store")
	filler := filepath.Join(mnt, "filler")
	o := Options{SegmentSize: 4 << 20, Reserve: 2 << 20, CompactInterval: -1}
	s, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if s != nil {
			s.Close()
		}
	}()
	ctx := context.Background()

	type obj struct {
		id   oid.ID
		data []byte
	}
	var acked []obj
	aborted := 0
	n := 0
	// write stores one file of one block, as a server's commit does.
	write := func(size int) error {
		n++
		o := obj{id: oid.Make(7, uint64(n)), data: randBlock(t, size)}
		h, err := s.PutBlock(o.data)
		if err != nil {
			return err
		}
		err = s.Update(ctx, func(tx *Tx) error {
			tx.OnAbort(func() { aborted++ })
			if err := tx.PutMeta(&wire.Meta{Id: uint64(o.id), Size: uint64(len(o.data))}); err != nil {
				return err
			}
			if err := tx.SetBlock(o.id, 0, h); err != nil {
				return err
			}
			// A large attribute fills the log too, not only the segments.
			return tx.SetXattr(o.id, "user.pad", bytes.Repeat([]byte{byte(n)}, 48<<10))
		})
		if err == nil {
			acked = append(acked, o)
		}
		return err
	}
	check := func(when string) {
		t.Helper()
		for _, o := range acked {
			var h [32]byte
			var ok bool
			if err := s.View(func(tx *Tx) (err error) { h, ok, err = tx.Block(o.id, 0); return err }); err != nil || !ok {
				t.Fatalf("%s: object %v lost its block: %v", when, o.id, err)
			}
			got, err := s.ReadBlock(h)
			if err != nil || !bytes.Equal(got, o.data) {
				t.Fatalf("%s: object %v: read back %d bytes, %v", when, o.id, len(got), err)
			}
		}
	}
	for range 20 {
		if err := write(64 << 10); err != nil {
			t.Fatalf("write before the disk is full: %v", err)
		}
	}
	tmpfs.Fill(t, filler)

	// Writes now fail with ENOSPC, promptly: the block append, or the log
	// once its preallocated room is used up.
	var failed error
	start := time.Now()
	for i := 0; i < 200 && failed == nil; i++ {
		failed = write(64 << 10)
	}
	if !errors.Is(failed, fserr.ErrNoSpace) {
		t.Fatalf("write to a full disk: %v, want ENOSPC", failed)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the failing write took %v", d)
	}
	// Fill the log's room with meta-data only updates until the log is
	// refused too: a failed commit fails its callers and undoes their
	// OnAbort state, and the store stays usable.
	var logErr error
	for i := 0; i < 200 && logErr == nil; i++ {
		id := oid.Make(8, uint64(i+1))
		logErr = s.Update(ctx, func(tx *Tx) error {
			tx.OnAbort(func() { aborted++ })
			if err := tx.PutMeta(&wire.Meta{Id: uint64(id)}); err != nil {
				return err
			}
			return tx.SetXattr(id, "user.pad", bytes.Repeat([]byte{1}, 60<<10))
		})
	}
	if !errors.Is(logErr, fserr.ErrNoSpace) {
		t.Fatalf("meta-data updates on a full disk: %v, want ENOSPC", logErr)
	}
	if aborted == 0 {
		t.Error("no OnAbort function ran for the updates that failed")
	}
	check("full disk")

	// Space comes back: the next write succeeds without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := write(64 << 10); err != nil {
		t.Fatalf("write after freeing space: %v", err)
	}
	check("space freed")

	// A restart on a full disk comes up with everything: the reserve,
	// topped up at Close, gives the new log its space.
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	tmpfs.Fill(t, filler) // the space of the log files Close deleted too
	if s, err = Open(dir, o); err != nil {
		t.Fatalf("Open on a full disk: %v", err)
	}
	check("reopened on a full disk")
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := write(64 << 10); err != nil {
		t.Fatalf("write after reopening and freeing space: %v", err)
	}
	check("reopened, space freed")

	// Without a reserve it still opens on a full disk, with an empty log
	// that takes writes once there is room.
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, reserveFile)); err != nil {
		t.Fatal(err)
	}
	tmpfs.Fill(t, filler)
	o.Reserve = -1
	if s, err = Open(dir, o); err != nil {
		t.Fatalf("Open on a full disk without a reserve: %v", err)
	}
	check("reopened on a full disk without a reserve")
	if err := write(64 << 10); !errors.Is(err, fserr.ErrNoSpace) {
		t.Fatalf("write on a full disk without a reserve: %v, want ENOSPC", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := write(64 << 10); err != nil {
		t.Fatalf("write once there is room: %v", err)
	}
	check("no reserve, space freed")
}

// TestCompactFullDisk runs Compact on a full disk: it moves only what fits,
// deletes segments with nothing live, leaves nothing of a failed pass
// behind, and loses no block.
func TestCompactFullDisk(t *testing.T) {
	mnt := tmpfs.Mount(t, 32<<20)
	s := openT(t, filepath.Join(mnt, "store"), Options{SegmentSize: 2 << 20, Reserve: -1, CompactInterval: -1})
	ctx := context.Background()
	var keep []obj2
	for i := range 48 { // 3 MiB in 64 KiB blocks over two segments; two in three freed
		data := randBlock(t, 64<<10)
		h, err := s.PutBlock(data)
		if err != nil {
			t.Fatal(err)
		}
		id := oid.Make(9, uint64(i+1))
		update(t, s, func(tx *Tx) error { return tx.SetBlock(id, 0, h) })
		if i%3 == 0 {
			keep = append(keep, obj2{id, data})
		} else {
			update(t, s, func(tx *Tx) error { return tx.ClearBlock(id, 0) })
		}
	}
	// Roll to a fresh active segment so the written ones are candidates.
	s.appendMu.Lock()
	seg, err := s.newSegmentLocked()
	if err != nil {
		t.Fatal(err)
	}
	s.active = seg
	s.appendMu.Unlock()
	before, _ := s.Usage()
	intact := func(when string) {
		t.Helper()
		for _, o := range keep {
			var h [32]byte
			view(t, s, func(tx *Tx) (err error) { h, _, err = tx.Block(o.id, 0); return err })
			if got, err := s.ReadBlock(h); err != nil || !bytes.Equal(got, o.data) {
				t.Fatalf("block of %v %s: %v", o.id, when, err)
			}
		}
		if u, _ := s.Usage(); u.SegmentBytes > before.SegmentBytes {
			t.Errorf("segment bytes grew %s: %d → %d", when, before.SegmentBytes, u.SegmentBytes)
		}
	}
	filler := filepath.Join(mnt, "filler")
	tmpfs.Fill(t, filler)
	if err := s.Compact(ctx); err != nil {
		t.Fatalf("Compact on a full disk: %v", err)
	}
	intact("after compacting on a full disk")

	// The disk fills up in the middle of a pass: the pass fails and takes
	// its copies back.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	s.compactHook = func(stage string) {
		if stage == "copying" {
			tmpfs.Fill(t, filler)
		}
	}
	if err := s.Compact(ctx); !errors.Is(err, fserr.ErrNoSpace) {
		t.Fatalf("Compact that runs out of space = %v, want ENOSPC", err)
	}
	intact("after a pass ran out of space")

	s.compactHook = nil
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx); err != nil {
		t.Fatalf("Compact with space: %v", err)
	}
	if u, _ := s.Usage(); u.ReclaimedBytes == 0 {
		t.Errorf("nothing reclaimed once space returned: %+v", u)
	}
}

type obj2 struct {
	id   oid.ID
	data []byte
}

// TestSegmentSyncFailure: after a segment's fdatasync fails (ENOSPC on
// thin or copy-on-write storage), the batch fails, and nothing is later
// committed on the strength of a retried fdatasync that may succeed
// without the bytes: a commit naming the blocks again fails until they
// are put again, the copies go to a new segment, and Compact moves the
// segment's live blocks out of it.
func TestSegmentSyncFailure(t *testing.T) {
	s := openT(t, t.TempDir(), Options{CompactInterval: -1})
	ctx := context.Background()
	keep := randBlock(t, 64<<10)
	hk, err := s.PutBlock(keep)
	if err != nil {
		t.Fatal(err)
	}
	keepID := oid.Make(10, 1)
	update(t, s, func(tx *Tx) error { return tx.SetBlock(keepID, 0, hk) }) // inline: the segment is not synced
	var datas [][]byte
	for range 5 { // more than inlineMax: the commit syncs the segment
		datas = append(datas, randBlock(t, 64<<10))
	}
	hs, err := s.PutBlocks(datas)
	if err != nil {
		t.Fatal(err)
	}
	id := oid.Make(10, 2)
	commit := func() error {
		return s.Update(ctx, func(tx *Tx) error {
			for i, h := range hs {
				if err := tx.SetBlock(id, uint64(i), h); err != nil {
					return err
				}
			}
			return nil
		})
	}
	s.syncFault = func(uint32) error { return syscall.ENOSPC }
	if err := commit(); !errors.Is(err, fserr.ErrNoSpace) {
		t.Fatalf("commit with a failing segment sync = %v, want ENOSPC", err)
	}
	s.syncFault = nil
	if err := commit(); err == nil {
		t.Fatal("commit of the same blocks succeeded after a failed sync, without writing them again")
	}
	old := s.active.id
	if hs2, err := s.PutBlocks(datas); err != nil || !slices.Equal(hs2, hs) {
		t.Fatalf("PutBlocks again: %v", err)
	}
	if err := commit(); err != nil {
		t.Fatalf("commit after putting the blocks again: %v", err)
	}
	if s.active.id == old {
		t.Errorf("still appending to segment %d after its sync failed", old)
	}
	if err := s.Compact(ctx); err != nil {
		t.Fatalf("Compact: %v", err)
	}
	if s.segment(old) != nil {
		t.Errorf("segment %d, whose sync failed, is still there after Compact", old)
	}
	for i, h := range append([][32]byte{hk}, hs...) {
		want := keep
		if i > 0 {
			want = datas[i-1]
		}
		if got, err := s.ReadBlock(h); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("block %d: %v", i, err)
		}
	}
}
