package server

import (
	"slices"
	"testing"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

func fileState(version uint64, size uint64, nlink uint32) *wire.ObjectState {
	return &wire.ObjectState{Meta: &wire.Meta{Id: 7, Type: wire.Type_TYPE_FILE, Version: version, Size: size, Nlink: nlink}}
}

func TestMergeFile(t *testing.T) {
	tie1, tie2 := fileState(5, 1, 1), fileState(5, 2, 1)
	tieWinner := tie1
	if store.MetaSum(tie2.Meta) > store.MetaSum(tie1.Meta) {
		tieWinner = tie2
	}
	for _, tc := range []struct {
		name        string
		mine, their *wire.ObjectState
		wantSize    uint64
		wantVersion uint64
		wantTheirs  bool
	}{
		{"theirs newer", fileState(3, 10, 1), fileState(5, 20, 2), 20, 6, true},
		{"mine newer", fileState(7, 10, 1), fileState(5, 20, 1), 10, 8, false},
		{"tie by meta-data sum", tie1, tie2, tieWinner.Meta.Size, 6, tieWinner == tie2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, theirs := mergeFile(tc.mine, tc.their)
			if out.Meta.Size != tc.wantSize || out.Meta.Version != tc.wantVersion || theirs != tc.wantTheirs {
				t.Errorf("got size %d version %d theirs %v, want %d %d %v",
					out.Meta.Size, out.Meta.Version, theirs, tc.wantSize, tc.wantVersion, tc.wantTheirs)
			}
			if out.Meta.Nlink != tc.mine.Meta.Nlink {
				t.Errorf("nlink %d, want the primary's %d", out.Meta.Nlink, tc.mine.Meta.Nlink)
			}
			// Symmetric: the other replica order picks the same content.
			back, _ := mergeFile(tc.their, tc.mine)
			if back.Meta.Size != out.Meta.Size || back.Meta.Version != out.Meta.Version {
				t.Errorf("merge is not symmetric: %v vs %v", back.Meta, out.Meta)
			}
		})
	}
	// The inputs are not changed.
	mine, theirs := fileState(1, 1, 1), fileState(2, 2, 1)
	mergeFile(mine, theirs)
	if mine.Meta.Version != 1 || theirs.Meta.Version != 2 {
		t.Errorf("mergeFile changed its inputs")
	}
}

func TestMergeDirMeta(t *testing.T) {
	mine := &wire.Meta{Type: wire.Type_TYPE_DIR, Mode: 0o755, Version: 4, MtimeNs: 100, Nlink: 3}
	theirs := &wire.Meta{Type: wire.Type_TYPE_DIR, Mode: 0o770, Version: 6, MtimeNs: 50, Nlink: 9,
		Acl:        []*wire.AclEntry{{Tag: 2, Perm: 7, Id: 1001}, {Tag: 4, Perm: 5, Id: ^uint32(0)}},
		DefaultAcl: []*wire.AclEntry{{Tag: 1, Perm: 7}, {Tag: 4, Perm: 5}, {Tag: 0x20, Perm: 0}}}
	out := mergeDirMeta(mine, theirs)
	if out.Mode != 0o770 || out.MtimeNs != 100 || out.Version != 7 || out.Nlink != 3 {
		t.Errorf("got mode %o mtime %d version %d nlink %d, want 770 100 7 3", out.Mode, out.MtimeNs, out.Version, out.Nlink)
	}
	if len(out.Acl) != 2 || len(out.DefaultAcl) != 3 {
		t.Errorf("the ACLs did not come with the newer mode: %v / %v", out.Acl, out.DefaultAcl)
	}
	out = mergeDirMeta(theirs, mine) // the primary's copy newer
	if out.Mode != 0o770 || out.Version != 7 || out.Nlink != 9 || len(out.Acl) != 2 {
		t.Errorf("got mode %o version %d nlink %d acl %v, want 770 7 9 with the ACL", out.Mode, out.Version, out.Nlink, out.Acl)
	}
}

func TestResolveEntry(t *testing.T) {
	e := func(id, version uint64) *wire.Entry {
		return &wire.Entry{Name: "n", Id: id, Type: wire.Type_TYPE_FILE, Version: version}
	}
	op := func(e *wire.Entry, op uint64, attempt uint32) *wire.Entry {
		e.Op, e.Attempt = op, attempt
		return e
	}
	for _, tc := range []struct {
		name               string
		union              bool
		cur, in            *wire.Entry
		put, moved, unlink uint64 // ids; 0: none
		movedTo            string
	}{
		{"new name", true, nil, e(5, 1), 5, 0, 0, ""},
		{"same id", true, e(5, 1), e(5, 3), 0, 0, 0, ""},
		{"union: incoming smaller keeps the name", true, e(9, 1), e(5, 1), 5, 9, 0, conflictName("n", 9)},
		{"union: current smaller keeps the name", true, e(5, 1), e(9, 1), 0, 9, 0, conflictName("n", 9)},
		{"last writer: newer entry wins", false, e(5, 1), e(9, 2), 9, 0, 5, ""},
		{"last writer: tie keeps the primary's", false, e(9, 2), e(5, 2), 0, 0, 5, ""},
		// One eventual create made at the primary (attempt 0) and at a
		// fallback (attempt 1): the fallback's, which the client heard
		// of, keeps the name whatever the ids and versions say.
		{"twin: later attempt keeps the name", false, op(e(5, 2), 7, 0), op(e(9, 1), 7, 1), 9, 5, 0, conflictName("n", 5)},
		{"twin: earlier attempt pushed late", true, op(e(9, 1), 7, 2), op(e(5, 1), 7, 1), 0, 5, 0, conflictName("n", 5)},
		{"twin: same attempt, smaller id", false, op(e(9, 1), 7, 0), op(e(5, 1), 7, 0), 5, 9, 0, conflictName("n", 9)},
		{"different ops: the usual rules", false, op(e(5, 1), 7, 0), op(e(9, 2), 8, 1), 9, 0, 5, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := resolveEntry(tc.union, tc.cur, tc.in)
			id := func(e *wire.Entry) uint64 {
				if e == nil {
					return 0
				}
				return e.Id
			}
			if id(o.put) != tc.put || id(o.moved) != tc.moved || id(o.unlinked) != tc.unlink || o.movedTo != tc.movedTo {
				t.Errorf("got put %d moved %d→%q unlinked %d, want %d %d→%q %d",
					id(o.put), id(o.moved), o.movedTo, id(o.unlinked), tc.put, tc.moved, tc.movedTo, tc.unlink)
			}
		})
	}
	if got := conflictName("mail", oid.ID(0x2a)); got != "mail~000000000000002a" {
		t.Errorf("conflictName = %q", got)
	}
}

func TestTombstoneKeys(t *testing.T) {
	k := tombKey("name", oid.ID(3))
	if !isTombstone(k) || !hidden(k) || hidden("user.x") || isTombstone("user.x") {
		t.Errorf("tombstone key %q not recognised", k)
	}
	if tombKey("a", 3) == tombKey("b", 3) || tombKey("a", 3) == tombKey("a", 4) {
		t.Errorf("tombstone keys collide")
	}
	seq, name, ok := parseTomb(tombValue(42, "a/b"))
	if !ok || seq != 42 || name != "a/b" {
		t.Errorf("parseTomb = %d %q %v", seq, name, ok)
	}
	if _, _, ok := parseTomb([]byte{1}); ok {
		t.Errorf("short tombstone value accepted")
	}
}

func TestIDBlocksAfterTakeover(t *testing.T) {
	const block = 1 << tailBlockBits
	for _, tc := range []struct{ counter, want uint64 }{{0, block}, {1, block}, {block - 1, block}, {block, 2 * block}, {block + 7, 2 * block}} {
		if got := tailFloor(tc.counter); got != tc.want {
			t.Errorf("tailFloor(%d) = %d, want %d", tc.counter, got, tc.want)
		}
	}
	id := func(n uint64) oid.ID { return oid.Make(9, n) }
	// The new primary's counter after a takeover from a copy whose next ID
	// was 3, then two creates of its own.
	next := tailFloor(3) + 2
	for _, tc := range []struct {
		n    uint64
		want bool
	}{
		{1, false},         // seen by the backups, deleted since or not: an earlier block
		{3, false},         // the old primary's tail, unseen here
		{block, true},      // this primary's first
		{block + 1, true},  // its second
		{block + 2, false}, // not handed out yet
	} {
		if got := issuedHere(id(tc.n), next); got != tc.want {
			t.Errorf("issuedHere(%d, next %d) = %v, want %v", tc.n, next, got, tc.want)
		}
	}
}

func TestObjectsFirst(t *testing.T) {
	pre := divSlicePrefix(3)
	keys := []string{pre + "e/0000000000000001/a", pre + "e/0000000000000001/b", pre + "o/0000000000000002", pre + "o/0000000000000003"}
	want := []string{keys[2], keys[3], keys[0], keys[1]}
	if got := objectsFirst(keys, pre); !slices.Equal(got, want) {
		t.Errorf("objectsFirst = %v, want %v", got, want)
	}
}
