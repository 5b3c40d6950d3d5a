package e2e

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The helper is a copy of the test binary that performs one file system
// operation and prints the resulting errno, so that tests can run exact
// system calls as another user (through setpriv) and check the errno.
const helperEnv = "WHEELFS_E2E_HELPER"

var helperBin string

func copyHelper(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// helperMain runs one operation: read PATH | create PATH | append PATH DATA |
// unlink PATH | rename OLD NEW | chmod PATH OCTAL | mkdir PATH | readdir PATH |
// creatrw PATH OCTAL DATA | openrw PATH | createmode PATH OCTAL UMASK |
// mkdirmode PATH OCTAL UMASK.
// It prints "errno=N" (0 on success) and exits 0; usage errors exit 2.
func helperMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "helper: usage: OP PATH [ARG]")
		return 2
	}
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	var err error
	switch op, path := args[0], args[1]; op {
	case "read":
		_, err = os.ReadFile(path)
	case "create":
		var fd int
		fd, err = syscall.Open(path, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_EXCL, 0o644)
		if err == nil {
			err = syscall.Close(fd)
		}
	case "append":
		var fd int
		fd, err = syscall.Open(path, syscall.O_WRONLY|syscall.O_APPEND, 0)
		if err == nil {
			_, err = syscall.Write(fd, []byte(arg(2)))
			if cerr := syscall.Close(fd); err == nil {
				err = cerr
			}
		}
	case "unlink":
		err = syscall.Unlink(path)
	case "rename":
		err = syscall.Rename(path, arg(2))
	case "chmod":
		var mode uint64
		mode, err = strconv.ParseUint(arg(2), 8, 32)
		if err == nil {
			err = syscall.Chmod(path, uint32(mode))
		}
	case "mkdir":
		err = syscall.Mkdir(path, 0o755)
	case "createmode", "mkdirmode":
		// createmode/mkdirmode PATH MODE UMASK (octal): creat or mkdir
		// with that mode under that umask.
		var mode, umask uint64
		if mode, err = strconv.ParseUint(arg(2), 8, 32); err == nil {
			if umask, err = strconv.ParseUint(arg(3), 8, 32); err == nil {
				syscall.Umask(int(umask))
				if op == "mkdirmode" {
					err = syscall.Mkdir(path, uint32(mode))
				} else if fd, cerr := syscall.Open(path, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_EXCL, uint32(mode)); cerr != nil {
					err = cerr
				} else {
					err = syscall.Close(fd)
				}
			}
		}
	case "creatrw":
		var mode uint64
		if mode, err = strconv.ParseUint(arg(2), 8, 32); err == nil {
			err = creatRW(path, uint32(mode), []byte(arg(3)))
		}
	case "openrw":
		var fd int
		fd, err = syscall.Open(path, syscall.O_RDWR, 0)
		if err == nil {
			err = syscall.Close(fd)
		}
	case "readdir":
		_, err = os.ReadDir(path)
	case "churn":
		var n int
		if n, err = strconv.Atoi(arg(2)); err == nil {
			err = churn(path, n)
		}
	default:
		fmt.Fprintln(os.Stderr, "helper: unknown op", op)
		return 2
	}
	var errno syscall.Errno
	if err != nil && !errors.As(err, &errno) {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
	}
	fmt.Printf("errno=%d\n", int(errno))
	return 0
}

// creatRW does what a program creating a private file does:
// open(O_CREAT|O_EXCL|O_RDWR, mode), then writes data, reads it back,
// truncates and extends it through the descriptor and closes it. On
// Linux all of it succeeds whatever mode is: the open that creates a
// file gets the access it asked for.
func creatRW(path string, mode uint32, data []byte) error {
	fd, err := syscall.Open(path, syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR, mode)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	fail := func(op string, err error) error {
		syscall.Close(fd)
		return fmt.Errorf("%s: %w", op, err)
	}
	if _, err := syscall.Write(fd, append(data, "tail"...)); err != nil {
		return fail("write", err)
	}
	if err := syscall.Ftruncate(fd, int64(len(data))); err != nil {
		return fail("ftruncate", err)
	}
	if err := syscall.Fsync(fd); err != nil {
		return fail("fsync", err)
	}
	buf := make([]byte, len(data)+8)
	n, err := syscall.Pread(fd, buf, 0)
	if err != nil {
		return fail("pread", err)
	}
	if string(buf[:n]) != string(data) {
		syscall.Close(fd)
		return fmt.Errorf("read back %q, want %q: %w", buf[:n], data, syscall.EIO)
	}
	if err := syscall.Close(fd); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// churn creates, writes, closes, renames over and stats a file in dir n
// times, as programs that save files atomically do. It carries on after
// failures and returns the first one, with a count of failures per step.
func churn(dir string, n int) error {
	tmp, target := dir+"/churn.tmp", dir+"/churn"
	var first error
	fails := map[string]int{}
	fail := func(i int, op string, err error) {
		fails[op]++
		if first == nil {
			first = fmt.Errorf("iteration %d: %s: %w", i, op, err)
		}
	}
	for i := 0; i < n; i++ {
		fd, err := syscall.Open(tmp, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC, 0o644)
		if err != nil {
			fail(i, "open", err)
			continue
		}
		if _, err := syscall.Write(fd, []byte("iteration "+strconv.Itoa(i))); err != nil {
			fail(i, "write", err)
		}
		if err := syscall.Close(fd); err != nil {
			fail(i, "close", err)
			continue
		}
		if err := syscall.Rename(tmp, target); err != nil {
			fail(i, "rename", err)
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(target, &st); err != nil {
			fail(i, "stat", err)
		}
	}
	if first != nil {
		fmt.Fprintf(os.Stderr, "helper: failures in %d iterations per step: %v\n", n, fails)
	}
	return first
}

// as runs the helper operation as uid:gid (no supplementary groups) and
// returns the errno it got.
func as(t *testing.T, uid, gid int, op string, args ...string) syscall.Errno {
	t.Helper()
	name, argv := asUser(uid, gid, helperBin, append([]string{op}, args...)...)
	r := run(t, "/", 30*time.Second, []string{helperEnv + "=1"}, name, argv...)
	if r.err != nil {
		t.Fatalf("helper %s %v as %d: %v\n%s", op, args, uid, r.err, r.out)
	}
	s, ok := strings.CutPrefix(strings.TrimSpace(r.stdout), "errno=")
	n, err := strconv.Atoi(s)
	if !ok || err != nil {
		t.Fatalf("helper %s %v: bad output %q", op, args, r.out)
	}
	return syscall.Errno(n)
}

// expect checks that uid:gid doing op gets want (0 for success).
func expect(t *testing.T, uid, gid int, want syscall.Errno, op string, args ...string) {
	t.Helper()
	if got := as(t, uid, gid, op, args...); got != want {
		t.Errorf("uid %d: %s %s: got %v (%d), want %v (%d)", uid, op, strings.Join(args, " "),
			errnoName(got), int(got), errnoName(want), int(want))
	}
}

func errnoName(e syscall.Errno) string {
	if e == 0 {
		return "success"
	}
	return e.Error()
}
