package server

import (
	"fmt"
	"slices"
	"sync"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// nameLocks serializes the operations on one directory entry whose steps
// span servers (a remove of a remotely placed object drops its link there,
// then the name here): a rename of the same name waits, instead of moving
// a name whose object is being deleted (which left it dangling).
type nameLocks struct {
	mu    sync.Mutex
	locks map[string]*nameLock
}

type nameLock struct {
	mu    sync.Mutex
	users int
}

func nameKey(dir oid.ID, name string) string { return fmt.Sprintf("%016x/%s", uint64(dir), name) }

// lock takes the locks of the given entries (in a fixed order, so two
// callers never wait for each other) and returns their release.
func (n *nameLocks) lock(keys ...string) (unlock func()) {
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*nameLock, 0, len(keys))
	for _, k := range keys {
		n.mu.Lock()
		if n.locks == nil {
			n.locks = map[string]*nameLock{}
		}
		l := n.locks[k]
		if l == nil {
			l = &nameLock{}
			n.locks[k] = l
		}
		l.users++
		n.mu.Unlock()
		l.mu.Lock()
		held = append(held, l)
	}
	return func() {
		for i, l := range held {
			l.mu.Unlock()
			n.mu.Lock()
			if l.users--; l.users == 0 {
				delete(n.locks, keys[i])
			}
			n.mu.Unlock()
		}
	}
}
