package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/client"
)

// TestPosixDetails checks what a POSIX conformance suite probes beyond
// go-fuse's posixtest: modes of 0, the access of the open that creates a
// file, and renameat2 flags WheelFS does not implement.
func TestPosixDetails(t *testing.T) {
	t.Parallel()
	up := startUp(t, t.TempDir())
	mnt := up.Mnt
	// t.TempDir's parent is 0700; let other users reach the mount.
	if err := os.Chmod(filepath.Dir(mnt), 0o755); err != nil {
		t.Fatal(err)
	}
	stat := func(t *testing.T, p string) *syscall.Stat_t {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatalf("stat %s: %v", p, err)
		}
		return &st
	}

	// The kernel reads ahead as far as the core prefetches (it starts a
	// FUSE mount at 128 KiB): sequential reads are asked for in large
	// steps.
	t.Run("ReadAhead", func(t *testing.T) {
		st := stat(t, mnt)
		p := "/sys/class/bdi/" + strconv.Itoa(int(unix.Major(st.Dev))) + ":" + strconv.Itoa(int(unix.Minor(st.Dev))) + "/read_ahead_kb"
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.TrimSpace(string(b)), strconv.Itoa(client.ReadAheadBytes>>10); got != want {
			t.Errorf("%s = %s, want %s", p, got, want)
		}
	})

	// fsync(2) of a directory succeeds (it was EOPNOTSUPP): databases
	// fsync the directory after creating or renaming a file in it, with
	// the new file still open.
	t.Run("FsyncDir", func(t *testing.T) {
		dir := filepath.Join(mnt, "fsyncdir")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(filepath.Join(dir, "journal"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		d, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if err := d.Sync(); err != nil {
			t.Errorf("fsync of a directory: %v", err)
		}
	})

	// Mode 0 is a mode: the kernel must see 0, as the server stores and
	// checks it (go-fuse used to show it as 0644, or 0755 for a directory).
	t.Run("ModeZero", func(t *testing.T) {
		dir := filepath.Join(mnt, "mode0")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, "file")
		fd, err := syscall.Open(file, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Close(fd); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkdir(filepath.Join(dir, "dir"), 0); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]uint32{"file": syscall.S_IFREG, "dir": syscall.S_IFDIR, "fifo": syscall.S_IFIFO} {
			if m := stat(t, filepath.Join(dir, name)).Mode; m != want {
				t.Errorf("%s created with mode 0: st_mode %o, want %o", name, m, want)
			}
		}
		// chmod 0 too; root still reads (CAP_DAC_OVERRIDE), users do not.
		plain := filepath.Join(dir, "plain")
		if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(plain, 0); err != nil {
			t.Fatal(err)
		}
		if m := stat(t, plain).Mode; m != syscall.S_IFREG {
			t.Errorf("after chmod 0: st_mode %o, want %o", m, syscall.S_IFREG)
		}
		if b, err := os.ReadFile(plain); err != nil || string(b) != "x" {
			t.Errorf("root reading a mode 0 file: %q, %v", b, err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		expect(t, user1k, user1k, syscall.EACCES, "read", plain)
	})

	// open(O_CREAT|O_RDWR, mode) by a user gets a read-write descriptor
	// whatever mode says, as on Linux; later opens are checked against it.
	t.Run("CreateReadOnlyModes", func(t *testing.T) {
		dir := filepath.Join(mnt, "pub")
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		for _, mode := range []uint32{0, 0o400, 0o444} {
			p := filepath.Join(dir, "creat-"+modeName(mode))
			expect(t, user1k, user1k, 0, "creatrw", p, modeName(mode), "private data")
			st := stat(t, p)
			if st.Mode != syscall.S_IFREG|mode || st.Uid != user1k || st.Size != int64(len("private data")) {
				t.Errorf("%s: mode %o uid %d size %d, want %o %d %d", p, st.Mode, st.Uid, st.Size,
					syscall.S_IFREG|mode, user1k, len("private data"))
			}
			if b, err := os.ReadFile(p); err != nil || string(b) != "private data" {
				t.Errorf("%s read by root: %q, %v", p, b, err)
			}
			expect(t, user1k, user1k, syscall.EACCES, "openrw", p)
		}
	})

	// renameat2(RENAME_WHITEOUT) is refused: WheelFS has no whiteouts,
	// and accepting the flag while leaving none would be a silent lie.
	t.Run("RenameWhiteout", func(t *testing.T) {
		dir := filepath.Join(mnt, "whiteout")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
		if err := os.WriteFile(src, []byte("src"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_WHITEOUT); err != syscall.EINVAL {
			t.Errorf("renameat2(RENAME_WHITEOUT) = %v, want EINVAL", err)
		}
		if b, err := os.ReadFile(src); err != nil || string(b) != "src" {
			t.Errorf("source after the refused rename: %q, %v", b, err)
		}
		if _, err := os.Lstat(dst); !os.IsNotExist(err) {
			t.Errorf("destination after the refused rename: %v, want ENOENT", err)
		}
		// The flags it implements keep working.
		if err := os.WriteFile(dst, []byte("dst"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != syscall.EEXIST {
			t.Errorf("renameat2(RENAME_NOREPLACE) onto a name = %v, want EEXIST", err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
			t.Errorf("renameat2(RENAME_EXCHANGE) = %v", err)
		}
		if b, err := os.ReadFile(src); err != nil || string(b) != "dst" {
			t.Errorf("source after the exchange: %q, %v", b, err)
		}
	})
}

func modeName(mode uint32) string { return strconv.FormatUint(uint64(mode), 8) }
