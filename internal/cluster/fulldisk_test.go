package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/tmpfs"
)

// TestFullDisk gives east's server a 64 MiB tmpfs as its data directory
// and fills it (issue 16 item 6): east publishes itself full, a write to
// what east stores, or that needs a copy there, fails with ENOSPC
// promptly and loses nothing written before, a new .Site=east object goes
// to west, east restarts on its full disk, and once space is freed writes
// to east succeed again and the .Site=east object moves home.
func TestFullDisk(t *testing.T) {
	mnt := tmpfs.Mount(t, 64<<20)
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ConfigMembers: 1,
		Adjust: func(n *Node, cfg *deploy.Config) {
			if n.Name != "east-0" {
				return
			}
			cfg.DataDir = mnt
			cfg.Store.SegmentSize = 4 << 20
			cfg.Store.Reserve = 2 << 20
			cfg.Server.DiskReserve = 8 << 20
		}})
	ctx := opCtx(t)
	west, east := c.Client("west"), c.Client("east")
	eastSrv := c.Servers("east")[0]
	published := func(full bool) func() error {
		return func() error {
			tb, err := c.Conf.Table(ctx)
			if err != nil {
				return err
			}
			si, ok := tb.Servers[eastSrv.ID()]
			switch {
			case !ok:
				return errors.New("east's server is not registered")
			case si.Total == 0:
				return fmt.Errorf("east published no free space: %+v", si)
			case si.Full != full:
				return fmt.Errorf("east published full=%v (free %d of %d), want %v", si.Full, si.Free, si.Total, full)
			}
			return nil
		}
	}
	c.WaitFor(20*time.Second, "east publishes its free space", published(false))
	c.WaitFor(60*time.Second, "every slice meets its policy", func() error { return slicesHealthy(ctx, c) })

	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	acked := map[string][]byte{}
	for i := range 4 {
		p := fmt.Sprintf("/.Site=east/d/before%d", i)
		data := randData(t, 256<<10)
		if err := east.WriteFile(ctx, Owner(), p, data, 0o644); err != nil {
			t.Fatalf("write %s before the disk is full: %v", p, err)
		}
		acked[fmt.Sprintf("/d/before%d", i)] = data
	}
	primaryAt := func(path, site string) func() error {
		return func() error {
			in, err := info(ctx, west, path)
			if err != nil {
				return err
			}
			if in.Primary.Site != site {
				return fmt.Errorf("%s: primary at %s, want %s", path, in.Primary.Site, site)
			}
			return nil
		}
	}
	c.WaitFor(20*time.Second, "before0 at east", primaryAt("/d/before0", "east"))

	filler := filepath.Join(mnt, "filler")
	tmpfs.Fill(t, filler)
	c.WaitFor(30*time.Second, "east publishes that it is full", published(true))

	// A write to what east stores fails with ENOSPC, well within the
	// client's call bound, and the file keeps what it held. (The store
	// may have given its reserve back meanwhile: what that freed is
	// filled too, and the write is larger than the reserve.)
	topUp := filepath.Join(mnt, "filler2")
	tmpfs.Fill(t, topUp)
	start := time.Now()
	err := appendFile(ctx, east, "/d/before0", randData(t, 8<<20))
	if !errors.Is(err, fserr.ErrNoSpace) {
		t.Fatalf("write to a full disk = %v, want ENOSPC", err)
	}
	if d := time.Since(start); d > client.DefaultTimeout/2 {
		t.Errorf("the write to a full disk took %v to fail", d)
	}
	checkAcked := func(when string) {
		t.Helper()
		for p, data := range acked {
			for _, fs := range []*client.FS{west, east} {
				got, err := fs.ReadFile(ctx, Owner(), p)
				if err != nil {
					t.Fatalf("%s: read %s: %v", when, p, err)
				}
				if !bytes.Equal(got, data) {
					t.Fatalf("%s: %s holds %d bytes, not the %d written", when, p, len(got), len(data))
				}
			}
		}
	}
	checkAcked("disk full")

	// New objects go where there is room: .Site=east falls back to west
	// (the directory's server), and a write-local create at east goes
	// elsewhere too. One that needs a copy on every server, east's
	// included (RepLevel 3 of 3), fails with ENOSPC at once.
	start = time.Now()
	if err := east.WriteFile(ctx, Owner(), "/.Site=east/d/three", randData(t, 64<<10), 0o644); !errors.Is(err, fserr.ErrNoSpace) {
		t.Fatalf("create needing east's copy while east is full: %v, want ENOSPC", err)
	}
	if d := time.Since(start); d > client.DefaultTimeout/2 {
		t.Errorf("the create needing east's copy took %v to fail", d)
	}
	home := randData(t, 64<<10)
	if err := east.WriteFile(ctx, Owner(), "/.Site=east/.RepLevel=2/d/home", home, 0o644); err != nil {
		t.Fatalf("create .Site=east while east is full: %v", err)
	}
	acked["/d/home"] = home
	c.WaitFor(20*time.Second, "home placed at west", primaryAt("/d/home", "west"))
	local := randData(t, 64<<10)
	if err := east.WriteFile(ctx, Owner(), "/.RepLevel=2/d/local", local, 0o644); err != nil {
		t.Fatalf("write-local create while east is full: %v", err)
	}
	acked["/d/local"] = local
	c.WaitFor(20*time.Second, "local placed away from east", func() error {
		in, err := info(ctx, west, "/d/local")
		if err != nil {
			return err
		}
		for _, r := range in.Replicas {
			if r.Site == "east" {
				return fmt.Errorf("a copy of /d/local at east: %+v", in)
			}
		}
		return nil
	})

	// A restart on the full disk comes up with everything (what the
	// store freed at Close is filled too).
	c.Stop(eastSrv)
	topUp2 := filepath.Join(mnt, "filler3")
	tmpfs.Fill(t, topUp2)
	c.Restart(eastSrv)
	c.WaitFor(30*time.Second, "east, restarted, publishes that it is full", published(true))
	checkAcked("east restarted on a full disk")

	// Space returns: writes to east succeed again, without a restart, and
	// the .Site=east object moves home.
	for _, f := range []string{filler, topUp, topUp2} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	c.WaitFor(30*time.Second, "east publishes that it has room", published(false))
	more := randData(t, 1<<20)
	c.WaitFor(30*time.Second, "write to east after freeing space", func() error {
		return appendFile(ctx, east, "/d/before1", more)
	})
	acked["/d/before1"] = append(acked["/d/before1"], more...)
	c.WaitFor(60*time.Second, ".Site=east object moves home", primaryAt("/d/home", "east"))
	checkAcked("space freed")
}

// TestFullBackupReplaced: the only backup of a file fills its disk. The
// primary learns it from the stream's answer (ENOSPC) and replaces that
// backup at once, so a write waiting for a backup's copy succeeds. The
// primary's DeadAfter is set far beyond the client's call bound: a
// backup that fails is replaced only after DeadAfter otherwise, and the
// write would time out.
func TestFullBackupReplaced(t *testing.T) {
	mnts := map[string]string{"east": tmpfs.Mount(t, 64<<20), "eu": tmpfs.Mount(t, 64<<20)}
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ConfigMembers: 1,
		Adjust: func(n *Node, cfg *deploy.Config) {
			switch {
			case n.Name == "west-0":
				cfg.Server.DeadAfter = 10 * time.Minute
				return
			case n.Name != n.Site+"-0": // a client node
				return
			}
			cfg.DataDir = mnts[n.Site]
			cfg.Store.SegmentSize = 4 << 20
			cfg.Store.Reserve = 2 << 20
			cfg.Server.DiskReserve = 8 << 20
		}})
	ctx := opCtx(t)
	west := c.Client("west")
	if _, err := west.Mkdir(ctx, Owner(), "/.Site=west/d", 0o755); err != nil {
		t.Fatal(err)
	}
	first := randData(t, 64<<10)
	if err := west.WriteFile(ctx, Owner(), "/.Site=west/.RepLevel=2/d/f", first, 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := info(ctx, west, "/d/f")
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Replicas) != 2 || in.Primary.Site != "west" {
		t.Fatalf("/d/f placed at %+v: want its primary at west and one backup", in)
	}
	backup := in.Replicas[1]
	tmpfs.Fill(t, filepath.Join(mnts[backup.Site], "filler"))

	more := randData(t, 8<<20)
	if err := appendFile(ctx, west, "/d/f", more); err != nil {
		t.Fatalf("write while the backup at %s is full: %v; want the backup replaced", backup.Site, err)
	}
	in, err = info(ctx, west, "/d/f")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range in.Replicas {
		if r.Server == backup.Server {
			t.Errorf("the full server at %s is still a replica: %+v", backup.Site, in.Replicas)
		}
	}
	if err := readIs(ctx, c.Client("eu"), "/d/f", append(first, more...)); err != nil {
		t.Error(err)
	}
}

// appendFile writes data at the end of path (no truncation first: a
// failed write must leave what the file held).
func appendFile(ctx context.Context, fs *client.FS, path string, data []byte) error {
	r, err := fs.Resolve(ctx, Owner(), path)
	if err != nil {
		return err
	}
	if r.Meta == nil {
		return fmt.Errorf("%s: %w", path, fserr.ErrNotExist)
	}
	h, _, err := fs.Open(ctx, Owner(), r.Cues, oid.ID(r.Meta.Id), syscall.O_WRONLY)
	if err != nil {
		return err
	}
	defer h.Release(ctx)
	if _, err := h.Write(ctx, data, int64(r.Meta.Size)); err != nil {
		return err
	}
	return h.Flush(ctx)
}

func randData(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
