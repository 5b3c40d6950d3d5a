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

// Run measures every target and returns the report. The targets are all
// set up first and take turns, workload by workload and run by run. It
// returns a partial report with an error if it was cancelled or could not
// prepare; failures of single workloads are recorded in the report
// instead.
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

	// Every target is set up first and the workloads then alternate
	// between them, run by run: a ratio compares measurements taken
	// seconds apart, not minutes (this VM's disk and CPU change speed by
	// up to 2x between phases minutes apart, docs/BENCHMARKS.md).
	var runs []*targetRun
	defer func() {
		for i := len(runs) - 1; i >= 0; i-- {
			runs[i].close()
		}
	}()
	for _, s := range setups {
		tr := &TargetResult{Name: s.name, Results: map[string]*Measurement{}}
		rep.Targets = append(rep.Targets, tr)
		tlog := log.With("target", s.name)
		tlog.Info("setting up target")
		t, serr := s.start()
		if t != nil {
			tr.Description = t.Describe()
		}
		r := &targetRun{ctx: ctx, t: t, o: o, data: data, tarball: tarball, rep: rep, tr: tr, log: tlog}
		if serr != nil {
			tr.Error = "setup: " + serr.Error()
			tlog.Error("target setup failed", "err", serr)
			r.stopped = true
		}
		if t != nil {
			runs = append(runs, r)
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	steps := []func(r *targetRun){(*targetRun).begin}
	n := max(o.Runs, 1)
	for i := 0; i < n; i++ {
		steps = append(steps, func(r *targetRun) { r.seqRound(i) })
	}
	steps = append(steps, (*targetRun).endSeq)
	for i := 0; i < n; i++ {
		steps = append(steps, func(r *targetRun) { r.metaRound(i) })
	}
	steps = append(steps, (*targetRun).endMeta, (*targetRun).tar)
	for _, step := range steps {
		for _, r := range runs {
			if !r.stopped {
				step(r)
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
	}
	return rep, nil
}

// allWorkloads lists the workloads in the order they run.
var allWorkloads = []string{SeqWrite, SeqRead, Create, Stat, Readdir, Unlink, Tar}

// targetRun runs one target's workloads in steps (Run interleaves the
// targets' steps), recording failures. It checks that the target is still
// mounted before and after each step, so that a vanished mount cannot
// pass its mount point's directory off as the file system; once it is
// down, or a step failed in a way that voids the rest, stopped is set and
// Run skips its remaining steps.
type targetRun struct {
	ctx     context.Context
	t       target
	o       Options
	data    []byte
	tarball string
	rep     *Report
	tr      *TargetResult
	log     *slog.Logger
	stopped bool

	writes, reads []*Measurement
	seqDone       bool // a sequential step failed: no more rounds
	metas         []map[string]*Measurement
	metaDone      bool
}

func (r *targetRun) record(key string, m *Measurement, err error) bool {
	if err != nil {
		if r.ctx.Err() != nil {
			return false
		}
		r.log.Error("workload failed", "workload", key, "err", err)
		r.tr.Results[key] = &Measurement{Error: err.Error()}
		return false
	}
	r.log.Info("workload done", "workload", key, "seconds", fmt.Sprintf("%.3f", m.Seconds),
		"rate", formatNumber(m.Rate)+" "+m.Unit)
	r.tr.Results[key] = m
	return true
}

// down reports whether the target is gone after (or before) the
// workloads in keys; their results, if any, are then void and the
// remaining ones are not run.
func (r *targetRun) down(keys ...string) bool {
	err := r.t.Check()
	if err == nil {
		return false
	}
	r.log.Error("target is down", "err", err)
	for _, k := range keys {
		r.tr.Results[k] = &Measurement{Error: "target went down: " + err.Error()}
	}
	for _, k := range allWorkloads {
		if r.tr.Results[k] == nil {
			r.tr.Results[k] = &Measurement{Error: "not run: target is down"}
		}
	}
	r.stopped = true
	return true
}

func (r *targetRun) begin() {
	unix.Sync()
	r.down()
}

// seqRound is run i of the sequential write and the cold read of what it
// wrote.
func (r *targetRun) seqRound(i int) {
	if r.seqDone {
		return
	}
	ctx, t, log := r.ctx, r.t, r.log
	runs := max(r.o.Runs, 1)
	var m *Measurement
	var err error
	seq := filepath.Join(t.Root(), fmt.Sprintf("seq-%d.dat", i))
	unix.Sync()
	log.Info("sequential write", "size", FormatSize(r.o.Size), "run", i+1, "of", runs)
	onQuietThread(func() { m, err = seqWrite(ctx, seq, r.data, log) })
	if err != nil {
		r.record(SeqWrite, m, err)
		r.tr.Results[SeqRead] = &Measurement{Error: "not run: the write failed"}
		r.seqDone = true
		return
	}
	r.writes = append(r.writes, m)
	if ctx.Err() != nil || r.down(SeqWrite) {
		return
	}
	log.Info("making caches cold before the read")
	if err := t.Restart(ctx); err != nil {
		r.record(SeqRead, nil, err)
		if ctx.Err() == nil {
			r.down() // a failed restart leaves nothing to run on
		}
		r.stopped = true
		return
	}
	if r.rep.ColdCache {
		if err := dropCaches(); err != nil {
			log.Warn("drop caches failed", "err", err)
		}
	}
	if r.down() {
		return
	}
	log.Info("sequential read", "size", FormatSize(r.o.Size), "run", i+1, "of", runs)
	onQuietThread(func() { m, err = seqRead(ctx, seq, r.data, log) })
	if err != nil {
		r.record(SeqRead, m, err)
		r.seqDone = true
		return
	}
	r.reads = append(r.reads, m)
	if ctx.Err() != nil || r.down(SeqRead) {
		return
	}
	os.Remove(seq) // keep the disk's free space the same for every run
}

func (r *targetRun) endSeq() {
	runs := max(r.o.Runs, 1)
	if len(r.writes) == runs {
		r.record(SeqWrite, median(r.writes), nil)
	}
	if len(r.reads) == runs {
		r.record(SeqRead, median(r.reads), nil)
	}
}

// metaKeys are the metadata workloads. They run Runs times too, each in a
// directory of its own, and each row reports its median: one pass moved
// a ratio by a third on a noisy disk (docs/BENCHMARKS.md).
var metaKeys = []string{Create, Stat, Readdir, Unlink}

// floorKey is the measurement of a durable create's floor (durableFloor)
// that t takes beside the creates it bounds: the disk's durable append on
// the raw target, the loopback's creates each followed by one on the
// loopback.
func floorKey(t target) string {
	switch t.(type) {
	case *rawTarget:
		return Flush
	case *loopbackTarget:
		return CreateDurable
	}
	return ""
}

func (r *targetRun) metaRound(i int) {
	if r.metaDone {
		return
	}
	ctx, t, log := r.ctx, r.t, r.log
	runs := max(r.o.Runs, 1)
	fk := floorKey(t)
	res := map[string]*Measurement{}
	if fk == Flush {
		unix.Sync()
		log.Info("durable appends", "records", flushRecords, "run", i+1, "of", runs)
		res[Flush] = measureOrError(Flush, log, func() (*Measurement, error) { return durableAppends(ctx, t.Root()) })
	}
	unix.Sync()
	log.Info("metadata workloads", "files", r.o.Files, "run", i+1, "of", runs)
	onQuietThread(func() { metaWorkloads(ctx, filepath.Join(t.Root(), fmt.Sprintf("meta-%d", i)), r.o.Files, log, res) })
	if fk == CreateDurable && ctx.Err() == nil && !failedAny(res, metaKeys) {
		unix.Sync()
		log.Info("durable creates (the floor of WheelFS's)", "files", r.o.Files, "run", i+1, "of", runs)
		logPath := filepath.Join(filepath.Dir(t.(*loopbackTarget).backing), "durable-creates.log")
		res[CreateDurable] = measureOrError(CreateDurable, log, func() (*Measurement, error) {
			return durableCreates(ctx, filepath.Join(t.Root(), fmt.Sprintf("durable-%d", i)), logPath, r.o.Files)
		})
	}
	r.metas = append(r.metas, res)
	if ctx.Err() != nil {
		return
	}
	if failedAny(res, metaKeys) {
		r.metaDone = true
		return
	}
	r.down(metaKeys...)
}

func (r *targetRun) endMeta() {
	for _, k := range metaKeys {
		r.tr.Results[k] = medianOf(r.metas, k)
	}
	if fk := floorKey(r.t); fk != "" {
		r.tr.Results[fk] = medianOf(r.metas, fk)
	}
}

func (r *targetRun) tar() {
	r.log.Info("extracting tarball", "files", r.rep.TarFiles)
	m, err := extract(r.ctx, r.tarball, filepath.Join(r.t.Root(), "tar"), r.rep.TarFiles, r.log)
	r.record(Tar, m, err)
	if r.ctx.Err() == nil {
		r.down(Tar)
	}
}

// close stops the target, if it was set up, and records a failed
// teardown.
func (r *targetRun) close() {
	if r.t == nil {
		return
	}
	if p, ok := r.t.(interface{ problems() []string }); ok && len(r.tr.failures()) > 0 {
		r.tr.Problems = p.problems()
	}
	if cerr := r.t.Close(); cerr != nil {
		r.tr.Error = strings.TrimPrefix(r.tr.Error+"; ", "; ") + "teardown: " + cerr.Error()
		r.log.Error("target teardown failed", "err", cerr)
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
