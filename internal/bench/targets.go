package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
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
	return &rawTarget{dir: dir}, mkdirSpread(dir)
}

// mkdirSpread makes a target's directory on the backing disk, whose
// subdirectories each start in an ext4 block group of their own
// (spreadSubdirs).
func mkdirSpread(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return spreadSubdirs(dir)
}

func (t *rawTarget) Root() string                  { return t.dir }
func (t *rawTarget) Describe() string              { return "directory " + t.dir }
func (t *rawTarget) Restart(context.Context) error { return nil }
func (t *rawTarget) Close() error                  { return nil }
func (t *rawTarget) Check() error                  { return nil }

// loopbackTarget is go-fuse's loopback mounting a directory of the backing
// disk, served by `wheelfs bench loopback` (internal/loopbackfs).
type loopbackTarget struct {
	backing, mnt string
	passthrough  bool
	proc         *child
	log          *slog.Logger
}

func startLoopback(ctx context.Context, self string, passthrough bool, base string, log *slog.Logger) (*loopbackTarget, error) {
	t := &loopbackTarget{backing: filepath.Join(base, "loopback-backing"), mnt: filepath.Join(base, "loopback-mnt"),
		passthrough: passthrough, log: log}
	if err := mkdirSpread(t.backing); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(t.mnt, 0o755); err != nil {
		return nil, err
	}
	argv := []string{self, "bench", "loopback", t.mnt, t.backing}
	if os.Getuid() == 0 {
		// Like `wheelfs up` as root: allow_other, with the kernel
		// checking permissions (and mount(2) called directly).
		argv = append(argv, "--allow-other")
	}
	if passthrough {
		argv = append(argv, "--passthrough")
	}
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
	how := "reads and writes through its process"
	if t.passthrough {
		how = "FUSE passthrough: the kernel reads and writes the backing files"
	}
	return fmt.Sprintf("go-fuse loopback at %s over %s (%s)", t.mnt, t.backing, how)
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
	if err := mkdirSpread(t.data); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(t.mnt, 0o755); err != nil {
		return nil, err
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
