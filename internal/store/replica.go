package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Replication support (paper §5.3). An Update function's changes to
// objects are recorded as wire.Mutations as they are made; the server
// takes them with Mutations and forwards them to the slice's backups,
// which apply them with Apply. Each mutation records a resulting state,
// so applying one twice, or on top of a newer snapshot, converges.

// record appends a mutation of the running function.
func (t *Tx) record(kind wire.MutationKind, id uint64, data []byte, name string, index uint64) {
	t.rec = append(t.rec, &wire.Mutation{Kind: kind, Id: id, Data: data, Name: name, Index: index})
}

// Changed reports whether the running Update function has changed
// anything so far.
func (t *Tx) Changed() bool { return len(t.rec) > 0 }

// Mutations returns the changes the running Update function has made so
// far, in order, and forgets them.
func (t *Tx) Mutations() []*wire.Mutation {
	m := t.rec
	t.rec = nil
	return m
}

// Removed is a directory entry an update removed or pointed elsewhere.
type Removed struct {
	Dir  oid.ID
	Name string
	ID   oid.ID // the object the name named
}

// RemovedEntries returns the entries the running Update function has
// removed or replaced so far (the server leaves tombstones for them), and
// forgets them.
func (t *Tx) RemovedEntries() []Removed {
	r := t.removed
	t.removed = nil
	return r
}

// MutationSlice returns the slice a mutation belongs to.
func MutationSlice(m *wire.Mutation) oid.Slice {
	if m.Kind == wire.MutationKind_MUT_COUNTER_FLOOR {
		return oid.Slice(m.Id)
	}
	return oid.ID(m.Id).Slice()
}

// MutationBlocks returns the hashes of the blocks mutations make files
// reference.
func MutationBlocks(ms []*wire.Mutation) [][32]byte {
	var out [][32]byte
	for _, m := range ms {
		if m.Kind == wire.MutationKind_MUT_SET_BLOCK && len(m.Data) == 32 {
			out = append(out, [32]byte(m.Data))
		}
	}
	return out
}

// Apply makes a mutation recorded by another store's transaction. Deleting
// what is already gone is not an error.
func (t *Tx) Apply(m *wire.Mutation) error {
	id := oid.ID(m.Id)
	var err error
	switch m.Kind {
	case wire.MutationKind_MUT_PUT_META:
		meta := new(wire.Meta)
		if err := proto.Unmarshal(m.Data, meta); err != nil {
			return fmt.Errorf("store: replicated meta-data: %w: %v", fserr.ErrInvalid, err)
		}
		err = t.PutMeta(meta)
	case wire.MutationKind_MUT_DELETE_OBJECT:
		err = t.purgeObject(id)
	case wire.MutationKind_MUT_PUT_ENTRY:
		e, derr := decodeEntry(m.Data)
		if derr != nil {
			return derr
		}
		err = t.PutEntry(id, e)
	case wire.MutationKind_MUT_DELETE_ENTRY:
		err = t.DeleteEntry(id, m.Name)
	case wire.MutationKind_MUT_SET_BLOCK:
		if len(m.Data) != 32 {
			return fmt.Errorf("store: replicated block hash of %d bytes: %w", len(m.Data), fserr.ErrInvalid)
		}
		err = t.SetBlock(id, m.Index, [32]byte(m.Data))
	case wire.MutationKind_MUT_CLEAR_BLOCK:
		err = t.ClearBlock(id, m.Index)
	case wire.MutationKind_MUT_TRUNCATE_BLOCKS:
		err = t.TruncateBlocks(id, m.Index)
	case wire.MutationKind_MUT_SET_XATTR:
		err = t.SetXattr(id, m.Name, m.Data)
	case wire.MutationKind_MUT_REMOVE_XATTR:
		err = t.RemoveXattr(id, m.Name)
	case wire.MutationKind_MUT_COUNTER_FLOOR:
		err = t.SetCounterFloor(oid.Slice(m.Id), m.Index)
	default:
		return fmt.Errorf("store: unknown mutation kind %v: %w", m.Kind, fserr.ErrInvalid)
	}
	if errors.Is(err, fserr.ErrNotExist) || errors.Is(err, fserr.ErrNoAttr) {
		return nil
	}
	return err
}

// purgeObject deletes an object with its directory entries, if present.
func (t *Tx) purgeObject(id oid.ID) error {
	k := idKey(id)
	if _, ok := t.get(bObjects, k[:]); !ok {
		return nil
	}
	es, err := t.Entries(id, "", 0)
	if err != nil {
		return err
	}
	for _, e := range es {
		if err := t.DeleteEntry(id, e.Name); err != nil {
			return err
		}
	}
	return t.DeleteObject(id)
}

// Counter returns the next counter value slice s would allocate.
func (t *Tx) Counter(s oid.Slice) uint64 { return t.counter(s) }

// MetaSum is a checksum of an object's encoded meta-data. Two replicas
// with the same version and sum of an object hold the same version of it;
// the sum tells apart equal version numbers written by different primaries
// (a stale primary's refused writes).
func MetaSum(m *wire.Meta) uint64 {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// SliceMetas calls fn for every object of slice s, in ID order, until fn
// returns false.
func (t *Tx) SliceMetas(s oid.Slice, fn func(m *wire.Meta) bool) error {
	return t.SliceMetasAfter(s, 0, fn)
}

// SliceMetasAfter is SliceMetas from the first object after ID after (0:
// from the slice's start), for reading a slice in pages.
func (t *Tx) SliceMetasAfter(s oid.Slice, after oid.ID, fn func(m *wire.Meta) bool) error {
	seek := idKey(oid.Make(s, 0))
	if after != 0 {
		seek = idKey(after + 1)
	}
	var err error
	t.scan(bObjects, seek[:], 0, func(k, v []byte) bool {
		if len(k) != 8 || oid.ID(binary.BigEndian.Uint64(k)).Slice() != s {
			return false
		}
		m := new(wire.Meta)
		if err = proto.Unmarshal(v, m); err != nil {
			err = fmt.Errorf("store: object %x: corrupt meta-data: %w: %v", k, fserr.ErrIO, err)
			return false
		}
		return fn(m)
	})
	return err
}

// ObjectSlices returns the slices this store holds objects of, in order:
// one seek per slice, not a scan of every object.
func (t *Tx) ObjectSlices() []oid.Slice {
	var out []oid.Slice
	next := oid.Slice(0)
	for {
		seek := idKey(oid.Make(next, 0))
		found := false
		t.scan(bObjects, seek[:], 0, func(k, _ []byte) bool {
			if len(k) == 8 {
				next, found = oid.ID(binary.BigEndian.Uint64(k)).Slice(), true
			}
			return false
		})
		if !found {
			return out
		}
		out = append(out, next)
		if next >= oid.MaxSlice {
			return out
		}
		next++
	}
}

// ObjectState returns everything stored about object id.
func (t *Tx) ObjectState(id oid.ID) (*wire.ObjectState, error) {
	m, err := t.Meta(id)
	if err != nil {
		return nil, err
	}
	st := &wire.ObjectState{Meta: m}
	switch m.Type {
	case wire.Type_TYPE_DIR:
		if st.Entries, err = t.Entries(id, "", 0); err != nil {
			return nil, err
		}
	case wire.Type_TYPE_FILE:
		refs, err := t.Blocks(id, 0, ^uint64(0))
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			st.Blocks = append(st.Blocks, &wire.BlockRef{Index: r.Index, Hash: bytes.Clone(r.Hash[:]), Len: r.Len})
		}
	}
	names, err := t.Xattrs(id)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		v, err := t.Xattr(id, n)
		if err != nil {
			return nil, err
		}
		st.XattrNames = append(st.XattrNames, n)
		st.XattrValues = append(st.XattrValues, v)
	}
	return st, nil
}

// InstallObject replaces everything stored about st's object with st.
// The blocks it references must be present (HasBlock).
func (t *Tx) InstallObject(st *wire.ObjectState) error {
	m := st.GetMeta()
	if m.GetId() == 0 {
		return fmt.Errorf("store: install of an object without an id: %w", fserr.ErrInvalid)
	}
	id := oid.ID(m.Id)
	if err := t.PutMeta(m); err != nil {
		return err
	}
	// Entries: drop the names st does not have, put the others.
	have, err := t.Entries(id, "", 0)
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(st.Entries))
	for _, e := range st.Entries {
		want[e.Name] = true
	}
	for _, e := range have {
		if !want[e.Name] {
			if err := t.DeleteEntry(id, e.Name); err != nil {
				return err
			}
		}
	}
	for _, e := range st.Entries {
		if err := t.PutEntry(id, e); err != nil {
			return err
		}
	}
	// Blocks: set the listed ones, clear the others.
	old, err := t.Blocks(id, 0, ^uint64(0))
	if err != nil {
		return err
	}
	keep := make(map[uint64]bool, len(st.Blocks))
	for _, b := range st.Blocks {
		if len(b.Hash) != 32 {
			return fmt.Errorf("store: install: block hash of %d bytes: %w", len(b.Hash), fserr.ErrInvalid)
		}
		keep[b.Index] = true
		if err := t.SetBlock(id, b.Index, [32]byte(b.Hash)); err != nil {
			return err
		}
	}
	for _, r := range old {
		if !keep[r.Index] {
			if err := t.ClearBlock(id, r.Index); err != nil {
				return err
			}
		}
	}
	// Extended attributes likewise.
	names, err := t.Xattrs(id)
	if err != nil {
		return err
	}
	wantX := make(map[string]bool, len(st.XattrNames))
	for i, n := range st.XattrNames {
		wantX[n] = true
		var v []byte
		if i < len(st.XattrValues) {
			v = st.XattrValues[i]
		}
		if err := t.SetXattr(id, n, v); err != nil {
			return err
		}
	}
	for _, n := range names {
		if !wantX[n] {
			if err := t.RemoveXattr(id, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// PurgeObject deletes an object and its entries (if present), as a
// replica does for an object its primary no longer has.
func (t *Tx) PurgeObject(id oid.ID) error { return t.purgeObject(id) }
