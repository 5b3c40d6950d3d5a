package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestSkiplistVersions checks the order a reader relies on: keys
// ascending, the versions of one key newest first, each visible only at
// or after its sequence number, through levels above the inline tower.
func TestSkiplistVersions(t *testing.T) {
	m := newMemtable()
	const n = 5000
	for seq := uint64(1); seq <= 3; seq++ {
		for i := range n {
			m.put(bObjects, entryShapedKey(i), fmt.Appendf(nil, "v%d", seq), seq, seq == 3 && i%2 == 0)
		}
	}
	l := &m.lists[bObjects]
	if h := l.height.Load(); h <= inlineHeight {
		t.Fatalf("height %d: the test needs towers above the inline levels", h)
	}
	for i := range n {
		for seq := uint64(1); seq <= 3; seq++ {
			nd := l.get(entryShapedKey(i), seq)
			if nd == nil || nd.seq != seq || string(nd.val) != fmt.Sprintf("v%d", seq) || nd.del != (seq == 3 && i%2 == 0) {
				t.Fatalf("key %d at %d: got %+v", i, seq, nd)
			}
		}
		if nd := l.get(entryShapedKey(i), 0); nd != nil {
			t.Fatalf("key %d visible before its first version", i)
		}
	}
	count := 0
	var prev []byte
	for it := l.iter(nil, 2); it.n != nil; it.next() {
		if prev != nil && string(prev) >= string(it.n.key) || it.n.seq != 2 {
			t.Fatalf("iteration at %x (seq %d) after %x", it.n.key, it.n.seq, prev)
		}
		prev = it.n.key
		count++
	}
	if count != n {
		t.Fatalf("iterated %d keys, want %d", count, n)
	}
}

// entryShapedKey is a directory entry's key: a directory id, then a name.
func entryShapedKey(i int) []byte {
	k := binary.BigEndian.AppendUint64(nil, 42)
	return fmt.Appendf(k, "f%07d", i)
}

// BenchmarkMemtable measures the committer's insert and a reader's point
// lookup in a layer of 100 000 keys, the size a busy layer reaches
// between checkpoints.
func BenchmarkMemtable(b *testing.B) {
	const n = 100_000
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = entryShapedKey(i * 7919 % n)
	}
	b.Run("put", func(b *testing.B) {
		b.ReportAllocs()
		m := newMemtable()
		for i := 0; b.Loop(); i++ {
			m.put(bEntries, keys[i%n], keys[i%n], uint64(i+1), false)
		}
	})
	b.Run("get", func(b *testing.B) {
		m := newMemtable()
		for i, k := range keys {
			m.put(bEntries, k, k, uint64(i+1), false)
		}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if m.lists[bEntries].get(keys[i%n], n) == nil {
				b.Fatal("missing key")
			}
		}
	})
}

// TestSkiplistOrder checks the comparison by the keys' first words
// against bytes.Compare on keys made to tie there: short keys, zero
// bytes, shared 16-byte prefixes, prefixes of one another.
func TestSkiplistOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte{0, 1, 'a', 0xff}
	seen := map[string]bool{}
	var keys [][]byte
	m := newMemtable()
	for range 20000 {
		k := make([]byte, r.IntN(24))
		for i := range k {
			k[i] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(4) == 0 {
			k = append([]byte("0123456789abcdef"), k...) // tie on both words
		}
		m.put(bXattrs, k, k, 1, false)
		if !seen[string(k)] {
			seen[string(k)] = true
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, bytes.Compare)
	i := 0
	for it := m.lists[bXattrs].all(); it.n != nil; it.next() {
		if i >= len(keys) || !bytes.Equal(it.n.key, keys[i]) {
			t.Fatalf("key %d: got %x, want %x", i, it.n.key, keys[min(i, len(keys)-1)])
		}
		i++
	}
	if i != len(keys) {
		t.Fatalf("iterated %d keys, want %d", i, len(keys))
	}
	for _, k := range keys {
		if n := m.lists[bXattrs].get(k, 1); n == nil || !bytes.Equal(n.val, k) {
			t.Fatalf("get %x: %v", k, n)
		}
	}
}

// TestRecentMeta: the overlay answers for an object changed since the
// last checkpoint (its last version, or its deletion), and defers to View
// once a checkpoint moved it into bbolt.
func TestRecentMeta(t *testing.T) {
	s := openT(t, t.TempDir(), Options{})
	ctx := context.Background()
	id := oid.Make(1, 1)
	for v := uint64(1); v <= 2; v++ {
		if err := s.Update(ctx, func(tx *Tx) error {
			return tx.PutMeta(&wire.Meta{Id: uint64(id), Type: wire.Type_TYPE_FILE, Version: v})
		}); err != nil {
			t.Fatal(err)
		}
	}
	if m, ok := s.RecentMeta(id); !ok || m == nil || m.Version != 2 {
		t.Fatalf("after two changes: %v, %v; want version 2", m, ok)
	}
	if _, ok := s.RecentMeta(oid.Make(1, 2)); ok {
		t.Error("an object the overlay does not hold was answered")
	}
	if err := s.checkpoint(false); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.RecentMeta(id); ok {
		t.Error("answered from the overlay after a checkpoint emptied it")
	}
	if err := s.Update(ctx, func(tx *Tx) error { return tx.DeleteObject(id) }); err != nil {
		t.Fatal(err)
	}
	if m, ok := s.RecentMeta(id); !ok || m != nil {
		t.Errorf("after the delete: %v, %v; want nil, true", m, ok)
	}
}
