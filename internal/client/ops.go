package client

import (
	"math/rand/v2"
	"sync"

	"github.com/wheelfs/wheelfs/internal/wire"
)

// opSeq numbers this client core's mutations for exactly-once execution
// at the servers (server/once.go): every retry of an operation carries
// the same (session, seq), and done_below tells the servers which
// answers the client no longer needs.
type opSeq struct {
	session uint64 // random per client core: a restarted client starts afresh

	mu   sync.Mutex
	next uint64
	live map[uint64]struct{} // operations not answered yet
}

func newOpSeq() *opSeq {
	return &opSeq{session: rand.Uint64() | 1, live: map[uint64]struct{}{}}
}

// stamp gives c's operation the next number and returns the function
// that marks it answered (call it once the operation, retries included,
// has ended).
func (o *opSeq) stamp(c *wire.Caller) (done func()) {
	if c == nil {
		return func() {}
	}
	o.mu.Lock()
	o.next++
	seq := o.next
	o.live[seq] = struct{}{}
	low := seq
	for s := range o.live {
		low = min(low, s)
	}
	o.mu.Unlock()
	c.Op = &wire.OpRef{Session: o.session, Seq: seq, DoneBelow: low}
	return func() {
		o.mu.Lock()
		delete(o.live, seq)
		o.mu.Unlock()
	}
}
