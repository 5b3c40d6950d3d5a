package experiment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/testbed"
)

func webCache() *Experiment {
	return &Experiment{
		Name: "webcache",
		Summary: "cooperative web cache (§8.3, Figs. 6–8): Apache mod_cache_disk at every site over one WheelFS " +
			"cache directory, Zipf clients, a slow origin; one site cut off for 30 s of every minute",
		Params: map[string]string{
			"sites": "west,east,eu,asia", "rtt": "100ms", "duration": "3m", "warmup": "1m", "fail-every": "1m", "fail-for": "30s",
			"clients": "5", "pages": "100", "page-size": "41000", "zipf": "1.1",
			"origin-rate": "400kbit", "origin-delay": "75ms", "lock-ttl": "2m",
			"cues": ".EventualConsistency/.MaxTime=1000/.Hotspot", "stdev": "native,shim",
		},
		Run: runWebCache,
	}
}

// Ports of the experiment's servers inside the hosts' namespaces.
const (
	originPort = 8090
	proxyPort  = 8080
)

// webCacheConfig is one run's settings.
type webCacheConfig struct {
	sites                []string
	rtt, lockTTL         time.Duration
	duration, warmup     time.Duration
	every, cut           time.Duration
	clients, pages, size int
	zipf                 float64
	originBPS            uint64
	originDelay          time.Duration
	cues                 string
}

func runWebCache(ctx context.Context, env *Env) (*Result, error) {
	var c webCacheConfig
	c.sites = splitComma(env.Param("sites", "west,east,eu,asia"))
	if len(c.sites) < 2 {
		return nil, errors.New("sites: want at least two (the origin's site is never cut off)")
	}
	ds := map[string]*time.Duration{"rtt": &c.rtt, "lock-ttl": &c.lockTTL, "duration": &c.duration, "warmup": &c.warmup,
		"fail-every": &c.every, "fail-for": &c.cut, "origin-delay": &c.originDelay}
	for k, p := range ds {
		v, err := env.Durations(k, webCache().Params[k])
		if err != nil {
			return nil, err
		}
		*p = v[0]
	}
	if c.cut >= c.every || c.every <= 0 {
		return nil, errors.New("fail-for must be shorter than fail-every")
	}
	ints := map[string]*int{"clients": &c.clients, "pages": &c.pages, "page-size": &c.size}
	for k, p := range ints {
		v, err := strconv.Atoi(env.Param(k, webCache().Params[k]))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%s: want a positive number", k)
		}
		*p = v
	}
	var err error
	if c.zipf, err = strconv.ParseFloat(env.Param("zipf", "1.1"), 64); err != nil || c.zipf <= 1 {
		return nil, errors.New("zipf: want an exponent above 1")
	}
	if c.originBPS, err = testbed.ParseRate(env.Param("origin-rate", "400kbit")); err != nil || c.originBPS == 0 {
		return nil, errors.New("origin-rate: want a rate such as 400kbit")
	}
	c.cues = strings.Trim(env.Param("cues", webCache().Params["cues"]), "/")
	modes := splitComma(env.Param("stdev", "native,shim"))
	for _, m := range modes {
		if m != "native" && m != "shim" {
			return nil, fmt.Errorf("stdev: %q is neither native nor shim", m)
		}
	}
	if err := ensureApache(ctx, env); err != nil {
		return nil, err
	}
	res := &Result{Notes: []string{
		fmt.Sprintf("%d sites at %s RTT, one WheelFS node each; Apache %s at every site as a caching reverse proxy of the origin (mod_proxy_http ProxyPass, mod_cache, mod_cache_disk, CacheKeyBaseURL so that all sites use one key per page) with CacheRoot <mount>/%s/cache",
			len(c.sites), c.rtt, apacheVersion(), c.cues),
		fmt.Sprintf("origin at %s-1: %d pages of %d bytes, Cache-Control max-age=86400, %s after each request, all responses sharing %s; %d clients per site, each a closed loop over Zipf(s=%.2f) pages",
			c.sites[0], c.pages, c.size, c.originDelay, formatBPS(c.originBPS), c.clients, c.zipf),
		fmt.Sprintf("after a warm-up of %s without failures, in every %s one site (in turn %s) is cut off from all others for the last %s; slice lock TTL %s",
			c.warmup, c.every, strings.Join(c.sites[1:], ", "), c.cut, c.lockTTL),
		".Hotspot is accepted by the cue parser and ignored (not implemented yet): reads go to the primary, a backup or the local cache",
	}}
	for _, mode := range modes {
		r, notes, err := webCacheRun(ctx, env, c, mode)
		if err != nil {
			return nil, fmt.Errorf("stdev=%s: %w", mode, err)
		}
		res.Tables = append(res.Tables, r...)
		res.Notes = append(res.Notes, notes...)
	}
	return res, nil
}

func splitComma(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func formatBPS(bps uint64) string {
	if bps%1000 == 0 && bps < 1e6 {
		return fmt.Sprintf("%d kbit/s", bps/1000)
	}
	return fmt.Sprintf("%.1f Mbit/s", float64(bps)/1e6)
}

// apache2 is Debian's httpd binary; its modules live in apacheModules.
const (
	apache2       = "/usr/sbin/apache2"
	apacheModules = "/usr/lib/apache2/modules"
)

// ensureApache installs Apache httpd from the distribution if it is missing.
func ensureApache(ctx context.Context, env *Env) error {
	if _, err := os.Stat(filepath.Join(apacheModules, "mod_cache_disk.so")); err == nil {
		return nil
	}
	progress(env, "installing apache2 (apt-get)")
	install := func() error {
		return run(ctx, 10*time.Minute, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", "apache2")
	}
	if err := install(); err != nil {
		if err := run(ctx, 10*time.Minute, "apt-get", "update", "-q"); err != nil {
			return fmt.Errorf("apt-get update: %w", err)
		}
		if err := install(); err != nil {
			return fmt.Errorf("apt-get install apache2: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(apacheModules, "mod_cache_disk.so")); err != nil {
		return fmt.Errorf("apache2 installed but %s/mod_cache_disk.so is missing", apacheModules)
	}
	return nil
}

func apacheVersion() string {
	b, err := exec.Command(apache2, "-v").Output()
	if err != nil {
		return "httpd"
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if _, v, ok := strings.Cut(line, "Apache/"); ok {
		return strings.Fields(v)[0]
	}
	return "httpd"
}

// wcEvent is one answered (or failed) client request.
type wcEvent struct {
	at   time.Duration // since the start of the load
	site int
	ok   bool // 200 with the right body
	hit  bool // X-Cache: HIT
	bad  bool // 200 with a wrong body
	lat  time.Duration
}

// wcCut is one scheduled failure.
type wcCut struct {
	site       string
	start, end time.Duration
}

func webCacheRun(ctx context.Context, env *Env, c webCacheConfig, mode string) ([]*Table, []string, error) {
	work := filepath.Join(env.Dir, "webcache-"+mode)
	if err := os.RemoveAll(work); err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, nil, err
	}
	var shim string
	if mode == "shim" {
		var err error
		if shim, err = buildStdevShim(ctx, work); err != nil {
			return nil, []string{fmt.Sprintf("stdev=shim skipped: %v", err)}, nil
		}
	}
	st, err := up(ctx, env, testbed.Options{Sites: c.sites, RTT: testbed.Uniform(c.sites, c.rtt), ServersPerSite: 1,
		LockTTL: c.lockTTL, TCPCongestion: "cubic"})
	if err != nil {
		return nil, nil, err
	}
	defer down(env)
	hostOf := func(site string) *testbed.Host {
		h, _ := st.Host(site + "-1")
		return h
	}
	// The shared cache directory, writable by Apache's workers.
	cacheRel := filepath.Join(c.cues, "cache")
	cacheDir := filepath.Join(hostOf(c.sites[0]).Mount, cacheRel)
	if err := os.Mkdir(cacheDir, 0o777); err != nil {
		return nil, nil, fmt.Errorf("mkdir %s: %w", cacheDir, err)
	}
	if err := os.Chmod(cacheDir, 0o777); err != nil {
		return nil, nil, err
	}
	for _, s := range c.sites {
		p := filepath.Join(hostOf(s).Mount, cacheRel)
		if _, err := until(ctx, time.Minute, func() error { _, err := os.Stat(p); return err }); err != nil {
			return nil, nil, fmt.Errorf("cache directory at %s: %w", s, err)
		}
	}
	// The origin.
	pages := make([][]byte, c.pages)
	for i := range pages {
		pages[i] = pageBody(i, c.size)
	}
	originHost := hostOf(c.sites[0])
	originAddr := net.JoinHostPort(originHost.Addr, strconv.Itoa(originPort))
	ln, err := listenIn(st, originHost.Name, originAddr)
	if err != nil {
		return nil, nil, err
	}
	org := &origin{pages: pages, delay: c.originDelay, pace: &pacer{bps: float64(c.originBPS)}}
	srv := &http.Server{Handler: org, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	// Apache at every site.
	var proxies []*daemon
	defer func() {
		for _, d := range proxies {
			if err := d.stop(10 * time.Second); err != nil {
				env.Log.Warn("stop apache", "err", err)
			}
		}
	}()
	for _, s := range c.sites {
		h := hostOf(s)
		d, err := startApache(st, h, filepath.Join(work, s), filepath.Join(h.Mount, cacheRel), originAddr, shim)
		if err != nil {
			return nil, nil, err
		}
		proxies = append(proxies, d)
	}
	for i, s := range c.sites {
		h := hostOf(s)
		addr := net.JoinHostPort(h.Addr, strconv.Itoa(proxyPort))
		if _, err := until(ctx, 30*time.Second, func() error {
			if proxies[i].exited() {
				return fmt.Errorf("apache at %s exited; see %s", s, filepath.Join(work, s, "error.log"))
			}
			cl, err := httpClientIn(st, h.Name, "", 1, 2*time.Second)
			if err != nil {
				return err
			}
			resp, err := cl.Get("http://" + addr + "/")
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		}); err != nil {
			return nil, nil, fmt.Errorf("apache at %s not answering: %w", s, err)
		}
	}
	progress(env, "stdev=%s: origin at %s, Apache up at %d sites; load for %s", mode, originAddr, len(c.sites), c.duration)

	// The failure schedule.
	var cuts []wcCut
	for k := 0; ; k++ {
		start := c.warmup + time.Duration(k)*c.every + c.every - c.cut
		if start >= c.duration {
			break
		}
		cuts = append(cuts, wcCut{site: c.sites[1+k%(len(c.sites)-1)], start: start, end: min(start+c.cut, c.duration)})
	}
	var (
		mu     sync.Mutex
		events []wcEvent
		badEx  []string
	)
	loadCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	org.start(t0)
	var wg sync.WaitGroup
	for si, s := range c.sites {
		h := hostOf(s)
		proxy := "http://" + net.JoinHostPort(h.Addr, strconv.Itoa(proxyPort))
		cl, err := httpClientIn(st, h.Name, "", c.clients, 30*time.Second)
		if err != nil {
			return nil, nil, err
		}
		for ci := 0; ci < c.clients; ci++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(si), uint64(ci)))
				z := rand.NewZipf(rng, c.zipf, 1, uint64(c.pages-1))
				for loadCtx.Err() == nil && time.Since(t0) < c.duration {
					n := int(z.Uint64())
					start := time.Now()
					ev := wcEvent{site: si}
					body, hit, err := fetchPage(loadCtx, cl, fmt.Sprintf("%s/page/%d", proxy, n))
					ev.at, ev.lat = time.Since(t0), time.Since(start)
					switch {
					case err != nil:
						if loadCtx.Err() != nil {
							return
						}
						time.Sleep(100 * time.Millisecond) // a refused proxy must not spin
					case !bytes.Equal(body, pages[n]):
						ev.bad = true
						mu.Lock()
						if len(badEx) < 5 {
							badEx = append(badEx, fmt.Sprintf("%s: page %d: %d bytes, want %d (hit=%v)", s, n, len(body), len(pages[n]), hit))
						}
						mu.Unlock()
					default:
						ev.ok, ev.hit = true, hit
					}
					mu.Lock()
					events = append(events, ev)
					mu.Unlock()
				}
			}()
		}
	}
	for _, cut := range cuts {
		if err := sleepUntil(ctx, t0.Add(cut.start)); err != nil {
			return nil, nil, err
		}
		if err := testbed.Partition(env.Dir, cut.site, ""); err != nil {
			return nil, nil, err
		}
		progress(env, "stdev=%s: %s cut off", mode, cut.site)
		if err := sleepUntil(ctx, t0.Add(cut.end)); err != nil {
			return nil, nil, err
		}
		if err := testbed.Heal(env.Dir, cut.site); err != nil {
			return nil, nil, err
		}
		progress(env, "stdev=%s: %s healed", mode, cut.site)
	}
	if err := sleepUntil(ctx, t0.Add(c.duration)); err != nil {
		return nil, nil, err
	}
	cancel()
	wg.Wait()
	originTimes := org.arrivals()
	notes := []string{}
	// What the kernel reports for one cached body at two sites.
	notes = append(notes, stdevFacts(st, c, cacheRel, mode)...)
	for _, s := range c.sites {
		l := readApacheLog(filepath.Join(work, s, "error.log"))
		notes = append(notes, fmt.Sprintf("stdev=%s, %s: Apache stored %d entries (AH00737), failed to store %d (AH00699 rename of a temporary file: %s), recalled %d (AH00709) and ignored %d whose header did not match the body (AH00710)",
			mode, s, l.stored, l.renameFailed, l.renameErrs, l.recalled, l.mismatched))
	}
	for _, b := range badEx {
		notes = append(notes, fmt.Sprintf("stdev=%s: WRONG BODY %s", mode, b))
	}
	tables := webCacheTables(c, mode, cuts, events, originTimes)
	if err := webCachePlot(filepath.Join(env.Dir, "webcache-"+mode+".png"), c, cuts, events, originTimes); err != nil {
		notes = append(notes, fmt.Sprintf("plot: %v", err))
	} else {
		notes = append(notes, fmt.Sprintf("stdev=%s: plot in %s", mode, filepath.Join(env.Dir, "webcache-"+mode+".png")))
	}
	return tables, notes, nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}

// fetchPage gets url from a site's Apache and tells whether it answered
// from its cache.
func fetchPage(ctx context.Context, cl *http.Client, url string) ([]byte, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, false, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("%s", resp.Status)
	}
	return body, strings.HasPrefix(resp.Header.Get("X-Cache"), "HIT"), nil
}

// pageBody is page n's deterministic content.
func pageBody(n, size int) []byte {
	b := make([]byte, size)
	copy(b, fmt.Sprintf("page %d\n", n))
	rng := rand.New(rand.NewPCG(uint64(n), 0x77656263))
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789\n"
	for i := len(fmt.Sprintf("page %d\n", n)); i < size; i++ {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return b
}

// origin is the web server behind a slow link: every response waits
// delay, then all bodies share one paced link.
type origin struct {
	pages [][]byte
	delay time.Duration
	pace  *pacer

	mu   sync.Mutex
	t0   time.Time
	hits []time.Duration
}

func (o *origin) start(t0 time.Time) {
	o.mu.Lock()
	o.t0, o.hits = t0, nil
	o.mu.Unlock()
}

func (o *origin) arrivals() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.hits)
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var n int
	if _, err := fmt.Sscanf(r.URL.Path, "/page/%d", &n); err != nil || n < 0 || n >= len(o.pages) {
		http.NotFound(w, r)
		return
	}
	o.mu.Lock()
	if !o.t0.IsZero() {
		o.hits = append(o.hits, time.Since(o.t0))
	}
	o.mu.Unlock()
	select {
	case <-r.Context().Done():
		return
	case <-time.After(o.delay):
	}
	body := o.pages[n]
	h := w.Header()
	h.Set("Content-Type", "text/plain")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "public, max-age=86400")
	h.Set("Last-Modified", "Mon, 02 Jan 2006 15:04:05 GMT")
	w.WriteHeader(http.StatusOK)
	for off := 0; off < len(body); off += 4096 {
		end := min(off+4096, len(body))
		if err := o.pace.wait(r.Context(), end-off); err != nil {
			return
		}
		if _, err := w.Write(body[off:end]); err != nil {
			return
		}
	}
}

// pacer serializes writes at a rate, like one shared link.
type pacer struct {
	bps  float64
	mu   sync.Mutex
	next time.Time
}

func (p *pacer) wait(ctx context.Context, n int) error {
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(time.Duration(float64(n*8) / p.bps * float64(time.Second)))
	at := p.next
	p.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(at)):
		return nil
	}
}

var apacheConf = template.Must(template.New("httpd.conf").Parse(`# Written by wheelfs testbed run webcache.
ServerRoot "{{.Run}}"
ServerName wheelfs-cache-{{.Site}}
Listen {{.Listen}}
PidFile "{{.Run}}/httpd.pid"
DefaultRuntimeDir "{{.Run}}"
ErrorLog "{{.Run}}/error.log"
User {{.User}}
Group {{.Group}}
LoadModule mpm_event_module {{.Mods}}/mod_mpm_event.so
LoadModule authz_core_module {{.Mods}}/mod_authz_core.so
LoadModule proxy_module {{.Mods}}/mod_proxy.so
LoadModule proxy_http_module {{.Mods}}/mod_proxy_http.so
LoadModule cache_module {{.Mods}}/mod_cache.so
LoadModule cache_disk_module {{.Mods}}/mod_cache_disk.so
LogLevel warn cache_disk:debug
StartServers 1
ServerLimit 2
ThreadsPerChild 25
MaxRequestWorkers 50
Timeout 30
KeepAlive On
EnableSendfile Off
EnableMMAP Off
ProxyRequests Off
ProxyVia Off
ProxyTimeout 10
ProxyPass "/" "http://{{.Origin}}/"
CacheRoot "{{.CacheRoot}}"
CacheEnable disk /
# One key for a page at every site (the default names this proxy).
CacheKeyBaseURL "http://origin.wheelfs.test:{{.OriginPort}}"
CacheDirLevels 2
CacheDirLength 1
CacheQuickHandler On
CacheLock Off
CacheHeader On
CacheIgnoreNoLastMod On
CacheMaxFileSize 10000000
`))

// startApache writes a site's configuration and starts httpd in the
// foreground in the host's namespace.
func startApache(st *testbed.State, h *testbed.Host, run, cacheRoot, origin, shim string) (*daemon, error) {
	if err := os.MkdirAll(run, 0o755); err != nil {
		return nil, err
	}
	usr, grp := "www-data", "www-data"
	if _, err := user.Lookup(usr); err != nil {
		usr, grp = "nobody", "nogroup"
	}
	var b bytes.Buffer
	if err := apacheConf.Execute(&b, map[string]string{
		"Run": run, "Site": h.Site, "Listen": net.JoinHostPort(h.Addr, strconv.Itoa(proxyPort)),
		"User": usr, "Group": grp, "Mods": apacheModules, "CacheRoot": cacheRoot,
		"Origin": origin, "OriginPort": strconv.Itoa(originPort),
	}); err != nil {
		return nil, err
	}
	conf := filepath.Join(run, "httpd.conf")
	if err := os.WriteFile(conf, b.Bytes(), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(apache2, "-f", conf, "-DFOREGROUND")
	cmd.Env = append(os.Environ(), "APACHE_RUN_DIR="+run)
	if shim != "" {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+shim)
	}
	lf, err := os.Create(filepath.Join(run, "stdout.log"))
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd.Stdout, cmd.Stderr = lf, lf
	return startDaemon(st, h.Name, "apache at "+h.Site, cmd)
}

// stdevShim makes fstat report one device number for every file on a FUSE
// mount: what WheelFS cannot make the kernel do (see webcache in
// docs/BENCHMARKS.md). Apache's mod_cache_disk compares the st_dev and
// st_ino of a cached body with those its writer recorded.
const stdevShim = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

/* The device numbers of the FUSE mounts, read once: a per-call fstatfs
   would be a FUSE request, which waits on a cut-off site. */
static dev_t fuse_devs[256];
static int nfuse;
static int (*real_fstat)(int, struct stat *);

__attribute__((constructor)) static void init(void) {
	char line[4096];
	FILE *f = fopen("/proc/self/mountinfo", "r");
	real_fstat = (int (*)(int, struct stat *))dlsym(RTLD_NEXT, "fstat");
	while (f && nfuse < 256 && fgets(line, sizeof line, f)) {
		unsigned maj, min;
		char *sep = strstr(line, " - ");
		if (sep && sscanf(line, "%*d %*d %u:%u", &maj, &min) == 2 && strncmp(sep + 3, "fuse", 4) == 0)
			fuse_devs[nfuse++] = makedev(maj, min);
	}
	if (f)
		fclose(f);
}

int fstat(int fd, struct stat *st) {
	int r = real_fstat(fd, st);
	for (int i = 0; r == 0 && i < nfuse; i++)
		if (st->st_dev == fuse_devs[i]) {
			st->st_dev = makedev(0, 0xfff);
			break;
		}
	return r;
}
`

// buildStdevShim compiles the shim with the system's C compiler.
func buildStdevShim(ctx context.Context, work string) (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", errors.New("no C compiler (cc) to build the LD_PRELOAD shim")
	}
	src, so := filepath.Join(work, "stdev.c"), filepath.Join(work, "stdev.so")
	if err := os.WriteFile(src, []byte(stdevShim), 0o644); err != nil {
		return "", err
	}
	if err := run(ctx, time.Minute, cc, "-shared", "-fPIC", "-O2", "-o", so, src, "-ldl"); err != nil {
		return "", fmt.Errorf("build shim: %w", err)
	}
	return so, nil
}

// conflictSuffix is the name a union merge gives the loser of a name
// clash (server.conflictName).
var conflictSuffix = regexp.MustCompile(`~[0-9a-f]{16}$`)

// stdevFacts stats one cached body through two sites' mounts and counts
// what the cache directory holds.
func stdevFacts(st *testbed.State, c webCacheConfig, cacheRel, mode string) []string {
	var notes []string
	var devs []string
	for _, s := range c.sites {
		h, _ := st.Host(s + "-1")
		var sb unix.Stat_t
		if err := unix.Stat(h.Mount, &sb); err == nil {
			devs = append(devs, fmt.Sprintf("%s %d:%d", s, unix.Major(sb.Dev), unix.Minor(sb.Dev)))
		}
	}
	notes = append(notes, fmt.Sprintf("stdev=%s: st_dev of each site's mount (kernel's anonymous device per FUSE mount): %s", mode, strings.Join(devs, ", ")))
	a, _ := st.Host(c.sites[0] + "-1")
	b, _ := st.Host(c.sites[1] + "-1")
	var body string
	var headers, datas, temps, clashes int
	var clashEx []string
	filepath.WalkDir(filepath.Join(a.Mount, cacheRel), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		name := d.Name()
		switch {
		case conflictSuffix.MatchString(name):
			clashes++
			if len(clashEx) < 3 {
				clashEx = append(clashEx, name)
			}
		case strings.HasPrefix(name, "aptmp"):
			temps++
		case strings.HasSuffix(name, ".header"):
			headers++
		case strings.HasSuffix(name, ".data"):
			datas++
			if body == "" {
				body = p
			}
		}
		return nil
	})
	notes = append(notes, fmt.Sprintf("stdev=%s: cache directory after the run (seen at %s): %d .header, %d .data, %d aptmp* temporaries, %d names with a WheelFS conflict suffix ~<id> %v",
		mode, a.Site, headers, datas, temps, clashes, clashEx))
	if body == "" {
		return append(notes, fmt.Sprintf("stdev=%s: no cached body (.data) found under the cache directory", mode))
	}
	rel, _ := filepath.Rel(a.Mount, body)
	var sa, sb unix.Stat_t
	ea, eb := unix.Stat(body, &sa), unix.Stat(filepath.Join(b.Mount, rel), &sb)
	if ea != nil || eb != nil {
		return append(notes, fmt.Sprintf("stdev=%s: stat %s: %v / %v", mode, rel, ea, eb))
	}
	return append(notes, fmt.Sprintf("stdev=%s: %s through %s's mount: st_dev %d:%d st_ino %d; through %s's: st_dev %d:%d st_ino %d",
		mode, rel, a.Site, unix.Major(sa.Dev), unix.Minor(sa.Dev), sa.Ino, b.Site, unix.Major(sb.Dev), unix.Minor(sb.Dev), sb.Ino))
}

// apacheLog is what mod_cache_disk's log says about the cache.
type apacheLog struct {
	stored, renameFailed, recalled, mismatched int
	renameErrs                                 string // by errno
}

// renameErr picks the APR error of an AH00699 line: "(2)No such file or directory".
var renameErr = regexp.MustCompile(`\((\d+)\)([^:]+): \[client [^]]*\] AH00699`)

func readApacheLog(path string) apacheLog {
	b, err := os.ReadFile(path)
	if err != nil {
		return apacheLog{}
	}
	l := apacheLog{stored: bytes.Count(b, []byte("AH00737")), recalled: bytes.Count(b, []byte("AH00709")),
		mismatched: bytes.Count(b, []byte("AH00710"))}
	errs := map[string]int{}
	for _, m := range renameErr.FindAllSubmatch(b, -1) {
		l.renameFailed++
		errs[string(m[2])]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		parts = append(parts, fmt.Sprintf("%d %s", errs[k], k))
	}
	l.renameErrs = strings.Join(parts, ", ")
	if l.renameErrs == "" {
		l.renameErrs = "none"
	}
	return l
}

// webCacheTables buckets the events by 10 s.
func webCacheTables(c webCacheConfig, mode string, cuts []wcCut, events []wcEvent, originT []time.Duration) []*Table {
	const bucket = 10 * time.Second
	n := int((c.duration + bucket - 1) / bucket)
	cols := []string{"t (s)", "cut off", "origin req/s"}
	for _, s := range c.sites {
		cols = append(cols, s+" served/s")
	}
	cols = append(cols, "all served/s", "hits %", "failed/s")
	t := &Table{Title: fmt.Sprintf("stdev=%s: per 10 s", mode), Columns: cols}
	served := make([][]int, n)
	hits, failed, origin := make([]int, n), make([]int, n), make([]int, n)
	for i := range served {
		served[i] = make([]int, len(c.sites))
	}
	for _, e := range events {
		i := min(int(e.at/bucket), n-1)
		if e.ok {
			served[i][e.site]++
			if e.hit {
				hits[i]++
			}
		} else {
			failed[i]++
		}
	}
	for _, o := range originT {
		if i := int(o / bucket); i < n {
			origin[i]++
		}
	}
	rate := func(k int) string { return fmt.Sprintf("%.1f", float64(k)/bucket.Seconds()) }
	for i := 0; i < n; i++ {
		from := time.Duration(i) * bucket
		state := "—"
		for _, cu := range cuts {
			if cu.start < from+bucket && cu.end > from {
				state = cu.site
			}
		}
		row := []string{fmt.Sprint(int(from.Seconds())), state, rate(origin[i])}
		all := 0
		for _, k := range served[i] {
			row = append(row, rate(k))
			all += k
		}
		pct := "—"
		if all > 0 {
			pct = fmt.Sprintf("%.0f", 100*float64(hits[i])/float64(all))
		}
		row = append(row, rate(all), pct, rate(failed[i]))
		t.Add(row...)
	}
	// Summary: during cuts against outside them, after the first minute.
	sum := &Table{Title: fmt.Sprintf("stdev=%s: summary", mode),
		Columns: []string{"period", "seconds", "origin req/s", "served req/s", "hits %", "failed req/s", "wrong bodies", "served latency p50 / p99 ms"}}
	inCut := func(at time.Duration) bool {
		for _, cu := range cuts {
			if at >= cu.start && at < cu.end {
				return true
			}
		}
		return false
	}
	type agg struct {
		secs                       float64
		origin, ok, hit, fail, bad int
		lats                       []time.Duration
	}
	periods := []struct {
		name string
		keep func(time.Duration) bool
	}{
		{"whole run", func(time.Duration) bool { return true }},
		{"warm-up (first " + c.warmup.String() + ")", func(at time.Duration) bool { return at < c.warmup }},
		{"after it, links up", func(at time.Duration) bool { return at >= c.warmup && !inCut(at) }},
		{"after it, a site cut off", func(at time.Duration) bool { return at >= c.warmup && inCut(at) }},
	}
	for _, p := range periods {
		var a agg
		for s := time.Duration(0); s < c.duration; s += 100 * time.Millisecond {
			if p.keep(s) {
				a.secs += 0.1
			}
		}
		for _, o := range originT {
			if p.keep(o) {
				a.origin++
			}
		}
		for _, e := range events {
			if !p.keep(e.at) {
				continue
			}
			switch {
			case e.ok:
				a.ok++
				a.lats = append(a.lats, e.lat)
				if e.hit {
					a.hit++
				}
			case e.bad:
				a.bad++
			default:
				a.fail++
			}
		}
		if a.secs == 0 {
			continue
		}
		pct, lat := "—", "—"
		if a.ok > 0 {
			pct = fmt.Sprintf("%.0f", 100*float64(a.hit)/float64(a.ok))
			slices.Sort(a.lats)
			lat = fmt.Sprintf("%s / %s", ms(a.lats[len(a.lats)/2]), ms(a.lats[len(a.lats)*99/100]))
		}
		sum.Add(p.name, fmt.Sprintf("%.0f", a.secs), fmt.Sprintf("%.2f", float64(a.origin)/a.secs),
			fmt.Sprintf("%.1f", float64(a.ok)/a.secs), pct, fmt.Sprintf("%.2f", float64(a.fail)/a.secs), fmt.Sprint(a.bad), lat)
	}
	return []*Table{sum, t}
}

// webCachePlot draws origin load and service rate per 5 s on a log scale,
// with the failures shaded, as the paper's Figures 6–8.
func webCachePlot(path string, c webCacheConfig, cuts []wcCut, events []wcEvent, originT []time.Duration) error {
	const bucket = 5 * time.Second
	n := int((c.duration + bucket - 1) / bucket)
	origin, served := make([]float64, n), make([]float64, n)
	for _, o := range originT {
		if i := int(o / bucket); i < n {
			origin[i]++
		}
	}
	for _, e := range events {
		if i := int(e.at / bucket); i < n && e.ok {
			served[i]++
		}
	}
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = (float64(i) + 0.5) * bucket.Seconds()
		origin[i] /= bucket.Seconds()
		served[i] /= bucket.Seconds()
	}
	p := &plot{title: fmt.Sprintf("webcache: %d sites, grey = one site cut off", len(c.sites)),
		xlabel: "time (s)", ylabel: "requests/s (log)", logY: true,
		series: []series{{"clients served", palette[1], xs, served}, {"origin", palette[0], xs, origin}}}
	for _, cu := range cuts {
		p.shade = append(p.shade, [2]float64{cu.start.Seconds(), cu.end.Seconds()})
	}
	return p.writePNG(path)
}
