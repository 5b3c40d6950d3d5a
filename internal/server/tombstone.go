package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/protobuf/proto"
)

// A tombstone is an extended attribute of the directory, hidden from
// clients (a NUL byte starts its name): tombPrefix, the hash of the
// entry's name, and the removed object's id. Its value is the batch seq
// that recorded it (0 at a backup) followed by the name. Being an
// attribute it is replicated, installed and purged with its directory.
const tombPrefix = "\x00tomb/"

func isTombstone(xattr string) bool { return strings.HasPrefix(xattr, tombPrefix) }

// hidden reports whether an attribute name is the server's, not a client's.
func hidden(xattr string) bool { return strings.HasPrefix(xattr, "\x00") }

func nameHash(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

func tombNamePrefix(name string) string { return hexKey(tombPrefix, nameHash(name), "/") }

func tombKey(name string, id oid.ID) string {
	return hexKey2(tombPrefix, nameHash(name), uint64(id))
}

func tombValue(seq uint64, name string) []byte {
	return append(binary.BigEndian.AppendUint64(nil, seq), name...)
}

func parseTomb(v []byte) (seq uint64, name string, ok bool) {
	if len(v) < 8 {
		return 0, "", false
	}
	return binary.BigEndian.Uint64(v), string(v[8:]), true
}

// hasTombstone reports whether name → id was removed from dir.
func hasTombstone(tx *store.Tx, dir oid.ID, name string, id oid.ID) bool {
	v, err := tx.Xattr(dir, tombKey(name, id))
	if err != nil {
		return false
	}
	_, n, ok := parseTomb(v)
	return ok && n == name
}

// tombstoned returns the ids removed from name in dir.
func tombstoned(tx *store.Tx, dir oid.ID, name string) ([]oid.ID, error) {
	names, err := tx.Xattrs(dir)
	if err != nil {
		return nil, err
	}
	p := tombNamePrefix(name)
	var out []oid.ID
	for _, x := range names {
		if !strings.HasPrefix(x, p) {
			continue
		}
		v, err := tx.Xattr(dir, x)
		if err != nil {
			continue
		}
		var id uint64
		if _, n, ok := parseTomb(v); ok && n == name {
			if _, err := fmt.Sscanf(x[len(p):], "%016x", &id); err == nil {
				out = append(out, oid.ID(id))
			}
		}
	}
	return out, nil
}

// tombstones leaves a tombstone for every entry the running update
// removed or pointed elsewhere, and drops those of entries it put back.
// seq gives the batch number a slice's changes will get (0: backup mode).
func tombstones(tx *store.Tx, removed []store.Removed, puts []*wire.Mutation, seq func(oid.Slice) uint64) error {
	for _, r := range removed {
		if _, err := tx.Meta(r.Dir); err != nil {
			continue // the directory went too
		}
		if err := tx.SetXattr(r.Dir, tombKey(r.Name, r.ID), tombValue(seq(r.Dir.Slice()), r.Name)); err != nil {
			return err
		}
	}
	for _, m := range puts {
		if m.Kind != wire.MutationKind_MUT_PUT_ENTRY {
			continue
		}
		e := new(wire.Entry)
		if proto.Unmarshal(m.Data, e) != nil {
			continue
		}
		dir := oid.ID(m.Id)
		if hasTombstone(tx, dir, e.Name, oid.ID(e.Id)) {
			if err := tx.RemoveXattr(dir, tombKey(e.Name, oid.ID(e.Id))); err != nil && !errors.Is(err, fserr.ErrNoAttr) {
				return err
			}
		}
	}
	return nil
}

// dropTombstones removes tombstone attributes from an object's state.
func dropTombstones(st *wire.ObjectState) {
	var names []string
	var vals [][]byte
	for i, n := range st.XattrNames {
		if !hidden(n) && i < len(st.XattrValues) {
			names, vals = append(names, n), append(vals, st.XattrValues[i])
		}
	}
	st.XattrNames, st.XattrValues = names, vals
}

// collectTombstones removes the tombstones of slice sl recorded in
// batches up to seq, which every replica has applied, and returns how
// many it removed.
func (s *Server) collectTombstones(ctx context.Context, sl oid.Slice, upTo uint64) (int, error) {
	type tomb struct {
		dir     oid.ID
		key     string
		name    string
		restamp bool // recorded at a backup (seq 0): give it ours
	}
	var old []tomb
	left := false
	err := s.store.View(func(tx *store.Tx) error {
		return tx.SliceMetas(sl, func(m *wire.Meta) bool {
			if !isDir(m) {
				return true
			}
			names, _ := tx.Xattrs(oid.ID(m.Id))
			for _, n := range names {
				if !isTombstone(n) {
					continue
				}
				v, err := tx.Xattr(oid.ID(m.Id), n)
				seq, name, ok := parseTomb(v)
				switch {
				case err == nil && ok && seq == 0:
					old = append(old, tomb{oid.ID(m.Id), n, name, true})
					left = true
				case err == nil && ok && seq <= upTo:
					old = append(old, tomb{oid.ID(m.Id), n, name, false})
				default:
					left = true
				}
			}
			return true
		})
	})
	if err != nil || len(old) == 0 {
		if err == nil && !left {
			s.noTombs(sl)
		}
		return 0, err
	}
	err = s.update(withEventual(ctx), 0, func(tx *store.Tx) error {
		for _, t := range old {
			var err error
			if t.restamp {
				err = tx.SetXattr(t.dir, t.key, tombValue(s.nextSeq(sl), t.name))
			} else if err = tx.RemoveXattr(t.dir, t.key); errors.Is(err, fserr.ErrNoAttr) {
				err = nil
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && !left {
		s.noTombs(sl)
	}
	return len(old), err
}

func (s *Server) noTombs(sl oid.Slice) {
	r := s.owned.repl(sl)
	if r != nil {
		r.mu.Lock()
		r.tombs = false
		r.mu.Unlock()
	}
}

// Tombstones returns the number of tombstones in this server's copy of
// directory dir (tests check that they are collected).
func (s *Server) Tombstones(dir oid.ID) (int, error) {
	n := 0
	err := s.store.View(func(tx *store.Tx) error {
		names, err := tx.Xattrs(dir)
		for _, x := range names {
			if isTombstone(x) {
				n++
			}
		}
		return err
	})
	return n, err
}

// writesTombstone reports whether muts leave a tombstone.
func writesTombstone(muts []*wire.Mutation) bool {
	for _, m := range muts {
		if m.Kind == wire.MutationKind_MUT_SET_XATTR && isTombstone(m.Name) {
			return true
		}
	}
	return false
}
