package fusefs

import (
	"context"
	"encoding/binary"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// maxEntryTimeout bounds how long the kernel keeps a name (less when the
// core's lease on its directory ends sooner).
const maxEntryTimeout = 10 * time.Second

// notifyIncEpoch is FUSE_NOTIFY_INC_EPOCH (protocol 7.44, Linux 6.16):
// every name the kernel holds is looked up again before its next use.
const notifyIncEpoch = 8

// kernelNames lets the kernel keep names (dentries) while the core holds
// a lease on their directory, and takes them all back with one epoch
// notification when such a lease is revoked. Invalidating one name
// instead takes the directory's lock in the kernel, which a request of
// this mount may hold while it waits for the very change being revoked
// (and a mount killed then stays unkillable); the epoch takes no lock. A
// lookup the kernel began before an epoch ends with a name already
// invalid, so a reply built before a revocation cannot outlive it.
//
// Without it (not root, or a kernel before 6.16) the entry timeout is 0
// and every lookup reaches the core.
type kernelNames struct {
	mu sync.Mutex
	fd int // a duplicate of the mount's /dev/fuse descriptor; -1 once closed
	// dirs holds, for each directory whose names were handed to the
	// kernel with a timeout, when the last of them expires there (Unix
	// ns, slack included). A revocation of any of them costs an epoch,
	// which takes back every name, so it empties the map.
	dirs   map[oid.ID]int64
	epochs uint64 // notifications sent
}

// newKernelNames returns the name cache on the mount's descriptor fd, or
// nil when the kernel cannot take names back.
func newKernelNames(fd int, minor uint32) *kernelNames {
	if fd < 0 || minor < 44 {
		return nil
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil
	}
	unix.CloseOnExec(dup)
	k := &kernelNames{fd: dup, dirs: map[oid.ID]int64{}}
	if !k.bump() {
		k.close()
		return nil
	}
	return k
}

// hold records that the kernel may keep names of dir until now+t (plus
// slack). It is called before the lease is read, with the longest t, so
// that a revocation after the read finds the record.
func (k *kernelNames) hold(dir oid.ID, now time.Time) {
	until := now.Add(maxEntryTimeout + replySlack).UnixNano()
	k.mu.Lock()
	if k.dirs[dir] < until {
		k.dirs[dir] = until
	}
	if len(k.dirs) > 1<<16 {
		for id, u := range k.dirs {
			if u < now.UnixNano() {
				delete(k.dirs, id)
			}
		}
	}
	k.mu.Unlock()
}

// changed takes every name back from the kernel if it may hold names of
// any of ids; false if it may and could not.
func (k *kernelNames) changed(ids []oid.ID) bool {
	now := time.Now().UnixNano()
	k.mu.Lock()
	defer k.mu.Unlock()
	held := false
	for _, id := range ids {
		if k.dirs[id] > now {
			held = true
			break
		}
	}
	if !held {
		return true
	}
	if !k.bumpLocked() {
		return k.fd < 0 // unmounted: nothing is kept
	}
	clear(k.dirs)
	return true
}

func (k *kernelNames) bump() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.bumpLocked()
}

// bumpLocked sends the epoch notification: a bare out header with
// unique 0 and the notification code as its error.
func (k *kernelNames) bumpLocked() bool {
	if k.fd < 0 {
		return false
	}
	var hdr [16]byte
	binary.LittleEndian.PutUint32(hdr[0:], uint32(len(hdr)))
	binary.LittleEndian.PutUint32(hdr[4:], notifyIncEpoch)
	if _, err := unix.Write(k.fd, hdr[:]); err != nil {
		return false
	}
	k.epochs++
	return true
}

// close stops the notifications (the mount ended).
func (k *kernelNames) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fd >= 0 {
		unix.Close(k.fd)
		k.fd = -1
	}
}

// entryTimeout is how long the kernel may keep a name in dir from the
// reply being built: while the core's lease on dir lasts, nothing if it
// was revoked since the request began (its answer may predate that),
// and nothing in .EventualConsistency views, whose answers may come from
// a backup, older than what the lease covers. own says the reply is to
// this mount's own change, which the core adopted into what it caches
// (that change ended the request's mark, so it is not checked).
func (r *root) entryTimeout(ctx context.Context, dir *node, own bool) time.Duration {
	k := r.names.Load()
	if k == nil || dir.cues.EventualConsistency {
		return 0
	}
	k.hold(dir.id, time.Now())
	var left time.Duration
	if own {
		left = r.core.LeaseLeft(dir.id)
	} else {
		mark, ok := ctx.Value(markKey{}).(uint64)
		if !ok {
			mark = 0 // no mark: any revocation on record voids the lease
		}
		left = r.core.LeaseLeftSince(dir.id, mark)
	}
	return min(maxEntryTimeout, left)
}

// namesChanged takes the kernel's names back when it may hold names of
// ids (directories whose leases were revoked, or that changed here).
func (r *root) namesChanged(ids []oid.ID) {
	if k := r.names.Load(); k != nil && !k.changed(ids) {
		r.log.Warn("the kernel may keep names of a changed directory until they time out: epoch notification failed")
	}
}
