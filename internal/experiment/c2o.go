package experiment

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/wheelfs/wheelfs/internal/testbed"
)

func closeToOpen() *Experiment {
	return &Experiment{
		Name:    "close-to-open",
		Summary: "write+close a 64 KiB file at one site, open+read it at another; cached re-read; close() at SyncLevel 1/2/3",
		Params:  map[string]string{"rtt": "100ms", "size": "65536", "idle": "0s", "slow-start-after-idle": "1"},
		Run:     runCloseToOpen,
	}
}

func runCloseToOpen(ctx context.Context, env *Env) (*Result, error) {
	rtts, err := env.Durations("rtt", "100ms")
	if err != nil {
		return nil, err
	}
	rtt := rtts[0]
	var size int
	if _, err := fmt.Sscan(env.Param("size", "65536"), &size); err != nil || size <= 0 {
		return nil, fmt.Errorf("size: want a positive number of bytes")
	}
	idle, err := env.Durations("idle", "0s")
	if err != nil {
		return nil, err
	}
	sites := []string{"west", "east", "eu"}
	st, err := up(ctx, env, testbed.Options{Sites: sites, RTT: testbed.Uniform(sites, rtt), ServersPerSite: 1, TCPCongestion: "cubic",
		NoSlowStartAfterIdle: env.Param("slow-start-after-idle", "1") == "0"})
	if err != nil {
		return nil, err
	}
	defer down(env)
	west, east := st.Mounts("west")[0], st.Mounts("east")[0]
	if err := os.Mkdir(filepath.Join(west, "c2o"), 0o755); err != nil {
		return nil, err
	}
	// The reader knows the directory before the first round, as a reader
	// that polls it would: the rounds time the file, not the path.
	if _, err := os.ReadDir(filepath.Join(east, "c2o")); err != nil {
		return nil, err
	}
	var write, closeT, read, reread []time.Duration
	var wreq, rreq, rrreq string // the requests of the last round
	for i := 0; i < env.Runs; i++ {
		data := make([]byte, size)
		rand.Read(data)
		name := fmt.Sprintf("c2o/f%d", i)
		var w, c time.Duration
		_, err, wreq = timedAt(west, func() (err error) {
			w, c, err = writeFile(filepath.Join(west, name), data)
			return err
		})
		if err != nil {
			return nil, err
		}
		// An idle pause lets the connections' congestion windows restart
		// (tcp_slow_start_after_idle) before the remote read.
		time.Sleep(idle[0])
		var r, rr time.Duration
		_, err, rreq = timedAt(east, func() (err error) {
			r, err = readCheck(filepath.Join(east, name), data)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("round %d: read at east: %w", i, err)
		}
		_, err, rrreq = timedAt(east, func() (err error) {
			rr, err = readCheck(filepath.Join(east, name), data)
			return err
		})
		if err != nil {
			return nil, err
		}
		write, closeT, read, reread = append(write, w), append(closeT, c), append(read, r), append(reread, rr)
		progress(env, "round %d: close %s ms, remote read %s ms, re-read %s ms", i+1, ms(c), ms(r), ms(rr))
	}
	sync := map[int][]time.Duration{}
	for level := 1; level <= 3; level++ {
		for i := 0; i < env.Runs; i++ {
			data := make([]byte, size)
			rand.Read(data)
			_, c, err := writeFile(filepath.Join(west, fmt.Sprintf(".SyncLevel=%d", level), fmt.Sprintf("c2o/s%d-%d", level, i)), data)
			if err != nil {
				return nil, fmt.Errorf("SyncLevel=%d: %w", level, err)
			}
			sync[level] = append(sync[level], c)
		}
		progress(env, "SyncLevel=%d: close %s", level, stats(sync[level]))
	}
	t := &Table{
		Title: fmt.Sprintf("%d-byte file, 3 sites, %s RTT, %d rounds, %s idle before each read, tcp_slow_start_after_idle=%s: median (min–max) ms",
			size, rtt, env.Runs, idle[0], env.Param("slow-start-after-idle", "1")),
		Columns: []string{"step", "WheelFS ms", "limit ms", "WheelFS / limit", "why the limit", "requests (last round)"},
	}
	add := func(step string, ds []time.Duration, limit time.Duration, why, reqs string) {
		s := stats(ds)
		t.Add(step, s.String(), ms(limit), ratio(s.Median, limit), why, reqs)
	}
	add("open+write at west (primary local)", write, 0, "all local", "")
	add("close() at west, default SyncLevel (3)", closeT, rtt, "1 RTT to the farther backup, in parallel", "with open+write: "+wreq)
	add("open+read at east, first time", read, rtt, "1 RTT to the primary, data with it", rreq)
	add("open+read at east again (cached)", reread, 0, "data cached; version under lease", rrreq)
	add("close() at .SyncLevel=1", sync[1], 0, "the primary's own disk", "")
	add("close() at .SyncLevel=2", sync[2], rtt, "1 RTT to the nearer backup", "")
	add("close() at .SyncLevel=3", sync[3], rtt, "1 RTT to the farther backup", "")
	return &Result{Tables: []*Table{t}}, nil
}

// writeFile creates path with data and returns the time of open+write and
// the time of close (when the write is durable at the promised SyncLevel).
func writeFile(path string, data []byte) (write, closeT time.Duration, err error) {
	t := time.Now()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, 0, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return 0, 0, err
	}
	write = time.Since(t)
	t = time.Now()
	if err := f.Close(); err != nil {
		return 0, 0, fmt.Errorf("close %s: %w", path, err)
	}
	return write, time.Since(t), nil
}

// readCheck times open+read+close of path and checks the contents.
func readCheck(path string, want []byte) (time.Duration, error) {
	t := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	got, err := io.ReadAll(f)
	f.Close()
	d := time.Since(t)
	if err != nil {
		return 0, err
	}
	if !bytes.Equal(got, want) {
		return 0, fmt.Errorf("%s: read %d bytes that differ from the %d written (stale read)", path, len(got), len(want))
	}
	return d, nil
}
