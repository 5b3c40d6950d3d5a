//go:build !linux

package store

import "os"

// fdatasync flushes f to stable storage.
func fdatasync(f *os.File) error { return f.Sync() }

// startWriteback is a no-op where sync_file_range is unavailable.
func startWriteback(f *os.File, off, n int64) {}

func adviseSequential(*os.File) {}
