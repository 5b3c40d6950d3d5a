package bench

import (
	"errors"

	"golang.org/x/sys/unix"
)

// fsTopdirFL is FS_TOPDIR_FL (linux/fs.h; chattr +T): ext4's Orlov
// allocator spreads the subdirectories of such a directory over block
// groups as it does the root's, instead of keeping them near their parent.
const fsTopdirFL = 0x00020000

// spreadSubdirs marks dir so that the directories made in it (each run's
// meta-N, tar) start in block groups of their own.
//
// Why: ext4 without a journal will not reuse an inode freed in the last
// 60 s (300 s while its inode table block is dirty), and every create in
// a group scans past each such inode (ialloc.c, recently_deleted). The
// bench's own unlinks leave 10 000 of them, so the next pass's creates in
// the same group took 400-650 us each instead of 25-30 us (perf: 38 % of
// the loopback's CPU in recently_deleted and find_get_block_common). That
// measured the previous pass, not the file system: raw and loopback create
// rates swung 15x between runs, and WheelFS, which makes no inode per
// file, looked up to twice as good as it is (docs/BENCHMARKS.md).
//
// Other file systems ignore or refuse the flag; that is not an error.
func spreadSubdirs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err == nil && flags&fsTopdirFL == 0 {
		err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopdirFL))
	}
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	return err
}
