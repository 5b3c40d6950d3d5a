package experiment

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/testbed"
)

func scale() *Experiment {
	return &Experiment{
		Name: "scale",
		Summary: "paper Fig. 3: N nodes each primary of a directory of 1 MB files; all read 10 files of others at once; " +
			"read latency and config-service load (CPU, bytes) per N; then client-only mounts added up to hundreds of hosts",
		Params: map[string]string{"nodes": "5,10,20", "clients": "0", "client-files": "0", "files": "10",
			"size": "1048576", "rtt": "100ms", "idle": "20s", "settle": "35s"},
		Run: runScale,
	}
}

// scaleRun is one deployment of the scale experiment.
type scaleRun struct{ servers, clients int }

func runScale(ctx context.Context, env *Env) (*Result, error) {
	counts, err := multiplesOf5(env.Param("nodes", "5,10,20"), 5)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	extra, err := multiplesOf5(env.Param("clients", "0"), 0)
	if err != nil {
		return nil, fmt.Errorf("clients: %w", err)
	}
	files, err1 := strconv.Atoi(env.Param("files", "10"))
	size, err2 := strconv.Atoi(env.Param("size", "1048576"))
	clientFiles, err3 := strconv.Atoi(env.Param("client-files", "0"))
	if err := errors.Join(err1, err2, err3); err != nil || files < 1 || size < 1 || clientFiles < 0 {
		return nil, fmt.Errorf("files, size, client-files: want positive numbers (%v)", err)
	}
	rtt, err := env.Durations("rtt", "100ms")
	if err != nil {
		return nil, err
	}
	idle, err := env.Durations("idle", "20s")
	if err != nil {
		return nil, err
	}
	// Hosts publish their first coordinate one publication period
	// (deploy.DefaultPublishEvery, 30 s) after they start: the idle load is
	// measured after that, in the steady state.
	settle, err := env.Durations("settle", "35s")
	if err != nil {
		return nil, err
	}
	// The storage nodes' runs first, then the largest of them with client-only
	// mounts added: every host of a deployment keeps a coordinate, a watch of
	// the slice table and connections to the config members, so the config
	// service's load grows with hosts, not with servers.
	var runs []scaleRun
	for _, n := range counts {
		runs = append(runs, scaleRun{servers: n})
	}
	for _, c := range extra {
		if c > 0 {
			runs = append(runs, scaleRun{servers: counts[len(counts)-1], clients: c})
		}
	}
	sites := []string{"west", "east", "eu", "asia", "aus"}
	t := &Table{
		Title: fmt.Sprintf("N hosts over 5 sites (%s RTT); each storage node reads %d files of %d bytes written by others, each client-only mount %d, all at once",
			rtt[0], files, size, clientFiles),
		Columns: []string{"N", "servers", "clients", "reads", "read median ms", "read p90 ms", "limit ms", "median / limit",
			"config CPU idle %", "config KB/s idle", "config CPU reading %", "config KB/s reading", "machine CPU busy reading %"},
	}
	type point struct {
		n             int
		idleCPU, idle float64
	}
	var pts []point
	for _, r := range runs {
		n := r.servers + r.clients
		st, err := up(ctx, env, testbed.Options{Sites: sites, RTT: testbed.Uniform(sites, rtt[0]),
			ServersPerSite: r.servers / len(sites), ClientsPerSite: r.clients / len(sites), TCPCongestion: "cubic"})
		if err != nil {
			return nil, err
		}
		row, idleCPU, idleKB, err := scaleRound(ctx, env, st, files, clientFiles, size, settle[0], idle[0])
		down(env)
		if err != nil {
			return nil, fmt.Errorf("N=%d: %w", n, err)
		}
		t.Add(append([]string{fmt.Sprint(n), fmt.Sprint(r.servers), fmt.Sprint(r.clients), row[0], row[1], row[2], ms(rtt[0]), ratioStr(row[1], rtt[0])}, row[3:]...)...)
		pts = append(pts, point{n, idleCPU, idleKB})
	}
	res := &Result{Tables: []*Table{t}, Notes: []string{
		"Every storage node is a server and a mount (`wheelfs node`), primary of its own directory (write-local); readers never read their own or the same file twice, as in the paper.",
		"Client-only mounts (`wheelfs mount`) hold no data; each keeps what every host keeps: a network coordinate it publishes, a watch of the slice table, a membership in the config service's probes.",
		"Config service load: CPU time and bytes (in+out) of all config members' processes and interfaces, per second, over an idle period and over the read phase.",
		"Limit: one RTT (a request to a primary at another site and the data back), the best a remote read can do.",
	}}
	if len(pts) >= 2 {
		a, b := pts[0], pts[len(pts)-1]
		perCPU := (b.idleCPU - a.idleCPU) / float64(b.n-a.n)
		perKB := (b.idle - a.idle) / float64(b.n-a.n)
		res.Notes = append(res.Notes, fmt.Sprintf(
			"Idle config-service load grows by %.4f%% CPU and %.3f KB/s per host between N=%d and N=%d; at that rate 250 hosts cost %.1f%% CPU and %.0f KB/s.",
			perCPU, perKB, a.n, b.n, b.idleCPU+perCPU*float64(250-b.n), b.idle+perKB*float64(250-b.n)))
	}
	return res, nil
}

// multiplesOf5 parses a comma-separated list of host counts spread over 5
// sites, each at least least.
func multiplesOf5(list string, least int) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < least || n%5 != 0 {
			return nil, fmt.Errorf("%q: want multiples of 5, at least %d (hosts are spread over 5 sites)", s, least)
		}
		out = append(out, n)
	}
	return out, nil
}

func ratioStr(medianMS string, limit time.Duration) string {
	v, err := strconv.ParseFloat(medianMS, 64)
	if err != nil || limit <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v/(float64(limit)/float64(time.Millisecond)))
}

// scaleRound runs one N: write, measure idle load, read all at once.
func scaleRound(ctx context.Context, env *Env, st *testbed.State, files, clientFiles, size int, settle, idle time.Duration) (row []string, idleCPU, idleKB float64, err error) {
	began := time.Now() // the hosts have just started
	var nodes, clients []testbed.Host
	var members []*testbed.Host
	for i := range st.Hosts {
		switch st.Hosts[i].Role {
		case testbed.RoleNode:
			nodes = append(nodes, st.Hosts[i])
		case testbed.RoleClient:
			clients = append(clients, st.Hosts[i])
		case testbed.RoleConfig:
			members = append(members, &st.Hosts[i])
		}
	}
	data := make([]byte, size)
	rand.Read(data)
	var wg sync.WaitGroup
	errs := make([]error, len(nodes))
	for i, h := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := filepath.Join(h.Mount, "n-"+h.Name)
			if errs[i] = os.Mkdir(dir, 0o755); errs[i] != nil {
				return
			}
			for f := 0; f < files; f++ {
				if _, _, err := writeFile(filepath.Join(dir, fmt.Sprintf("f%d", f)), data); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, 0, 0, fmt.Errorf("writing: %w", err)
	}
	progress(env, "N=%d: %d files written; settling %s, then measuring %s idle", len(nodes)+len(clients), len(nodes)*files, settle, idle)
	if rest := settle - time.Since(began); rest > 0 {
		time.Sleep(rest)
	}
	load := func(d time.Duration, during func() error) (cpuPct, kbps float64, err error) {
		before, err := sumCounters(members)
		if err != nil {
			return 0, 0, err
		}
		start := time.Now()
		if err := during(); err != nil {
			return 0, 0, err
		}
		if rest := d - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
		el := time.Since(start)
		after, err := sumCounters(members)
		if err != nil {
			return 0, 0, err
		}
		return 100 * float64(after.CPU-before.CPU) / float64(el),
			float64(after.RxBytes+after.TxBytes-before.RxBytes-before.TxBytes) / 1024 / el.Seconds(), nil
	}
	idleCPU, idleKB, err = load(idle, func() error { return nil })
	if err != nil {
		return nil, 0, 0, err
	}
	var (
		mu  sync.Mutex
		lat []time.Duration
	)
	readers := slices.Concat(nodes, clients)
	readAll := func() error {
		errs := make([]error, len(readers))
		for i, h := range readers {
			n := files
			if h.Role == testbed.RoleClient {
				n = clientFiles
			}
			// Files of other nodes, never the same twice.
			var pool []string
			for _, o := range nodes {
				if o.Name != h.Name {
					for f := 0; f < files; f++ {
						pool = append(pool, filepath.Join(h.Mount, "n-"+o.Name, fmt.Sprintf("f%d", f)))
					}
				}
			}
			mrand.Shuffle(len(pool), func(a, b int) { pool[a], pool[b] = pool[b], pool[a] })
			pool = pool[:min(n, len(pool))]
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, p := range pool {
					d, err := readCheck(p, data)
					if err != nil {
						errs[i] = err
						return
					}
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	busy0, total0 := machineCPU()
	readCPU, readKB, err := load(0, readAll)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("reading: %w", err)
	}
	busy1, total1 := machineCPU()
	busyPct := 100 * float64(busy1-busy0) / float64(max(1, total1-total0))
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	p90 := lat[min(len(lat)-1, len(lat)*9/10)]
	row = []string{fmt.Sprint(len(lat)), ms(stats(lat).Median), ms(p90), fmt.Sprintf("%.1f", idleCPU), fmt.Sprintf("%.1f", idleKB),
		fmt.Sprintf("%.1f", readCPU), fmt.Sprintf("%.1f", readKB), fmt.Sprintf("%.0f", busyPct)}
	progress(env, "N=%d: %d reads, median %s ms, p90 %s ms; config idle %.1f%% CPU %.1f KB/s, reading %.1f%% %.1f KB/s",
		len(nodes)+len(clients), len(lat), row[1], row[2], idleCPU, idleKB, readCPU, readKB)
	return row, idleCPU, idleKB, nil
}

func sumCounters(hosts []*testbed.Host) (testbed.Counters, error) {
	var sum testbed.Counters
	for _, h := range hosts {
		c, err := h.Counters()
		if err != nil {
			return sum, err
		}
		sum.CPU += c.CPU
		sum.RxBytes += c.RxBytes
		sum.TxBytes += c.TxBytes
	}
	return sum, nil
}

// machineCPU returns the machine's busy and total CPU ticks (/proc/stat):
// on one machine all nodes share its cores, which real sites do not.
func machineCPU() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}
