package cluster

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// Benchmarks of replication over a wide area (issue 3; docs/BENCHMARKS.md).
// The baseline is the emulated link itself: results are reported in
// milliseconds and in round trips of the inter-site RTT.
//
//	go test ./internal/cluster/ -run '^$' -bench 'ReplicatedClose|Failover' -benchtime 20x

const benchRTT = 100 * time.Millisecond

// BenchmarkReplicatedClose measures close() of a 64 KiB file written by a
// client at the primary's site, for SyncLevel 1–3 with the three replicas
// on 1, 2 or 3 sites (.RepSites), at 100 ms between sites.
func BenchmarkReplicatedClose(b *testing.B) {
	c := Start(b, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 3, RTT: UniformRTT(benchRTT)})
	ctx := context.Background()
	fs := c.Client("west")
	data := make([]byte, 64<<10)
	for sites := 1; sites <= 3; sites++ {
		dir := fmt.Sprintf("/.RepSites=%d/.RepLevel=3/s%d", sites, sites)
		if _, err := fs.Mkdir(ctx, Owner(), dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for sync := 1; sync <= 3; sync++ {
			path := fmt.Sprintf("/.RepSites=%d/.RepLevel=3/.SyncLevel=%d/s%d/f%d", sites, sync, sites, sync)
			if err := fs.WriteFile(ctx, Owner(), path, data, 0o644); err != nil {
				b.Fatal(err)
			}
			r, err := fs.Resolve(ctx, Owner(), path)
			if err != nil {
				b.Fatal(err)
			}
			in, err := fs.Info(ctx, Owner(), r.Cues, oid.ID(r.Meta.Id))
			if err != nil {
				b.Fatal(err)
			}
			if got := len(replicaSites(in)); got != sites || in.Primary.Site != "west" {
				b.Fatalf("%s: replicas %+v, want 3 over %d sites with the primary at west", path, in.Replicas, sites)
			}
			b.Run(fmt.Sprintf("sites=%d/sync=%d", sites, sync), func(b *testing.B) {
				var total time.Duration
				for i := 0; i < b.N; i++ {
					h, _, err := fs.Open(ctx, Owner(), r.Cues, oid.ID(r.Meta.Id), syscall.O_WRONLY)
					if err != nil {
						b.Fatal(err)
					}
					data[0] = byte(i) // a new block every time
					if _, err := h.Write(ctx, data, 0); err != nil {
						b.Fatal(err)
					}
					began := time.Now()
					if err := h.Flush(ctx); err != nil {
						b.Fatal(err)
					}
					total += time.Since(began)
					h.Release(ctx)
				}
				per := total / time.Duration(b.N)
				b.ReportMetric(float64(per.Microseconds())/1000, "ms/close")
				b.ReportMetric(float64(per)/float64(benchRTT), "RTTs/close")
			})
		}
	}
}

// BenchmarkFailover measures, for lock lengths L of 2, 4 and 8 s, the time
// from a primary's crash until a client at another site has a write to the
// slice acknowledged again (the slice is writable), at 100 ms between sites.
func BenchmarkFailover(b *testing.B) {
	for _, l := range []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second} {
		b.Run(fmt.Sprintf("L=%v", l), func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				c := Start(b, Options{Sites: []string{"west", "east", "eu"}, RTT: UniformRTT(benchRTT), LockTTL: l,
					ClientTimeout: 10 * l})
				ctx := context.Background()
				if err := c.Client("west").WriteFile(ctx, Owner(), "/f", []byte("v1"), 0o644); err != nil {
					b.Fatal(err)
				}
				p, err := c.PrimaryOf(ctx, c.Client("east"), "/f")
				if err != nil {
					b.Fatal(err)
				}
				// Let the replicas settle (three replicas, renewed lock).
				c.WaitFor(30*time.Second, "healthy", func() error { return slicesHealthy(ctx, c) })
				began := time.Now()
				c.Crash(p)
				if err := c.Client("east").WriteFile(ctx, Owner(), "/f", []byte("v2"), 0o644); err != nil {
					b.Fatal(err)
				}
				total += time.Since(began)
			}
			per := total / time.Duration(b.N)
			b.ReportMetric(per.Seconds(), "s/failover")
			b.ReportMetric(per.Seconds()/l.Seconds(), "L/failover")
		})
	}
}

// BenchmarkLeasedRead measures reading a 64 KiB file that a client at
// another site (100 ms away) has read before: open by path, read, close,
// with meta-data leases (issue 4) and without (every lookup and open asks
// the primary, as before leases).
//
//	go test ./internal/cluster/ -run '^$' -bench LeasedRead -benchtime 20x
func BenchmarkLeasedRead(b *testing.B) {
	c := Start(b, Options{RTT: UniformRTT(benchRTT)})
	ctx := context.Background()
	if _, err := c.Client("west").Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		b.Fatal(err)
	}
	if err := c.Client("west").WriteFile(ctx, Owner(), "/d/page", make([]byte, 64<<10), 0o644); err != nil {
		b.Fatal(err)
	}
	east := c.ClientNode("east").host
	for _, leases := range []bool{true, false} {
		cfg := client.NewConfig()
		cfg.Logger = c.opts.Logger
		cfg.Site = "east"
		cfg.NoLeases = !leases
		fs := client.New(cfg, east.Router)
		b.Cleanup(func() { fs.Close() })
		for range 2 { // the first read opens the back channels
			if _, err := fs.ReadFile(ctx, Owner(), "/d/page"); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("leases=%v", leases), func(b *testing.B) {
			began := time.Now()
			for i := 0; i < b.N; i++ {
				if _, err := fs.ReadFile(ctx, Owner(), "/d/page"); err != nil {
					b.Fatal(err)
				}
			}
			per := time.Since(began) / time.Duration(b.N)
			b.ReportMetric(float64(per)/float64(benchRTT), "RTTs/op")
		})
	}
}
