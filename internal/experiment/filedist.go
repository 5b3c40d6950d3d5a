package experiment

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/testbed"
)

func fileDist() *Experiment {
	return &Experiment{
		Name: "filedist",
		Summary: "file distribution (§8.5, Fig. 11): 15 readers at 5 sites read one file written at a 16th node at once; " +
			"CDF beside one direct transfer and 15 simultaneous direct transfers over the same links",
		Params: map[string]string{"size": "5MB", "uplink": "6mbit", "rtt": "100ms", "sites": "5",
			"readers-per-site": "3", "cues": ".WholeFile/.Hotspot", "write-cues": ".RepSites=1", "write-chunk": "1MB", "host-log-level": "info",
			"direct-all": "yes"},
		Run: runFileDist,
	}
}

// parseSize reads "5MB", "50MiB", "65536".
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes such as 5MB or 50MiB", s)
	}
	return v * mult, nil
}

func runFileDist(ctx context.Context, env *Env) (*Result, error) {
	size, err := parseSize(env.Param("size", "5MB"))
	if err != nil {
		return nil, err
	}
	uplink, err := testbed.ParseRate(env.Param("uplink", "6mbit"))
	if err != nil {
		return nil, err
	}
	rtts, err := env.Durations("rtt", "100ms")
	if err != nil {
		return nil, err
	}
	nsites, err := strconv.Atoi(env.Param("sites", "5"))
	if err != nil || nsites < 1 || nsites > 20 {
		return nil, errors.New("sites: want 1 to 20 reader sites")
	}
	perSite, err := strconv.Atoi(env.Param("readers-per-site", "3"))
	if err != nil || perSite < 1 {
		return nil, errors.New("readers-per-site: want a positive number")
	}
	cues := strings.Trim(env.Param("cues", ".WholeFile/.Hotspot"), "/")
	sites := []string{"src"}
	for i := 1; i <= nsites; i++ {
		sites = append(sites, fmt.Sprintf("s%d", i))
	}
	// Every reader is a storage node with its mount, as in the paper; the
	// testbed gives src as many, and src-1 (the 16th node) writes the file.
	st, err := up(ctx, env, testbed.Options{Sites: sites, RTT: testbed.Uniform(sites, rtts[0]), Uplink: uplink,
		ServersPerSite: perSite, TCPCongestion: "cubic"})
	if err != nil {
		return nil, err
	}
	defer down(env)
	var readers []*testbed.Host
	for i := range st.Hosts {
		if h := &st.Hosts[i]; h.Site != "src" && h.Mount != "" {
			readers = append(readers, h)
		}
	}
	src, _ := st.Host("src-1")
	n := len(readers)
	// The limit: one transfer needs size/uplink; n of them through the
	// source's uplink need n times that.
	one := time.Duration(float64(size*8) / float64(uplink) * float64(time.Second))
	limit := 3*time.Duration(n)*one + 2*time.Minute

	data := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{'w', 'h', 'e', 'e', 'l', 'f', 's'})
	rng.Read(data)
	want := sha256.Sum256(data)
	// The paper's setup (and issue 12's): every replica at the origin's
	// site, so that every byte the readers get first leaves through its
	// uplink. .RepSites=1 keeps RepLevel 3 there (src-2, src-3).
	wcues := strings.Trim(env.Param("write-cues", ".RepSites=1"), "/")
	if err := os.Mkdir(filepath.Join(src.Mount, wcues, "dist"), 0o755); err != nil {
		return nil, err
	}
	// Each commit sends its new blocks to the two backups in one call per
	// backup, bounded by the servers' peer timeout (10 s): through a
	// 6 Mbit/s uplink shared by two backups a commit of more than ~3.7 MB
	// never completes (see docs/BENCHMARKS.md). The writer therefore
	// fsyncs every chunk, as an application writing a large file may.
	chunk, err := parseSize(env.Param("write-chunk", "1MB"))
	if err != nil {
		return nil, fmt.Errorf("write-chunk: %w", err)
	}
	progress(env, "writing %d bytes at src-1 (%s/dist/file), fsync every %d bytes", size, wcues, chunk)
	w, c, err := writeChunked(filepath.Join(src.Mount, wcues, "dist", "file"), data, int(chunk))
	if err != nil {
		return nil, fmt.Errorf("write at src-1: %w", err)
	}
	progress(env, "written: open+write %s s, close %s s", secs(w), secs(c))

	// Direct transfers: an HTTP server in src-1's namespace, clients in
	// the readers' namespaces, over the same links as WheelFS.
	ln, err := listenIn(st, src.Name, net.JoinHostPort(src.Addr, "8091"))
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "file", time.Time{}, bytes.NewReader(data))
	}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + net.JoinHostPort(src.Addr, "8091") + "/file"
	direct := func(h *testbed.Host) (time.Duration, error) {
		cl, err := httpClientIn(st, h.Name, "", 1, limit)
		if err != nil {
			return 0, err
		}
		return timed(func() error {
			resp, err := cl.Get(url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			hash := sha256.New()
			if _, err := io.Copy(hash, resp.Body); err != nil {
				return err
			}
			if !bytes.Equal(hash.Sum(nil), want[:]) {
				return errors.New("direct transfer: wrong contents")
			}
			return nil
		})
	}
	progress(env, "one direct transfer src-1 → %s", readers[0].Name)
	single, err := direct(readers[0])
	if err != nil {
		return nil, fmt.Errorf("direct transfer: %w", err)
	}
	progress(env, "one direct transfer: %s s; now %d at once", secs(single), n)
	// The n direct transfers take n times one (100 s for 5 MB): "no"
	// leaves them out when tuning the WheelFS phase.
	directN, derrs := make([]time.Duration, n), make([]error, n)
	var directBytes uint64
	if env.Param("direct-all", "yes") != "no" {
		before := uplinkBytes(st, "src")
		directN, derrs = together(readers, func(h *testbed.Host) (time.Duration, error) { return direct(h) })
		directBytes = uplinkBytes(st, "src") - before
		progress(env, "%d direct transfers: median %s s", n, secs(median(directN)))
	} else {
		for i := range derrs {
			derrs[i] = errSkipped
		}
	}

	// What src's uplink carries with no reads: the control plane (config
	// service, leases, coordinates), which the reads share the uplink with.
	idleFrom := uplinkBytes(st, "src")
	time.Sleep(idleSample)
	idle := float64(uplinkBytes(st, "src")-idleFrom) / idleSample.Seconds()
	progress(env, "%d WheelFS readers at once (%s/dist/file)", n, cues)
	before := uplinkBytes(st, "src")
	sampler := startRateSampler(st, "src", rateSample)
	sitesBefore := map[string]uint64{}
	for _, site := range sites {
		sitesBefore[site] = uplinkBytes(st, site)
	}
	wfs, werrs := together(readers, func(h *testbed.Host) (time.Duration, error) {
		return timedWithin(limit, func() error {
			f, err := os.Open(filepath.Join(h.Mount, cues, "dist", "file"))
			if err != nil {
				return err
			}
			defer f.Close()
			hash := sha256.New()
			if _, err := io.CopyBuffer(hash, f, make([]byte, 1<<20)); err != nil {
				return err
			}
			if !bytes.Equal(hash.Sum(nil), want[:]) {
				return errors.New("read through WheelFS: wrong contents (stale or corrupt)")
			}
			return nil
		})
	})
	wfsBytes := uplinkBytes(st, "src") - before
	var rateMBs []string
	for _, r := range sampler.stop() {
		rateMBs = append(rateMBs, fmt.Sprintf("%.2f", r/1e6))
	}
	// Where the WheelFS readers' bytes came from, site by site: what
	// limits them is how evenly the uplinks are used.
	var siteMB []string
	for _, site := range sites {
		siteMB = append(siteMB, fmt.Sprintf("%s %.1f", site, float64(uplinkBytes(st, site)-sitesBefore[site])/1e6))
	}
	progress(env, "WheelFS readers: median %s s", secs(median(wfs)))

	res := &Result{Notes: []string{
		fmt.Sprintf("%d bytes written at src-1 (a site of its own, whose other %d nodes stay idle), %d readers at %d sites (%d storage nodes with their mounts per site); every site's uplink %s, %s RTT between sites",
			size, perSite-1, n, nsites, perSite, formatBPS(uplink), rtts[0]),
		fmt.Sprintf("the write at src-1 took %s s (open, write and fsync every %d bytes: each fsync waits until both backups, at other sites, have the new blocks) + %s s (close)", secs(w), chunk, secs(c)),
		fmt.Sprintf("physical limits: one transfer %s s (size/uplink); %d transfers from one node through its uplink %s s", secs(one), n, secs(time.Duration(n)*one)),
		fmt.Sprintf("bytes out of src's uplink (IP, with headers) for %d × %d bytes delivered: %.1f MB (%.2f×) during the direct transfers, %.1f MB (%.2f×) during the WheelFS reads",
			n, size, float64(directBytes)/1e6, float64(directBytes)/float64(int64(n)*size), float64(wfsBytes)/1e6, float64(wfsBytes)/float64(int64(n)*size)),
		fmt.Sprintf("bytes out of each site's uplink during the WheelFS reads (MB): %s", strings.Join(siteMB, ", ")),
		fmt.Sprintf("src's uplink with no reads (%s before them: config service, leases, coordinates): %.1f KB/s; during the reads, MB/s per %s: %s",
			idleSample, idle/1e3, rateSample, strings.Join(rateMBs, " ")),
		coordNote(st, src),
		hotspotNote(cues, wcues),
	}}
	for i, e := range derrs {
		if e != nil && e != errSkipped {
			res.Notes = append(res.Notes, fmt.Sprintf("direct transfer to %s failed: %v", readers[i].Name, e))
		}
	}
	for i, e := range werrs {
		if e != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("WheelFS read at %s FAILED: %v", readers[i].Name, e))
		}
	}
	cdf := &Table{
		Title:   fmt.Sprintf("download times of %d bytes, %d readers at once (CDF)", size, n),
		Columns: []string{"readers done", "WheelFS s", fmt.Sprintf("%d direct s", n), "1 direct s"},
	}
	ws, ds := sortedOK(wfs, werrs), sortedOK(directN, derrs)
	for i := 0; i < n; i++ {
		cell := func(v []time.Duration) string {
			if i < len(v) {
				return secs(v[i])
			}
			return "—"
		}
		one := ""
		if i == 0 {
			one = secs(single)
		}
		cdf.Add(fmt.Sprintf("%d/%d", i+1, n), cell(ws), cell(ds), one)
	}
	sum := &Table{
		Title:   "summary",
		Columns: []string{"", "min s", "median s", "max s", "median / 1 direct"},
	}
	for _, row := range []struct {
		name string
		v    []time.Duration
	}{{"WheelFS " + cues, ws}, {fmt.Sprintf("%d direct", n), ds}, {"1 direct", []time.Duration{single}}} {
		if len(row.v) == 0 {
			sum.Add(row.name, "—", "—", "—", "—")
			continue
		}
		sum.Add(row.name, secs(row.v[0]), secs(median(row.v)), secs(row.v[len(row.v)-1]), ratio(median(row.v), single))
	}
	res.Tables = []*Table{sum, cdf}
	png := filepath.Join(env.Dir, "filedist.png")
	p := &plot{title: fmt.Sprintf("filedist: %d readers, %s file, %s uplinks", n, strings.TrimSpace(env.Param("size", "5MB")), formatBPS(uplink)),
		xlabel: "download time (s)", ylabel: "fraction of readers done"}
	p.series = append(p.series, cdfSeries("wheelfs", palette[0], ws, n), cdfSeries(fmt.Sprintf("%d direct", n), palette[1], ds, n),
		series{name: "1 direct", color: palette[2], xs: []float64{single.Seconds(), single.Seconds()}, ys: []float64{0, 1}})
	if err := p.writePNG(png); err != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("plot: %v", err))
	} else {
		res.Notes = append(res.Notes, "CDF plot in "+png)
	}
	return res, nil
}

// errSkipped marks the direct transfers left out (direct-all=no).
var errSkipped = errors.New("not run")

// together runs fn for every host at once and returns each one's time.
func together(hosts []*testbed.Host, fn func(*testbed.Host) (time.Duration, error)) ([]time.Duration, []error) {
	ts, errs := make([]time.Duration, len(hosts)), make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts[i], errs[i] = fn(h)
		}()
	}
	wg.Wait()
	return ts, errs
}

// timedWithin times fn, giving up waiting after limit (fn may go on).
func timedWithin(limit time.Duration, fn func() error) (time.Duration, error) {
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(limit):
		return limit, fmt.Errorf("not done after %s", limit)
	}
}

func sortedOK(ts []time.Duration, errs []error) []time.Duration {
	var out []time.Duration
	for i, t := range ts {
		if errs[i] == nil {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

func median(ts []time.Duration) time.Duration {
	if len(ts) == 0 {
		return 0
	}
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[len(s)/2]
}

// cdfSeries is a step CDF of sorted times over n readers.
func cdfSeries(name string, c color.RGBA, ts []time.Duration, n int) series {
	s := series{name: name, color: c, xs: []float64{0}, ys: []float64{0}}
	for i, t := range ts {
		s.xs = append(s.xs, t.Seconds(), t.Seconds())
		s.ys = append(s.ys, float64(i)/float64(n), float64(i+1)/float64(n))
	}
	return s
}

// writeChunked creates path with data, fsyncing every chunk bytes, and
// returns the time until the last fsync and the time of close.
func writeChunked(path string, data []byte, chunk int) (write, closeT time.Duration, err error) {
	t := time.Now()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, 0, err
	}
	for off := 0; off < len(data); off += chunk {
		if _, err := f.Write(data[off:min(off+chunk, len(data))]); err != nil {
			f.Close()
			return 0, 0, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return 0, 0, fmt.Errorf("fsync at %d bytes: %w", off, err)
		}
	}
	write = time.Since(t)
	t = time.Now()
	if err := f.Close(); err != nil {
		return 0, 0, fmt.Errorf("close %s: %w", path, err)
	}
	return write, time.Since(t), nil
}

// coordNote reports the network coordinates the nodes published, as
// `wheelfs status` shows them (run in host's namespace): the median
// Vivaldi error and the estimated RTT between sites.
func coordNote(st *testbed.State, host *testbed.Host) string {
	self, err := os.Executable()
	if err != nil {
		return "coordinates: " + err.Error()
	}
	cmd := exec.Command("ip", "netns", "exec", host.NS, self, "status", "--json", "--config", st.Config, "--ca", st.CA)
	out, err := cmd.Output()
	if err != nil {
		return fmt.Sprintf("coordinates: wheelfs status: %v", err)
	}
	var stat struct {
		Coords []struct {
			Error float64 `json:"error"`
		} `json:"coords"`
		RTT []struct {
			A        string  `json:"a"`
			B        string  `json:"b"`
			MedianMs float64 `json:"median_ms"`
		} `json:"rtt"`
	}
	if err := json.Unmarshal(out, &stat); err != nil {
		return fmt.Sprintf("coordinates: %v", err)
	}
	var errs []float64
	for _, c := range stat.Coords {
		errs = append(errs, c.Error)
	}
	slices.Sort(errs)
	var far []float64 // estimates between different sites
	for _, r := range stat.RTT {
		if r.A != r.B {
			far = append(far, r.MedianMs)
		}
	}
	slices.Sort(far)
	if len(errs) == 0 || len(far) == 0 {
		return "coordinates: none published yet"
	}
	return fmt.Sprintf("coordinates after the run (wheelfs status): %d nodes, Vivaldi error median %.2f (max %.2f); estimated RTT between sites: median %.0f ms, range %.0f–%.0f ms over %d site pairs",
		len(errs), errs[len(errs)/2], errs[len(errs)-1], far[len(far)/2], far[0], far[len(far)-1], len(far))
}

// How long src's idle uplink is measured before the WheelFS reads, and
// the period of its rate during them.
const (
	idleSample = 10 * time.Second
	rateSample = 5 * time.Second
)

// rateSampler samples a site's uplink counter every period from a shell
// loop started before the reads: forking `ip` from this process while its
// goroutines read through FUSE stalled for minutes in the first runs.
type rateSampler struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startRateSampler(st *testbed.State, site string, period time.Duration) *rateSampler {
	r := &rateSampler{}
	loop := fmt.Sprintf("while :; do echo $(date +%%s.%%N) $(ip -n %s -s -j link show wan); sleep %g; done", st.Prefix+site, period.Seconds())
	r.cmd = exec.Command("sh", "-c", loop)
	r.cmd.Stdout = &r.out
	if err := r.cmd.Start(); err != nil {
		r.cmd = nil
	}
	return r
}

// stop ends the loop and returns the rates (bytes/s) between samples.
func (r *rateSampler) stop() []float64 {
	if r.cmd == nil {
		return nil
	}
	r.cmd.Process.Kill()
	r.cmd.Wait()
	type sample struct {
		at float64
		n  uint64
	}
	var ss []sample
	for line := range strings.Lines(r.out.String()) {
		at, js, _ := strings.Cut(line, " ")
		t, err := strconv.ParseFloat(at, 64)
		if n, ok := txBytes([]byte(js)); ok && err == nil {
			ss = append(ss, sample{t, n})
		}
	}
	var out []float64
	for i := 1; i < len(ss); i++ {
		out = append(out, float64(ss[i].n-ss[i-1].n)/(ss[i].at-ss[i-1].at))
	}
	return out
}

// uplinkBytes is what a site has sent to the wide area so far: the
// counter of the link from its namespace to the router's (0 if unknown).
func uplinkBytes(st *testbed.State, site string) uint64 {
	out, err := exec.Command("ip", "-n", st.Prefix+site, "-s", "-j", "link", "show", "wan").Output()
	if err != nil {
		return 0
	}
	n, _ := txBytes(out)
	return n
}

// txBytes parses `ip -s -j link show` output: the first link's bytes sent.
func txBytes(out []byte) (uint64, bool) {
	var links []struct {
		Stats64 struct {
			Tx struct {
				Bytes uint64 `json:"bytes"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if json.Unmarshal(out, &links) != nil || len(links) == 0 {
		return 0, false
	}
	return links[0].Stats64.Tx.Bytes, true
}

// hotspotNote says where the WheelFS readers' blocks come from under cues.
func hotspotNote(cues, wcues string) string {
	where := "the slice's backups are placed by " + cmp.Or(wcues, "the default policy (RepLevel 3, one copy per site)") +
		": readers at a site holding one find every block there"
	if wcues == ".RepSites=1" {
		where = "every replica is at src's site (.RepSites=1): every block first leaves through its uplink"
	}
	if !slices.Contains(strings.Split(cues, "/"), ".Hotspot") {
		return "without .Hotspot every reader fetches every block from the file's primary at src-1 (a replica at its own site when one has the block); " + where
	}
	return ".Hotspot: each reader goes round the file's blocks (one ring, ordered by hash) from a random point of its own, fetching each from readers at its own site " +
		"that hold it (the primary names holders, its site first), a replica at its own site, then holders, replicas and the primary elsewhere; " + where
}
