// Package experiment holds the paper's wide-area experiments as code: each
// brings up a testbed (real wheelfs processes in network namespaces, with
// emulated wide-area delays), drives the FUSE mounts the way a user or an
// application would, prints a table that puts a physical limit or the
// home-site figure beside every WheelFS figure, writes the same as JSON,
// and takes the testbed down.
package experiment

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/wheelfs/wheelfs/internal/testbed"
)

// Env is what an experiment runs with.
type Env struct {
	Dir    string // testbed directory
	Binary string // wheelfs executable ("" = this one)
	Runs   int    // repetitions of each measured step
	Keep   bool   // leave the testbed up afterwards
	Out    io.Writer
	Log    *slog.Logger
	// Params are experiment-specific settings (--set key=value).
	Params map[string]string
}

// Param returns a parameter or its default.
func (e *Env) Param(key, def string) string {
	if v, ok := e.Params[key]; ok {
		return v
	}
	return def
}

// Durations reads a comma-separated list of durations.
func (e *Env) Durations(key, def string) ([]time.Duration, error) {
	var out []time.Duration
	for _, s := range strings.Split(e.Param(key, def), ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a duration", key, s)
		}
		out = append(out, d)
	}
	return out, nil
}

// Experiment is one runnable experiment.
type Experiment struct {
	Name    string
	Summary string
	// Params documents the --set keys it reads, with defaults.
	Params map[string]string
	Run    func(ctx context.Context, env *Env) (*Result, error)
}

// Result is an experiment's output: tables and free-form notes.
type Result struct {
	Experiment string    `json:"experiment"`
	Started    time.Time `json:"started"`
	Seconds    float64   `json:"seconds"`
	Command    string    `json:"command"`
	Tables     []*Table  `json:"tables"`
	Notes      []string  `json:"notes,omitempty"`
}

// Table is one printed table.
type Table struct {
	Title   string     `json:"title"`
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
}

// Add appends a row.
func (t *Table) Add(cells ...string) { t.Rows = append(t.Rows, cells) }

// All lists the experiments by name.
func All() []*Experiment {
	list := []*Experiment{closeToOpen(), failover(), partition(), dice(), scale(), webCache(), fileDist()}
	slices.SortFunc(list, func(a, b *Experiment) int { return cmp.Compare(a.Name, b.Name) })
	return list
}

// Find returns the named experiment.
func Find(name string) (*Experiment, error) {
	var names []string
	for _, e := range All() {
		if e.Name == name {
			return e, nil
		}
		names = append(names, e.Name)
	}
	return nil, fmt.Errorf("no experiment %q (experiments: %s)", name, strings.Join(names, ", "))
}

// Write prints a result's tables.
func (r *Result) Write(w io.Writer) {
	fmt.Fprintf(w, "\n%s (%.0f s): %s\n", r.Experiment, r.Seconds, r.Command)
	for _, t := range r.Tables {
		fmt.Fprintf(w, "\n%s\n", t.Title)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, strings.Join(t.Columns, "\t")+"\t")
		for _, row := range t.Rows {
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\n- %s", n)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
	}
}

// WriteJSON writes the result to path.
func (r *Result) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// up brings up a testbed for an experiment, taking down one that an
// earlier run left in the same directory.
func up(ctx context.Context, env *Env, o testbed.Options) (*testbed.State, error) {
	o.Binary = env.Binary
	o.LogLevel = env.Param("host-log-level", "")
	if st, err := testbed.Load(env.Dir); err == nil && st.Up {
		fmt.Fprintf(env.Out, "taking down the testbed already up in %s\n", env.Dir)
		if err := testbed.Down(env.Dir, env.Out); err != nil {
			return nil, err
		}
	}
	st, err := testbed.Up(ctx, env.Dir, o, env.Out)
	if err != nil {
		// What did start is taken down (unless kept for a look): a failed
		// run must not leave hundreds of processes behind.
		down(env)
		return nil, fmt.Errorf("testbed up: %w (logs in %s/logs)", err, env.Dir)
	}
	return st, nil
}

// down takes the testbed down unless the user asked to keep it.
func down(env *Env) {
	if env.Keep {
		fmt.Fprintf(env.Out, "testbed left up in %s ('wheelfs testbed down --dir %s')\n", env.Dir, env.Dir)
		return
	}
	if err := testbed.Down(env.Dir, env.Out); err != nil {
		env.Log.Error("testbed down", "err", err)
	}
}

// Stats summarizes repeated timings.
type Stats struct{ Min, Median, Max time.Duration }

func stats(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return Stats{Min: s[0], Median: s[len(s)/2], Max: s[len(s)-1]}
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond))
}

// secs formats a duration in seconds.
func secs(d time.Duration) string {
	return fmt.Sprintf("%.2f", d.Seconds())
}

func (s Stats) String() string {
	return fmt.Sprintf("%s (%s–%s)", ms(s.Median), ms(s.Min), ms(s.Max))
}

// ratio formats a/b, or "—" when b is zero.
func ratio(a, b time.Duration) string {
	if b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

// timed runs fn and returns how long it took.
func timed(fn func() error) (time.Duration, error) {
	t := time.Now()
	err := fn()
	return time.Since(t), err
}

// progress prints a step of a long experiment.
func progress(env *Env, format string, args ...any) {
	fmt.Fprintf(env.Out, "  %s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
