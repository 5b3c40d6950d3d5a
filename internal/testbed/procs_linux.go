package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// procStart returns a process's state letter and start time (clock ticks
// since boot), which tells a live process from a reused PID.
func procStart(pid int) (state byte, start uint64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err == nil
}

// alive tells whether the host's recorded process still runs.
func (h *Host) alive() bool {
	if h.PID <= 0 {
		return false
	}
	state, start, ok := procStart(h.PID)
	return ok && state != 'Z' && state != 'X' && start == h.Start
}

// start starts the host's process in its namespace, detached from the
// caller (its own session), with output appended to its log.
func (st *State) start(h *Host) error {
	lf, err := os.OpenFile(h.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	fmt.Fprintf(lf, "==== %s: wheelfs %s\n", time.Now().Format(time.RFC3339), strings.Join(h.Args, " "))
	if h.Ready != "" {
		os.Remove(h.Ready)
	}
	if h.Mount != "" {
		unmountDead(h.Mount) // left by a killed mount process
		if err := os.MkdirAll(h.Mount, 0o755); err != nil {
			return err
		}
	}
	cmd := exec.Command(st.Opts.Binary, h.Args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := startIn(h.NS, cmd); err != nil {
		return fmt.Errorf("start %s: %w", h.Name, err)
	}
	h.PID = cmd.Process.Pid
	_, h.Start, _ = procStart(h.PID)
	go cmd.Wait() // reap it if it exits while we run
	return nil
}

// unmountDead lazily unmounts a mount point left by a killed mount
// process ("transport endpoint is not connected").
func unmountDead(dir string) {
	if mountinfo.Mounted(dir) {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
}

// waitReady waits for the host's ready file, failing early if its process
// exits.
func (h *Host) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(h.Ready); err == nil {
			return nil
		}
		if !h.alive() {
			return fmt.Errorf("%s exited before it was ready; last lines of %s:\n%s", h.Name, h.Log, tail(h.Log, 15))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s; last lines of %s:\n%s", h.Name, timeout, h.Log, tail(h.Log, 15))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop signals the host's process and waits up to grace for it to exit
// (SIGKILL afterwards). kill9 sends SIGKILL at once, as a crash would; the
// mount is then left dead, as after a crash, until restart.
func (h *Host) stop(kill9 bool, grace time.Duration) error {
	if !h.alive() {
		return nil
	}
	sig := syscall.SIGTERM
	if kill9 {
		sig = syscall.SIGKILL
	}
	if err := syscall.Kill(h.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	deadline := time.Now().Add(grace)
	for h.alive() {
		if time.Now().After(deadline) {
			_ = syscall.Kill(h.PID, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
			sig = syscall.SIGKILL
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// processesIn returns the PIDs of every process whose network namespace is
// one of the given inodes.
func processesIn(inodes map[uint64]bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil {
			continue
		}
		if inodes[st.Ino] {
			if s, _, ok := procStart(pid); ok && s != 'Z' {
				out = append(out, pid)
			}
		}
	}
	return out
}

func tail(path string, n int) string {
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

func mkdirs(dirs ...string) error {
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Counters are a host's resource use so far: its process's CPU time and
// the bytes its network interface moved.
type Counters struct {
	CPU     time.Duration
	RxBytes uint64
	TxBytes uint64
}

// Counters reads the host's counters (CPU of its current process only).
func (h *Host) Counters() (Counters, error) {
	var c Counters
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", h.PID))
	if err != nil || !h.alive() {
		return c, fmt.Errorf("%s is not running", h.Name)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	c.CPU = time.Duration(utime+stime) * time.Second / 100 // USER_HZ
	hl, ns, err := handle(h.NS)
	if err != nil {
		return c, err
	}
	defer hl.Close()
	defer ns.Close()
	l, err := hl.LinkByName("eth0")
	if err != nil {
		return c, err
	}
	if s := l.Attrs().Statistics; s != nil {
		c.RxBytes, c.TxBytes = s.RxBytes, s.TxBytes
	}
	return c, nil
}
