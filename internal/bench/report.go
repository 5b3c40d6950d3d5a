package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Target names.
const (
	Raw      = "raw"
	Loopback = "loopback"
	WheelFS  = "wheelfs"
)

// Workload keys, as used in TargetResult.Results.
const (
	SeqWrite = "seq-write"
	SeqRead  = "seq-read"
	Create   = "create"
	Stat     = "stat"
	Readdir  = "readdir"
	Unlink   = "unlink"
	Tar      = "tar"
	// Flush is the raw disk's durable append (durableAppends).
	Flush = "flush"
	// CreateDurable is the loopback's create with a durable append after
	// each (durableCreates).
	CreateDurable = "create-durable"
)

// Measurement is one timed workload on one target.
type Measurement struct {
	// Seconds is the wall-clock time of the timed part.
	Seconds float64 `json:"seconds"`
	// Count is what was done in that time: bytes for the sequential
	// workloads, operations or entries for the metadata ones, regular files
	// for the extraction.
	Count int64 `json:"count"`
	// Rate is Count per second, in MB/s (10^6 bytes) for the sequential
	// workloads.
	Rate  float64 `json:"rate"`
	Unit  string  `json:"unit"`
	Error string  `json:"error,omitempty"`
}

// notRun tells whether the workload was skipped because an earlier one failed.
func (m *Measurement) notRun() bool { return strings.HasPrefix(m.Error, "not run") }

// TargetResult holds every workload's measurement on one target.
type TargetResult struct {
	Name string `json:"name"`
	// Description says what the target is (mount point, backing directory).
	Description string                  `json:"description"`
	Results     map[string]*Measurement `json:"results"`
	// Error is set when the target could not be set up or torn down.
	Error string `json:"error,omitempty"`
	// Problems holds the failed operations the file system logged, if a
	// workload failed.
	Problems []string `json:"problems,omitempty"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	Hostname string `json:"hostname"`
	CPU      string `json:"cpu"`
	Cores    int    `json:"cores"`
	MemBytes int64  `json:"mem_bytes"`
	Kernel   string `json:"kernel"`
	// Disk is the file system holding the scratch directory: type, device
	// and mount point.
	Disk      string `json:"disk"`
	GoVersion string `json:"go_version"`
	// LoadStart and LoadEnd are /proc/loadavg's 1, 5 and 15 minute load
	// averages when the run began and ended: other work skews the figures.
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

// Report is the result of one run.
type Report struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Machine  Machine   `json:"machine"`
	Dir      string    `json:"dir"`
	Size     int64     `json:"size"`
	Files    int       `json:"files"`
	// ColdCache tells whether the kernel's caches were dropped before the
	// sequential reads (needs root); if false the reads were warm.
	ColdCache bool `json:"cold_cache"`
	// LoopbackDataPath says how the loopback target moved file data:
	// "process" (through its process, as WheelFS does) or "passthrough"
	// (the kernel read and wrote the backing files; the raw disk's
	// figures). Empty in reports made before it was recorded, whose
	// loopback used passthrough where the kernel offered it (root, Linux
	// 6.9+).
	LoopbackDataPath string `json:"loopback_data_path,omitempty"`
	// TarFiles is the number of regular files in the extracted tree.
	TarFiles int `json:"tar_files"`
	// TarDirs is the number of directories in it (0 in reports made
	// before it was recorded).
	TarDirs int             `json:"tar_dirs,omitempty"`
	Targets []*TargetResult `json:"targets"`
}

// Target returns the named target's results, or nil.
func (r *Report) Target(name string) *TargetResult {
	for _, t := range r.Targets {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// Failures lists every error in the report, one per line.
func (r *Report) Failures() []string {
	var out []string
	for _, t := range r.Targets {
		out = append(out, t.failures()...)
	}
	return out
}

func (t *TargetResult) failures() []string {
	var out []string
	if t.Error != "" {
		out = append(out, fmt.Sprintf("%s: %s", t.Name, t.Error))
	}
	for _, row := range rows {
		if row.secondRow {
			continue
		}
		if m := t.Results[row.key]; m != nil && m.Error != "" && !m.notRun() {
			out = append(out, fmt.Sprintf("%s %s: %s", t.Name, row.key, m.Error))
		}
	}
	return out
}

// row is one line of the table.
type row struct {
	key   string
	label string
	unit  string
	// base is the target the ratio is taken against.
	base string
	// seconds shows the elapsed time instead of the rate; the ratio is then
	// base time / target time, so that higher is better on every row.
	seconds bool
	// secondRow marks the second line of a workload shown twice.
	secondRow bool
	// goal is the target for WheelFS as a ratio against base (0: none).
	goal float64
	// data marks workloads that move file data: their loopback figures
	// depend on the loopback's data path (Report.LoopbackDataPath).
	data bool
}

var rows = []row{
	{key: SeqWrite, label: "sequential write", unit: "MB/s", base: Raw, goal: 0.6, data: true},
	{key: SeqRead, label: "sequential read", unit: "MB/s", base: Loopback, goal: 0.8, data: true},
	{key: Create, label: "create", unit: "ops/s", base: Loopback, goal: 0.6},
	{key: Stat, label: "stat", unit: "ops/s", base: Loopback, goal: 0.9},
	{key: Readdir, label: "readdir", unit: "entries/s", base: Loopback},
	{key: Unlink, label: "unlink", unit: "ops/s", base: Loopback, goal: 0.6},
	{key: Tar, label: "tar -x GOROOT/src", unit: "s", base: Loopback, seconds: true, goal: 0.6},
	{key: Tar, label: "tar -x GOROOT/src", unit: "files/s", base: Loopback, secondRow: true},
	{key: CreateDurable, label: "create + durable append", unit: "ops/s"},
	{key: Flush, label: "durable append", unit: "syncs/s"},
}

// ratio returns target/base for rates and base/target for times; ok is
// false when either side is missing.
func (rw row) ratio(m, base *Measurement) (float64, bool) {
	if m == nil || base == nil || m.Error != "" || base.Error != "" {
		return 0, false
	}
	if rw.seconds {
		if m.Seconds <= 0 || base.Seconds <= 0 {
			return 0, false
		}
		return base.Seconds / m.Seconds, true
	}
	if base.Rate <= 0 {
		return 0, false
	}
	return m.Rate / base.Rate, true
}

// formatNumber prints three significant figures at most, no exponent.
func formatNumber(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func (rw row) cell(m *Measurement) string {
	switch {
	case m == nil:
		return "-"
	case m.notRun():
		return "not run"
	case m.Error != "":
		return "ERROR"
	case rw.seconds:
		return formatNumber(m.Seconds)
	default:
		return formatNumber(m.Rate)
	}
}

// WriteTable prints the report as a table: one line per workload, one
// column per target, each with its ratio against the raw disk (I/O rows)
// or the loopback mount (metadata and extraction rows), and a last column
// saying whether WheelFS meets the goal.
func WriteTable(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "WheelFS benchmark, %s (%.0f s)\n", r.Started.UTC().Format("2006-01-02 15:04 MST"),
		r.Finished.Sub(r.Started).Seconds())
	m := r.Machine
	fmt.Fprintf(w, "machine: %s, %d cores, %s RAM, Linux %s, %s\n", m.CPU, m.Cores, gib(m.MemBytes), m.Kernel, m.GoVersion)
	fmt.Fprintf(w, "disk: %s (scratch in %s)\n", m.Disk, r.Dir)
	if m.LoadStart != "" {
		fmt.Fprintf(w, "load average: %s at start, %s at end\n", m.LoadStart, m.LoadEnd)
	}
	cache := "cold (caches dropped; WheelFS restarted)"
	if !r.ColdCache {
		cache = "WARM (not root: could not drop caches; WheelFS restarted)"
	}
	fmt.Fprintf(w, "file %s in 1 MiB I/Os, read %s; %d small files; tar of %d files\n\n",
		FormatSize(r.Size), cache, r.Files, r.TarFiles)

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := []string{"WORKLOAD", "UNIT"}
	for _, t := range r.Targets {
		header = append(header, strings.ToUpper(t.Name))
	}
	wfs := r.Target(WheelFS)
	if wfs != nil {
		header = append(header, "WHEELFS GOAL", "VS LB + FLUSHES")
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, rw := range rows {
		label := rw.label
		if rw.key == SeqRead {
			if r.ColdCache {
				label += " (cold)"
			} else {
				label += " (warm)"
			}
		}
		cells := []string{label, rw.unit}
		base := r.Target(rw.base)
		for _, t := range r.Targets {
			m := t.Results[rw.key]
			c := rw.cell(m)
			if base != nil && t != base && !(rw.base == Loopback && t.Name == Raw) {
				if q, ok := rw.ratio(m, base.Results[rw.key]); ok {
					vs := fmt.Sprintf("%.2fx %s", q, abbrev(rw.base))
					// Data also against the disk itself.
					if raw := r.Target(Raw); rw.data && rw.base != Raw && t.Name == WheelFS && raw != nil {
						if q, ok := rw.ratio(m, raw.Results[rw.key]); ok {
							vs += fmt.Sprintf(", %.2fx raw", q)
						}
					}
					c += " (" + vs + ")"
				}
			}
			cells = append(cells, c)
		}
		if wfs != nil {
			g := ""
			if rw.goal > 0 {
				g = fmt.Sprintf(">= %.1fx %s", rw.goal, abbrev(rw.base))
				if base == nil {
					g += ": n/a"
				} else if q, ok := rw.ratio(wfs.Results[rw.key], base.Results[rw.key]); ok {
					if q >= rw.goal {
						g += ": met"
					} else {
						g += ": MISSED"
					}
				} else {
					g += ": n/a"
				}
			}
			cells = append(cells, g, r.floorCell(rw))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if f := r.Failures(); len(f) > 0 {
		fmt.Fprintln(w, "\nerrors:")
		for _, line := range f {
			fmt.Fprintln(w, "  "+line)
		}
		for _, t := range r.Targets {
			if len(t.Problems) > 0 {
				fmt.Fprintf(w, "\n%s logged:\n", t.Name)
				for _, line := range t.Problems {
					fmt.Fprintln(w, "  "+line)
				}
			}
		}
	}
	return nil
}

// floorCell gives WheelFS's ratio to the loopback with one flush per
// durable step (durableFloor), on the first row of a workload that has
// durable steps.
func (r *Report) floorCell(rw row) string {
	if rw.secondRow {
		return ""
	}
	q, floor, ok := floorRatio(r, rw)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%.2fx (%s %s)", q, rw.cell(floor), rw.unit)
}

func abbrev(target string) string {
	if target == Loopback {
		return "lb"
	}
	if target == floorBase {
		return "lb+fl"
	}
	return target
}

func gib(n int64) string {
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
