package e2e

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/tmpfs"
)

// TestFullDisk: with the store of `wheelfs up` on a full 64 MiB tmpfs, a
// write through the mount fails with ENOSPC (not EIO, not a hang), the
// file written before is intact, and once space is freed the same write
// succeeds.
func TestFullDisk(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	store := filepath.Join(data, "store")
	tmpfs.MountAt(t, store, 64<<20)
	up := startUp(t, data)
	before := randBytes(t, 256<<10)
	if err := os.WriteFile(filepath.Join(up.Mnt, "before"), before, 0o644); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(store, "filler")
	tmpfs.Fill(t, filler)

	// Larger than the store's own reserve, which it may give back.
	big := randBytes(t, 16<<20)
	start := time.Now()
	err := os.WriteFile(filepath.Join(up.Mnt, "big"), big, 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write on a full disk: %v, want ENOSPC", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("the write on a full disk took %v to fail", d)
	}
	if got, err := os.ReadFile(filepath.Join(up.Mnt, "before")); err != nil || !bytes.Equal(got, before) {
		t.Fatalf("file written before the disk filled: %d bytes, %v", len(got), err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(up.Mnt, "big"), big, 0o644); err != nil {
		t.Fatalf("write after freeing space: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(up.Mnt, "big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back after freeing space: %d bytes, %v", len(got), err)
	}
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
