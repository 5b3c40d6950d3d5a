// Package e2e runs the real wheelfs binary (`wheelfs up`) with a real FUSE
// mount and drives it through the kernel: go-fuse's POSIX conformance
// tests, cue paths, permissions as seen by unprivileged local users, real
// programs (git, tar, sqlite3, rsync, cp, make), crash durability and the
// command's error messages.
//
// The tests need root and /dev/fuse; without them the package is skipped.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// wheelfsBin is the binary built once by TestMain.
var wheelfsBin string

// goBin is the go command used to build the binary (and to find GOROOT).
var goBin string

const (
	readyLine    = "WheelFS mounted at"
	readyTimeout = 60 * time.Second
	stopTimeout  = 45 * time.Second
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain(os.Args[1:]))
	}
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipping: these tests mount FUSE and switch users, so they must run as root")
		os.Exit(0)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Printf("e2e: skipping: /dev/fuse is not available: %v\n", err)
		os.Exit(0)
	}
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	var err error
	goBin, err = exec.LookPath("go")
	if err != nil {
		if gr := os.Getenv("GOROOT"); gr != "" {
			goBin = filepath.Join(gr, "bin", "go")
		} else {
			fmt.Fprintln(os.Stderr, "e2e: cannot find the go command to build wheelfs:", err)
			return 1
		}
	}
	dir, err := os.MkdirTemp("", "wheelfs-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Unprivileged users run the helper copy of this binary from here.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if err := copyHelper(filepath.Join(dir, "e2e-helper")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: copying the test binary for the helper:", err)
		return 1
	}
	helperBin = filepath.Join(dir, "e2e-helper")
	wheelfsBin = filepath.Join(dir, "wheelfs")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-o", wheelfsBin, "github.com/wheelfs/wheelfs/cmd/wheelfs")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building wheelfs: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// syncBuffer is a bytes.Buffer safe for a writer goroutine and readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// upProc is one running `wheelfs up`.
type upProc struct {
	t      *testing.T
	Mnt    string
	Data   string
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	exited chan struct{} // closed when the process has exited
	err    error         // Wait's result, valid after exited
	ended  bool          // stop or kill9 already ran
}

// startUp runs `wheelfs up --data dataDir MNT` on a fresh mount directory
// and returns once it has printed its readiness line. The cleanup stops it
// with SIGTERM (unless stop or kill9 already ran) and requires exit 0 and
// the mount gone. dataDir must come from t.TempDir (or outlive the test).
func startUp(t *testing.T, dataDir string) *upProc {
	t.Helper()
	mnt := t.TempDir() // registered before our cleanup, so removed after it
	return startUpAt(t, dataDir, mnt)
}

func startUpAt(t *testing.T, dataDir, mnt string) *upProc {
	t.Helper()
	return startWheelfs(t, dataDir, mnt, "up", "--data", dataDir, mnt)
}

// startWheelfs runs wheelfs with args in the foreground and returns once it
// has printed its readiness line (and, when mnt is not empty, mounted mnt),
// with the same cleanup as startUp.
func startWheelfs(t *testing.T, dataDir, mnt string, args ...string) *upProc {
	t.Helper()
	p := &upProc{t: t, Mnt: mnt, Data: dataDir, exited: make(chan struct{})}
	p.cmd = exec.Command(wheelfsBin, args...)
	readyPrefix := readyLine
	if mnt == "" {
		readyPrefix = "WheelFS " // "WheelFS <role> running (...)"
	}
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Its own process group, so a test's ^C does not race our SIGTERM; and
	// if the test binary dies (go test's timeout), wheelfs unmounts and exits.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start wheelfs %s: %v", args[0], err)
	}
	ready := make(chan struct{})
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			p.stdout.Write([]byte(line + "\n"))
			if !signalled && strings.HasPrefix(line, readyPrefix) {
				signalled = true
				close(ready)
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() {
		<-scanDone // Wait closes the pipe; let the scanner drain it first
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if !p.ended {
			p.stop()
		}
		if t.Failed() {
			t.Logf("wheelfs up (%s) stdout:\n%s\nstderr (last 8 KiB):\n%s", p.Mnt, p.stdout.String(), tail(p.stderr.String(), 8<<10))
		}
	})
	select {
	case <-ready:
	case <-p.exited:
		p.ended = true
		detach(mnt)
		t.Fatalf("wheelfs up exited before it was ready: %v\nstderr:\n%s", p.err, p.stderr.String())
	case <-time.After(readyTimeout):
		p.kill9()
		t.Fatalf("wheelfs up not ready within %v\nstderr:\n%s", readyTimeout, p.stderr.String())
	}
	if mnt != "" && !isMounted(mnt) {
		t.Fatalf("wheelfs up said it was ready but %s is not in /proc/self/mountinfo", mnt)
	}
	return p
}

// stop sends SIGTERM and requires a clean exit (status 0) with the mount gone.
func (p *upProc) stop() {
	t := p.t
	t.Helper()
	if p.ended {
		return
	}
	p.ended = true
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("SIGTERM wheelfs up: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		p.cmd.Process.Kill()
		<-p.exited
		detach(p.Mnt)
		t.Errorf("wheelfs up did not exit within %v of SIGTERM", stopTimeout)
		return
	}
	if p.err != nil {
		t.Errorf("wheelfs up exited with %v after SIGTERM, want status 0", p.err)
	}
	if isMounted(p.Mnt) {
		detach(p.Mnt)
		t.Errorf("%s still mounted after wheelfs up exited", p.Mnt)
	}
}

// kill9 kills the process with SIGKILL and detaches its dead mount.
func (p *upProc) kill9() {
	p.t.Helper()
	p.ended = true
	p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		p.t.Errorf("wheelfs up did not die within %v of SIGKILL", stopTimeout)
	}
	detach(p.Mnt)
	if isMounted(p.Mnt) {
		p.t.Errorf("%s still mounted after lazy unmount", p.Mnt)
	}
}

// detach lazily unmounts dir if something is mounted there.
func detach(dir string) {
	for i := 0; i < 10 && isMounted(dir); i++ {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			exec.Command("fusermount3", "-u", "-z", dir).Run()
		}
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// isMounted reports whether dir is a mount point.
func isMounted(dir string) bool { return mountinfo.Mounted(dir) }

// result is a finished command.
type result struct {
	stdout string
	out    string // stdout and stderr, interleaved
	err    error
	code   int
}

// run runs a command in dir with a time bound and returns its result.
func run(t *testing.T, dir string, timeout time.Duration, env []string, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, all syncBuffer
	cmd.Stdout = io.MultiWriter(&stdout, &all)
	cmd.Stderr = &all
	err := cmd.Run()
	r := result{stdout: stdout.String(), out: all.String(), err: err}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		r.code = -1
	}
	if ctx.Err() != nil {
		r.err = fmt.Errorf("%s timed out after %v: %w", name, timeout, err)
		r.code = -1
	}
	return r
}

// mustRun runs a command, fails the test unless it succeeds, and returns its stdout.
func mustRun(t *testing.T, dir string, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	r := run(t, dir, timeout, nil, name, args...)
	if r.err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), r.err, tail(r.out, 4<<10))
	}
	return r.stdout
}

// asUser prefixes a command line to run it as uid:gid with no supplementary groups.
func asUser(uid, gid int, name string, args ...string) (string, []string) {
	return "setpriv", append([]string{"--reuid=" + strconv.Itoa(uid), "--regid=" + strconv.Itoa(gid),
		"--clear-groups", "--", name}, args...)
}

// runAs runs a command as uid:gid and returns its result.
func runAs(t *testing.T, uid, gid int, name string, args ...string) result {
	t.Helper()
	n, a := asUser(uid, gid, name, args...)
	return run(t, "/", 30*time.Second, nil, n, a...)
}

// grepLines returns the lines of s that contain any of the words.
func grepLines(s string, words ...string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
