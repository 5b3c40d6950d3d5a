package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/server"
	"github.com/wheelfs/wheelfs/internal/wire"
)

const (
	testRate  = 20
	testBurst = 10
	testWait  = 20 * time.Millisecond
)

func limitedRig(t *testing.T) *rig {
	return startRig(t, func(c *deploy.Config) {
		c.TrustClientUIDs = true
		c.Server.RateLimit = server.RateLimit{Rate: testRate, Burst: testBurst, Wait: testWait}
	})
}

// TestRateLimitPerClient floods a server from one client node: the
// flooder gets no more than its bucket allows and is refused with EAGAIN
// beyond, while another client node's requests complete at once, and a
// server's Peer calls are not limited.
func TestRateLimitPerClient(t *testing.T) {
	r := limitedRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	flooder := wire.NewStorageClient(r.dial(t, "flooder"))
	other := wire.NewStorageClient(r.dial(t, "other"))
	getattr := &wire.GetAttrRequest{Caller: &wire.Caller{}, Id: uint64(oid.Root)}

	var ok, refused atomic.Int64
	var wrong atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := flooder.GetAttr(ctx, getattr)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(fserr.FromStatus(err), fserr.ErrAgain):
					refused.Add(1)
				default:
					wrong.Store(err)
				}
			}
		})
	}
	// The other client's requests, at its own rate, go through at once
	// while the flood goes on (for a second).
	tick := time.NewTicker(time.Second / testRate)
	defer tick.Stop()
	for i := range testRate {
		<-tick.C
		t0 := time.Now()
		if _, err := other.GetAttr(ctx, getattr); err != nil {
			t.Fatalf("other client's request %d during the flood: %v", i, err)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("other client's request %d took %v during the flood", i, d)
		}
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	if err := wrong.Load(); err != nil {
		t.Fatalf("flooder got %v, want success or EAGAIN", err)
	}
	// A request may wait up to testWait for tokens, so the bucket can have
	// promised that much of the future too.
	limit := testBurst + testRate*(elapsed+testWait).Seconds() + 1
	if n := float64(ok.Load()); n > limit {
		t.Errorf("flooder had %v requests answered in %v, more than its bucket's %v", n, elapsed, limit)
	}
	if refused.Load() == 0 {
		t.Error("flooder never refused")
	}
	t.Logf("flooder: %d answered, %d refused in %v", ok.Load(), refused.Load(), elapsed)

	// Servers' own traffic (the Peer service) is not limited.
	peer := wire.NewPeerClient(r.dialWith(t, r.h.Creds))
	for i := range 5 * testBurst {
		if _, err := peer.Ping(ctx, &wire.PingRequest{}); err != nil {
			t.Fatalf("peer ping %d: %v", i, err)
		}
	}
}

// TestRateLimitedClientCoreRetries runs a client core on a client-only
// node over its rate: every operation succeeds (it retries EAGAIN within
// its time bound), no faster than the bucket allows.
func TestRateLimitedClientCoreRetries(t *testing.T) {
	r := limitedRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := deploy.NewConfig(t.TempDir())
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Roles, cfg.InitCA = deploy.RoleClient, false
	cfg.Etcd, cfg.CADir = r.h.ConfigEndpoints(), r.caDir()
	h, err := deploy.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	const n = 50
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := h.Client.Create(ctx, client.User{}, client.NoCues, oid.Root, fmt.Sprintf("f%d", i), client.CreateArgs{Type: client.TypeFile, Mode: 0o644})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("create over the rate: %v", err)
		}
	}
	if d, least := time.Since(start), time.Duration(float64(n-testBurst)/testRate*float64(time.Second))-testWait; d < least {
		t.Errorf("%d creates in %v, faster than the rate allows (%v)", n, d, least)
	}
}
