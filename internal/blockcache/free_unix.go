//go:build unix

package blockcache

import "golang.org/x/sys/unix"

// freeBytes reports the space available to unprivileged users on the file
// system holding dir.
func freeBytes(dir string) (int64, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}
