// Package blockcache is the client's in-memory cache of file blocks, keyed by
// content hash and bounded by bytes. Content addressing makes it coherent for
// free: a block's bytes never change, only which blocks a file version names.
package blockcache

import (
	"container/list"
	"sync"
)

// Hash is a block's SHA-256.
type Hash = [32]byte

// Cache is a byte-bounded LRU of blocks. It is safe for concurrent use.
type Cache struct {
	mu    sync.Mutex
	limit int64
	used  int64
	ll    *list.List
	items map[Hash]*list.Element

	hits, misses uint64
}

type item struct {
	hash Hash
	data []byte
}

// New returns a cache that holds at most limit bytes of block data.
func New(limit int64) *Cache {
	return &Cache{limit: limit, ll: list.New(), items: make(map[Hash]*list.Element)}
}

// Get returns the cached block. Callers must not modify it.
func (c *Cache) Get(h Hash) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[h]; ok {
		c.ll.MoveToFront(e)
		c.hits++
		return e.Value.(*item).data, true
	}
	c.misses++
	return nil, false
}

// Add caches data under h. The cache keeps the slice: callers must not
// modify it afterwards.
func (c *Cache) Add(h Hash, data []byte) {
	if int64(len(data)) > c.limit {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[h]; ok {
		c.ll.MoveToFront(e)
		return
	}
	c.items[h] = c.ll.PushFront(&item{hash: h, data: data})
	c.used += int64(len(data))
	for c.used > c.limit {
		last := c.ll.Back()
		it := last.Value.(*item)
		c.ll.Remove(last)
		delete(c.items, it.hash)
		c.used -= int64(len(it.data))
	}
}

// Stats reports hits, misses and bytes in use.
func (c *Cache) Stats() (hits, misses uint64, used int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.used
}
