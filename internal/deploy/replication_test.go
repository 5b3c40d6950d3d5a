package deploy

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/poll"
)

// startSites starts one host per site sharing the first host's embedded
// configuration service and CA.
func startSites(t *testing.T, sites ...string) []*Host {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var hosts []*Host
	for i, site := range sites {
		dir := t.TempDir()
		cfg := NewConfig(dir)
		cfg.Logger = testLogger(t).With("site", site)
		cfg.LockTTL = 2 * time.Second
		cfg.Site = site
		if i > 0 {
			cfg.Roles = RoleServer | RoleClient
			cfg.CADir = filepath.Join(hosts[0].cfg.DataDir, "ca")
			cfg.Etcd = hosts[0].ConfigEndpoints()
		}
		h, err := Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start %s: %v", site, err)
		}
		hosts = append(hosts, h)
	}
	t.Cleanup(func() {
		for i := len(hosts) - 1; i >= 0; i-- {
			hosts[i].Close()
		}
	})
	return hosts
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	poll.Until(t, d, what, func() error {
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	})
}

func TestReplicatedAcrossSitesAndFailover(t *testing.T) {
	hosts := startSites(t, "west", "east", "eu")
	ctx := context.Background()
	west, east := hosts[0], hosts[1]
	// Write-local: a file created by east's client lives in a slice east is primary of.
	data := bytes.Repeat([]byte("replicated "), 20000)
	if err := east.Client.WriteFile(ctx, root, "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := west.Client.Resolve(ctx, root, "/f")
	if err != nil || r.Meta == nil {
		t.Fatalf("resolve: %v", err)
	}
	id := oid.ID(r.Meta.Id)
	info, err := west.Client.Info(ctx, root, client.NoCues, id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Primary.Site != "east" {
		t.Fatalf("primary at %q, want east (write-local): %+v", info.Primary.Site, info)
	}
	waitFor(t, "three replicas", 10*time.Second, func() bool {
		info, err = west.Client.Info(ctx, root, client.NoCues, id)
		return err == nil && len(info.Replicas) == 3
	})
	// The primary goes away; a backup takes over and serves the file.
	// A close acknowledged once all three replicas have it (the default
	// SyncLevel is RepLevel): a backup listed but still installing its
	// snapshot would not have it yet.
	if err := east.Client.WriteFile(ctx, root, "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	east.Close()
	got, err := west.Client.ReadFile(ctx, root, "/f")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after failover: %d bytes, %v", len(got), err)
	}
	info, err = west.Client.Info(ctx, root, client.NoCues, id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Primary.Site == "east" {
		t.Fatalf("primary still east: %+v", info)
	}
	// And it takes writes that two replicas can acknowledge: east stays
	// in the replica list (three servers, no replacement), so a write at
	// the default SyncLevel of three waits for it.
	if err := west.Client.WriteFile(ctx, root, "/.SyncLevel=2/f", []byte("after"), 0o644); err != nil {
		t.Fatal(err)
	}
}
