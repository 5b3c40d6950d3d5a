package bench

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestSpreadSubdirs(t *testing.T) {
	dir := t.TempDir()
	if err := spreadSubdirs(dir); err != nil {
		t.Fatalf("spreadSubdirs: %v", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Skipf("%s keeps no inode flags: %v", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.EXT4_SUPER_MAGIC && flags&fsTopdirFL == 0 {
		t.Fatalf("flags %#x on ext4: FS_TOPDIR_FL not set", flags)
	}
	// A second call leaves the flag as it is.
	if err := spreadSubdirs(dir); err != nil {
		t.Fatalf("spreadSubdirs again: %v", err)
	}
	if err := spreadSubdirs(dir + "/missing"); err == nil {
		t.Fatal("spreadSubdirs of a missing directory: no error")
	}
}
