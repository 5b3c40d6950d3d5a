//go:build unix

package store

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

// lockDir takes an exclusive, non-blocking flock on dir/LOCK so that two
// processes (or two Stores in one process) never share a data directory.
func lockDir(dir string) (*os.File, error) {
	path := dir + string(os.PathSeparator) + "LOCK"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("store: open lock file: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
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
			return nil, fmt.Errorf("store: data directory %s is in use by another process or store (lock %s held): %w",
				dir, path, fserr.ErrBusy)
		}
		return nil, fmt.Errorf("store: lock %s: %w", path, lerr)
	}
	return f, nil
}
