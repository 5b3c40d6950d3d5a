package cluster

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/deploy"
)

// TestLargeWriteOverSlowUplink: a write larger than the uplink carries
// in one peer timeout still reaches every replica. Replication used to
// send up to 8 MiB per call, each bounded by the peer timeout, and retry
// the same call for ever; calls are now sized by the rate each link
// showed.
func TestLargeWriteOverSlowUplink(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	c := Start(t, Options{Sites: []string{"west", "east", "eu"},
		RTT:       UniformRTT(40 * time.Millisecond),
		Bandwidth: map[string]int64{"east": 512 << 10},
		// One call may last 1 s: 1 MiB to two backups through east's
		// uplink takes 4 s.
		Adjust: func(n *Node, cfg *deploy.Config) { cfg.Server.PeerTimeout = time.Second },
	})
	ctx := opCtx(t)
	east := c.Servers("east")[0].Client()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	began := time.Now()
	if err := east.WriteFile(ctx, Owner(), "/big", data, 0o644); err != nil {
		t.Fatalf("write of %d bytes at east (replicated at close): %v after %v", size, err, time.Since(began))
	}
	t.Logf("1 MiB written and replicated to two backups over a 512 KiB/s uplink in %v", time.Since(began))
	west := c.Servers("west")[0].Client()
	got, err := west.ReadFile(ctx, Owner(), "/big")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("west reads /big: %d bytes, %v", len(got), err)
	}
}
