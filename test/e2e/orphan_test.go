package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
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
