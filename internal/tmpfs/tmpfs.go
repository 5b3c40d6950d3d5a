// Package tmpfs mounts small, size-limited tmpfs file systems for tests
// that need a disk that fills up (full-disk handling).
package tmpfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Mount mounts a tmpfs of size bytes on a new directory under t.TempDir()
// and unmounts it when the test ends. The test is skipped, with the
// reason, where mounting is not permitted (not root, no CAP_SYS_ADMIN).
func Mount(t testing.TB, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	MountAt(t, dir, size)
	return dir
}

// MountAt is Mount on dir, which it creates if needed; dir must outlive
// the test's cleanups (come from t.TempDir).
func MountAt(t testing.TB, dir string, size int64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		t.Skipf("cannot mount a size-limited tmpfs (needs root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() {
		// A lazy unmount: a file the test left open must not fail it.
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// Fill writes a file at path until the file system is full (ENOSPC) and
// returns how many bytes it wrote. Removing the file frees the space.
func Fill(t testing.TB, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			if !errorsIsNoSpace(err) {
				t.Fatalf("fill %s: %v", path, err)
			}
			break
		}
	}
	// The last partial chunk may leave less than a page: fill that too.
	for {
		w, err := f.Write(buf[:512])
		n += int64(w)
		if err != nil {
			break
		}
	}
	return n
}

func errorsIsNoSpace(err error) bool {
	return errors.Is(err, unix.ENOSPC)
}
