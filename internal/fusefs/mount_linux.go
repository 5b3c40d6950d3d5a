package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// mountOwnFD mounts a FUSE file system at dir with a /dev/fuse descriptor
// this process opened, as go-fuse's direct mount does, and returns that
// descriptor: go-fuse serves it through its "/dev/fd/N" mount point, and
// names.go writes the notification go-fuse has no call for on it. Only
// root may mount(2); others get an error and mount through go-fuse
// (fusermount) without kernel name caching.
func mountOwnFD(dir string, mo *fuse.MountOptions) (int, error) {
	if os.Geteuid() != 0 {
		return -1, fmt.Errorf("mount(2) needs root")
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return -1, err
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	opts := []string{
		fmt.Sprintf("fd=%d", fd),
		fmt.Sprintf("rootmode=%o", st.Mode&unix.S_IFMT),
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
	}
	opts = append(opts, mo.Options...)
	if mo.AllowOther {
		opts = append(opts, "allow_other")
	}
	err = unix.Mount(mo.FsName, dir, "fuse."+mo.Name, unix.MS_NOSUID|unix.MS_NODEV, strings.Join(opts, ","))
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount(2): %w", err)
	}
	return fd, nil
}

// pollHack is go-fuse's wait for the first request, which it skips for a
// "/dev/fd/N" mount point: opening its magic name makes the kernel finish
// the handshake (KernelSettings is known after it), and polling it tells
// the kernel that this file system does not poll, so that the runtime's
// epoll on a file of the mount cannot deadlock the server.
func pollHack(dir string) error {
	fd, err := unix.Open(filepath.Join(dir, ".go-fuse-epoll-hack"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	return nil
}

// setReadAhead sets the kernel's read-ahead for the mount at dir (its
// backing device info) to kb KiB. The kernel starts a FUSE mount at
// 128 KiB whatever MaxReadAhead says, so a sequential reader asked for
// 128 KiB at a time although the core prefetches further: raising it to
// the core's window took a cold 512 MiB read from 0.85 to 1.1–1.3 GB/s
// (docs/BENCHMARKS.md). Only root may write it.
func setReadAhead(dir string, kb int) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	return os.WriteFile(p, []byte(fmt.Sprintf("%d\n", kb)), 0)
}
