package cluster

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
)

// BenchmarkCacheRead reads a 16 MiB file whose primary is at west, from a
// client at west (gRPC on the same machine) and from a client at east
// (100 ms away): cold (every block from the server), then through a
// restarted client core from its disk cache, then again from memory.
// Results are ratios of the same site's cold read in the same run
// (docs/BENCHMARKS.md, "Client block cache").
//
//	go test ./internal/cluster/ -run '^$' -bench CacheRead -benchtime 5x
func BenchmarkCacheRead(b *testing.B) {
	c := Start(b, Options{Sites: []string{"west", "east"}, RTT: UniformRTT(benchRTT)})
	ctx := context.Background()
	data := make([]byte, 16<<20)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if err := c.Client("west").WriteFile(ctx, Owner(), "/.Site=west/bench", data, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, site := range []string{"west", "east"} {
		b.Run("client="+site, func(b *testing.B) {
			cfg := client.NewConfig()
			cfg.Logger = slog.New(slog.DiscardHandler)
			cfg.Site = site
			timeRead := func(fs *client.FS) time.Duration {
				start := time.Now()
				got, err := fs.ReadFile(ctx, Owner(), "/bench")
				if err != nil || len(got) != len(data) {
					b.Fatalf("read: %d bytes, %v", len(got), err)
				}
				return time.Since(start)
			}
			var cold, disk, mem time.Duration
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				cfg.CacheDir = filepath.Join(b.TempDir(), "cache")
				fs := client.New(cfg, c.ClientNode(site).Host().Router)
				cold += timeRead(fs)
				fs.Close() // writes the queued blocks; not part of any read
				fs = client.New(cfg, c.ClientNode(site).Host().Router)
				disk += timeRead(fs)
				mem += timeRead(fs)
				if _, _, _, s := fs.CacheStats(); s.Hits == 0 {
					b.Fatalf("no disk cache hits: %+v", s)
				}
				fs.Close()
			}
			n := float64(b.N)
			b.ReportMetric(float64(cold.Microseconds())/1000/n, "cold-ms")
			b.ReportMetric(float64(disk.Microseconds())/1000/n, "disk-ms")
			b.ReportMetric(float64(mem.Microseconds())/1000/n, "mem-ms")
			b.ReportMetric(float64(disk)/float64(cold), "disk/cold")
			b.ReportMetric(float64(mem)/float64(cold), "mem/cold")
		})
	}
}
