package fusefs

import (
	"context"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/wheelfs/wheelfs/internal/client"
)

// walkGap is the longest pause between two requests of one thread that
// still counts as one system call's path walk.
const walkGap = 20 * time.Millisecond

// maxWalkSteps ends a walk that chains more requests than any path has
// components: a thread issuing lookups back to back (stat of many files)
// must not have its later calls counted from the first one's start.
const maxWalkSteps = 256

// stepKind says how a request takes part in a system call's path walk.
type stepKind int

const (
	stepLookup stepKind = iota // a component of the walk: starts or continues it
	stepFinal                  // the system call's own request: ends the walk
	// stepRevalidate is the kernel checking a directory's attributes
	// before or during a walk (the mount root or working directory it
	// starts from): it starts or continues the walk but never ends it,
	// so the request that follows keeps the call's bound.
	stepRevalidate
)

// walk is a path walk in progress on one thread: the lookups of a system
// call (open, stat, create...) and its final request.
type walk struct {
	start time.Time // when the system call's first request arrived
	last  time.Time // when its latest request ended
	steps int
}

// step starts serving one request of the calling thread. The kernel turns
// open("/a/b/c") into LOOKUP a, b, c and OPEN; .MaxTime bounds the whole
// system call (paper §4.5), so a request that follows a lookup of the same
// thread within walkGap gets the time that is left of the walk's limit
// (client.WithStart). final ends the walk. done records the request's end.
// The request's cancellation is dropped (see detach).
func (r *root) step(ctx context.Context, final bool) (context.Context, func()) {
	if final {
		return r.stepAs(ctx, stepFinal)
	}
	return r.stepAs(ctx, stepLookup)
}

// endWalk forgets the calling thread's walk: its system call failed.
func (r *root) endWalk(ctx context.Context) {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return
	}
	r.mu.Lock()
	delete(r.walks, c.Pid)
	r.mu.Unlock()
}

// stepAs is step for a request of the given kind.
func (r *root) stepAs(ctx context.Context, kind stepKind) (context.Context, func()) {
	final := kind == stepFinal
	// Before anything is read for this request: see root.attrTimeout.
	ctx = context.WithValue(detach(ctx), markKey{}, r.core.RevocationMark())
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return ctx, func() {}
	}
	tid := c.Pid // the kernel's task ID: one per thread
	now := time.Now()
	r.mu.Lock()
	w, ok := r.walks[tid]
	if !ok || now.Sub(w.last) > walkGap || w.steps >= maxWalkSteps {
		w = walk{start: now}
	}
	w.steps++
	if final {
		delete(r.walks, tid)
	} else if len(r.walks) > 4096 {
		clear(r.walks) // threads that died mid-walk
	}
	r.mu.Unlock()
	return client.WithStart(ctx, w.start), func() {
		if final {
			return
		}
		w.last = time.Now()
		r.mu.Lock()
		r.walks[tid] = w
		r.mu.Unlock()
	}
}
