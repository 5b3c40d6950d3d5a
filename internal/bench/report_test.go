package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

func rate(r float64, unit string) *Measurement {
	return &Measurement{Seconds: 1, Count: int64(r), Rate: r, Unit: unit}
}

func sampleReport() *Report {
	start := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	mk := func(name string, w, rd, cr, st, rdd, ul, tarSec float64) *TargetResult {
		return &TargetResult{Name: name, Results: map[string]*Measurement{
			SeqWrite: rate(w, "MB/s"), SeqRead: rate(rd, "MB/s"),
			Create: rate(cr, "ops/s"), Stat: rate(st, "ops/s"), Readdir: rate(rdd, "entries/s"), Unlink: rate(ul, "ops/s"),
			Tar: {Seconds: tarSec, Count: 1000, Rate: 1000 / tarSec, Unit: "files/s"},
		}}
	}
	return &Report{
		Started: start, Finished: start.Add(3 * time.Minute),
		Machine:   Machine{CPU: "Test CPU", Cores: 2, MemBytes: 24 << 30, Kernel: "6.1", Disk: "/dev/vda on / (ext4)", GoVersion: "go1.26"},
		Dir:       "/var/tmp/x",
		Size:      512 << 20,
		Files:     10000,
		ColdCache: true,
		TarFiles:  1000,
		Targets: []*TargetResult{
			mk(Raw, 1000, 1000, 30000, 300000, 1e6, 100000, 1),
			mk(Loopback, 700, 900, 4000, 20000, 100000, 20000, 4),
			mk(WheelFS, 500, 700, 1000, 12000, 50000, 5000, 10),
		},
	}
}

func lineWith(t *testing.T, out, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting with %q in\n%s", prefix, out)
	return ""
}

// unitRow is the table's line for label in unit.
func unitRow(t *testing.T, out, label, unit string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, label); ok {
			if f := strings.Fields(rest); len(f) > 0 && f[0] == unit {
				return l
			}
		}
	}
	t.Fatalf("no %q row in %s in\n%s", label, unit, out)
	return ""
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"2026-11-22 07:00 UTC (180 s)", "Test CPU, 2 cores, 24.0 GiB RAM", "512MiB", "cold", "WHEELFS GOAL"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// I/O rows: ratio against the raw disk; the raw column has none.
	w := lineWith(t, out, "sequential write")
	for _, want := range []string{"1000  ", "700 (0.70x raw)", "500 (0.50x raw)", ">= 0.6x raw: MISSED"} {
		if !strings.Contains(w, want) {
			t.Errorf("write row lacks %q: %q", want, w)
		}
	}
	// The cold read: against the loopback (whose reads go through its
	// process, as WheelFS's do), and the raw disk too.
	if r := lineWith(t, out, "sequential read (cold)"); !strings.Contains(r, "700 (0.78x lb, 0.70x raw)") || !strings.Contains(r, ">= 0.8x lb: MISSED") {
		t.Errorf("read row: %q", r)
	}
	// Metadata rows: ratio against loopback only.
	c := lineWith(t, out, "create")
	if strings.Contains(c, "x raw") || !strings.Contains(c, "1000 (0.25x lb)") {
		t.Errorf("create row: %q", c)
	}
	if s := lineWith(t, out, "stat"); !strings.Contains(s, "12000 (0.60x lb)") || !strings.Contains(s, ">= 0.9x lb: MISSED") {
		t.Errorf("stat row: %q", s)
	}
	// Seconds: lower is better, so the ratio is loopback time / WheelFS time.
	tarRow := unitRow(t, out, "tar -x GOROOT/src", "s")
	if !strings.Contains(tarRow, "10.0 (0.40x lb)") || !strings.Contains(tarRow, "MISSED") {
		t.Errorf("tar row: %q", tarRow)
	}
	if strings.Contains(out, "errors:") {
		t.Errorf("unexpected errors section:\n%s", out)
	}
}

func TestWriteTableErrorsAndWarm(t *testing.T) {
	r := sampleReport()
	r.ColdCache = false
	r.Targets = []*TargetResult{r.Targets[0], r.Targets[2]} // --skip-loopback
	r.Targets[1].Results[Create] = &Measurement{Error: "create f0000091: connection timed out"}
	r.Targets[1].Results[Stat] = &Measurement{Error: "not run: create failed"}
	var b strings.Builder
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "sequential read (warm)") || !strings.Contains(out, "WARM") {
		t.Errorf("warm reads not flagged:\n%s", out)
	}
	if c := lineWith(t, out, "create"); !strings.Contains(c, "ERROR") || !strings.Contains(c, "n/a") {
		t.Errorf("create row: %q", c)
	}
	if s := lineWith(t, out, "stat"); !strings.Contains(s, "not run") {
		t.Errorf("stat row: %q", s)
	}
	if f := r.Failures(); len(f) != 1 || !strings.Contains(f[0], "wheelfs create: create f0000091") {
		t.Errorf("Failures() = %q", f)
	}
	if !strings.Contains(out, "errors:\n  wheelfs create:") {
		t.Errorf("errors section missing:\n%s", out)
	}
}

func TestDurableFloor(t *testing.T) {
	r := sampleReport()
	r.TarDirs = 100
	r.Target(Raw).Results[Flush] = rate(5000, "syncs/s") // 200 us a flush
	// The loopback's 4000 creates took 1 s; with a flush each, 1.8 s:
	// 2222/s, against which WheelFS's 1000/s is 0.45x.
	floor, ok := r.durableFloor(Create)
	if !ok || floor.Count != 4000 || floor.Seconds < 1.799 || floor.Seconds > 1.801 {
		t.Fatalf("create floor = %+v, %v", floor, ok)
	}
	// tar: 4 s + (1000 files + 100 dirs) * 200 us = 4.22 s.
	if floor, ok := r.durableFloor(Tar); !ok || floor.Seconds < 4.219 || floor.Seconds > 4.221 {
		t.Fatalf("tar floor = %+v, %v", floor, ok)
	}
	if _, ok := r.durableFloor(Unlink); ok {
		t.Error("unlinks are durable lazily: no floor")
	}
	var b strings.Builder
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if c := lineWith(t, out, "create"); !strings.HasSuffix(strings.TrimSpace(c), "0.45x (2222 ops/s)") {
		t.Errorf("create row: %q", c)
	}
	if c := unitRow(t, out, "tar -x GOROOT/src", "s"); !strings.HasSuffix(strings.TrimSpace(c), "0.42x (4.22 s)") {
		t.Errorf("tar row: %q", c)
	}
	if c := lineWith(t, out, "durable append"); !strings.Contains(c, "5000") {
		t.Errorf("flush row: %q", c)
	}
	// A measured floor (the loopback's creates, each followed by a durable
	// append) takes the place of the computed one.
	r.Target(Loopback).Results[CreateDurable] = rate(2000, "ops/s")
	if floor, ok := r.durableFloor(Create); !ok || floor.Rate != 2000 {
		t.Errorf("measured create floor = %+v, %v", floor, ok)
	}
	delete(r.Target(Loopback).Results, CreateDurable)
	// Without the raw disk's flushes (older reports) the column is empty.
	delete(r.Target(Raw).Results, Flush)
	if _, ok := r.durableFloor(Create); ok {
		t.Error("a floor without a flush figure")
	}
	// compare has no base for the flush row and skips it.
	for _, c := range Compare(r, r, DefaultSlack) {
		if c.Workload == Flush {
			t.Errorf("Compare lists %s", Flush)
		}
	}
}

func TestDurableAppends(t *testing.T) {
	m, err := durableAppends(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if m.Count != flushRecords || m.Seconds <= 0 || m.Rate <= 0 || m.Unit != "syncs/s" {
		t.Fatalf("durableAppends = %+v", m)
	}
}

func TestDurableCreates(t *testing.T) {
	base := t.TempDir()
	m, err := durableCreates(t.Context(), base+"/d", base+"/log", 50)
	if err != nil {
		t.Fatal(err)
	}
	if m.Count != 50 || m.Rate <= 0 || m.Unit != "ops/s" {
		t.Fatalf("durableCreates = %+v", m)
	}
	names, err := os.ReadDir(base + "/d")
	if err != nil || len(names) != 50 {
		t.Fatalf("%d files made (%v), want 50", len(names), err)
	}
	if _, err := os.Stat(base + "/log"); !os.IsNotExist(err) {
		t.Errorf("the log was left behind: %v", err)
	}
	// An existing directory is an error, not a silent reuse.
	if _, err := durableCreates(t.Context(), base+"/d", base+"/log", 1); err == nil {
		t.Error("durableCreates into an existing directory: no error")
	}
}
