// Package bench implements `wheelfs bench`: one run that measures, side by
// side on the same backing disk, the raw disk (a plain directory), go-fuse's
// loopback example (the FUSE ceiling of the machine) and a one-host WheelFS
// started as `wheelfs up`. The workloads are a sequential write and a
// cold-cache sequential read in 1 MiB I/Os, create/stat/readdir/unlink of
// many empty files, and extracting a tarball of $GOROOT/src.
//
// Run does the measuring and owns every process and mount it starts: it
// stops and unmounts them before returning, whether the run succeeded,
// failed or its context was cancelled. WriteTable prints a Report.
package bench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// Options configures a run.
type Options struct {
	// Dir is where the scratch directory is made (default /var/tmp); all
	// three targets live in it, so they share its disk.
	Dir string
	// Size is the sequential file's size in bytes.
	Size int64
	// Files is the number of small files.
	Files int
	// Runs is how many times the sequential write and read, and the
	// metadata workloads, are repeated; each row reports its median (the
	// disk of a VM is noisy).
	Runs int
	// SkipLoopback leaves out the go-fuse loopback target.
	SkipLoopback bool
	// LoopbackPassthrough lets the loopback's kernel read and write its
	// backing files itself (loopbackfs.Options.Passthrough).
	LoopbackPassthrough bool
	// Keep leaves the scratch directory (logs, data) in place.
	Keep bool
	// Self is the wheelfs binary to run as `wheelfs up`.
	Self string
	// Logger receives progress; nil means slog.Default().
	Logger *slog.Logger
}

// Run measures every target and returns the report. It returns a partial
// report with an error if it was cancelled or could not prepare; failures
// of single workloads are recorded in the report instead.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if o.Size < chunk {
		return nil, fmt.Errorf("size %d: at least 1MiB", o.Size)
	}
	if o.Files < 1 {
		return nil, fmt.Errorf("files %d: at least 1", o.Files)
	}
	if avail := memAvailable(); avail > 0 && o.Size > avail/2 {
		return nil, fmt.Errorf("size %s: the data is generated in memory, and only %s is available", FormatSize(o.Size), gib(avail))
	}
	if o.Self == "" {
		return nil, errors.New("no wheelfs binary (Options.Self)")
	}
	parent := o.Dir
	if parent == "" {
		parent = "/var/tmp"
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	base, err := os.MkdirTemp(parent, "wheelfs-bench-")
	if err != nil {
		return nil, err
	}
	if base, err = filepath.Abs(base); err != nil {
		return nil, err
	}
	if err := spreadSubdirs(base); err != nil {
		log.Warn("cannot spread the targets over ext4 block groups: the comparators' creates may measure earlier passes' unlinks", "dir", base, "err", err)
	}
	// The mount points are in base, and the loopback or wheelfs could leave
	// one behind only if unmounting failed: never remove through a mount.
	defer func() {
		if left := mountinfo.Under(base); len(left) > 0 {
			err = errors.Join(err, fmt.Errorf("left mounted, not removing %s: %s", base, strings.Join(left, ", ")))
			return
		}
		if o.Keep {
			log.Info("keeping scratch directory", "dir", base)
			return
		}
		log.Info("removing scratch directory", "dir", base)
		if rerr := os.RemoveAll(base); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	log.Info("scratch directory", "dir", base)

	rep = &Report{Started: time.Now(), Machine: describeMachine(base), Dir: base, Size: o.Size, Files: o.Files}
	defer func() { rep.Finished, rep.Machine.LoadEnd = time.Now(), loadavg() }()

	goTool, err := findGo()
	if err != nil {
		return rep, err
	}
	out, err := exec.CommandContext(ctx, goTool, "env", "GOROOT").Output()
	if err != nil {
		return rep, fmt.Errorf("go env GOROOT: %w", err)
	}
	goroot := strings.TrimSpace(string(out))

	log.Info("preparing tarball", "of", filepath.Join(goroot, "src"))
	tarball := filepath.Join(base, "gosrc.tar")
	if rep.TarFiles, rep.TarDirs, err = prepareTarball(ctx, goroot, tarball); err != nil {
		return rep, err
	}
	log.Info("generating random data", "size", FormatSize(o.Size))
	data := randomData(o.Size)

	if err := dropCaches(); err != nil {
		log.Warn("cannot drop the kernel's caches (not root?): sequential reads will be WARM", "err", err)
	} else {
		rep.ColdCache = true
	}

	type setup struct {
		name  string
		start func() (target, error)
	}
	setups := []setup{{Raw, func() (target, error) { return newRaw(base) }}}
	if !o.SkipLoopback {
		rep.LoopbackDataPath = "process"
		if o.LoopbackPassthrough {
			rep.LoopbackDataPath = "passthrough"
		}
		setups = append(setups, setup{Loopback, func() (target, error) { return startLoopback(ctx, o.Self, o.LoopbackPassthrough, base, log) }})
	}
	setups = append(setups, setup{WheelFS, func() (target, error) { return startWheelFS(ctx, o.Self, base, log) }})

	for _, s := range setups {
		tr := &TargetResult{Name: s.name, Results: map[string]*Measurement{}}
		rep.Targets = append(rep.Targets, tr)
		tlog := log.With("target", s.name)
		tlog.Info("setting up target")
		t, serr := s.start()
		if t != nil {
			tr.Description = t.Describe()
		}
		if serr == nil {
			runTarget(ctx, t, o, data, tarball, rep, tr, tlog)
			if p, ok := t.(interface{ problems() []string }); ok && len(tr.failures()) > 0 {
				tr.Problems = p.problems()
			}
		} else {
			tr.Error = "setup: " + serr.Error()
			tlog.Error("target setup failed", "err", serr)
		}
		if t != nil {
			if cerr := t.Close(); cerr != nil {
				tr.Error = strings.TrimPrefix(tr.Error+"; ", "; ") + "teardown: " + cerr.Error()
				tlog.Error("target teardown failed", "err", cerr)
			}
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	return rep, nil
}

// allWorkloads lists the workloads in the order they run.
var allWorkloads = []string{SeqWrite, SeqRead, Create, Stat, Readdir, Unlink, Tar}

// runTarget runs every workload on one target, recording failures. It
// checks that the target is still mounted before and after each step, so
// that a vanished mount cannot pass its mount point's directory off as
// the file system.
func runTarget(ctx context.Context, t target, o Options, data []byte, tarball string, rep *Report, tr *TargetResult, log *slog.Logger) {
	record := func(key string, m *Measurement, err error) bool {
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			log.Error("workload failed", "workload", key, "err", err)
			tr.Results[key] = &Measurement{Error: err.Error()}
			return false
		}
		log.Info("workload done", "workload", key, "seconds", fmt.Sprintf("%.3f", m.Seconds),
			"rate", formatNumber(m.Rate)+" "+m.Unit)
		tr.Results[key] = m
		return true
	}
	// down reports whether the target is gone after (or before) the
	// workloads in keys; their results, if any, are then void and the
	// remaining ones are not run.
	down := func(keys ...string) bool {
		err := t.Check()
		if err == nil {
			return false
		}
		log.Error("target is down", "err", err)
		for _, k := range keys {
			tr.Results[k] = &Measurement{Error: "target went down: " + err.Error()}
		}
		for _, k := range allWorkloads {
			if tr.Results[k] == nil {
				tr.Results[k] = &Measurement{Error: "not run: target is down"}
			}
		}
		return true
	}
	var m *Measurement
	var err error

	unix.Sync()
	if down() {
		return
	}
	runs := max(o.Runs, 1)
	var writes, reads []*Measurement
	for i := 0; i < runs; i++ {
		seq := filepath.Join(t.Root(), fmt.Sprintf("seq-%d.dat", i))
		unix.Sync()
		log.Info("sequential write", "size", FormatSize(o.Size), "run", i+1, "of", runs)
		onQuietThread(func() { m, err = seqWrite(ctx, seq, data, log) })
		if err != nil {
			record(SeqWrite, m, err)
			tr.Results[SeqRead] = &Measurement{Error: "not run: the write failed"}
			break
		}
		writes = append(writes, m)
		if ctx.Err() != nil || down(SeqWrite) {
			return
		}
		log.Info("making caches cold before the read")
		if err := t.Restart(ctx); err != nil {
			record(SeqRead, nil, err)
			if ctx.Err() == nil {
				down() // a failed restart leaves nothing to run on
			}
			return
		}
		if rep.ColdCache {
			if err := dropCaches(); err != nil {
				log.Warn("drop caches failed", "err", err)
			}
		}
		if down() {
			return
		}
		log.Info("sequential read", "size", FormatSize(o.Size), "run", i+1, "of", runs)
		onQuietThread(func() { m, err = seqRead(ctx, seq, data, log) })
		if err != nil {
			record(SeqRead, m, err)
			break
		}
		reads = append(reads, m)
		if ctx.Err() != nil || down(SeqRead) {
			return
		}
		os.Remove(seq) // keep the disk's free space the same for every run
	}
	if len(writes) == runs {
		record(SeqWrite, median(writes), nil)
	}
	if len(reads) == runs {
		record(SeqRead, median(reads), nil)
	}

	// The metadata workloads run runs times too, each in a directory of
	// its own, and each row reports its median: one pass moved a ratio
	// by a third on a noisy disk (docs/BENCHMARKS.md).
	metaKeys := []string{Create, Stat, Readdir, Unlink}
	var metas []map[string]*Measurement
	// The floor of a durable create (durableFloor) is measured beside the
	// creates it bounds: the disk's durable append on the raw target, the
	// loopback's creates each followed by one on the loopback.
	var floorKey string
	switch t.(type) {
	case *rawTarget:
		floorKey = Flush
	case *loopbackTarget:
		floorKey = CreateDurable
	}
	for i := 0; i < runs; i++ {
		res := map[string]*Measurement{}
		if floorKey == Flush {
			unix.Sync()
			log.Info("durable appends", "records", flushRecords, "run", i+1, "of", runs)
			res[Flush] = measureOrError(Flush, log, func() (*Measurement, error) { return durableAppends(ctx, t.Root()) })
		}
		unix.Sync()
		log.Info("metadata workloads", "files", o.Files, "run", i+1, "of", runs)
		onQuietThread(func() { metaWorkloads(ctx, filepath.Join(t.Root(), fmt.Sprintf("meta-%d", i)), o.Files, log, res) })
		if floorKey == CreateDurable && ctx.Err() == nil && !failedAny(res, metaKeys) {
			unix.Sync()
			log.Info("durable creates (the floor of WheelFS's)", "files", o.Files, "run", i+1, "of", runs)
			logPath := filepath.Join(filepath.Dir(t.(*loopbackTarget).backing), "durable-creates.log")
			res[CreateDurable] = measureOrError(CreateDurable, log, func() (*Measurement, error) {
				return durableCreates(ctx, filepath.Join(t.Root(), fmt.Sprintf("durable-%d", i)), logPath, o.Files)
			})
		}
		metas = append(metas, res)
		if ctx.Err() != nil {
			return
		}
		if failedAny(res, metaKeys) {
			break
		}
		if down(metaKeys...) {
			return
		}
	}
	for _, k := range metaKeys {
		tr.Results[k] = medianOf(metas, k)
	}
	if floorKey != "" {
		tr.Results[floorKey] = medianOf(metas, floorKey)
	}

	log.Info("extracting tarball", "files", rep.TarFiles)
	m, err = extract(ctx, tarball, filepath.Join(t.Root(), "tar"), rep.TarFiles, log)
	record(Tar, m, err)
	if ctx.Err() == nil {
		down(Tar)
	}
}

// measureOrError runs workload key's f on a quiet thread (onQuietThread)
// and returns its measurement, or its error (logged) as one.
func measureOrError(key string, log *slog.Logger, f func() (*Measurement, error)) *Measurement {
	var m *Measurement
	var err error
	onQuietThread(func() { m, err = f() })
	if err != nil {
		log.Error("workload failed", "workload", key, "err", err)
		return &Measurement{Error: err.Error()}
	}
	return m
}

// failedAny reports whether any of keys failed (or did not run) in res.
func failedAny(res map[string]*Measurement, keys []string) bool {
	for _, k := range keys {
		if m := res[k]; m == nil || m.Error != "" {
			return true
		}
	}
	return false
}

// medianOf returns the median of key's measurements across runs, or the
// first failure.
func medianOf(runs []map[string]*Measurement, key string) *Measurement {
	var ms []*Measurement
	for _, res := range runs {
		m := res[key]
		if m == nil {
			return &Measurement{Error: "not run"}
		}
		if m.Error != "" {
			return m
		}
		ms = append(ms, m)
	}
	if len(ms) == 0 {
		return &Measurement{Error: "not run"}
	}
	return median(ms)
}

// median returns the measurement with the median rate.
func median(ms []*Measurement) *Measurement {
	sorted := slices.Clone(ms)
	slices.SortFunc(sorted, func(a, b *Measurement) int { return cmp.Compare(a.Rate, b.Rate) })
	return sorted[len(sorted)/2]
}

// describeMachine gathers the facts printed with the results.
func describeMachine(dir string) Machine {
	m := Machine{Cores: runtime.NumCPU(), GoVersion: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	m.MemBytes = meminfo("MemTotal")
	m.LoadStart = loadavg()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if ms, err := mountinfo.Read(); err == nil {
		if e, ok := mountinfo.Of(ms, dir); ok {
			m.Disk = fmt.Sprintf("%s on %s (%s)", e.Source, e.Point, e.FSType)
		}
	}
	return m
}

// loadavg returns the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return ""
}

func memAvailable() int64 { return meminfo("MemAvailable") }

// meminfo returns a /proc/meminfo field in bytes, or 0.
func meminfo(field string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != field {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			return 0
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		return n << 10
	}
	return 0
}
