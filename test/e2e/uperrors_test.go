package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// checkNoPanic fails if output looks like a Go panic or crash dump.
func checkNoPanic(t *testing.T, out string) {
	t.Helper()
	for _, s := range []string{"panic:", "goroutine ", "SIGSEGV", "fatal error:"} {
		if strings.Contains(out, s) {
			t.Errorf("output contains %q:\n%s", s, tail(out, 4<<10))
			return
		}
	}
}

// upFails runs `wheelfs up` expecting it to refuse quickly.
func upFails(t *testing.T, mnt string) result {
	t.Helper()
	r := run(t, "/", 60*time.Second, nil, wheelfsBin, "up", "--data", t.TempDir(), mnt)
	if r.code <= 0 {
		t.Fatalf("wheelfs up %s: exit code %d (err %v), want a non-zero exit\n%s", mnt, r.code, r.err, r.out)
	}
	if strings.Contains(r.stdout, readyLine) {
		t.Errorf("wheelfs up %s claimed to be mounted:\n%s", mnt, r.out)
	}
	checkNoPanic(t, r.out)
	if isMounted(mnt) {
		t.Errorf("%s is mounted after a failed wheelfs up", mnt)
	}
	return r
}

func TestUpErrors(t *testing.T) {
	t.Parallel()
	t.Run("MissingMountpoint", func(t *testing.T) {
		t.Parallel()
		missing := filepath.Join(t.TempDir(), "no", "such", "dir")
		r := upFails(t, missing)
		if !strings.Contains(r.out, missing) || !strings.Contains(r.out, "does not exist") {
			t.Errorf("message does not name the missing mount point %s:\n%s", missing, r.out)
		}
	})
	t.Run("NotADirectory", func(t *testing.T) {
		t.Parallel()
		f := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		r := upFails(t, f)
		if !strings.Contains(r.out, f) || !strings.Contains(r.out, "not a directory") {
			t.Errorf("message does not say %s is not a directory:\n%s", f, r.out)
		}
	})
	t.Run("AlreadyMounted", func(t *testing.T) {
		t.Parallel()
		up := startUp(t, t.TempDir())
		if err := os.WriteFile(filepath.Join(up.Mnt, "before"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := run(t, "/", 60*time.Second, nil, wheelfsBin, "up", "--data", t.TempDir(), up.Mnt)
		if r.code <= 0 {
			t.Fatalf("second wheelfs up on %s: exit code %d (err %v), want non-zero\n%s", up.Mnt, r.code, r.err, r.out)
		}
		checkNoPanic(t, r.out)
		if !strings.Contains(r.out, "busy") || !strings.Contains(r.out, up.Mnt) {
			t.Errorf("message does not say %s is busy:\n%s", up.Mnt, r.out)
		}
		// The first deployment is unharmed.
		if b, err := os.ReadFile(filepath.Join(up.Mnt, "before")); err != nil || string(b) != "x" {
			t.Errorf("first mount after the refused second up: %q, %v", b, err)
		}
		if err := os.WriteFile(filepath.Join(up.Mnt, "after"), []byte("y"), 0o644); err != nil {
			t.Errorf("write to the first mount after the refused second up: %v", err)
		}
	})
}
