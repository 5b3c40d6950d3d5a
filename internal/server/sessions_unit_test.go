package server

import (
	"testing"
	"time"
)

// TestSessionOwnersForgetIdle: a binding refuses other nodes; it is
// forgotten once idle for ownerIdle with nothing of the session held
// here, and kept while something is (a stream, an open handle).
func TestSessionOwnersForgetIdle(t *testing.T) {
	held := map[uint64]bool{}
	clock := time.Now()
	o := newSessionOwners(func() map[uint64]bool { return held })
	o.now = func() time.Time { return clock }
	for _, s := range []uint64{1, 2} {
		if err := o.claim("a", s); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.claim("b", 1); err == nil {
		t.Fatal("node b used node a's session")
	}
	if err := o.claim("a", 0); err != nil {
		t.Fatalf("session 0 (none): %v", err)
	}
	held[2] = true
	clock = clock.Add(ownerIdle + time.Second)
	if err := o.claim("b", 1); err != nil {
		t.Fatalf("an idle binding of nothing held was kept: %v", err)
	}
	if err := o.claim("b", 2); err == nil {
		t.Fatal("the binding of a session with something held here was forgotten")
	}
}
