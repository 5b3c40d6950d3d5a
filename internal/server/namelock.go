package server

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/wheelfs/wheelfs/internal/fserr"
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
	ch    chan struct{} // holds a token while locked; a channel so that waiting can end with ctx
	users int
}

func nameKey(dir oid.ID, name string) string {
	var buf [keyBuf]byte
	b := append(appendHex(buf[:0], uint64(dir), 16), '/')
	return string(append(b, name...))
}

// lock takes the locks of the given entries (in a fixed order, so two
// callers never wait for each other) and returns their release. It fails
// with fserr.ErrTimeout, holding none, if ctx ends first: the holder may
// be a change waiting for backups that are cut off.
func (n *nameLocks) lock(ctx context.Context, keys ...string) (unlock func(), err error) {
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*nameLock, 0, len(keys))
	release := func() {
		for i, l := range held {
			<-l.ch
			n.mu.Lock()
			if l.users--; l.users == 0 {
				delete(n.locks, keys[i])
			}
			n.mu.Unlock()
		}
	}
	for _, k := range keys {
		n.mu.Lock()
		if n.locks == nil {
			n.locks = map[string]*nameLock{}
		}
		l := n.locks[k]
		if l == nil {
			l = &nameLock{ch: make(chan struct{}, 1)}
			n.locks[k] = l
		}
		l.users++
		n.mu.Unlock()
		select {
		case l.ch <- struct{}{}:
			held = append(held, l)
		case <-ctx.Done():
			n.mu.Lock()
			if l.users--; l.users == 0 {
				delete(n.locks, k)
			}
			n.mu.Unlock()
			release()
			return nil, fmt.Errorf("waiting for another operation on %q: %w", k, fserr.ErrTimeout)
		}
	}
	return release, nil
}
