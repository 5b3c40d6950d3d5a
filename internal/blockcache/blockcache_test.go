package blockcache

import "testing"

func TestEvictsLeastRecentlyUsedByBytes(t *testing.T) {
	c := New(10)
	a, b, d := Hash{1}, Hash{2}, Hash{3}
	c.Add(a, make([]byte, 4))
	c.Add(b, make([]byte, 4))
	if _, ok := c.Get(a); !ok { // a becomes most recent
		t.Fatal("a missing")
	}
	c.Add(d, make([]byte, 4)) // 12 > 10: evict b
	if _, ok := c.Get(b); ok {
		t.Fatal("b should have been evicted")
	}
	if _, ok := c.Get(a); !ok {
		t.Fatal("a evicted instead of b")
	}
	if _, _, used := c.Stats(); used != 8 {
		t.Fatalf("used = %d, want 8", used)
	}
	c.Add(Hash{4}, make([]byte, 11)) // larger than the cache: ignored
	if _, ok := c.Get(Hash{4}); ok {
		t.Fatal("oversized block cached")
	}
}
