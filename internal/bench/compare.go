package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
)

// DefaultSlack is how much lower WheelFS's ratio to its base may fall
// between two recorded runs before Compare flags the workload.
const DefaultSlack = 0.20

// Change is one workload's WheelFS ratio (against the raw disk or the
// loopback of the same run) in a recorded run and in a new one.
type Change struct {
	Workload string  `json:"workload"`
	Base     string  `json:"base"`
	Old      float64 `json:"old"`
	New      float64 `json:"new"`
	// OldFigure and NewFigure are WheelFS's own figures (Unit), for
	// telling a slower WheelFS from a faster base.
	OldFigure float64 `json:"old_figure"`
	NewFigure float64 `json:"new_figure"`
	Unit      string  `json:"unit"`
	// Regressed is set when New < Old × (1 − slack).
	Regressed bool `json:"regressed"`
	// Missing says why a ratio could not be taken (a failed workload, a
	// target not run).
	Missing string `json:"missing,omitempty"`
}

// Compare sets WheelFS's ratio of every workload in a new run against the
// same ratio in a recorded one. Ratios, not absolute figures, are compared:
// the raw disk and the loopback of the same run absorb most of what the
// machine's load and disk do to a run, which absolute figures do not.
func Compare(old, cur *Report, slack float64) []Change {
	var out []Change
	for _, rw := range rows {
		if rw.secondRow || rw.base == "" {
			continue
		}
		c := compareRatios(old, cur, rw, rw.key, rw.base, func(r *Report) (float64, bool) { return wheelfsRatio(r, rw) }, slack)
		if rw.data && rw.base == Loopback && old.LoopbackDataPath != cur.LoopbackDataPath {
			c.Old, c.New, c.Regressed = 0, 0, false
			c.Missing = fmt.Sprintf("not comparable: the loopback's data path changed (%s -> %s)",
				dataPath(old), dataPath(cur))
		}
		out = append(out, c)
	}
	// Against the durable floor too: both sides then pay the disk's
	// flushes, so the ratio moves less with the host's flush latency.
	for _, rw := range rows {
		if rw.secondRow || (rw.key != Create && rw.key != Tar) {
			continue
		}
		out = append(out, compareRatios(old, cur, rw, rw.key+"-vs-floor", floorBase,
			func(r *Report) (float64, bool) { q, _, ok := floorRatio(r, rw); return q, ok }, slack))
	}
	return out
}

// floorBase names the durable floor (Report.durableFloor) as a base.
const floorBase = "lb+flushes"

// compareRatios is one Change: ratio taken in both reports.
func compareRatios(old, cur *Report, rw row, workload, base string, ratio func(*Report) (float64, bool), slack float64) Change {
	c := Change{Workload: workload, Base: base, Unit: rw.unit}
	c.OldFigure, _ = wheelfsFigure(old, rw)
	c.NewFigure, _ = wheelfsFigure(cur, rw)
	o, okOld := ratio(old)
	n, okNew := ratio(cur)
	switch {
	case !okOld:
		c.Missing = "not in the recorded run"
	case !okNew:
		c.Missing = "not in the new run"
	default:
		c.Old, c.New = o, n
		c.Regressed = n < o*(1-slack)
	}
	return c
}

// floorRatio is WheelFS's ratio to the durable floor of rw's workload,
// and the floor.
func floorRatio(r *Report, rw row) (float64, *Measurement, bool) {
	w := r.Target(WheelFS)
	floor, ok := r.durableFloor(rw.key)
	if w == nil || !ok {
		return 0, nil, false
	}
	q, ok := rw.ratio(w.Results[rw.key], floor)
	return q, floor, ok
}

func dataPath(r *Report) string {
	if r.LoopbackDataPath == "" {
		return "unrecorded"
	}
	return r.LoopbackDataPath
}

func wheelfsRatio(r *Report, rw row) (float64, bool) {
	w, b := r.Target(WheelFS), r.Target(rw.base)
	if w == nil || b == nil {
		return 0, false
	}
	return rw.ratio(w.Results[rw.key], b.Results[rw.key])
}

func wheelfsFigure(r *Report, rw row) (float64, bool) {
	w := r.Target(WheelFS)
	if w == nil {
		return 0, false
	}
	m := w.Results[rw.key]
	if m == nil || m.Error != "" {
		return 0, false
	}
	if rw.seconds {
		return m.Seconds, true
	}
	return m.Rate, true
}

// Regressions counts the flagged workloads.
func Regressions(cs []Change) int {
	n := 0
	for _, c := range cs {
		if c.Regressed {
			n++
		}
	}
	return n
}

// WriteComparison prints one line per workload: both ratios, their change,
// WheelFS's own figures (a ratio also falls when the base got faster, as
// it does between a loaded and a quiet machine), and REGRESSED where the
// new ratio fell by more than slack.
func WriteComparison(w io.Writer, cs []Change, slack float64) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tBASE\tRECORDED\tNEW\tCHANGE\tWHEELFS ITSELF\tVERDICT")
	for _, c := range cs {
		if c.Missing != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t%s\n", c.Workload, abbrev(c.Base), c.Missing)
			continue
		}
		own := fmt.Sprintf("%s -> %s %s", formatNumber(c.OldFigure), formatNumber(c.NewFigure), c.Unit)
		verdict := "ok"
		if c.Regressed {
			verdict = fmt.Sprintf("REGRESSED (more than %.0f%% lower)", slack*100)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2fx\t%.2fx\t%+.0f%%\t%s\t%s\n", c.Workload, abbrev(c.Base), c.Old, c.New,
			(c.New/c.Old-1)*100, own, verdict)
	}
	return tw.Flush()
}

// ReadReport loads a report written by `wheelfs bench --json`.
func ReadReport(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r Report
	if err := json.NewDecoder(f).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: not a wheelfs bench --json report: %w", path, err)
	}
	if r.Target(WheelFS) == nil {
		return nil, fmt.Errorf("%s: the report has no %s target", path, WheelFS)
	}
	return &r, nil
}
