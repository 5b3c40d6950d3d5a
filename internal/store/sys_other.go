//go:build !unix

package store

import "os"

// lockDir is a no-op where flock is unavailable; it only creates dir/LOCK.
func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(dir+string(os.PathSeparator)+"LOCK", os.O_RDWR|os.O_CREATE, 0o644)
}
