// Package blockcache is the client's cache of file blocks, keyed by content
// hash and bounded by bytes: an in-memory LRU, optionally over an on-disk
// LRU that survives restarts. Content addressing makes it coherent for
// free: a block's bytes never change, only which blocks a file version names.
package blockcache

import (
	"container/list"
	"log/slog"
	"sync"
)

// Hash is a block's SHA-256.
type Hash = [32]byte

// Cache is a byte-bounded LRU of blocks in memory, with an optional disk
// tier below it. It is safe for concurrent use.
type Cache struct {
	disk *Disk // nil: memory only

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

// Open returns a cache of memLimit bytes in memory over a disk tier of
// diskLimit bytes in dir (see OpenDisk). Close it to write what is queued.
func Open(memLimit int64, dir string, diskLimit int64, log *slog.Logger) (*Cache, error) {
	d, err := OpenDisk(dir, diskLimit, log)
	if err != nil {
		return nil, err
	}
	c := New(memLimit)
	c.disk = d
	return c, nil
}

// Get returns the cached block from memory, else from the disk tier (and
// then keeps it in memory). Callers must not modify it.
func (c *Cache) Get(h Hash) ([]byte, bool) {
	if b, ok := c.getMem(h); ok || c.disk == nil {
		return b, ok
	}
	b, ok := c.disk.Get(h)
	if ok {
		c.addMem(h, b)
	}
	return b, ok
}

func (c *Cache) getMem(h Hash) ([]byte, bool) {
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

// Contains reports whether h is in memory, without touching the disk tier
// or the LRU order.
func (c *Cache) Contains(h Hash) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.items[h]
	return ok
}

// Add caches data under h in memory and queues it for the disk tier. The
// cache keeps the slice: callers must not modify it afterwards.
func (c *Cache) Add(h Hash, data []byte) { c.AddOwned(0, h, data) }

// AddMemory caches data under h in memory only: for blocks that a server
// in this process keeps on the same disk, where a disk copy would double
// the writes of a cold read and save no round trip.
func (c *Cache) AddMemory(h Hash, data []byte) { c.addMem(h, data) }

// AddOwned is Add on behalf of owner (a file's ID), whose blocks
// ForgetOwner drops; 0 is no owner.
func (c *Cache) AddOwned(owner uint64, h Hash, data []byte) {
	c.addMem(h, data)
	if c.disk != nil {
		c.disk.PutOwned(owner, h, data)
	}
}

// ForgetOwner drops the blocks cached for owner from both tiers: its file
// was deleted, so they will likely never be read again and should not
// hold disk space until the bound or the age limit evicts them. Only the
// disk tier remembers owners (the memory tier is small and turns over).
func (c *Cache) ForgetOwner(owner uint64) {
	if c.disk == nil || owner == 0 {
		return
	}
	hs := c.disk.ForgetOwner(owner)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range hs {
		if e, ok := c.items[h]; ok {
			c.ll.Remove(e)
			delete(c.items, h)
			c.used -= int64(len(e.Value.(*item).data))
		}
	}
}

func (c *Cache) addMem(h Hash, data []byte) {
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

// Stats reports the memory tier's hits, misses and bytes in use (a block
// found on disk counts as a memory miss).
func (c *Cache) Stats() (hits, misses uint64, used int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses, c.used
}

// DiskStats reports the disk tier's counters (zero without one).
func (c *Cache) DiskStats() DiskStats {
	if c.disk == nil {
		return DiskStats{}
	}
	return c.disk.Stats()
}

// Flush waits until the blocks queued for the disk tier are written.
func (c *Cache) Flush() {
	if c.disk != nil {
		c.disk.Flush()
	}
}

// Close writes the blocks queued for the disk tier and stops its writer.
func (c *Cache) Close() error {
	if c.disk == nil {
		return nil
	}
	return c.disk.Close()
}
