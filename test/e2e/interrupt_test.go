package e2e

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalledSyscalls runs a file-churning process while it receives a
// stream of harmless signals (SIGURG, which the Go runtime uses for
// preemption and which every Go program receives on its own). A signal
// makes the kernel send FUSE_INTERRUPT for the request in flight; on a
// local file system a signal never makes open, close, rename or stat fail,
// so none may fail here either.
func TestSignalledSyscalls(t *testing.T) {
	t.Parallel()
	up := startUp(t, t.TempDir())
	cmd := exec.Command(helperBin, "churn", up.Mnt, "3000")
	cmd.Env = append(cmd.Environ(), helperEnv+"=1")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(2 * time.Minute)
	signals := 0
	tick := time.NewTicker(200 * time.Microsecond)
	defer tick.Stop()
loop:
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("churn helper: %v\n%s", err, out.String())
			}
			break loop
		case <-deadline:
			cmd.Process.Kill()
			<-done
			t.Fatalf("churn helper did not finish within 2 minutes\n%s", out.String())
		case <-tick.C:
			if cmd.Process.Signal(syscall.SIGURG) == nil {
				signals++
			}
		}
	}
	res := out.String()
	if !strings.Contains(res, "errno=0") {
		t.Errorf("a system call failed while the process was receiving signals (%d sent):\n%s", signals, res)
	}
	// A close that gave up half-way must not silently drop the data either.
	if log := up.stderr.String(); strings.Contains(log, "writes dropped") {
		t.Errorf("wheelfs dropped written data after an interrupted request:\n%s", grepLines(log, "writes dropped", "operation failed"))
	}
}
