// Package dirlock gives a process exclusive use of a data directory with a
// non-blocking flock on DIR/LOCK, so that a second process fails at once
// with a clear error instead of blocking (etcd's and bbolt's own locks
// block forever).
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

// Lock takes dir/LOCK exclusively and records this process's pid in it.
// Close the returned file to release the lock.
func Lock(dir string) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		lerr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
	}); err != nil {
		lerr = err
	}
	if lerr != nil {
		f.Close()
		if errors.Is(lerr, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != "" {
				holder = "process " + strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("data directory %s is in use by %s: %w", dir, holder, fserr.ErrBusy)
		}
		return nil, fmt.Errorf("lock %s: %w", path, lerr)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
