package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestFsckListPages reads a slice with more objects, and a directory
// with more entries, than one page holds, as the CA key's holder: every
// page stays within wire.MaxListEntries, and the pages together hold
// every object once and every entry in order.
func TestFsckListPages(t *testing.T) {
	r := startRig(t, nil)
	const files, names = 5000, 2*wire.MaxListEntries + 7
	big := oid.Make(oid.RootSlice, 1<<30)
	if err := r.h.Store.Update(t.Context(), func(tx *store.Tx) error {
		if err := tx.PutMeta(&wire.Meta{Id: uint64(big), Type: wire.Type_TYPE_DIR, Version: 1, Nlink: 2}); err != nil {
			return err
		}
		for i := range names {
			if err := tx.PutEntry(big, &wire.Entry{Name: fmt.Sprintf("n%05d", i), Id: uint64(oid.Make(oid.RootSlice, 1<<31+uint64(i))), Type: wire.Type_TYPE_FILE}); err != nil {
				return err
			}
		}
		for i := range files {
			if err := tx.PutMeta(&wire.Meta{Id: uint64(oid.Make(oid.RootSlice, 1<<20+uint64(i))), Type: wire.Type_TYPE_FILE, Version: 1, Nlink: 1}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(r.caDir())
	if err != nil {
		t.Fatal(err)
	}
	admin, err := ca.RootCredentials()
	if err != nil {
		t.Fatal(err)
	}
	peer := wire.NewPeerClient(r.dialWith(t, admin))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := map[uint64]int{}
	var entries []string
	req := &wire.FsckListRequest{Slice: uint32(oid.RootSlice)}
	pages := 0
	for {
		resp, err := peer.FsckList(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		n := len(resp.Objects)
		for _, o := range resp.Objects {
			n += len(o.Entries)
			if len(o.Entries) == 0 || req.AfterName == "" || o.Id != req.AfterId {
				seen[o.Id]++
			}
			if o.Id == uint64(big) {
				for _, e := range o.Entries {
					entries = append(entries, e.Name)
				}
			}
		}
		if n > wire.MaxListEntries {
			t.Fatalf("page %d holds %d objects and entries", pages, n)
		}
		if resp.Epoch == 0 {
			t.Errorf("page %d carries no stream position", pages)
		}
		if resp.Eof {
			break
		}
		req.AfterId, req.AfterName = resp.NextId, resp.NextName
	}
	if len(seen) < files+2 { // the root and the big directory too
		t.Errorf("%d objects listed, want at least %d", len(seen), files+2)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("object %v listed %d times", oid.ID(id), n)
		}
	}
	if len(entries) != names {
		t.Fatalf("%d entries of the big directory, want %d", len(entries), names)
	}
	for i, e := range entries {
		if want := fmt.Sprintf("n%05d", i); e != want {
			t.Fatalf("entry %d is %q, want %q", i, e, want)
		}
	}
	if pages < 4 {
		t.Errorf("%d pages: the test did not page", pages)
	}
}
