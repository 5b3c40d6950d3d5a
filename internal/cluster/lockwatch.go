package cluster

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/server"
)

// lockWatch hears every server's slice lock events (server.Config.OnLock)
// and finds takeovers that came while an earlier holder could still count
// its lock held (its last renewal + L): that holder may still have been
// serving reads and honouring the leases it granted. Every cluster test
// checks it when it ends (issue 16, item 9).
type lockWatch struct {
	mu     sync.Mutex
	events map[oid.Slice][]server.LockEvent
	// denied holders lose their locks at once, by design (Cluster.Deny).
	denied map[string]bool
}

func newLockWatch() *lockWatch {
	return &lockWatch{events: map[oid.Slice][]server.LockEvent{}, denied: map[string]bool{}}
}

func (w *lockWatch) record(e server.LockEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events[e.Slice] = append(w.events[e.Slice], e)
}

func (w *lockWatch) deny(holder string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.denied[holder] = true
}

// takeovers counts locks taken at a new epoch.
func (w *lockWatch) takeovers() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, evs := range w.events {
		seen := map[int64]bool{}
		for _, e := range evs {
			if e.Kind == server.LockTaken && !seen[e.Epoch] {
				seen[e.Epoch] = true
				n++
			}
		}
	}
	return n
}

// violations lists every lock taken at a new epoch before an earlier
// epoch's holder stopped counting its own lock held, unless that holder
// released it first or was denied.
func (w *lockWatch) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for sl, evs := range w.events {
		for _, t := range evs {
			if t.Kind != server.LockTaken {
				continue
			}
			for _, e := range evs {
				if e.Epoch >= t.Epoch || e.Kind == server.LockReleased || !e.Until.After(t.At) || w.denied[e.Holder] {
					continue
				}
				if slices.ContainsFunc(evs, func(r server.LockEvent) bool {
					return r.Kind == server.LockReleased && r.Epoch == e.Epoch && !r.At.After(t.At)
				}) {
					continue
				}
				out = append(out, fmt.Sprintf("slice %d: %s took it (epoch %d) at %s, %v before %s's lock (epoch %d, %s at %s) could have expired",
					sl, t.Holder, t.Epoch, t.At.Format(time.StampMilli), e.Until.Sub(t.At).Round(time.Millisecond),
					e.Holder, e.Epoch, e.Kind, e.At.Format(time.StampMilli)))
				break
			}
		}
	}
	slices.Sort(out)
	return out
}
