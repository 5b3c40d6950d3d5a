package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// webCacheFullEnv runs the web-cache experiment on the paper's schedule
// (§8.3: each minute one site's link fails for 30 s) instead of the
// scaled-down one.
const webCacheFullEnv = "WHEELFS_WEBCACHE_FULL"

// webSchedule is a failure schedule: after warm-up, cycles of period, the
// last fail of each with one site (in turn) partitioned.
type webSchedule struct {
	warmup, period, fail time.Duration
	cycles               int
	lockTTL              time.Duration
}

var (
	webScaled = webSchedule{warmup: 8 * time.Second, period: 8 * time.Second, fail: 4 * time.Second,
		cycles: 3, lockTTL: 10 * time.Second}
	webFull = webSchedule{warmup: 30 * time.Second, period: 60 * time.Second, fail: 30 * time.Second,
		cycles: 5, lockTTL: 60 * time.Second}
)

const (
	webPages          = 100
	webPageSize       = 8 << 10
	webMaxTime        = time.Second
	webOriginDelay    = 150 * time.Millisecond // RTT to the origin server (paper: 150 ms)
	webProxiesPerSite = 2
)

// webPage is the origin's copy of url: a header naming it, then filler,
// as a cached page whose header a proxy checks.
func webPage(url string) []byte {
	head := "URL " + url + "\n"
	return append([]byte(head), bytes.Repeat([]byte{'.'}, webPageSize-len(head))...)
}

func webHash(url string) string {
	h := sha256.Sum256([]byte(url))
	return hex.EncodeToString(h[:8])
}

// webSample is one request of one proxy.
type webSample struct {
	site     string
	at       time.Time     // when the request began
	open     time.Duration // the open(): path resolution and Open
	maxCall  time.Duration // the slowest single client call of the open and read
	slowest  string        // which call was the slowest
	store    time.Duration // writing the origin's copy into the cache (several calls)
	hit      bool          // served from WheelFS
	openErr  syscall.Errno // why the open() failed (ENOENT: a miss), 0 if it did not
	storeErr bool
	total    time.Duration
}

// webWindow is a failure: site partitioned from start to end.
type webWindow struct {
	site       string
	start, end time.Time
}

type webResult struct {
	samples []webSample
	windows []webWindow
	began   time.Time
	ended   time.Time
}

// runWebCache runs the experiment with every proxy using prefix (the cue
// components before /cache) and returns what it measured.
func runWebCache(t *testing.T, prefix string, s webSchedule) webResult {
	sites := []string{"s0", "s1", "s2", "s3", "s4"}
	c := Start(t, Options{Sites: sites, LockTTL: s.lockTTL, RTT: UniformRTT(40 * time.Millisecond),
		ClientTimeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The cache directory lives at s1 (write-local); the root's primary is
	// s0's server, the first started.
	if _, err := c.Client("s1").Mkdir(ctx, Owner(), "/cache", 0o777); err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		res = webResult{began: time.Now()}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, site := range sites {
		for p := range webProxiesPerSite {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(p)))
			zipf := rand.NewZipf(rng, 1.1, 1, webPages-1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				fs := c.Client(site)
				for {
					select {
					case <-stop:
						return
					default:
					}
					url := fmt.Sprintf("http://origin/page/%d", zipf.Uint64())
					smp := webRequest(ctx, fs, prefix+"/cache/"+webHash(url), url)
					smp.site = site
					mu.Lock()
					res.samples = append(res.samples, smp)
					mu.Unlock()
				}
			}()
		}
	}
	time.Sleep(s.warmup) // the proxies populate the cache
	for cycle := range s.cycles {
		time.Sleep(s.period - s.fail)
		site := sites[cycle%len(sites)]
		w := webWindow{site: site, start: time.Now()}
		c.PartitionSite(site)
		time.Sleep(s.fail)
		c.HealSite(site)
		w.end = time.Now()
		res.windows = append(res.windows, w)
		t.Logf("failure %d: %s partitioned for %v", cycle+1, site, w.end.Sub(w.start).Round(time.Millisecond))
	}
	time.Sleep(s.period - s.fail) // a last healthy stretch
	stopped := make(chan struct{})
	go func() {
		close(stop)
		wg.Wait()
		close(stopped)
	}()
	// No proxy hangs: each finishes its request within the bound of a few
	// client calls and an origin fetch.
	select {
	case <-stopped:
	case <-time.After(10*webMaxTime + webOriginDelay + time.Minute):
		t.Fatal("a proxy hangs: its request did not return")
	}
	res.ended = time.Now()
	return res
}

// webRequest serves one request: open the cached page (a miss or an error
// sends it to the origin, whose copy is then written to the cache).
func webRequest(ctx context.Context, fs *client.FS, path, url string) webSample {
	smp := webSample{at: time.Now()}
	timed := func(name string, f func() error) error {
		b := time.Now()
		err := f()
		if d := time.Since(b); d > smp.maxCall {
			smp.maxCall, smp.slowest = d, fmt.Sprintf("%s (%v)", name, err)
		}
		return err
	}
	var h *client.Handle
	var size uint64
	// open(): a lookup per component (as the kernel sends them), then
	// Open, all steps of one system call: .MaxTime bounds them together
	// (the FUSE adapter marks a thread's path walk the same way).
	octx := client.WithStart(ctx, smp.at)
	comps, _, err := fs.ParseCues(path)
	dir, meta := fs.Root(), (*client.Attr)(nil)
	for _, c := range comps {
		if err != nil {
			break
		}
		err = timed("lookup "+c.Name, func() (e error) {
			meta, e = fs.Lookup(octx, Owner(), c.Cues, dir, c.Name)
			return e
		})
		if err == nil {
			dir = oid.ID(meta.Id)
		}
	}
	if err == nil {
		err = timed("open", func() error {
			hh, m, e := fs.Open(octx, Owner(), comps[len(comps)-1].Cues, oid.ID(meta.Id), syscall.O_RDONLY)
			if e == nil {
				h, size = hh, m.Size
			}
			return e
		})
	}
	smp.open = time.Since(smp.at)
	if err == nil {
		buf := make([]byte, size)
		var n int
		rerr := timed("read", func() (e error) { n, e = h.Read(ctx, buf, 0); return e })
		if (rerr == nil || rerr == io.EOF) && bytes.Equal(buf[:n], webPage(url)) {
			smp.hit = true
		}
		timed("release", func() error { h.Release(ctx); return nil })
	} else {
		smp.openErr = fserr.Errno(err)
	}
	if !smp.hit {
		time.Sleep(webOriginDelay) // the origin server answers
		b := time.Now()
		if err := fs.WriteFile(ctx, Owner(), path, webPage(url), 0o644); err != nil {
			smp.storeErr = true
		}
		smp.store = time.Since(b)
	}
	smp.total = time.Since(smp.at)
	return smp
}

// webRates are requests per second.
type webRates struct {
	served, hits, origin float64
	n                    int
}

func (r webRates) String() string {
	return fmt.Sprintf("%.1f served/s, %.1f from WheelFS/s, %.1f origin fetches/s (%d requests)",
		r.served, r.hits, r.origin, r.n)
}

// summarize splits the samples after warm-up into those that began during
// a failure and the others.
func (res webResult) summarize(s webSchedule) (during, outside webRates) {
	from := res.began.Add(s.warmup)
	var failTime time.Duration
	for _, w := range res.windows {
		failTime += w.end.Sub(w.start)
	}
	inFailure := func(at time.Time) bool {
		for _, w := range res.windows {
			if !at.Before(w.start) && at.Before(w.end) {
				return true
			}
		}
		return false
	}
	add := func(r *webRates, smp webSample) {
		r.n++
		r.served++
		if smp.hit {
			r.hits++
		} else {
			r.origin++
		}
	}
	for _, smp := range res.samples {
		if smp.at.Before(from) {
			continue
		}
		if inFailure(smp.at) {
			add(&during, smp)
		} else {
			add(&outside, smp)
		}
	}
	per := func(r *webRates, d time.Duration) {
		if d > 0 {
			r.served /= d.Seconds()
			r.hits /= d.Seconds()
			r.origin /= d.Seconds()
		}
	}
	per(&during, failTime)
	per(&outside, res.ended.Sub(from)-failTime)
	return during, outside
}

// timeline renders per-second counts: served, from WheelFS, origin; a *
// marks seconds with a failure.
func (res webResult) timeline() string {
	secs := int(res.ended.Sub(res.began).Seconds()) + 1
	served, hits := make([]int, secs), make([]int, secs)
	for _, smp := range res.samples {
		i := int(smp.at.Sub(res.began).Seconds())
		served[i]++
		if smp.hit {
			hits[i]++
		}
	}
	var b strings.Builder
	for i := range secs {
		at := res.began.Add(time.Duration(i) * time.Second)
		mark := " "
		for _, w := range res.windows {
			if at.Add(time.Second).After(w.start) && at.Before(w.end) {
				mark = "*"
			}
		}
		fmt.Fprintf(&b, "%3ds%s %3d/%3d/%3d\n", i, mark, served[i], hits[i], served[i]-hits[i])
	}
	return b.String()
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

// TestWebCacheUnderFailures is the paper's distributed web cache under
// failures (§8.3, Figures 6–7) in miniature: five sites with one server
// and two proxies each; a proxy picks one of 100 pages (Zipf), opens
// /<cues>/cache/<hash> and reads it; on a miss or an error it fetches the
// page from the origin (150 ms) and writes it into the cache. After a
// warm-up, one site in turn is partitioned for 4 s of every 8 s, three
// times (WHEELFS_WEBCACHE_FULL=1: 30 s of every minute, five times), with
// slice locks longer than a failure. It runs with
// .EventualConsistency/.MaxTime=1000 and with close-to-open and
// .MaxTime=1000, and reports served, from-WheelFS and origin rates during
// failures and outside them (docs/BENCHMARKS.md, "Web cache under
// failures").
//
// Checked: no request hangs; every single client call (each lookup of the
// path, Open, Read, Release) and every whole open() returns within MaxTime
// + boundMargin (the paper: "open() either finds a copy of the desired file
// or fails in one second"); a failed open() is a miss (ENOENT) or
// ETIMEDOUT; outside failures most requests are served from WheelFS; and
// with the eventual cue the rate served from WheelFS during failures stays
// at least half of the rate outside them.
func TestWebCacheUnderFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of proxies under failures")
	}
	s := webScaled
	if os.Getenv(webCacheFullEnv) != "" {
		s = webFull
	}
	for _, mode := range []struct{ name, prefix string }{
		{"eventual", "/.EventualConsistency/.MaxTime=1000"},
		{"close-to-open", "/.MaxTime=1000"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			res := runWebCache(t, mode.prefix, s)
			during, outside := res.summarize(s)
			// The whole open() (two lookups and the Open) is one
			// system call: MaxTime bounds it.
			openBound := webMaxTime + boundMargin
			overOne := 0
			var opens, calls, stores []time.Duration
			storeErrs := 0
			errnos := map[syscall.Errno]int{}
			slow, late := 0, 0
			for _, smp := range res.samples {
				if smp.maxCall > webMaxTime+200*time.Millisecond {
					late++
					if late <= 5 {
						t.Logf("request at %v from %s: slowest call %s took %v", smp.at.Sub(res.began).Round(time.Millisecond),
							smp.site, smp.slowest, smp.maxCall.Round(time.Millisecond))
					}
				}
				opens = append(opens, smp.open)
				if smp.open > webMaxTime+boundMargin {
					overOne++
				}
				calls = append(calls, smp.maxCall)
				if smp.store > 0 {
					stores = append(stores, smp.store)
				}
				if smp.storeErr {
					storeErrs++
				}
				if smp.openErr != 0 {
					errnos[smp.openErr]++
				}
				if smp.open > openBound || smp.maxCall > webMaxTime+boundMargin {
					slow++
					if slow <= 5 {
						t.Errorf("request at %v from %s: open() %v (want within %v), slowest call %s %v (want within %v + %v)",
							smp.at.Sub(res.began).Round(time.Millisecond), smp.site, smp.open, openBound, smp.slowest, smp.maxCall, webMaxTime, boundMargin)
					}
				}
			}
			if slow > 0 {
				t.Errorf("%d of %d requests exceeded the bound", slow, len(res.samples))
			}
			t.Logf("%s: during failures %v", mode.name, during)
			t.Logf("%s: outside failures %v", mode.name, outside)
			t.Logf("%s: open() latency p50 %v p99 %v max %v; slowest call max %v", mode.name,
				percentile(opens, .5), percentile(opens, .99), percentile(opens, 1), percentile(calls, 1))
			t.Logf("%s: %d open()s took longer than %v + %v", mode.name, overOne, webMaxTime, boundMargin)
			t.Logf("%s: failed open()s by errno: %v", mode.name, errnos)
			for e, n := range errnos {
				if e != syscall.ENOENT && e != syscall.ETIMEDOUT {
					t.Errorf("%d open()s failed with %v (%d), want ENOENT (a miss) or ETIMEDOUT", n, e, int(e))
				}
			}
			t.Logf("%s: cache stores p50 %v max %v, %d of %d failed", mode.name, percentile(stores, .5),
				percentile(stores, 1), storeErrs, len(stores))
			if testing.Verbose() {
				t.Logf("per second: served/from WheelFS/origin (* failure)\n%s", res.timeline())
			}
			if outside.n == 0 || outside.hits < 0.5*outside.served {
				t.Errorf("outside failures only %v: the cache does not work", outside)
			}
			if mode.name == "eventual" {
				if during.hits < 0.5*outside.hits {
					t.Errorf("with .EventualConsistency, served from WheelFS during failures %.1f/s, outside %.1f/s: want at least half",
						during.hits, outside.hits)
				}
			}
		})
	}
}
