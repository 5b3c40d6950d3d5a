package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// target is one file system under test.
type target interface {
	// Root is the directory the workloads run in.
	Root() string
	// Describe says what the target is.
	Describe() string
	// Restart empties the file system's own caches (not the kernel's);
	// a no-op for the raw disk and the loopback mount.
	Restart(ctx context.Context) error
	// Check returns an error if the file system is no longer mounted or
	// its process has exited.
	Check() error
	// Close stops the file system and unmounts it.
	Close() error
}

// checkMount is Check for a FUSE target served by proc.
func checkMount(name, mnt string, proc *child) error {
	if proc == nil {
		return fmt.Errorf("%s is not running", name)
	}
	if proc.exited() {
		return fmt.Errorf("%s exited (%v); log %s:\n%s", name, proc.err, proc.logPath, proc.logTail(10))
	}
	if !mountinfo.Mounted(mnt) {
		return fmt.Errorf("%s is no longer mounted at %s", name, mnt)
	}
	return nil
}

// rawTarget is a plain directory on the backing disk.
type rawTarget struct{ dir string }

func newRaw(base string) (*rawTarget, error) {
	dir := filepath.Join(base, "raw")
	return &rawTarget{dir: dir}, os.MkdirAll(dir, 0o755)
}

func (t *rawTarget) Root() string                  { return t.dir }
func (t *rawTarget) Describe() string              { return "directory " + t.dir }
func (t *rawTarget) Restart(context.Context) error { return nil }
func (t *rawTarget) Close() error                  { return nil }
func (t *rawTarget) Check() error                  { return nil }

// loopbackPkg is go-fuse's example pass-through file system.
const loopbackPkg = "github.com/hanwen/go-fuse/v2/example/loopback"

// buildLoopback builds go-fuse's loopback example into outDir: inside the
// current module if that works (the WheelFS source tree), else in a
// scratch module that requires the go-fuse version this binary was built
// with.
func buildLoopback(ctx context.Context, goTool, outDir string, log *slog.Logger) (string, error) {
	out := filepath.Join(outDir, "loopback")
	log.Info("building go-fuse loopback", "package", loopbackPkg)
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", out, loopbackPkg)
	first, err := cmd.CombinedOutput()
	if err == nil {
		return out, nil
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	version := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/hanwen/go-fuse/v2" {
				version = d.Version
				if d.Replace != nil {
					version = d.Replace.Version
				}
			}
		}
	}
	if version == "" || version == "(devel)" {
		return "", fmt.Errorf("go build %s: %v\n%s", loopbackPkg, err, first)
	}
	log.Info("not in the WheelFS source tree; building loopback in a scratch module", "go-fuse", version)
	mod := filepath.Join(outDir, "loopback-mod")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return "", err
	}
	gomod := "module wheelfsbenchloopback\n\ngo 1.22\n"
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644); err != nil {
		return "", err
	}
	for _, args := range [][]string{
		{"get", "github.com/hanwen/go-fuse/v2@" + version},
		{"build", "-o", out, loopbackPkg},
	} {
		cmd := exec.CommandContext(ctx, goTool, args...)
		cmd.Dir = mod
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go %s: %v\n%s\n(in the current directory: %s)", strings.Join(args, " "), err, b, first)
		}
	}
	return out, nil
}

// loopbackTarget is go-fuse's loopback mounting a directory of the backing disk.
type loopbackTarget struct {
	backing, mnt string
	proc         *child
	log          *slog.Logger
}

func startLoopback(ctx context.Context, bin, base string, log *slog.Logger) (*loopbackTarget, error) {
	t := &loopbackTarget{backing: filepath.Join(base, "loopback-backing"), mnt: filepath.Join(base, "loopback-mnt"), log: log}
	for _, d := range []string{t.backing, t.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	argv := []string{bin}
	if os.Getuid() == 0 {
		// Like `wheelfs up` as root: allow_other, and the mount(2) call
		// itself rather than fusermount (not installed on every host;
		// `wheelfs up` opens /dev/fuse itself too).
		argv = append(argv, "-allow-other", "-directmount")
	}
	argv = append(argv, t.mnt, t.backing)
	log.Info("mounting loopback", "mountpoint", t.mnt, "backing", t.backing)
	p, err := startChild("loopback", filepath.Join(base, "loopback.log"), nil, argv...)
	if err != nil {
		return nil, err
	}
	t.proc = p
	if err := waitMounted(ctx, p, t.mnt, 30*time.Second, log); err != nil {
		return t, err
	}
	return t, nil
}

func (t *loopbackTarget) Root() string { return t.mnt }
func (t *loopbackTarget) Describe() string {
	return fmt.Sprintf("go-fuse loopback at %s over %s", t.mnt, t.backing)
}
func (t *loopbackTarget) Restart(context.Context) error { return nil }
func (t *loopbackTarget) Check() error                  { return checkMount("loopback", t.mnt, t.proc) }

func (t *loopbackTarget) Close() error {
	if t.proc == nil {
		return ensureUnmounted(t.mnt, t.log)
	}
	t.log.Info("unmounting loopback", "mountpoint", t.mnt)
	err := t.proc.stop(15 * time.Second)
	if uerr := ensureUnmounted(t.mnt, t.log); uerr != nil {
		err = errors.Join(err, uerr)
	}
	return err
}

// readyPrefix starts the line `wheelfs up` prints once mounted.
const readyPrefix = "WheelFS mounted at"

// wheelfsTarget is a one-host WheelFS run as `wheelfs up --data D M`.
type wheelfsTarget struct {
	self, data, mnt, logPath string
	proc                     *child
	log                      *slog.Logger
	starts                   int
}

func startWheelFS(ctx context.Context, self, base string, log *slog.Logger) (*wheelfsTarget, error) {
	t := &wheelfsTarget{self: self, data: filepath.Join(base, "wheelfs-data"), mnt: filepath.Join(base, "wheelfs-mnt"),
		logPath: filepath.Join(base, "wheelfs-up.log"), log: log}
	for _, d := range []string{t.data, t.mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return t, t.start(ctx)
}

func (t *wheelfsTarget) start(ctx context.Context) error {
	t.starts++
	log := t.log.With("mountpoint", t.mnt, "data", t.data)
	log.Info("starting wheelfs up", "start", t.starts)
	var lw *lineWatcher
	p, err := startChild("wheelfs up", t.logPath, func(log io.Writer) io.Writer {
		lw = newLineWatcher(log, readyPrefix)
		return lw
	}, t.self, "up", "--data", t.data, t.mnt)
	if err != nil {
		return err
	}
	t.proc = p
	began := time.Now()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-lw.ready:
			if !mountinfo.Mounted(t.mnt) {
				return fmt.Errorf("wheelfs up printed %q but %s is not in /proc/self/mountinfo", readyPrefix, t.mnt)
			}
			log.Info("wheelfs up is ready", "after", time.Since(began).Round(time.Millisecond))
			return nil
		case <-p.done:
			return fmt.Errorf("wheelfs up exited before it was ready (%v); log %s:\n%s", p.err, t.logPath, p.logTail(15))
		case <-timeout.C:
			return fmt.Errorf("wheelfs up not ready after 2m; log %s:\n%s", t.logPath, p.logTail(15))
		case <-tick.C:
			log.Info("waiting for wheelfs up", "elapsed", time.Since(began).Round(time.Second))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stop sends SIGTERM and expects `wheelfs up` to unmount and exit 0.
func (t *wheelfsTarget) stop() error {
	if t.proc == nil {
		return ensureUnmounted(t.mnt, t.log)
	}
	t.log.Info("stopping wheelfs up", "mountpoint", t.mnt)
	began := time.Now()
	err := t.proc.stop(60 * time.Second)
	if err != nil {
		err = fmt.Errorf("%w; log %s:\n%s", err, t.logPath, t.proc.logTail(15))
	} else {
		t.log.Info("wheelfs up stopped", "after", time.Since(began).Round(time.Millisecond))
	}
	if uerr := ensureUnmounted(t.mnt, t.log); uerr != nil {
		err = errors.Join(err, fmt.Errorf("wheelfs up exited but left %s mounted: %w", t.mnt, uerr))
	}
	t.proc = nil
	return err
}

func (t *wheelfsTarget) Root() string { return t.mnt }
func (t *wheelfsTarget) Describe() string {
	return fmt.Sprintf("wheelfs up at %s, data in %s", t.mnt, t.data)
}

func (t *wheelfsTarget) Restart(ctx context.Context) error {
	if err := t.stop(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return t.start(ctx)
}

func (t *wheelfsTarget) Close() error { return t.stop() }
func (t *wheelfsTarget) Check() error { return checkMount("wheelfs up", t.mnt, t.proc) }

// problems returns the last failed operations `wheelfs up` logged, as
// evidence for a failed workload.
func (t *wheelfsTarget) problems() []string {
	b, err := os.ReadFile(t.logPath)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `msg="operation failed"`) {
			out = append(out, line)
		}
	}
	if len(out) > 10 {
		out = append([]string{fmt.Sprintf("... %d earlier lines", len(out)-10)}, out[len(out)-10:]...)
	}
	return out
}
