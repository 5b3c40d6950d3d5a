package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// flushRecords is how many durable appends the flush workload times.
const flushRecords = 2000

// flushRecordSize is about one create's log record in WheelFS (510 bytes
// in the daemon's trace).
const flushRecordSize = 512

// durableLog is a file prepared as WheelFS's log is (written and synced
// in full beforehand, so that an append changes no meta-data) for n
// records of flushRecordSize bytes, each made durable on its own.
type durableLog struct {
	f   *os.File
	rec []byte
}

func openDurableLog(path string, n int) (*durableLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	l := &durableLog{f: f, rec: make([]byte, flushRecordSize)}
	if _, err := f.Write(make([]byte, n*flushRecordSize+4096)); err != nil {
		l.close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// append writes record i and waits until it is on stable storage.
func (l *durableLog) append(i int) error {
	l.rec[0] = byte(i)
	if _, err := unix.Pwrite(int(l.f.Fd()), l.rec, int64(i*flushRecordSize)); err != nil {
		return fmt.Errorf("pwrite: %w", err)
	}
	if err := unix.Fdatasync(int(l.f.Fd())); err != nil {
		return fmt.Errorf("fdatasync: %w", err)
	}
	return nil
}

func (l *durableLog) close() {
	l.f.Close()
	os.Remove(l.f.Name())
}

// durableAppends times what one durable step costs on the backing disk
// when nothing else runs: flushRecords appends to a durableLog in dir. A
// file system that makes a create durable before it returns pays at least
// this once per create; the loopback (and the raw disk) pay nothing.
func durableAppends(ctx context.Context, dir string) (*Measurement, error) {
	l, err := openDurableLog(filepath.Join(dir, "flush.log"), flushRecords)
	if err != nil {
		return nil, err
	}
	defer l.close()
	start := time.Now()
	for i := 0; i < flushRecords; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := l.append(i); err != nil {
			return nil, err
		}
	}
	return measured(time.Since(start), flushRecords, "syncs/s"), nil
}

// durableCreates is the create workload on the loopback made durable as
// WheelFS's is: after each openat(O_CREAT|O_EXCL)+close in dir (a new
// directory in the mount), one record appended to a durableLog at logPath
// (on the backing disk, outside the mount) and synced. It measures the
// floor of a durable create on this machine, the spacing between flushes
// included: a flush after 250 us of other work took 1.3-1.7x as long as
// back to back (docs/BENCHMARKS.md), which durableAppends alone misses.
func durableCreates(ctx context.Context, dir, logPath string, files int) (*Measurement, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	l, err := openDurableLog(logPath, files)
	if err != nil {
		return nil, err
	}
	defer l.close()
	names := fileNames(files)
	start := time.Now()
	for i, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := createEmpty(fd, name); err != nil {
			return nil, fmt.Errorf("create %s: %w", name, err)
		}
		if err := l.append(i); err != nil {
			return nil, err
		}
	}
	return measured(time.Since(start), int64(files), "ops/s"), nil
}

// durableSteps is how many durable steps WheelFS makes in m, a
// measurement of key, with its default .SyncLevel: each create-and-close
// (the close makes the create durable, with the file's data if it wrote)
// and each mkdir (tar: every regular file once, every directory once); 0
// for workloads that make none (unlinks are durable lazily, stats and
// reads change nothing).
func (r *Report) durableSteps(key string, m *Measurement) float64 {
	switch key {
	case Create:
		return float64(m.Count)
	case Tar:
		return float64(m.Count) + float64(r.TarDirs)
	}
	return 0
}

// durableFloor is what the loopback would take for key if it made its
// creates and closes durable as WheelFS does: for creates, measured
// (durableCreates) where the run has it; otherwise the loopback's
// measurement with one flush (the raw disk's durable append, in the same
// run) added per durable step. ok is false without the figures.
func (r *Report) durableFloor(key string) (*Measurement, bool) {
	lb, raw := r.Target(Loopback), r.Target(Raw)
	if lb == nil {
		return nil, false
	}
	if m := lb.Results[CreateDurable]; key == Create && m != nil && m.Error == "" {
		return m, true
	}
	if raw == nil {
		return nil, false
	}
	m, fl := lb.Results[key], raw.Results[Flush]
	if m == nil || fl == nil || m.Error != "" || fl.Error != "" || fl.Rate <= 0 {
		return nil, false
	}
	steps := r.durableSteps(key, m)
	if steps == 0 {
		return nil, false
	}
	secs := m.Seconds + steps/fl.Rate
	return measured(time.Duration(secs*float64(time.Second)), m.Count, m.Unit), true
}
