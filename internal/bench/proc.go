package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// ensureUnmounted unmounts dir if it is still mounted: normally, then
// lazily, then with fusermount (for a non-root user).
func ensureUnmounted(dir string, log *slog.Logger) error {
	if !mountinfo.Mounted(dir) {
		return nil
	}
	log.Warn("still mounted; unmounting", "mountpoint", dir)
	for i := 0; i < 10 && mountinfo.Mounted(dir); i++ {
		if err := unix.Unmount(dir, 0); err != nil && !errors.Is(err, unix.EBUSY) {
			break
		}
		if mountinfo.Mounted(dir) {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if mountinfo.Mounted(dir) {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
	for _, fm := range []string{"fusermount3", "fusermount"} {
		if !mountinfo.Mounted(dir) {
			break
		}
		if p, err := exec.LookPath(fm); err == nil {
			_ = exec.Command(p, "-u", "-z", dir).Run()
		}
	}
	if mountinfo.Mounted(dir) {
		return fmt.Errorf("could not unmount %s", dir)
	}
	return nil
}

// lineWatcher is a child's stdout: it copies everything to w and closes
// ready when a line starting with prefix appears.
type lineWatcher struct {
	w      io.Writer
	prefix string
	ready  chan string
	mu     sync.Mutex
	buf    []byte
	seen   bool
}

func newLineWatcher(w io.Writer, prefix string) *lineWatcher {
	return &lineWatcher{w: w, prefix: prefix, ready: make(chan string, 1)}
}

func (lw *lineWatcher) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if !lw.seen {
		lw.buf = append(lw.buf, p...)
		for {
			i := bytes.IndexByte(lw.buf, '\n')
			if i < 0 {
				break
			}
			line := string(lw.buf[:i])
			lw.buf = lw.buf[i+1:]
			if strings.HasPrefix(line, lw.prefix) {
				lw.seen = true
				lw.buf = nil
				lw.ready <- line
				break
			}
		}
	}
	if lw.w != nil {
		lw.w.Write(p) // best effort: a log file
	}
	return len(p), nil
}

// child is a long-running process the benchmark started: a loopback file
// system or `wheelfs up`. It has its own process group, so that the
// terminal's Ctrl-C reaches only the benchmark, which then stops its
// children in order (and gets SIGTERM if the benchmark dies).
type child struct {
	name    string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	logPath string
}

// startChild starts argv with stderr and stdout appended to logPath;
// stdout, if not nil, wraps the log file for the child's standard output.
func startChild(name, logPath string, stdout func(log io.Writer) io.Writer, argv ...string) (*child, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(lf, "==== %s: %s\n", time.Now().Format(time.RFC3339), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = lf
	cmd.Stdout = lf
	if stdout != nil {
		cmd.Stdout = stdout(lf)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), logPath: logPath}
	go func() {
		c.err = cmd.Wait()
		lf.Close()
		close(c.done)
	}()
	return c, nil
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// logTail returns the last lines of the child's log, for error messages.
func (c *child) logTail(n int) string {
	return tailFile(c.logPath, n)
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop sends SIGTERM and waits up to grace for the child to exit, then
// kills its process group. It returns the child's exit error (nil for
// status 0), or an error saying it had to be killed.
func (c *child) stop(grace time.Duration) error {
	if c.exited() {
		return c.exitErr()
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return c.exitErr()
	case <-time.After(grace):
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.done
	return fmt.Errorf("%s did not exit within %s of SIGTERM; killed", c.name, grace)
}

func (c *child) exitErr() error {
	if c.err != nil {
		return fmt.Errorf("%s exited: %w", c.name, c.err)
	}
	return nil
}

// waitMounted polls /proc/self/mountinfo until dir is a mount point.
func waitMounted(ctx context.Context, c *child, dir string, timeout time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(timeout)
	next := time.Now().Add(5 * time.Second)
	for !mountinfo.Mounted(dir) {
		if c.exited() {
			return fmt.Errorf("%s exited before mounting (%v); log %s:\n%s", c.name, c.err, c.logPath, c.logTail(15))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not mount %s within %s", c.name, dir, timeout)
		}
		if time.Now().After(next) {
			log.Info("waiting for mount", "target", c.name, "mountpoint", dir)
			next = time.Now().Add(5 * time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// findGo returns the go command: on PATH, or in $GOROOT/bin or
// /usr/local/go/bin (sudo's secure_path usually lacks it).
func findGo() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	for _, dir := range []string{os.Getenv("GOROOT"), "/usr/local/go", "/usr/lib/go"} {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, "bin", "go")
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("the go command is not on PATH (needed to build the loopback file system and find GOROOT); put go on PATH or set GOROOT")
}
