package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestEventualCreatesSurviveTakeover replays a testbed finding: right
// after start, east makes an eventual directory, is cut off, creates a
// file in it while its locks still hold, and another site takes its
// slices over before the heal. Nothing acknowledged may be lost. Three
// causes were behind the loss: the mkdir, late at the primary (which
// places the object at east across the wide area), was made again at
// east's backup copy, and the merge kept the primary's empty twin; the
// file's name reached the new primary before its object, which took it
// for deleted; and IDs the old primary handed out unreplicated could be
// handed out again by the new one.
func TestEventualCreatesSurviveTakeover(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 3 * time.Second,
		RTT: UniformRTT(100 * time.Millisecond)})
	began := time.Now()
	ctx := opCtx(t)
	east := c.Servers("east")[0].Client()
	if _, err := east.Mkdir(ctx, Owner(), "/.EventualConsistency/ev", 0o777); err != nil {
		t.Fatal(err)
	}
	// An eventual lookup may be answered by east's own backup copy of the
	// root's slice, which the mkdir may not have reached yet: once east is
	// cut off, that copy is all it has, so wait until it has ev (under
	// load the copy can lag the primary's answer).
	var ev oid.ID
	c.WaitFor(10*time.Second, "east and its copy of the root see ev", func() error {
		r, err := east.Resolve(ctx, Owner(), "/.EventualConsistency/ev")
		if err == nil && r.Meta == nil {
			err = fmt.Errorf("ev not found")
		}
		if err != nil {
			return err
		}
		ev = oid.ID(r.Meta.Id)
		_, err = srv(t, c.Servers("east")[0]).Lookup(ctx, &wire.LookupRequest{Caller: evCaller(), Dir: uint64(oid.Root), Name: "ev"})
		return err
	})
	t.Logf("ev is %v (slice %d)", ev, ev.Slice())
	c.DropSite("east")
	const prefix = "/.EventualConsistency/.MaxTime=1000"
	err, took := syscallBound(ctx, func(ctx context.Context) error {
		return east.WriteFile(ctx, Owner(), prefix+"/ev/new0", []byte("x\n"), 0o666)
	})
	t.Logf("cut off: create ev/new0 at east: %v after %v", err, took)
	if err != nil {
		t.Fatalf("eventual create at the cut-off site: %v after %v", err, took)
	}
	c.WaitFor(30*time.Second, "another site takes ev's slice over", func() error {
		p, err := c.Primary(ctx, ev.Slice())
		if err != nil {
			return err
		}
		if p.Site == "east" {
			return fmt.Errorf("slice %d still held by %s", ev.Slice(), p)
		}
		return nil
	})
	t.Logf("%v after the start: east's slices taken over", time.Since(began))
	c.HealSite("east")
	for _, site := range c.Sites() {
		fs := c.Servers(site)[0].Client()
		c.WaitFor(60*time.Second, site+" sees ev and ev/new0", func() error {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if err := readIs(ctx, fs, "/ev/new0", []byte("x\n")); err != nil {
				r, rerr := fs.Resolve(ctx, Owner(), "/ev")
				var names []string
				if rerr == nil && r.Meta == nil {
					rerr = fmt.Errorf("no /ev")
				}
				if rerr == nil {
					es, _, lerr := fs.ReadDir(ctx, Owner(), r.Cues, oid.ID(r.Meta.Id))
					for _, e := range es {
						names = append(names, fmt.Sprintf("%s=%v", e.Name, oid.ID(e.Id)))
					}
					rerr = lerr
				}
				return fmt.Errorf("%w (ev lists %v, %v)", err, names, rerr)
			}
			return nil
		})
		got := listNames(t, fs, "/")
		if !slices.Contains(got, "ev") {
			t.Errorf("%s lists / as %v", site, got)
		}
		t.Logf("%s lists / as %v", site, got)
	}
}
