package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// chunk is the size of every sequential read and write.
const chunk = 1 << 20

// progress logs at most every few seconds while a step runs.
type progress struct {
	log  *slog.Logger
	next time.Time
}

func newProgress(log *slog.Logger) *progress {
	return &progress{log: log, next: time.Now().Add(5 * time.Second)}
}

func (p *progress) maybe(msg string, args ...any) {
	if now := time.Now(); now.After(p.next) {
		p.log.Info(msg, args...)
		p.next = now.Add(5 * time.Second)
	}
}

// randomData returns n bytes from a seeded ChaCha8 stream: no block
// repeats, so that deduplication or compression cannot help a target.
func randomData(n int64) []byte {
	var seed [32]byte
	copy(seed[:], "wheelfs bench: incompressible!!")
	buf := make([]byte, n)
	c := rand.NewChaCha8(seed)
	_, _ = c.Read(buf)
	return buf
}

func measured(d time.Duration, count int64, unit string) *Measurement {
	m := &Measurement{Seconds: d.Seconds(), Count: count, Unit: unit}
	if d > 0 {
		m.Rate = float64(count) / d.Seconds()
		if unit == "MB/s" {
			m.Rate /= 1e6
		}
	}
	return m
}

// seqWrite writes data to path in 1 MiB writes, then fsyncs and closes it;
// all of that is timed.
func seqWrite(ctx context.Context, path string, data []byte, log *slog.Logger) (*Measurement, error) {
	pr := newProgress(log)
	start := time.Now()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	for off := 0; off < len(data); off += chunk {
		if err := ctx.Err(); err != nil {
			f.Close()
			return nil, err
		}
		if _, err := f.Write(data[off:min(off+chunk, len(data))]); err != nil {
			f.Close()
			return nil, fmt.Errorf("write at %d: %w", off, err)
		}
		pr.maybe("writing", "done", FormatSize(int64(off+chunk)), "of", FormatSize(int64(len(data))))
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("close: %w", err)
	}
	return measured(time.Since(start), int64(len(data)), "MB/s"), nil
}

// seqRead reads path in 1 MiB reads and checks it holds exactly data.
func seqRead(ctx context.Context, path string, data []byte, log *slog.Logger) (*Measurement, error) {
	pr := newProgress(log)
	buf := make([]byte, chunk)
	start := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	for off := 0; off < len(data); off += chunk {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		want := data[off:min(off+chunk, len(data))]
		n, err := io.ReadFull(f, buf[:len(want)])
		if err != nil {
			return nil, fmt.Errorf("read at %d: got %d bytes: %w", off, n, err)
		}
		if !bytes.Equal(buf[:n], want) {
			i := 0
			for i < n && buf[i] == want[i] {
				i++
			}
			return nil, fmt.Errorf("read back wrong data at offset %d", off+i)
		}
		pr.maybe("reading", "done", FormatSize(int64(off+n)), "of", FormatSize(int64(len(data))))
	}
	if n, _ := f.Read(buf[:1]); n != 0 {
		return nil, fmt.Errorf("file is longer than the %d bytes written", len(data))
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("close: %w", err)
	}
	return measured(time.Since(start), int64(len(data)), "MB/s"), nil
}

// metaWorkloads runs the small-file workloads in dir: create, stat, readdir,
// unlink, each timed separately. A failed step ends the sequence.
func metaWorkloads(ctx context.Context, dir string, files int, log *slog.Logger, res map[string]*Measurement) {
	fail := func(keys []string, err error) {
		for _, k := range keys {
			res[k] = &Measurement{Error: err.Error()}
		}
	}
	all := []string{Create, Stat, Readdir, Unlink}
	if err := os.Mkdir(dir, 0o755); err != nil {
		fail(all, err)
		return
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		fail(all, err)
		return
	}
	defer unix.Close(fd)
	names := fileNames(files)
	steps := []struct {
		key string
		op  func(name string) error
	}{
		{Create, func(name string) error { return createEmpty(fd, name) }},
		{Stat, func(name string) error {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 0 {
				return fmt.Errorf("mode %o size %d, want an empty regular file", st.Mode, st.Size)
			}
			return nil
		}},
		{Readdir, nil},
		{Unlink, func(name string) error { return unix.Unlinkat(fd, name, 0) }},
	}
	for i, s := range steps {
		if s.key == Stat {
			// Let the loopback's 1 s entry and attribute caches expire, so
			// that each of its stats reaches its file system. WheelFS's
			// mount keeps attributes under its leases (up to 10 s, taken
			// back on revocation), so its stats here are the kernel's:
			// what a user re-reading a tree sees (docs/BENCHMARKS.md).
			time.Sleep(1500 * time.Millisecond)
		}
		log.Info("metadata step", "step", s.key, "files", files)
		pr := newProgress(log)
		var m *Measurement
		var err error
		if s.key == Readdir {
			m, err = readdir(dir, files)
		} else {
			start := time.Now()
			for j, name := range names {
				if err = ctx.Err(); err != nil {
					break
				}
				if err = s.op(name); err != nil {
					err = fmt.Errorf("%s %s (after %d): %w", s.key, name, j, err)
					break
				}
				pr.maybe(s.key, "done", j+1, "of", files)
			}
			if err == nil {
				m = measured(time.Since(start), int64(files), "ops/s")
			}
		}
		if err != nil && ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Error("workload failed", "workload", s.key, "err", err)
			res[s.key] = &Measurement{Error: err.Error()}
			for _, k := range all[i+1:] {
				res[k] = &Measurement{Error: "not run: " + s.key + " failed"}
			}
			return
		}
		log.Info("workload done", "workload", s.key, "seconds", fmt.Sprintf("%.3f", m.Seconds), "rate", formatNumber(m.Rate)+" "+m.Unit)
		res[s.key] = m
	}
}

// createEmpty is the create workload's step: a new empty file name in the
// directory dirfd, created and closed.
func createEmpty(dirfd int, name string) error {
	f, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	return unix.Close(f)
}

// fileNames names the small files of the metadata workloads.
func fileNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("f%07d", i)
	}
	return names
}

// readdir lists dir in full and checks it holds want entries.
func readdir(dir string, want int) (*Measurement, error) {
	start := time.Now()
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, err
	}
	d := time.Since(start)
	if len(names) != want {
		return nil, fmt.Errorf("readdir returned %d entries, want %d", len(names), want)
	}
	m := measured(d, int64(want), "entries/s")
	return m, nil
}

// prepareTarball archives $GOROOT/src into path and counts its regular
// files and directories.
func prepareTarball(ctx context.Context, goroot, path string) (files, dirs int, err error) {
	err = filepath.WalkDir(filepath.Join(goroot, "src"), func(_ string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
		case d.Type().IsRegular():
			files++
		case d.IsDir():
			dirs++
		}
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	cmd := exec.CommandContext(ctx, "tar", "-C", goroot, "-cf", path, "src")
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("tar -c: %v: %s", err, out)
	}
	return files, dirs, nil
}

// extract runs `tar -xf tarball -C dir` (timed) after reading the tarball
// once so that it comes from the page cache for every target.
func extract(ctx context.Context, tarball, dir string, files int, log *slog.Logger) (*Measurement, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	if f, err := os.Open(tarball); err == nil {
		_, _ = io.Copy(io.Discard, f)
		f.Close()
	}
	unix.Sync()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", dir)
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			d := time.Since(start)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if err != nil {
				msg := strings.TrimSpace(stderr.String())
				lines := strings.Split(msg, "\n")
				if len(lines) > 5 {
					msg = strings.Join(lines[:5], "\n") + fmt.Sprintf("\n... (%d more lines)", len(lines)-5)
				}
				return nil, fmt.Errorf("tar -x: %v: %s", err, msg)
			}
			return measured(d, int64(files), "files/s"), nil
		case <-tick.C:
			log.Info("still extracting", "elapsed", time.Since(start).Round(time.Second))
		}
	}
}

// dropCaches writes back dirty data and drops the page, dentry and inode
// caches. It fails unless run as root.
func dropCaches() error {
	unix.Sync()
	f, err := os.OpenFile("/proc/sys/vm/drop_caches", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("3\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errors.Join(errors.New("drop caches"), err)
	}
	return nil
}

// onQuietThread runs f on an OS thread of its own on which every signal is
// blocked, and waits for it. A signal arriving at a thread blocked in a
// FUSE request makes the kernel send the file system an INTERRUPT; the Go
// runtime itself signals threads (SIGURG, for preemption), which a C
// program such as tar or dd never gets. Blocking them makes the timed
// loops behave like such a program on every target. Ctrl-C still reaches
// the process on its other threads, and the loops check the context.
func onQuietThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread is given back with its mask restored rather than
		// ended: a child started with Pdeathsig from this thread (the
		// loopback, wheelfs up) would get that signal if it ended.
		runtime.LockOSThread()
		var all, old unix.Sigset_t
		for i := range all.Val {
			all.Val[i] = ^all.Val[i]
		}
		if err := unix.PthreadSigmask(unix.SIG_BLOCK, &all, &old); err != nil {
			runtime.UnlockOSThread()
			f()
			return
		}
		defer func() {
			if unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil) == nil {
				runtime.UnlockOSThread()
			} // else stay locked: the thread ends with the goroutine
		}()
		f()
	}()
	<-done
}
