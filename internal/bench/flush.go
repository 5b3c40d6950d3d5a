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

// durableAppends times what one durable step costs on the backing disk:
// pwrite of a small record after the last one, then fdatasync, into a file
// written and synced in full beforehand, as WheelFS's log is. A file system
// that makes a create durable before it returns pays at least this once per
// create; the loopback (and the raw disk) pay nothing, which is why the
// table also gives WheelFS's ratio to "loopback + these flushes".
func durableAppends(ctx context.Context, dir string) (*Measurement, error) {
	path := filepath.Join(dir, "flush.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer os.Remove(path)
	defer f.Close()
	if _, err := f.Write(make([]byte, flushRecords*flushRecordSize+4096)); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	rec := make([]byte, flushRecordSize)
	fd := int(f.Fd())
	start := time.Now()
	for i := 0; i < flushRecords; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rec[0] = byte(i)
		if _, err := unix.Pwrite(fd, rec, int64(i*flushRecordSize)); err != nil {
			return nil, fmt.Errorf("pwrite: %w", err)
		}
		if err := unix.Fdatasync(fd); err != nil {
			return nil, fmt.Errorf("fdatasync: %w", err)
		}
	}
	return measured(time.Since(start), flushRecords, "syncs/s"), nil
}

// durableSteps is how many durable steps WheelFS makes in m, a
// measurement of key, with its default .SyncLevel: each create and each
// close that commits data (tar: every regular file twice, every directory
// once); 0 for workloads that make none (unlinks are durable lazily, stats
// and reads change nothing).
func (r *Report) durableSteps(key string, m *Measurement) float64 {
	switch key {
	case Create:
		return float64(m.Count)
	case Tar:
		return float64(2*m.Count) + float64(r.TarDirs)
	}
	return 0
}

// durableFloor is the loopback's measurement of key with one flush (the
// raw disk's durable append, in the same run) added per durable step: what
// the loopback would take if it made its creates and closes durable as
// WheelFS does. ok is false without the figures.
func (r *Report) durableFloor(key string) (*Measurement, bool) {
	lb, raw := r.Target(Loopback), r.Target(Raw)
	if lb == nil || raw == nil {
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
