package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sync/atomic"
)

// memtable is one overlay layer: the committed writes not yet checkpointed
// into bbolt, one ordered skip list per bucket. Every version of a key is
// kept, tagged with the sequence number of its log record, so a reader at
// sequence number S sees exactly the records <= S while the committer keeps
// inserting (LevelDB's memtable design: one writer, lock-free readers).
type memtable struct {
	lists [nBuckets]skiplist
	bytes atomic.Int64 // approximate memory held (keys, values, nodes)
	ops   atomic.Int64 // versions inserted
	last  uint64       // highest sequence number inside; set when frozen
	// inline maps each segment holding blocks that this layer's log
	// records carry inline to the end of the highest such block: the
	// checkpoint fdatasyncs these before the records stop being replayed.
	// Committer only (commitMu held); read once the layer is frozen.
	inline map[uint32]int64
}

func newMemtable() *memtable {
	m := new(memtable)
	for i := range m.lists {
		m.lists[i].head.more = new([maxHeight - inlineHeight]atomic.Pointer[node])
	}
	return m
}

// put adds a version of key (committer only). key and val must never change.
func (m *memtable) put(b int, key, val []byte, seq uint64, del bool) {
	m.lists[b].put(key, val, seq, del)
	m.bytes.Add(int64(len(key) + len(val) + nodeOverhead))
	m.ops.Add(1)
}

// addInline notes blocks that a record of this layer carries inline.
func (m *memtable) addInline(blocks []inlineBlock) {
	if m.inline == nil {
		m.inline = make(map[uint32]int64)
	}
	var n int64
	for i := range blocks {
		l := blocks[i].l
		m.inline[l.seg] = max(m.inline[l.seg], l.end())
		n += int64(l.n)
	}
	m.bytes.Add(n) // the layer keeps the record, block bytes included
}

const (
	maxHeight    = 12  // ample for millions of keys with branching factor 4
	inlineHeight = 4   // levels kept in the node itself: 255 nodes in 256
	nodeOverhead = 128 // node struct (its size class), roughly
)

// node is one version of a key. Only its links change after publication.
// The lowest levels' links are part of the node, so a step along them
// touches one object, not the node and then its tower (a cache miss
// less per step, an allocation less per insert); and the key's first 16
// bytes are copied in as two words, which settle most comparisons
// without reading the key (an object's id, a directory and the start of
// a name).
type node struct {
	// A step reads the links, the key's words and seq: one 64-byte
	// cache line.
	next   [inlineHeight]atomic.Pointer[node]
	ka, kb uint64 // keyWords(key)
	seq    uint64
	key    []byte
	val    []byte
	more   *[maxHeight - inlineHeight]atomic.Pointer[node] // tall nodes only
	del    bool
}

// link returns the node's link on level i.
func (n *node) link(i int) *atomic.Pointer[node] {
	if i < inlineHeight {
		return &n.next[i]
	}
	return &n.more[i-inlineHeight]
}

// keyWords returns key's first 16 bytes, zero-padded, as two big-endian
// words. Keys whose words differ are in the words' order (a shorter key
// padded with zeros is a prefix of the other up to where they differ);
// keys whose words are equal must be compared whole.
func keyWords(key []byte) (a, b uint64) {
	if len(key) >= 16 {
		return binary.BigEndian.Uint64(key), binary.BigEndian.Uint64(key[8:])
	}
	var buf [16]byte
	copy(buf[:], key)
	return binary.BigEndian.Uint64(buf[:]), binary.BigEndian.Uint64(buf[8:])
}

// skiplist orders nodes by key ascending, then sequence number descending
// (so the newest version of a key comes first).
type skiplist struct {
	head   node
	height atomic.Int32
}

// pos is a position sought: a key (with its words) and a sequence number.
type pos struct {
	key    []byte
	ka, kb uint64
	seq    uint64
}

func posOf(key []byte, seq uint64) pos {
	a, b := keyWords(key)
	return pos{key: key, ka: a, kb: b, seq: seq}
}

// cmpNode compares n with the position p.
func cmpNode(n *node, p *pos) int {
	if n.ka != p.ka {
		return cmp.Compare(n.ka, p.ka)
	}
	if n.kb != p.kb {
		return cmp.Compare(n.kb, p.kb)
	}
	var c int
	if len(n.key) > 16 || len(p.key) > 16 {
		c = bytes.Compare(n.key, p.key)
	} else { // equal words: equal keys, or one is a prefix of the other
		c = cmp.Compare(len(n.key), len(p.key))
	}
	return cmp.Or(c, cmp.Compare(p.seq, n.seq)) // then newest first
}

// seek returns the first node at or after (key, seq), recording the last
// node before it on every level in prev if prev is not nil.
func (l *skiplist) seek(key []byte, seq uint64, prev *[maxHeight]*node) *node {
	p := posOf(key, seq)
	x, n := &l.head, (*node)(nil)
	for i := int(l.height.Load()) - 1; i >= 0; i-- {
		for {
			// Return the node compared, not a reload of x.next: the writer
			// may have inserted a newer version in between.
			if n = x.link(i).Load(); n == nil || cmpNode(n, &p) >= 0 {
				break
			}
			x = n
		}
		if prev != nil {
			prev[i] = x
		}
	}
	return n
}

// overlayGet returns the newest version of key in bucket b visible at
// seq in layers (newest layer first), or nil when they do not hold it.
func overlayGet(layers [2]*memtable, b int, key []byte, seq uint64) *node {
	for _, m := range layers {
		if m == nil {
			break
		}
		if n := m.lists[b].get(key, seq); n != nil {
			return n
		}
	}
	return nil
}

// get returns the newest version of key visible at seq, or nil.
func (l *skiplist) get(key []byte, seq uint64) *node {
	if n := l.seek(key, seq, nil); n != nil && bytes.Equal(n.key, key) {
		return n
	}
	return nil
}

func (l *skiplist) put(key, val []byte, seq uint64, del bool) {
	var prev [maxHeight]*node
	for i := range prev {
		prev[i] = &l.head
	}
	n := l.seek(key, seq, &prev)
	if n != nil && n.seq == seq && bytes.Equal(n.key, key) {
		// The same key twice in one record. Readers never look at the value
		// of a version newer than their snapshot, and seq is not yet
		// published, so it can be replaced in place.
		n.val, n.del = val, del
		return
	}
	h := 1
	for h < maxHeight && rand.Uint32()&3 == 0 {
		h++
	}
	if h > int(l.height.Load()) {
		l.height.Store(int32(h)) // new levels start at head (prev default)
	}
	nn := &node{key: key, val: val, seq: seq, del: del}
	nn.ka, nn.kb = keyWords(key)
	if h > inlineHeight {
		nn.more = new([maxHeight - inlineHeight]atomic.Pointer[node])
	}
	for i := range h { // bottom up, so a node is in level 0 before any index level
		nn.link(i).Store(prev[i].link(i).Load())
		prev[i].link(i).Store(nn)
	}
}

// memIter walks the newest version visible at seq of each key, in order.
type memIter struct {
	l   *skiplist
	n   *node // nil when exhausted
	seq uint64
}

func (l *skiplist) iter(key []byte, seq uint64) memIter {
	it := memIter{l: l, n: l.seek(key, seq, nil), seq: seq}
	it.settle()
	return it
}

// all iterates the newest version of every key.
func (l *skiplist) all() memIter { return l.iter(nil, math.MaxUint64) }

// settle skips versions newer than the snapshot. Versions of one key are
// newest first, so the first visible one is the one to use.
func (it *memIter) settle() {
	for it.n != nil && it.n.seq > it.seq {
		it.n = it.n.next[0].Load()
	}
}

// next moves to the next key. A hot key (a directory, a shared block's
// reference count) can have thousands of versions: after a few steps, seek
// past them all (sequence numbers start at 1, so (key, 0) follows them).
func (it *memIter) next() {
	k := it.n.key
	for range 4 {
		if it.n = it.n.next[0].Load(); it.n == nil || !bytes.Equal(it.n.key, k) {
			it.settle()
			return
		}
	}
	it.n = it.l.seek(k, 0, nil)
	it.settle()
}
