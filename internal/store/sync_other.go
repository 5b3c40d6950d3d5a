//go:build !linux

package store

import "os"

// fdatasync flushes f to stable storage.
func fdatasync(f *os.File) error { return f.Sync() }
