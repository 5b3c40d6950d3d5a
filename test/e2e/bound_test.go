package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBoundUnderKilledPrimary: after kill -9 of the node that is primary
// of the root and of /d (its slice lock lasts the default 2 minutes, so
// nobody takes over during the test), every system call at another site
// returns within its bound, through the kernel's path walk and its check
// of the mount root: a plain path fails with ETIMEDOUT after the default
// 30 s (not twice that, as a walk that restarted at the root's GETATTR
// did), a .MaxTime path after its limit, and .EventualConsistency reads
// and creates succeed within their limit from the backups.
func TestBoundUnderKilledPrimary(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for FUSE mounts")
	}
	tmp := t.TempDir()
	ca, members := startConfigService(t, tmp)
	config := strings.Join(members, ",")
	node := func(site string) *upProc { return startNode(t, tmp, config, ca, site) }
	west := node("west") // first: it creates the root
	_, eu := node("east"), node("eu")

	if err := os.MkdirAll(filepath.Join(west.Mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(west.Mnt, "d", "f"), []byte("kept by the backups"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(eu.Mnt, ".EventualConsistency", "ev"), 0o755); err != nil {
		t.Fatal(err)
	}
	west.kill9()

	const margin = 2 * time.Second
	timed := func(name string, bound time.Duration, op func() error) error {
		t.Helper()
		start := time.Now()
		err := op()
		if took := time.Since(start); took > bound+margin {
			t.Errorf("%s took %v, bound %v: %v", name, took, bound, err)
		} else {
			t.Logf("%s: %v after %v", name, err, took.Round(time.Millisecond))
		}
		return err
	}
	read := func(p string) func() error {
		return func() error { _, err := os.ReadFile(filepath.Join(eu.Mnt, p)); return err }
	}
	ec := filepath.Join(".EventualConsistency", ".MaxTime=1000")
	if err := timed("eventual read", time.Second, read(filepath.Join(ec, "d", "f"))); err != nil {
		t.Errorf("eventual read with the primary down: %v", err)
	}
	if err := timed("eventual create", time.Second, func() error {
		return os.WriteFile(filepath.Join(eu.Mnt, ec, "ev", "new"), []byte("x"), 0o644)
	}); err != nil {
		t.Errorf("eventual create at a live primary below a dead root: %v", err)
	}
	// A failed call's walk must not leak into the next call on the same
	// thread: each timeout takes its whole bound, not what was left.
	timesOut := func(name string, bound time.Duration, p string) {
		t.Helper()
		start := time.Now()
		err := timed(name, bound, read(p))
		if !errors.Is(err, syscall.ETIMEDOUT) {
			t.Errorf("%s with the primary down: %v, want ETIMEDOUT", name, err)
		}
		if took := time.Since(start); took < bound-100*time.Millisecond {
			t.Errorf("%s timed out after %v, before its bound %v", name, took, bound)
		}
	}
	timesOut(".MaxTime read", 3*time.Second, filepath.Join(".MaxTime=3000", "d", "f"))
	timesOut(".MaxTime read again", 3*time.Second, filepath.Join(".MaxTime=3000", "d", "f"))
	timesOut("plain read", 30*time.Second, filepath.Join("d", "f"))
}
