package store

import (
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestMutationsReplay makes random changes on one store, replays the
// recorded mutations on another (each batch twice: replays must be
// harmless), and checks that both hold the same objects.
func TestMutationsReplay(t *testing.T) {
	a := openT(t, t.TempDir(), Options{})
	b := openT(t, t.TempDir(), Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	const sl = oid.Slice(7)
	var blocks [][32]byte
	for i := 0; i < 8; i++ {
		data := randBlockSeeded(1000 + i)
		h, err := a.PutBlock(data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.PutBlock(data); err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, h)
	}
	dir := oid.Make(sl, 1)
	var live []oid.ID
	for round := 0; round < 300; round++ {
		for _, st := range []*Store{a, b} { // freed blocks must be put again
			for i := range blocks {
				if _, err := st.PutBlock(randBlockSeeded(1000 + i)); err != nil {
					t.Fatal(err)
				}
			}
		}
		op := func(tx *Tx) error {
			if round == 0 {
				if err := tx.PutMeta(&wire.Meta{Id: uint64(dir), Type: wire.Type_TYPE_DIR, Version: 1}); err != nil {
					return err
				}
			}
			switch op := rng.IntN(6); {
			case op == 0 || len(live) == 0: // create
				n, err := tx.NextCounter(sl)
				if err != nil {
					return err
				}
				id := oid.Make(sl, n+1)
				live = append(live, id)
				if err := tx.PutMeta(&wire.Meta{Id: uint64(id), Type: wire.Type_TYPE_FILE, Version: 1}); err != nil {
					return err
				}
				return tx.PutEntry(dir, &wire.Entry{Name: id.String(), Id: uint64(id), Type: wire.Type_TYPE_FILE, Version: 1})
			case op == 1: // write blocks
				id := live[rng.IntN(len(live))]
				for i := 0; i < 3; i++ {
					if err := tx.SetBlock(id, uint64(rng.IntN(6)), blocks[rng.IntN(len(blocks))]); err != nil {
						return err
					}
				}
				m, err := tx.Meta(id)
				if err != nil {
					return err
				}
				m.Version++
				return tx.PutMeta(m)
			case op == 2: // truncate or punch
				id := live[rng.IntN(len(live))]
				if rng.IntN(2) == 0 {
					return tx.TruncateBlocks(id, uint64(rng.IntN(4)))
				}
				return tx.ClearBlock(id, uint64(rng.IntN(6)))
			case op == 3: // xattrs
				id := live[rng.IntN(len(live))]
				if rng.IntN(3) == 0 {
					_ = tx.RemoveXattr(id, "user.a")
					return nil
				}
				return tx.SetXattr(id, "user.a", []byte{byte(round)})
			default: // delete
				i := rng.IntN(len(live))
				id := live[i]
				live = append(live[:i], live[i+1:]...)
				if err := tx.DeleteEntry(dir, id.String()); err != nil {
					return err
				}
				return tx.DeleteObject(id)
			}
		}
		var muts []*wire.Mutation
		update(t, a, func(tx *Tx) error {
			if err := op(tx); err != nil {
				return err
			}
			muts = tx.Mutations()
			return nil
		})
		update(t, b, func(tx *Tx) error {
			for pass := 0; pass < 2; pass++ {
				for _, m := range muts {
					if MutationSlice(m) != sl {
						t.Fatalf("mutation %v outside slice %d", m, sl)
					}
					if err := tx.Apply(m); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	states := func(s *Store) (map[uint64]*wire.ObjectState, uint64) {
		out := map[uint64]*wire.ObjectState{}
		var next uint64
		view(t, s, func(tx *Tx) error {
			next = tx.Counter(sl)
			return tx.SliceMetas(sl, func(m *wire.Meta) bool {
				st, err := tx.ObjectState(oid.ID(m.Id))
				if err != nil {
					t.Fatal(err)
				}
				out[m.Id] = st
				return true
			})
		})
		return out, next
	}
	sa, na := states(a)
	sb, nb := states(b)
	if na != nb {
		t.Fatalf("counters differ: %d vs %d", na, nb)
	}
	if len(sa) != len(sb) || len(sa) != len(live)+1 {
		t.Fatalf("%d objects vs %d (want %d)", len(sa), len(sb), len(live)+1)
	}
	for id, x := range sa {
		if !proto.Equal(x, sb[id]) {
			t.Fatalf("object %x differs:\n%v\n%v", id, x, sb[id])
		}
	}
	// A snapshot installed into a third, empty store gives the same state.
	c := openT(t, t.TempDir(), Options{})
	for i := range blocks {
		if _, err := c.PutBlock(randBlockSeeded(1000 + i)); err != nil {
			t.Fatal(err)
		}
	}
	update(t, c, func(tx *Tx) error {
		if err := tx.PutMeta(&wire.Meta{Id: uint64(oid.Make(sl, 999)), Type: wire.Type_TYPE_FILE}); err != nil {
			return err
		}
		for _, st := range sa {
			if err := tx.InstallObject(st); err != nil {
				return err
			}
		}
		return tx.PurgeObject(oid.Make(sl, 999))
	})
	sc, _ := states(c)
	if len(sc) != len(sa) {
		t.Fatalf("installed %d objects, want %d", len(sc), len(sa))
	}
	for id, x := range sa {
		if !proto.Equal(x, sc[id]) {
			t.Fatalf("installed object %x differs", id)
		}
	}
}

// randBlockSeeded returns n deterministic pseudo-random bytes.
func randBlockSeeded(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestObjectSlices lists the slices with objects, including those only
// in the uncheckpointed overlay and the largest slice number.
func TestObjectSlices(t *testing.T) {
	s := openT(t, t.TempDir(), Options{})
	want := []oid.Slice{1, 5, 6, 900, oid.MaxSlice}
	if err := s.Update(t.Context(), func(tx *Tx) error {
		for _, sl := range want {
			for c := uint64(1); c <= 3; c++ {
				if err := tx.PutMeta(&wire.Meta{Id: uint64(oid.Make(sl, c)), Type: wire.Type_TYPE_FILE, Version: 1}); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var got []oid.Slice
	_ = s.View(func(tx *Tx) error { got = tx.ObjectSlices(); return nil })
	if !slices.Equal(got, want) {
		t.Fatalf("ObjectSlices = %v, want %v", got, want)
	}
}
