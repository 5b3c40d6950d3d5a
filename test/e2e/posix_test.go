package e2e

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
)

// posixSkip lists the posixtest tests we do not run, each with its reason.
// go-fuse's own loopback file system skips exactly these two as well.
var posixSkip = map[string]string{
	// FdLeak counts the open descriptors of the whole test process before
	// and after; tests running in parallel open and close descriptors
	// meanwhile, and a leak inside wheelfs (another process) is invisible
	// to it anyway.
	"FdLeak": "counts the test process's own fds (racy with parallel tests; cannot see the wheelfs process)",
	// FcntlFlockLocksFile expects a second descriptor of the same process to
	// conflict with the first one's POSIX lock. POSIX record locks belong
	// to the process, so on a local file system (and under FUSE without
	// lock support, where the kernel keeps the locks) they never conflict.
	"FcntlFlockLocksFile": "same-process POSIX locks never conflict on a local FS; needs per-fd lock owners from a FUSE lock implementation",
}

// TestPosix runs every go-fuse posixtest test against its own directory of
// one mount.
func TestPosix(t *testing.T) {
	t.Parallel()
	up := startUp(t, t.TempDir())
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			if why, ok := posixSkip[name]; ok {
				t.Skip(why)
			}
			dir := filepath.Join(up.Mnt, name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			posixtest.All[name](t, dir)
		})
	}
}
