//go:build !linux

package store

import (
	"errors"
	"os"
)

// fdatasync flushes f to stable storage.
func fdatasync(f *os.File) error { return f.Sync() }

// startWriteback is a no-op where sync_file_range is unavailable.
func startWriteback(f *os.File, off, n int64) {}

func adviseSequential(*os.File) {}

// statfs is unsupported here: the store never reports itself full.
func statfs(string) (free, total int64, err error) {
	return 0, 0, errors.ErrUnsupported
}

func allocate(f *os.File, n int64) error { return writeZeros(f, n) }
