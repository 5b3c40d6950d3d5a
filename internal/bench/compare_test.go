package bench

import (
	"strings"
	"testing"
)

func TestCompareFlagsOnlyRatiosThatFell(t *testing.T) {
	old := sampleReport()
	cur := sampleReport()
	// The whole machine twice as slow: every target halves, no ratio moves.
	for _, tr := range cur.Targets {
		for _, m := range tr.Results {
			m.Rate /= 2
			m.Seconds *= 2
		}
	}
	// WheelFS's create falls 30 % further against the same run's loopback,
	// its tar 10 % (within the slack).
	wfs := cur.Target(WheelFS)
	wfs.Results[Create].Rate *= 0.7
	wfs.Results[Tar].Seconds /= 0.9
	wfs.Results[Stat].Error = "stat: EIO"

	cs := Compare(old, cur, DefaultSlack)
	got := map[string]Change{}
	for _, c := range cs {
		got[c.Workload] = c
	}
	if len(got) != 9 {
		t.Fatalf("%d workloads compared, want 9 (7 and create, tar against the durable floor): %+v", len(got), cs)
	}
	if c := got["create-vs-floor"]; c.Missing != "not in the recorded run" {
		t.Errorf("create against the floor, with no flush figures: %+v", c)
	}
	if !got[Create].Regressed || Regressions(cs) != 1 {
		t.Errorf("create regressed=%v, %d regressions; want only create: %+v", got[Create].Regressed, Regressions(cs), cs)
	}
	if c := got[Create]; c.OldFigure != 1000 || c.NewFigure != 350 || c.Unit != "ops/s" {
		t.Errorf("create's own figures %v -> %v %s; want 1000 -> 350 ops/s", c.OldFigure, c.NewFigure, c.Unit)
	}
	if c := got[Tar]; c.Regressed || c.New >= c.Old {
		t.Errorf("tar: %+v; want a 10%% fall within the slack", c)
	}
	if c := got[SeqWrite]; c.Old != c.New || c.Old != 0.5 {
		t.Errorf("seq-write ratio %v -> %v; want 0.5 both (machine-wide slowdown cancels)", c.Old, c.New)
	}
	if got[Stat].Missing == "" {
		t.Errorf("stat with an error in the new run: %+v; want it reported missing", got[Stat])
	}
	var b strings.Builder
	if err := WriteComparison(&b, cs, DefaultSlack); err != nil {
		t.Fatal(err)
	}
	if l := lineWith(t, b.String(), "create"); !strings.Contains(l, "REGRESSED") || !strings.Contains(l, "-30%") {
		t.Errorf("create line %q; want -30%% and REGRESSED", l)
	}
}

func TestCompareSkipsReadsWhenTheLoopbackDataPathChanged(t *testing.T) {
	old, cur := sampleReport(), sampleReport()
	old.LoopbackDataPath, cur.LoopbackDataPath = "passthrough", "process"
	// Through its process the loopback reads at half the speed: WheelFS's
	// read ratio doubles, which says nothing about WheelFS.
	cur.Target(Loopback).Results[SeqRead].Rate /= 2
	cur.Target(WheelFS).Results[SeqRead].Rate *= 0.5
	got := map[string]Change{}
	for _, c := range Compare(old, cur, DefaultSlack) {
		got[c.Workload] = c
	}
	if c := got[SeqRead]; !strings.Contains(c.Missing, "passthrough -> process") || c.Regressed {
		t.Errorf("seq-read across a data-path change: %+v; want it reported not comparable", c)
	}
	if c := got[SeqWrite]; c.Missing != "" {
		t.Errorf("seq-write (against the raw disk): %+v; want it compared", c)
	}
	if c := got[Create]; c.Missing != "" || c.Regressed {
		t.Errorf("create (metadata, not affected): %+v; want it compared, unchanged", c)
	}
}

func TestCompareAgainstTheDurableFloor(t *testing.T) {
	old, cur := sampleReport(), sampleReport()
	for _, r := range []*Report{old, cur} {
		r.TarDirs = 100
		r.Target(Raw).Results[Flush] = rate(5000, "syncs/s")
	}
	// The disk's flushes twice as slow: WheelFS's creates slow down as
	// much as the floor does, and only the loopback ratio falls.
	cur.Target(Raw).Results[Flush] = rate(2500, "syncs/s")
	cur.Target(WheelFS).Results[Create].Rate = 1000 * 1.8 / 2.6
	got := map[string]Change{}
	for _, c := range Compare(old, cur, DefaultSlack) {
		got[c.Workload] = c
	}
	if c := got[Create]; !c.Regressed {
		t.Errorf("create against the loopback: %+v; want it flagged", c)
	}
	f := got["create-vs-floor"]
	if f.Missing != "" || f.Regressed || f.Base != floorBase || f.New < f.Old*0.99 || f.New > f.Old*1.01 {
		t.Errorf("create against the floor: %+v; want the same ratio", f)
	}
	var b strings.Builder
	if err := WriteComparison(&b, Compare(old, cur, DefaultSlack), DefaultSlack); err != nil {
		t.Fatal(err)
	}
	if l := lineWith(t, b.String(), "create-vs-floor"); !strings.Contains(l, "lb+fl") || !strings.Contains(l, "ok") {
		t.Errorf("line %q", l)
	}
}
