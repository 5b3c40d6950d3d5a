package fusefs

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// notifyWait bounds how long a revocation waits for the kernel before it is
// acknowledged (attribute invalidation takes no lock a request could hold,
// so this is only a guard).
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

// revoked invalidates the kernel's cached attributes of ids because the
// core's leases on them were revoked, so the kernel never serves what the
// core would not; inodes whose attributes the kernel cannot hold (none
// handed out, or expired) cost no notification, which a one-host tar -x
// otherwise paid several times per file (docs/BENCHMARKS.md). Only attributes: dropping pages or names makes the kernel
// wait for locks that a request of this mount may hold while it waits for
// the very update being revoked, and a mount killed then stays unkillable
// (we saw it: kill -9 of wheelfs up left it in D state). The kernel keeps
// no names at all (entry timeout 0, answered from the core's leases), and
// its pages are kept at open only when the version is unchanged.
func (r *root) revoked(ids []oid.ID) {
	now := time.Now().UnixNano()
	type held struct {
		n     *node
		until int64
	}
	var nodes []held
	r.mu.Lock()
	for _, id := range ids {
		for n := range r.inodes.byID[id] {
			n.changedAt.Store(now)
			// Only where the kernel may hold attributes: after a
			// notification it holds none until a reply gives it some.
			if until := n.kernelUntil.Load(); until > now {
				nodes = append(nodes, held{n, until})
			}
		}
	}
	r.mu.Unlock()
	if len(nodes) == 0 {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, h := range nodes {
			h.n.EmbeddedInode().NotifyContent(-1, 0)
			h.n.kernelUntil.CompareAndSwap(h.until, 0) // unless a reply gave more since
		}
	}()
	select {
	case <-done:
	case <-time.After(notifyWait):
	}
}

var _ fs.NodeOnForgetter = (*node)(nil)
