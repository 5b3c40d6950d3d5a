package fsck

import (
	"slices"
	"strings"
	"testing"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

var (
	dirD  = oid.Make(1, 2)
	fileF = oid.Make(2, 1)
)

func dirObj(id oid.ID, nlink uint32, es ...*wire.Entry) *wire.FsckObject {
	return &wire.FsckObject{Id: uint64(id), Type: wire.Type_TYPE_DIR, Version: 1, Nlink: nlink, Entries: es}
}

func fileObj(id oid.ID, nlink uint32) *wire.FsckObject {
	return &wire.FsckObject{Id: uint64(id), Type: wire.Type_TYPE_FILE, Version: 1, Nlink: nlink}
}

func entry(name string, id oid.ID, typ wire.Type) *wire.Entry {
	return &wire.Entry{Name: name, Id: uint64(id), Type: typ, Version: 1}
}

func list(server string, seq uint64, objs ...*wire.FsckObject) *listing {
	l := &listing{server: server, byID: map[oid.ID]*wire.FsckObject{}, epoch: 1, seq: seq, stable: true}
	for _, o := range objs {
		l.objs = append(l.objs, o)
		l.byID[oid.ID(o.Id)] = o
	}
	return l
}

// healthy is a deployment of two servers and two slices, each at both:
// / (slice 1) holds d/ and f; f lives in slice 2.
func healthy() *scanned {
	t := &configsvc.Table{
		Servers: map[string]configsvc.ServerInfo{"a": {ID: "a"}, "b": {ID: "b"}},
		Slices: map[oid.Slice]configsvc.Slice{
			1: {ID: 1, Replicas: []string{"a", "b"}, Holder: "a"},
			2: {ID: 2, Replicas: []string{"b", "a"}, Holder: "b"},
		},
	}
	s1 := func(server string) *listing {
		return list(server, 5,
			dirObj(oid.Root, 3, entry("d", dirD, wire.Type_TYPE_DIR), entry("f", fileF, wire.Type_TYPE_FILE)),
			dirObj(dirD, 2))
	}
	s2 := func(server string) *listing { return list(server, 3, fileObj(fileF, 1)) }
	sc := &scanned{table: t,
		lists: map[oid.Slice]map[string]*listing{1: {"a": s1("a"), "b": s1("b")}, 2: {"b": s2("b"), "a": s2("a")}},
		held:  map[string][]oid.Slice{"a": {1, 2}, "b": {1, 2}}}
	sc.auth = map[oid.Slice]*listing{1: sc.lists[1]["a"], 2: sc.lists[2]["b"]}
	return sc
}

// TestAnalyze: each kind of damage on an otherwise healthy scan, and the
// states that are not damage (an orphan, a moving or diverged replica, a
// name only at a backup) reported as such.
func TestAnalyze(t *testing.T) {
	tests := []struct {
		name      string
		damage    func(sc *scanned)
		want      []Kind
		unchecked string
	}{
		{name: "healthy", damage: func(sc *scanned) {}},
		{name: "dangling entry", want: []Kind{Dangling}, damage: func(sc *scanned) {
			d := sc.auth[1].byID[dirD]
			d.Entries = append(d.Entries, entry("ghost", oid.Make(2, 99), wire.Type_TYPE_FILE))
			sc.lists[1]["b"].byID[dirD].Entries = d.Entries
		}},
		{name: "file link count", want: []Kind{LinkCount}, damage: func(sc *scanned) {
			sc.auth[2].byID[fileF].Nlink = 2
			sc.lists[2]["a"].byID[fileF].Nlink = 2
		}},
		{name: "directory link count", want: []Kind{LinkCount}, damage: func(sc *scanned) {
			sc.auth[1].byID[oid.Root].Nlink = 2
			sc.lists[1]["b"].byID[oid.Root].Nlink = 2
		}},
		{name: "leaked file", want: []Kind{Leaked}, damage: func(sc *scanned) {
			for _, l := range sc.lists[1] {
				r := l.byID[oid.Root]
				r.Entries = r.Entries[:1]
			}
		}},
		{name: "orphan is not leaked", damage: func(sc *scanned) {
			for _, l := range sc.lists[1] {
				r := l.byID[oid.Root]
				r.Entries = r.Entries[:1]
			}
			for _, l := range sc.lists[2] {
				l.byID[fileF].Orphan, l.byID[fileF].Nlink = true, 0
			}
		}},
		{name: "a young object is not leaked", unchecked: "too recently", damage: func(sc *scanned) {
			for _, l := range sc.lists[1] {
				r := l.byID[oid.Root]
				r.Entries = r.Entries[:1]
			}
			sc.young = 10
			for _, l := range sc.lists[2] {
				l.byID[fileF].CtimeNs = 11
			}
		}},
		{name: "named only at a backup", unchecked: "named only in a backup", damage: func(sc *scanned) {
			r := sc.auth[1].byID[oid.Root]
			r.Entries = r.Entries[:1]
			sc.lists[1]["b"].diverged = true
		}},
		{name: "replica differs", want: []Kind{ReplicaDiffers}, damage: func(sc *scanned) {
			sc.lists[2]["a"].byID[fileF].Sum = 7
		}},
		{name: "replica moving", unchecked: "not compared", damage: func(sc *scanned) {
			sc.lists[2]["a"].byID[fileF].Sum = 7
			sc.lists[2]["a"].seq = 2
		}},
		{name: "stale copy", want: []Kind{StaleCopy}, damage: func(sc *scanned) {
			sc.held["a"] = append(sc.held["a"], 9)
		}},
		{name: "unread slice", unchecked: "namespace not checked", damage: func(sc *scanned) {
			for _, l := range sc.lists[1] {
				l.byID[dirD].Entries = []*wire.Entry{entry("ghost", oid.Make(2, 99), wire.Type_TYPE_FILE)}
			}
			delete(sc.auth, 2)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := healthy()
			tc.damage(sc)
			var got []Kind
			for _, f := range analyze(sc) {
				got = append(got, f.Kind)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("findings %v, want %v", got, tc.want)
			}
			if tc.unchecked != "" && !slices.ContainsFunc(sc.unchecked, func(s string) bool { return strings.Contains(s, tc.unchecked) }) {
				t.Errorf("unchecked %q, want one with %q", sc.unchecked, tc.unchecked)
			}
			if tc.unchecked == "" && len(sc.unchecked) > 0 {
				t.Errorf("unchecked %q", sc.unchecked)
			}
		})
	}
}
