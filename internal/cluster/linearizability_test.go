package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	hist "github.com/wheelfs/wheelfs/internal/history"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// linDurationEnv lengthens TestLinearizableUnderFaults: a Go duration
// ("10m") for the workload instead of the default linDuration.
const linDurationEnv = "WHEELFS_LIN_DURATION"

// linDuration is the default length of the workload under faults.
const linDuration = time.Minute

// linQuiet is how long the workload runs undisturbed after each fault.
const linQuiet = 3 * time.Second

// linNames are the file names the workload uses in each directory.
var linNames = []string{"f0", "f1", "f2", "f3"}

// linTokenLen is the length of every contents token, so that an in-place
// overwrite covers the whole file.
const linTokenLen = 24

// linWorker is one client process of the workload.
type linWorker struct {
	id   int
	site string
	c    *Cluster
	rec  *hist.Recorder
	dirs map[string]oid.ID // directory name in the model → ID
	rng  *rand.Rand
	seq  int
	// create are the cues of a new file (.KeepTogether or none).
	create cue.Set
	// renameTwice counts puts whose rename of the temporary name answered
	// ENOENT: only a rename applied twice (a retry after the first one
	// took effect) can do that, as nobody else knows the name. Mutations
	// are exactly-once (server/once.go), so it must stay 0.
	renameTwice *atomic.Int64
}

func (w *linWorker) fs() *client.FS { return w.c.Client(w.site) }

func (w *linWorker) token() string {
	w.seq++
	return fmt.Sprintf("%-*s", linTokenLen, fmt.Sprintf("w%d-%d", w.id, w.seq))
}

// release drops h without waiting long for an unreachable primary.
func release(ctx context.Context, h *client.Handle) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	h.Release(ctx)
}

func isNotExist(err error) bool { return fserr.Errno(err) == syscall.ENOENT }

// lookup records a Lookup step; it returns the object, 0 if absent or
// unknown.
func (w *linWorker) lookup(ctx context.Context, dir, name string) oid.ID {
	st := w.rec.Begin(w.id, hist.Input{Kind: hist.Lookup, Dir: dir, Name: name})
	m, err := w.fs().Lookup(ctx, Owner(), client.NoCues, w.dirs[dir], name)
	switch {
	case isNotExist(err):
		st.End(hist.Output{})
	case err != nil:
		st.Drop()
	default:
		st.End(hist.Output{Obj: m.Id})
		return oid.ID(m.Id)
	}
	return 0
}

// get: open, read all, close.
func (w *linWorker) get(ctx context.Context, dir, name string) {
	id := w.lookup(ctx, dir, name)
	if id == 0 {
		return
	}
	st := w.rec.Begin(w.id, hist.Input{Kind: hist.Read, Obj: uint64(id)})
	h, _, err := w.fs().Open(ctx, Owner(), client.NoCues, id, syscall.O_RDONLY)
	if err != nil {
		st.Drop()
		return
	}
	defer release(ctx, h)
	buf := make([]byte, 4*linTokenLen)
	n, err := h.Read(ctx, buf, 0)
	if err != nil && err != io.EOF {
		st.Drop()
		return
	}
	st.End(hist.Output{Token: string(buf[:n])})
}

// overwrite: open O_WRONLY without O_TRUNC, write a whole-file token,
// close (the commit).
func (w *linWorker) overwrite(ctx context.Context, dir, name string) {
	id := w.lookup(ctx, dir, name)
	if id == 0 {
		return
	}
	w.write(ctx, id)
}

// write records a Write step of a new token to id; it reports whether the
// commit is known to have succeeded.
func (w *linWorker) write(ctx context.Context, id oid.ID) (string, bool) {
	tok := w.token()
	st := w.rec.Begin(w.id, hist.Input{Kind: hist.Write, Obj: uint64(id), Token: tok})
	h, _, err := w.fs().Open(ctx, Owner(), client.NoCues, id, syscall.O_WRONLY)
	if err != nil {
		st.Drop() // nothing was sent
		return tok, false
	}
	defer release(ctx, h)
	if _, err := h.Write(ctx, []byte(tok), 0); err != nil {
		st.Drop() // buffered writes are sent only by the flush below
		return tok, false
	}
	if err := h.Flush(ctx); err != nil {
		st.Unknown()
		return tok, false
	}
	st.End(hist.Output{})
	return tok, true
}

// put: write a temporary file, rename it over name.
func (w *linWorker) put(ctx context.Context, dir, name string) {
	fs := w.fs()
	w.seq++
	tmp := fmt.Sprintf("%sw%d.%d", hist.TempPrefix, w.id, w.seq) // never reused
	m, err := fs.Create(ctx, Owner(), w.create, w.dirs[dir], tmp, client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644})
	if err != nil {
		return // at most a temporary name appeared
	}
	if _, ok := w.write(ctx, oid.ID(m.Id)); !ok {
		return
	}
	st := w.rec.Begin(w.id, hist.Input{Kind: hist.Put, Dir: dir, Name: name, Obj: m.Id})
	err = fs.Rename(ctx, Owner(), client.NoCues, w.dirs[dir], tmp, w.dirs[dir], name, 0)
	switch {
	case err == nil:
		st.End(hist.Output{})
	case isNotExist(err):
		w.renameTwice.Add(1)
		st.End(hist.Output{}) // the temporary name is gone: the rename happened
	default:
		st.Unknown()
	}
}

func (w *linWorker) unlink(ctx context.Context, dir, name string) {
	st := w.rec.Begin(w.id, hist.Input{Kind: hist.Unlink, Dir: dir, Name: name})
	err := w.fs().Remove(ctx, Owner(), client.NoCues, w.dirs[dir], name, false)
	switch {
	case err == nil:
		st.End(hist.Output{Found: true})
	case isNotExist(err):
		st.End(hist.Output{Found: false})
	default:
		st.Unknown()
	}
}

func (w *linWorker) rename(ctx context.Context, dir, from, to string) {
	st := w.rec.Begin(w.id, hist.Input{Kind: hist.Rename, Dir: dir, Name: from, To: to})
	err := w.fs().Rename(ctx, Owner(), client.NoCues, w.dirs[dir], from, w.dirs[dir], to, 0)
	switch {
	case err == nil:
		st.End(hist.Output{Found: true})
	case isNotExist(err):
		st.End(hist.Output{Found: false})
	default:
		st.Unknown()
	}
}

func (w *linWorker) readdir(ctx context.Context, dir string) {
	st := w.rec.Begin(w.id, hist.Input{Kind: hist.ReadDir, Dir: dir})
	ents, _, err := w.fs().ReadDir(ctx, Owner(), client.NoCues, w.dirs[dir])
	if err != nil {
		st.Drop()
		return
	}
	var names []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name, hist.TempPrefix) {
			names = append(names, e.Name)
		}
	}
	st.End(hist.Output{Names: names})
}

// run issues random operations until stop closes.
func (w *linWorker) run(ctx context.Context, stop <-chan struct{}, dirs []string, ops *atomic.Int64) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		dir := dirs[w.rng.IntN(len(dirs))]
		name := linNames[w.rng.IntN(len(linNames))]
		switch p := w.rng.IntN(100); {
		case p < 35:
			w.get(ctx, dir, name)
		case p < 50:
			w.overwrite(ctx, dir, name)
		case p < 70:
			w.put(ctx, dir, name)
		case p < 80:
			w.unlink(ctx, dir, name)
		case p < 90:
			to := linNames[(slices.Index(linNames, name)+1+w.rng.IntN(len(linNames)-1))%len(linNames)]
			w.rename(ctx, dir, name, to)
		default:
			w.readdir(ctx, dir)
		}
		ops.Add(1)
		time.Sleep(time.Duration(2+w.rng.IntN(4)) * time.Millisecond) // leave the cores to the servers
	}
}

// TestLinearizableUnderFaults runs clients at three sites against two
// shared directories — whole-file puts (temporary file + rename), in-place
// overwrites, gets, unlinks, renames within a directory, readdirs — while
// faults are injected in turn: crash the primary of a directory and
// restart it, partition the site of a directory's primary and heal it,
// pause a primary past its lock and resume it. The recorded history is
// checked with porcupine against the close-to-open model of package
// history (per directory and per file object). On failure the test logs
// the steps around the first one porcupine cannot place, and writes the
// HTML visualization to t.ArtifactDir() (kept with go test -artifacts).
//
// Two placements: "together" creates the files with .KeepTogether (in
// their directory's slice: every name operation is local to one primary),
// "spread" places them write-local (on the creating client's site, so a
// lookup, unlink or rename over involves two servers). Each runs a minute of
// workload by default (WHEELFS_LIN_DURATION=10m for longer runs).
// Figures: docs/BENCHMARKS.md, "Linearizability under faults".
func TestLinearizableUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of workload under faults")
	}
	dur := linDuration
	if s := os.Getenv(linDurationEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s: %v", linDurationEnv, err)
		}
		dur = d
	}
	t.Run("together", func(t *testing.T) {
		linearizableUnderFaults(t, dur, cue.Set{KeepTogether: true})
	})
	t.Run("spread", func(t *testing.T) {
		linearizableUnderFaults(t, dur, client.NoCues)
	})
}

func linearizableUnderFaults(t *testing.T, dur time.Duration, create cue.Set) {
	const clientTimeout = 8 * time.Second
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, ServersPerSite: 2, LockTTL: 2 * time.Second,
		RTT: UniformRTT(10 * time.Millisecond), ClientTimeout: clientTimeout})
	ctx, cancel := context.WithTimeout(t.Context(), dur+10*time.Minute)
	defer cancel()

	// d0's primary is at west, d1's at east (write-local).
	dirNames := []string{"d0", "d1"}
	if _, err := c.Client("west").Mkdir(ctx, Owner(), "/lin", 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]oid.ID{}
	for i, d := range dirNames {
		m, err := c.Client(c.Sites()[i]).Mkdir(ctx, Owner(), "/lin/"+d, 0o777)
		if err != nil {
			t.Fatal(err)
		}
		dirs[d] = oid.ID(m.Id)
	}
	if create.KeepTogether { // the files land in their directory's slice
		m, err := c.Client("eu").Create(ctx, Owner(), create, dirs["d0"], "probe", client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644})
		if err != nil {
			t.Fatal(err)
		}
		if got := oid.ID(m.Id).Slice(); got != dirs["d0"].Slice() {
			t.Fatalf(".KeepTogether file in slice %d, its directory in %d", got, dirs["d0"].Slice())
		}
		if err := c.Client("eu").Remove(ctx, Owner(), client.NoCues, dirs["d0"], "probe", false); err != nil {
			t.Fatal(err)
		}
	}

	const perSite = 2
	nworkers := perSite * len(c.Sites())
	rec := hist.NewRecorder(nworkers)
	var ops, renameTwice atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range nworkers {
		w := &linWorker{id: i, site: c.Sites()[i%len(c.Sites())], c: c, rec: rec, dirs: dirs,
			rng: rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano()))), renameTwice: &renameTwice,
			create: create}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(ctx, stop, dirNames, &ops)
		}()
	}
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer halt()

	// A directory's slice never changes; its primary does.
	primaryOf := func(d string) *Node {
		var n *Node
		c.WaitFor(30*time.Second, "the primary of "+d, func() error {
			var err error
			n, err = c.Primary(ctx, dirs[d].Slice())
			if err == nil && !n.Up() {
				err = errors.New("primary is down")
			}
			return err
		})
		return n
	}
	takenOver := func(sl oid.Slice, from *Node, sameSiteOK bool) {
		c.WaitFor(40*time.Second, "another server takes over from "+from.Name, func() error {
			n, err := c.Primary(ctx, sl)
			if err != nil || n == from || (!sameSiteOK && n.Site == from.Site) {
				return fmt.Errorf("primary %v (%v)", n, err)
			}
			return nil
		})
	}
	progress := func(what string) {
		for _, site := range c.Sites() {
			c.WaitFor(60*time.Second, what+" at "+site, func() error {
				return c.Client(site).WriteFile(ctx, Owner(), "/lin/probe-"+site, []byte(what), 0o644)
			})
		}
	}

	began := time.Now()
	faults := 0
	for i := 0; time.Since(began) < dur || faults < 3; i++ { // every kind of fault at least once
		dir := dirNames[i%len(dirNames)]
		sl := dirs[dir].Slice()
		var name string
		switch i % 3 {
		case 0:
			p := primaryOf(dir)
			name = "crash " + p.Name + " (primary of " + dir + "), restart"
			c.Crash(p)
			takenOver(sl, p, true)
			c.Restart(p)
		case 1:
			p := primaryOf(dir)
			name = "partition " + p.Site + " (site of " + dir + "'s primary), heal"
			c.PartitionSite(p.Site)
			takenOver(sl, p, false)
			c.HealSite(p.Site)
		case 2:
			p := primaryOf(dir)
			name = "pause " + p.Name + " (primary of " + dir + ") past its lock, resume"
			c.Pause(p)
			takenOver(sl, p, true)
			c.Resume(p)
		}
		progress("writes after " + name)
		faults++
		time.Sleep(linQuiet) // the workload runs undisturbed for a while
		t.Logf("%v: fault %d: %s; %d operations so far", time.Since(began).Round(time.Second), faults, name, ops.Load())
	}
	halt()
	t.Logf("workload: %d operations by %d clients in %v, %d faults", ops.Load(), nworkers,
		time.Since(began).Round(time.Second), faults)

	rep := hist.Check(rec.Operations(), 2*time.Minute)
	t.Logf("porcupine: %s", rep.Summary())
	if n := renameTwice.Load(); n > 0 {
		t.Errorf("%d renames of a temporary name answered ENOENT: a retry ran again instead of answering as its first attempt", n)
	}
	if rep.Result != porcupine.Ok {
		// ArtifactDir is a temporary directory, kept by go test -artifacts.
		path := filepath.Join(t.ArtifactDir(), "history.html")
		if err := rep.Visualize(path); err != nil {
			t.Errorf("visualize: %v", err)
		}
		for _, k := range rep.Failing {
			t.Errorf("%s is not linearizable: %s", k, rep.Explain(k, 300*time.Millisecond))
		}
		t.Errorf("history not linearizable (%s); visualization (kept with go test -artifacts): %s", rep.Result, path)
	}
	if total, unknown := rec.Counts(); total-unknown < 200 || faults < 3 {
		t.Errorf("too little to judge: %d steps with a known outcome, %d faults", total-unknown, faults)
	}
}
