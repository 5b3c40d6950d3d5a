package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/server"
)

// objects returns the number of objects the deployment stores, which
// statfs reports as f_files - f_ffree.
func objects(t *testing.T, mnt string) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	err := syscall.Statfs(mnt, &st)
	for i := 0; i < 3 && err == syscall.ETIMEDOUT; i++ {
		// The FUSE-interrupt bug (TestSignalledSyscalls), not this test's.
		t.Logf("statfs: %v; retrying", err)
		err = syscall.Statfs(mnt, &st)
	}
	if err != nil {
		t.Fatalf("statfs: %v", err)
	}
	return st.Files - st.Ffree
}

// waitObjects waits (bounded) for the object count to reach want; FUSE
// sends RELEASE asynchronously after close, so reclamation may lag.
func waitObjects(t *testing.T, mnt string, want uint64, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := objects(t, mnt)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d objects 5 s later, want %d (the unlinked file was never reclaimed)", what, got, want)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOrphanReclaim checks that a file unlinked while open is deleted once
// its last descriptor is closed, however many descriptors it had.
func TestOrphanReclaim(t *testing.T) {
	t.Parallel()
	up := startUp(t, t.TempDir())
	dir := filepath.Join(up.Mnt, "orphans")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		fds         int
		unlinkFirst bool
	}{
		{"OneFdClosedThenUnlinked", 1, false},
		{"OneFdUnlinkedThenClosed", 1, true},
		{"TwoFdsClosedThenUnlinked", 2, false},
		{"TwoFdsUnlinkedThenClosed", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := objects(t, up.Mnt)
			p := filepath.Join(dir, tc.name)
			if err := os.WriteFile(p, make([]byte, 100<<10), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := objects(t, up.Mnt); got != base+1 {
				t.Fatalf("objects after creating a file = %d, want %d", got, base+1)
			}
			var fds []*os.File
			for i := 0; i < tc.fds; i++ {
				f, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				fds = append(fds, f)
			}
			if tc.unlinkFirst {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 10)
				if _, err := fds[0].ReadAt(buf, 0); err != nil {
					t.Errorf("read of the unlinked open file: %v", err)
				}
			}
			for _, f := range fds {
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.unlinkFirst {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
			}
			waitObjects(t, up.Mnt, base, "after the last close and the unlink")
		})
	}
}

// TestReplaceByRename checks rename(2)'s promise that a name replaced by a
// rename over it is never missing: a reader looping on a file that a
// writer keeps replacing (write a temporary file, rename it over) reads
// one whole version every time, never ENOENT, and the replaced versions
// are reclaimed afterwards (after the rename grace, server/orphans.go).
func TestReplaceByRename(t *testing.T) {
	t.Parallel()
	up := startUp(t, t.TempDir())
	dir := filepath.Join(up.Mnt, "replace")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p, tmp := filepath.Join(dir, "f"), filepath.Join(dir, "f.tmp")
	version := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("v%08d\n", i)), 512) }
	if err := os.WriteFile(p, version(0), 0o644); err != nil {
		t.Fatal(err)
	}
	base := objects(t, up.Mnt)
	stop := make(chan struct{})
	writerErr := make(chan error, 1)
	written := 0
	go func() {
		defer close(writerErr)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := os.WriteFile(tmp, version(i), 0o644); err != nil {
				writerErr <- err
				return
			}
			if err := os.Rename(tmp, p); err != nil {
				writerErr <- err
				return
			}
			written = i
		}
	}()
	reads, failed := 0, 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); reads++ {
		b, err := os.ReadFile(p)
		if err != nil {
			if failed++; failed <= 5 {
				t.Errorf("read %d: %v", reads, err)
			}
			continue
		}
		if len(b) != len(version(0)) || !bytes.Equal(b, bytes.Repeat(b[:10], 512)) {
			t.Errorf("read %d: %d bytes, not one whole version", reads, len(b))
		}
	}
	close(stop)
	if err := <-writerErr; err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("%d reads against %d replacements, %d failed", reads, written, failed)
	if failed > 0 {
		t.Errorf("%d of %d reads of a file replaced by rename failed", failed, reads)
	}
	if written == 0 {
		t.Fatal("the writer replaced nothing")
	}
	// Every replaced version goes once its grace is over.
	deadline := time.Now().Add(server.DefaultRenameGrace + 20*time.Second)
	for got := objects(t, up.Mnt); got != base; got = objects(t, up.Mnt) {
		if time.Now().After(deadline) {
			t.Fatalf("%d objects, want %d: replaced versions were not reclaimed", got, base)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
