package experiment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/wheelfs/wheelfs/internal/testbed"
)

func failover() *Experiment {
	return &Experiment{
		Name:    "failover",
		Summary: "kill -9 a site's node; time until its files are readable and writable again at the other sites, per lock TTL",
		Params:  map[string]string{"rtt": "100ms", "lock-ttls": "10s,30s", "servers-per-site": "2"},
		Run:     runFailover,
	}
}

func runFailover(ctx context.Context, env *Env) (*Result, error) {
	rtts, err := env.Durations("rtt", "100ms")
	if err != nil {
		return nil, err
	}
	ttls, err := env.Durations("lock-ttls", "10s,30s")
	if err != nil {
		return nil, err
	}
	var perSite int
	if _, err := fmt.Sscan(env.Param("servers-per-site", "2"), &perSite); err != nil || perSite < 1 {
		return nil, errors.New("servers-per-site: want a positive number")
	}
	sites := []string{"west", "east", "eu"}
	t := &Table{
		Title: fmt.Sprintf("kill -9 of west-1 (primary of the files), 3 sites × %d servers, %s RTT: seconds after the kill", perSite, rtts[0]),
		Columns: []string{"lock TTL L", "round", "read at east (never read there)", "create at east (dir at west-1)",
			"create at west-2 (same site)", "expected window (2L/3..L)"},
	}
	for _, ttl := range ttls {
		for round := 1; round <= env.Runs; round++ {
			st, err := up(ctx, env, testbed.Options{Sites: sites, RTT: testbed.Uniform(sites, rtts[0]),
				ServersPerSite: perSite, LockTTL: ttl, TCPCongestion: "cubic"})
			if err != nil {
				return nil, err
			}
			row, err := failoverRound(ctx, env, st, ttl)
			down(env)
			if err != nil {
				return nil, fmt.Errorf("lock TTL %s: %w", ttl, err)
			}
			t.Add(append([]string{ttl.String(), fmt.Sprint(round)}, row...)...)
		}
	}
	return &Result{Tables: []*Table{t}, Notes: []string{
		"A node killed with SIGKILL keeps its slice locks until they expire (lock TTL L); then a backup takes over.",
		"Each probe retries its call until it succeeds; a call blocks up to its bound (30 s) while the primary is unreachable.",
	}}, nil
}

func failoverRound(ctx context.Context, env *Env, st *testbed.State, ttl time.Duration) ([]string, error) {
	west, east := st.Mounts("west")[0], st.Mounts("east")[0]
	var west2 string
	if ms := st.Mounts("west"); len(ms) > 1 {
		west2 = ms[1]
	}
	dir := filepath.Join(west, "fo")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	data := make([]byte, 65536)
	for _, n := range []string{"f", "g"} {
		if _, _, err := writeFile(filepath.Join(dir, n), data); err != nil {
			return nil, err
		}
	}
	if _, err := readCheck(filepath.Join(east, "fo", "f"), data); err != nil {
		return nil, err
	}
	if err := testbed.Kill(env.Dir, []string{"west-1"}, true); err != nil {
		return nil, err
	}
	killed := time.Now()
	progress(env, "L=%s: west-1 killed; probing", ttl)
	probe := func(op func(attempt int) error) (time.Duration, error) {
		deadline := killed.Add(3*ttl + 2*time.Minute)
		for attempt := 0; ; attempt++ {
			err := op(attempt)
			if err == nil {
				return time.Since(killed), nil
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("still failing %s after the kill: %w", time.Since(killed).Round(time.Second), err)
			}
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	var (
		wg      sync.WaitGroup
		results [3]time.Duration
		errs    [3]error
	)
	ops := []func(int) error{
		func(int) error { _, err := readCheck(filepath.Join(east, "fo", "g"), data); return err },
		func(a int) error {
			_, _, err := writeFile(filepath.Join(east, "fo", fmt.Sprintf("e%d", a)), data)
			return err
		},
		func(a int) error {
			if west2 == "" {
				return nil
			}
			_, _, err := writeFile(filepath.Join(west2, "fo", fmt.Sprintf("w%d", a)), data)
			return err
		},
	}
	for i, op := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = probe(op)
		}()
	}
	wg.Wait()
	row := make([]string, 0, 4)
	for i := range ops {
		switch {
		case errs[i] != nil:
			row = append(row, "failed: "+errs[i].Error())
		case i == 2 && west2 == "":
			row = append(row, "—")
		default:
			row = append(row, secs(results[i]))
		}
	}
	row = append(row, fmt.Sprintf("%s..%s", secs(2*ttl/3), secs(ttl)))
	progress(env, "L=%s: %v", ttl, row)
	return row, nil
}

func partition() *Experiment {
	return &Experiment{
		Name:    "partition",
		Summary: "cut a site off: time every call there under .EventualConsistency/.MaxTime=1000 and with plain paths; convergence after the heal",
		Params:  map[string]string{"rtt": "100ms", "lock-ttl": "30s"},
		Run:     runPartition,
	}
}

// cutOp is one call timed at the cut-off site.
type cutOp struct {
	name string
	do   func(root string, i int) error
}

func runPartition(ctx context.Context, env *Env) (*Result, error) {
	rtts, err := env.Durations("rtt", "100ms")
	if err != nil {
		return nil, err
	}
	ttl, err := env.Durations("lock-ttl", "30s")
	if err != nil {
		return nil, err
	}
	sites := []string{"west", "east", "eu"}
	st, err := up(ctx, env, testbed.Options{Sites: sites, RTT: testbed.Uniform(sites, rtts[0]), ServersPerSite: 1,
		LockTTL: ttl[0], TCPCongestion: "cubic"})
	if err != nil {
		return nil, err
	}
	defer down(env)
	west, east := st.Mounts("west")[0], st.Mounts("east")[0]
	data := []byte("hello\n")
	if err := os.Mkdir(filepath.Join(west, "p2"), 0o755); err != nil {
		return nil, err
	}
	for _, n := range []string{"f1", "f2"} {
		if _, _, err := writeFile(filepath.Join(west, "p2", n), data); err != nil {
			return nil, err
		}
	}
	if _, err := os.ReadDir(filepath.Join(east, "p2")); err != nil {
		return nil, err
	}
	if _, err := readCheck(filepath.Join(east, "p2", "f1"), data); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(east, ".EventualConsistency", "ev"), 0o755); err != nil {
		return nil, err
	}
	if err := testbed.Partition(env.Dir, "east", ""); err != nil {
		return nil, err
	}
	cutAt := time.Now()
	progress(env, "east cut off")
	time.Sleep(time.Second) // as in the report: the first calls one second after the cut
	ops := []cutOp{
		{"stat p2/f1 (read before)", func(r string, _ int) error { _, err := os.Stat(filepath.Join(r, "p2", "f1")); return err }},
		{"read p2/f1 (read before)", func(r string, _ int) error { _, err := os.ReadFile(filepath.Join(r, "p2", "f1")); return err }},
		{"read p2/f2 (never read here)", func(r string, _ int) error { _, err := os.ReadFile(filepath.Join(r, "p2", "f2")); return err }},
		{"ls p2", func(r string, _ int) error { _, err := os.ReadDir(filepath.Join(r, "p2")); return err }},
		{"create ev/new (dir made here)", func(r string, i int) error {
			_, _, err := writeFile(filepath.Join(r, "ev", fmt.Sprintf("new%d", i)), data)
			return err
		}},
		{"mkdir ev/sub", func(r string, i int) error { return os.Mkdir(filepath.Join(r, "ev", fmt.Sprintf("sub%d", i)), 0o755) }},
		{"create p2/new (dir made at west)", func(r string, i int) error {
			_, _, err := writeFile(filepath.Join(r, "p2", fmt.Sprintf("new%d", i)), data)
			return err
		}},
	}
	t := &Table{
		Title:   fmt.Sprintf("calls at east while east is cut off from west and eu (%s RTT)", rtts[0]),
		Columns: []string{"call", ".EventualConsistency/.MaxTime=1000", "plain path (bound 30 s)"},
	}
	rows := make([][]string, len(ops))
	eventualCreate := false // did the cut-off site create ev/new0?
	for i, op := range ops {
		d, err := timed(func() error { return op.do(filepath.Join(east, ".EventualConsistency", ".MaxTime=1000"), 0) })
		rows[i] = []string{op.name, outcome(d, err), ""}
		if strings.HasPrefix(op.name, "create ev/") && err == nil {
			eventualCreate = true
		}
	}
	var wg sync.WaitGroup // plain calls may each wait their whole bound: run them together
	for i, op := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := timed(func() error { return op.do(east, 1) })
			rows[i][2] = outcome(d, err)
		}()
	}
	wg.Wait()
	for _, r := range rows {
		t.Add(r...)
	}
	// A write at west during the cut, at a SyncLevel the two connected
	// sites can meet.
	if _, _, err := writeFile(filepath.Join(west, ".SyncLevel=2", "p2", "during"), data); err != nil {
		return nil, fmt.Errorf("write at west during the cut: %w", err)
	}
	cutFor := time.Since(cutAt)
	if err := testbed.Heal(env.Dir, ""); err != nil {
		return nil, err
	}
	progress(env, "healed after %s; waiting for convergence", cutFor.Round(time.Second))
	conv := &Table{
		Title:   fmt.Sprintf("after the heal (east was cut off for %s)", cutFor.Round(time.Second)),
		Columns: []string{"what", "seconds after the heal"},
	}
	var waits []struct{ what, path string }
	if eventualCreate {
		waits = append(waits, struct{ what, path string }{"west reads ev/new0 (made at east during the cut)", filepath.Join(west, "ev", "new0")})
	} else {
		conv.Add("west reads ev/new0 (made at east during the cut)", "— (east could not create it during the cut)")
	}
	waits = append(waits, struct{ what, path string }{"east reads p2/during (made at west during the cut)", filepath.Join(east, "p2", "during")})
	var wg2 sync.WaitGroup
	results := make([]string, len(waits))
	for i, c := range waits {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			d, err := until(ctx, 3*time.Minute, func() error { _, err := os.ReadFile(c.path); return err })
			results[i] = outcome(d, err)
		}()
	}
	wg2.Wait()
	for i, c := range waits {
		conv.Add(c.what, results[i])
	}
	return &Result{Tables: []*Table{t, conv}}, nil
}

// until retries fn every 100 ms until it succeeds or limit passes, and
// returns how long that took.
func until(ctx context.Context, limit time.Duration, fn func() error) (time.Duration, error) {
	start := time.Now()
	for {
		err := fn()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return time.Since(start), err
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// outcome prints a call's time and its error, if any, by errno name.
func outcome(d time.Duration, err error) string {
	if err == nil {
		return ms(d) + " ms ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return fmt.Sprintf("%s ms %s", ms(d), errnoName(errno))
	}
	return fmt.Sprintf("%s ms %v", ms(d), err)
}

func errnoName(e syscall.Errno) string {
	switch e {
	case syscall.ETIMEDOUT:
		return "ETIMEDOUT"
	case syscall.EIO:
		return "EIO"
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EEXIST:
		return "EEXIST"
	case syscall.EAGAIN:
		return "EAGAIN"
	}
	return e.Error()
}
