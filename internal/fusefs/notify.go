package fusefs

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// notifyWait bounds how long a revocation waits for the kernel to drop
// its caches before it is acknowledged. The kernel takes a directory's
// lock to drop a name, and a request of this mount in that directory may
// hold it while it waits for the very update that is revoking the lease;
// past this bound the invalidation finishes on its own.
const notifyWait = 50 * time.Millisecond

// inodes tracks the kernel-visible inodes of each object (the plain view
// and any cue views), so that a revoked lease reaches all of them.
type inodes struct {
	byID map[oid.ID]map[*node]struct{}
}

// track records n as an inode of its object.
func (r *root) track(n *node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.inodes.byID[n.id]
	if set == nil {
		set = map[*node]struct{}{}
		r.inodes.byID[n.id] = set
	}
	set[n] = struct{}{}
}

// OnForget implements fs.NodeOnForgetter: the kernel forgot the inode.
func (n *node) OnForget() {
	r := n.root
	r.mu.Lock()
	defer r.mu.Unlock()
	if set := r.inodes.byID[n.id]; set != nil {
		delete(set, n)
		if len(set) == 0 {
			delete(r.inodes.byID, n.id)
		}
	}
}

// revoked invalidates what the kernel caches of ids (their attributes and
// pages, and the names in them when they are directories) because the
// core's leases on them were revoked: the kernel never serves what the
// core would not.
func (r *root) revoked(ids []oid.ID) {
	r.mu.Lock()
	var nodes []*node
	for _, id := range ids {
		for n := range r.inodes.byID[id] {
			nodes = append(nodes, n)
		}
	}
	r.mu.Unlock()
	if len(nodes) == 0 {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, n := range nodes {
			ino := n.EmbeddedInode()
			ino.NotifyContent(0, 0)
			if !ino.IsDir() {
				continue
			}
			for name := range ino.Children() {
				ino.NotifyEntry(name)
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(notifyWait):
	}
}

var _ fs.NodeOnForgetter = (*node)(nil)
