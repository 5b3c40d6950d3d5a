package cluster

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// hotspotRTT is the wide area of the .Hotspot tests: west–east 40 ms,
// east–eu 80 ms, west–eu 120 ms.
var hotspotRTT = map[[2]string]time.Duration{
	{"west", "east"}: 40 * time.Millisecond,
	{"east", "eu"}:   80 * time.Millisecond,
	{"west", "eu"}:   120 * time.Millisecond,
}

// fastCoords makes the hosts sample, probe and publish often, so that
// coordinates settle in seconds rather than minutes.
func fastCoords(_ *Node, cfg *deploy.Config) {
	cfg.Coord = deploy.CoordConfig{SampleEvery: 50 * time.Millisecond, ProbeEvery: 20 * time.Millisecond,
		PublishEvery: 200 * time.Millisecond}
}

// TestCoordinatesConverge checks that the coordinates the nodes publish
// estimate the configured RTT between every pair of sites (median over
// node pairs) within a third (+5 ms), and keep doing so for two
// seconds. (Vivaldi's own error estimates stay high, 0.5–1.5: they are
// relative errors, dominated by the sub-millisecond pairs within a site.)
func TestCoordinatesConverge(t *testing.T) {
	c := Start(t, Options{RTT: MatrixRTT(hotspotRTT), Adjust: fastCoords})
	ctx := t.Context()
	nodes := len(c.Servers("")) + len(c.Sites()) // a client host per site
	start := time.Now()
	var report string
	var goodSince time.Time
	c.WaitFor(90*time.Second, "coordinates estimate the site RTTs", func() error {
		err := estimatesClose(ctx, c, nodes, &report)
		switch {
		case err != nil:
			goodSince = time.Time{}
			return err
		case goodSince.IsZero():
			goodSince = time.Now()
		}
		if held := time.Since(goodSince); held < 2*time.Second {
			return fmt.Errorf("estimates close for %v only", held)
		}
		return nil
	})
	t.Logf("converged in %v:%s", time.Since(start).Round(time.Millisecond), report)
}

// estimatesClose checks that every node published a coordinate and that
// the median estimate between each pair of sites is close to the
// configured RTT; report describes the estimates.
func estimatesClose(ctx context.Context, c *Cluster, nodes int, report *string) error {
	coords, err := c.etcd.Coords(ctx)
	if err != nil {
		return err
	}
	if len(coords) < nodes {
		return fmt.Errorf("%d of %d nodes published a coordinate", len(coords), nodes)
	}
	est := map[[2]string][]time.Duration{}
	for a, ca := range coords {
		for b, cb := range coords {
			if a < b && ca.Site != cb.Site {
				key := [2]string{min(ca.Site, cb.Site), max(ca.Site, cb.Site)}
				est[key] = append(est[key], netcoord.Estimate(ca.Coord, cb.Coord))
			}
		}
	}
	*report = ""
	for _, nc := range coords {
		*report += fmt.Sprintf(" %s/%s err %.2f;", nc.Site, nc.ID, nc.Coord.Error)
	}
	for pair, real := range hotspotRTT {
		key := [2]string{min(pair[0], pair[1]), max(pair[0], pair[1])}
		ds := est[key]
		if len(ds) == 0 {
			return fmt.Errorf("no estimate for %v", key)
		}
		slices.Sort(ds)
		med := ds[len(ds)/2]
		*report += fmt.Sprintf(" %v: %v (configured %v);", key, med.Round(time.Millisecond/10), real)
		if d := med - real; d > real/3+5*time.Millisecond || -d > real/3+5*time.Millisecond {
			return fmt.Errorf("%v: median estimate %v, configured %v", key, med, real)
		}
	}
	return nil
}

// TestHoldersNearestFirst reads a file with .Hotspot from clients at every
// site and checks that the primary names them as holders, nearest to the
// asker first, and forgets them when the file changes.
func TestHoldersNearestFirst(t *testing.T) {
	c := Start(t, Options{RTT: MatrixRTT(hotspotRTT), Adjust: fastCoords})
	ctx := t.Context()
	// A holder's coordinate is the one it sent with its report, so the
	// reads wait until the coordinates have settled (under a loaded
	// -race run that can take most of a minute).
	nodes := len(c.Servers("")) + len(c.Sites())
	var report string
	c.WaitFor(90*time.Second, "coordinates estimate the site RTTs", func() error {
		return estimatesClose(ctx, c, nodes, &report)
	})
	u := Owner()
	data := bytes.Repeat([]byte("hotspot!"), 4*client.BlockSize/8) // 4 blocks
	if err := c.Client("west").WriteFile(ctx, u, "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Holders: the client hosts of east and eu, and the west server's
	// own client.
	readers := map[string]*client.FS{
		c.ClientNode("east").ID(): c.Client("east"),
		c.ClientNode("eu").ID():   c.Client("eu"),
		c.Servers("west")[0].ID(): c.Servers("west")[0].Client(),
	}
	for id, fs := range readers {
		got, err := fs.ReadFile(ctx, u, "/.Hotspot/f")
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s reads: %v (%d bytes)", id, err, len(got))
		}
	}
	east, eu, west := c.ClientNode("east").ID(), c.ClientNode("eu").ID(), c.Servers("west")[0].ID()
	for _, tc := range []struct {
		asker *client.FS
		site  string
		want  []string
	}{
		{c.Servers("east")[0].Client(), "east", []string{east, west, eu}},
		{c.Servers("eu")[0].Client(), "eu", []string{eu, east, west}},
	} {
		c.WaitFor(90*time.Second, "holders ranked for a reader at "+tc.site, func() error {
			hs, err := holdersOf(ctx, tc.asker, "/.Hotspot/f", 4)
			if err != nil {
				return err
			}
			var got []string
			for _, h := range hs {
				got = append(got, h.Node)
				if len(h.Blocks) != 1 || h.Blocks[0].First != 0 || h.Blocks[0].Count != 4 {
					return fmt.Errorf("holder %s has blocks %v, want 0-3", h.Node, h.Blocks)
				}
			}
			if !slices.Equal(got, tc.want) {
				return fmt.Errorf("holders %v, want %v (sites %s)", hs, tc.want, tc.site)
			}
			return nil
		})
	}
	// A new version: nobody holds it yet.
	if err := c.Client("west").WriteFile(ctx, u, "/f", append(data, 'x'), 0o644); err != nil {
		t.Fatal(err)
	}
	hs, err := holdersOf(ctx, c.Servers("east")[0].Client(), "/.Hotspot/f", 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 0 {
		t.Errorf("holders of the new version: %v, want none", hs)
	}
}

// holdersOf opens path and asks for the holders of its first n blocks.
func holdersOf(ctx context.Context, fs *client.FS, path string, n uint64) ([]client.BlockHolder, error) {
	r, err := fs.Resolve(ctx, Owner(), path)
	if err != nil {
		return nil, err
	}
	h, _, err := fs.Open(ctx, Owner(), r.Cues, oid.ID(r.Meta.Id), syscall.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer h.Release(ctx)
	return h.Holders(ctx, 0, n)
}
