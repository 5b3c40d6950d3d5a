package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
)

// TestWriteStallWhenBackupSiteCut is issue 11 item 5: with the default
// SyncLevel (every replica), a write at a healthy site whose file has a
// backup at a site that is cut off waits until the backup is replaced.
// It stalled 11.1 s: the replication call to the silent backup waited
// out its 10 s peer timeout, or an idle ping its 3 s, then DeadAfter.
// Now a replication call unanswered past StallAfter (beyond what its data
// takes) makes the primary ping the backup; one that answers neither is
// replaced at once, by a server that answers: 2.7 s in most runs (goal
// 3 s), up to 6.4 s when the replica-list update went to the config
// member at the cut-off site first. The bound asserted is generous.
func TestWriteStallWhenBackupSiteCut(t *testing.T) {
	t.Parallel()
	// A lock that lapses in 2 s (the harness default) may lapse on a
	// loaded machine while a server's configuration client moves off a
	// member at the cut site; this test times the backup's replacement.
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 2, LockTTL: 10 * time.Second,
		RTT: UniformRTT(100 * time.Millisecond)})
	ctx := opCtx(t)
	west := c.Servers("west")[0].Client()
	if err := west.WriteFile(ctx, Owner(), "/f", []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	info, err := west.Info(ctx, Owner(), client.NoCues, mustID(t, west, "/f"))
	if err != nil {
		t.Fatal(err)
	}
	cut := ""
	for _, r := range info.Replicas[1:] {
		if r.Site != "west" {
			cut = r.Site
			break
		}
	}
	if cut == "" {
		t.Fatalf("no backup of /f away from west: %+v", info.Replicas)
	}
	// Measured here: replacing the backup. An election, were the
	// configuration leader at the cut site, adds seconds of its own.
	c.LeadConfigAwayFrom(cut)
	c.DropSite(cut)
	began := time.Now()
	if err := west.WriteFile(ctx, Owner(), "/f", []byte("v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	t.Logf("write at west with the backup's site (%s) cut off: %v", cut, took)
	if took > 9*time.Second {
		t.Errorf("the write stalled %v with a backup's site cut off (11 s before; goal 3 s)", took)
	}
	// The client's copy of the slice table follows the configuration
	// service's watch, a moment behind the primary that wrote the list.
	c.WaitFor(10*time.Second, "the replica list without the cut-off site", func() error {
		info, err := west.Info(ctx, Owner(), client.NoCues, mustID(t, west, "/f"))
		if err != nil {
			return err
		}
		for _, r := range info.Replicas {
			if r.Site == cut {
				return fmt.Errorf("replicas %+v, still one at the cut-off site", info.Replicas)
			}
		}
		return nil
	})
}
