package fusefs

import (
	"context"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/wheelfs/wheelfs/internal/client"
)

// One thread's requests make one path walk: lookups and the kernel's
// revalidation of the starting directory continue it; only the system
// call's own request ends it; a chain longer than any path starts anew.
func TestWalkSteps(t *testing.T) {
	core := client.New(client.NewConfig(), nil) // no server: walks only take its revocation mark
	defer core.Close()
	r := &root{core: core, walks: map[uint32]walk{}}
	ctx := fuse.NewContext(context.Background(), &fuse.Caller{Pid: 7})
	run := func(kind stepKind) {
		_, done := r.stepAs(ctx, kind)
		done()
	}
	startOf := func() (walk, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		w, ok := r.walks[7]
		return w, ok
	}
	run(stepRevalidate)
	first, ok := startOf()
	if !ok {
		t.Fatal("a revalidation ended or did not start the walk")
	}
	run(stepLookup)
	run(stepRevalidate)
	if w, _ := startOf(); w.start != first.start || w.steps != 3 {
		t.Fatalf("walk after revalidate, lookup, revalidate: %+v, want start %v and 3 steps", w, first.start)
	}
	run(stepFinal)
	if _, ok := startOf(); ok {
		t.Fatal("the final request did not end the walk")
	}
	run(stepLookup)
	w, _ := startOf()
	for range maxWalkSteps {
		run(stepLookup)
	}
	if got, _ := startOf(); got.start == w.start {
		t.Fatalf("a chain of %d lookups is still one walk", maxWalkSteps+1)
	}
}
