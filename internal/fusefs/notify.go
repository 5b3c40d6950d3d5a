package fusefs

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// notifyWait bounds how long a revocation waits for the kernel before it is
// acknowledged (attribute invalidation takes no lock a request could hold,
// so this is only a guard).
const notifyWait = 50 * time.Millisecond

// inodes tracks the kernel-visible inodes of each object (the plain view
// and any cue views), so that a revoked lease reaches all of them, and
// what the kernel may hold of each inode number.
type inodes struct {
	byID  map[oid.ID]map[*node]struct{}
	byIno map[uint64]*kernelState
}

// kernelState is what the kernel may hold of one inode number. It is
// shared by every node of that number: go-fuse keeps the first node it
// registered for a number, and a lookup that made another (a second name
// of a file, a race) hands the kernel attributes for the same inode.
type kernelState struct {
	// until (Unix ns) is when the attributes last handed to the kernel
	// with a timeout expire there, plus slack; a revocation tells the
	// kernel only before then.
	until atomic.Int64
	// changedAt (Unix ns) is when the object last changed, as far as
	// this mount knows (a revocation, or a create or link here).
	changedAt atomic.Int64
	refs      int // tracked nodes of this number (under root.mu)
}

// garbageAfter is how long a node go-fuse never registered (or that the
// kernel forgot without telling) stays tracked: a registration completes
// within the lookup that made the node.
const garbageAfter = time.Minute

// track records n as an inode of its object and gives it its number's
// kernel state.
func (r *root) track(n *node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.inodes.byID[n.id]
	if set == nil {
		set = map[*node]struct{}{}
		r.inodes.byID[n.id] = set
	}
	if _, ok := set[n]; ok {
		return
	}
	set[n] = struct{}{}
	n.ino = n.StableAttr().Ino // the root's is 0 here (not yet mounted): it is alone anyway
	k := r.inodes.byIno[n.ino]
	if k == nil {
		k = &kernelState{}
		r.inodes.byIno[n.ino] = k
	}
	k.refs++
	n.kernel = k
	n.born = time.Now()
}

// untrackLocked forgets n.
func (r *root) untrackLocked(n *node) {
	set := r.inodes.byID[n.id]
	if _, ok := set[n]; !ok {
		return
	}
	delete(set, n)
	if len(set) == 0 {
		delete(r.inodes.byID, n.id)
	}
	if k := r.inodes.byIno[n.ino]; k == n.kernel {
		if k.refs--; k.refs == 0 {
			delete(r.inodes.byIno, n.ino)
		}
	}
}

// OnForget implements fs.NodeOnForgetter: the kernel forgot the inode.
func (n *node) OnForget() {
	n.root.mu.Lock()
	defer n.root.mu.Unlock()
	n.root.untrackLocked(n)
}

// revoked invalidates the kernel's cached attributes and names of ids
// because the core's leases on them were revoked (or what it cached of
// them dropped), so the kernel never serves what the core would not;
// inodes whose attributes the kernel cannot hold (none handed out, or
// expired) cost no notification, which a one-host tar -x otherwise paid
// several times per file (docs/BENCHMARKS.md). Attributes are dropped
// per inode and names all at once (names.go): dropping pages or single
// names makes the kernel wait for locks that a request of this mount may
// hold while it waits for the very update being revoked, and a mount
// killed then stays unkillable (we saw it: kill -9 of wheelfs up left it
// in D state). Pages are kept at open only when the version is unchanged.
func (r *root) revoked(ctx context.Context, ids []oid.ID) {
	r.namesChanged(ids)
	r.invalidate(ids, syscallInodes(ctx))
}

type syscallInodesKey struct{}

// withSyscallInodes marks ctx as the request of a system call that went
// through inodes inos, whose attributes the kernel invalidates itself
// when the call succeeds (an unlink's victim: fuse_entry_unlinked): the
// core's dropping them after the call's own change needs no notification
// there, only at the object's other inodes (other cue sets).
func withSyscallInodes(ctx context.Context, inos ...uint64) context.Context {
	return context.WithValue(ctx, syscallInodesKey{}, inos)
}

func syscallInodes(ctx context.Context) []uint64 {
	inos, _ := ctx.Value(syscallInodesKey{}).([]uint64)
	return inos
}

// changedHere tells the kernel of a change this mount made in directory
// dir (to its entry for child, if not nil) that the core adopted instead
// of having its leases revoked (client/own.go): the kernel invalidated
// the attributes of the inodes the system call went through itself, but
// not those of the same objects seen through other cue sets.
func (r *root) changedHere(dir, child *node) {
	ids := []oid.ID{dir.id}
	skip := []uint64{dir.ino}
	r.mu.Lock()
	views := len(r.inodes.byID[dir.id])
	r.mu.Unlock()
	if views > 1 {
		// The kernel changed the names of the view the call went
		// through, not those of the others.
		r.namesChanged(ids)
	}
	if child != nil {
		ids, skip = append(ids, child.id), append(skip, child.ino)
	}
	r.invalidate(ids, skip)
}

// invalidate drops the kernel's attributes of every inode of ids but the
// numbers in skip, where it may hold them, and marks them changed.
func (r *root) invalidate(ids []oid.ID, skip []uint64) {
	now := time.Now()
	type held struct {
		n     *node
		until int64
	}
	var nodes []held
	r.mu.Lock()
	for _, id := range ids {
		for n := range r.inodes.byID[id] {
			if now.Sub(n.born) > garbageAfter && !n.IsRoot() && n.Forgotten() {
				r.untrackLocked(n) // never registered, or forgotten unannounced
				continue
			}
			if slices.Contains(skip, n.ino) {
				continue
			}
			k := n.kernel
			k.changedAt.Store(now.UnixNano())
			// Only where the kernel may hold attributes: after a
			// notification it holds none until a reply gives it some.
			if until := k.until.Load(); until > now.UnixNano() {
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
			h.n.kernel.until.CompareAndSwap(h.until, 0) // unless a reply gave more since
		}
	}()
	select {
	case <-done:
	case <-time.After(notifyWait):
	}
}

var _ fs.NodeOnForgetter = (*node)(nil)
