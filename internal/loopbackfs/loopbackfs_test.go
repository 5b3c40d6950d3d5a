package loopbackfs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// TestServe mounts the bench's loopback without passthrough and
// checks that what is written through it lands in the backing directory
// and reads back, and that cancelling unmounts it.
func TestServe(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to mount")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	mnt, backing := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, mnt, backing, Options{AllowOther: true}, func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("loopback not mounted after 30 s")
	}
	want := bytes.Repeat([]byte("wheelfs"), 100_000)
	if err := os.WriteFile(filepath.Join(mnt, "f"), want, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(backing, "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("backing file: %d bytes, %v; want the %d written", len(got), err, len(want))
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read through the mount: %d bytes, %v; want the %d written", len(got), err, len(want))
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("loopback still serving 30 s after its context ended")
	}
	if mountinfo.Mounted(mnt) {
		t.Fatalf("%s still mounted", mnt)
	}
}
