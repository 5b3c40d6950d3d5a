package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
	"github.com/wheelfs/wheelfs/internal/testbed"
)

func dice() *Experiment {
	return &Experiment{
		Name: "dice",
		Summary: "remote meta-data (loosely-coupled WAFS, Tables I–III): tar -x at the home site, then ls -laR, " +
			"tar -c and rm -rf at a remote site, with and without .WholeFile, per RTT",
		Params: map[string]string{"rtts": "1ms,6ms,20ms,100ms", "tree": "$GOROOT/src/net", "timeout": "20m"},
		Run:    runDice,
	}
}

func runDice(ctx context.Context, env *Env) (*Result, error) {
	rtts, err := env.Durations("rtts", "1ms,6ms,20ms,100ms")
	if err != nil {
		return nil, err
	}
	limits, err := env.Durations("timeout", "20m")
	if err != nil {
		return nil, err
	}
	tree := strings.ReplaceAll(env.Param("tree", "$GOROOT/src/net"), "$GOROOT", runtime.GOROOT())
	files, dirs, err := countTree(tree)
	if err != nil {
		return nil, fmt.Errorf("tree: %w", err)
	}
	tarball := filepath.Join(os.TempDir(), fmt.Sprintf("wheelfs-dice-%d.tar", os.Getpid()))
	if err := run(ctx, time.Minute, "tar", "-C", filepath.Dir(tree), "-cf", tarball, filepath.Base(tree)); err != nil {
		return nil, err
	}
	defer os.Remove(tarball)
	sites := []string{"west", "east", "eu"}
	st, err := up(ctx, env, testbed.Options{Sites: sites, RTT: testbed.Uniform(sites, rtts[0]), ServersPerSite: 1, TCPCongestion: "cubic"})
	if err != nil {
		return nil, err
	}
	defer down(env)
	home, remote := st.Mounts("west")[0], st.Mounts("east")[0]
	res := &Result{Notes: []string{
		fmt.Sprintf("tree: %s (%d files, %d directories); home site west, remote site east; 3 sites, RepLevel 3", tree, files, dirs),
		"cold: first access at that site; warm: the same command right after",
		"RTT/dir: (remote − home) / RTT / directories, the round trips a remote walk spends per directory beyond the home site's time",
		"requests: what the mount's client sent (mountinfo.StatsXattr), by method; the stats reads themselves add one GetAttr at most",
	}}
	for i, rtt := range rtts {
		if err := testbed.SetRTT(env.Dir, testbed.Uniform(sites, rtt)); err != nil {
			return nil, err
		}
		t := &Table{
			Title:   fmt.Sprintf("RTT %s", rtt),
			Columns: []string{"step", "home s", "remote s", "remote / home", "RTT/dir", "home requests", "remote requests"},
		}
		base := fmt.Sprintf("dice%d", i)
		step := func(name string, homeCmd, remoteCmd []string) {
			var hd, rd time.Duration
			var herr, rerr error
			hreq, rreq := "—", "—"
			if homeCmd != nil {
				hd, herr, hreq = timedAt(home, func() error { return run(ctx, limits[0], homeCmd[0], homeCmd[1:]...) })
			}
			if remoteCmd != nil {
				rd, rerr, rreq = timedAt(remote, func() error { return run(ctx, limits[0], remoteCmd[0], remoteCmd[1:]...) })
			}
			cell := func(d time.Duration, err error, ran bool) string {
				switch {
				case !ran:
					return "—"
				case err != nil:
					return fmt.Sprintf("%s (%v)", secs(d), err)
				}
				return secs(d)
			}
			perDir := "—"
			if homeCmd != nil && remoteCmd != nil && herr == nil && rerr == nil && rtt > 0 {
				perDir = fmt.Sprintf("%.1f", float64(rd-hd)/float64(rtt)/float64(dirs))
			}
			rat := "—"
			if homeCmd != nil && remoteCmd != nil {
				rat = ratio(rd, hd)
			}
			t.Add(name, cell(hd, herr, homeCmd != nil), cell(rd, rerr, remoteCmd != nil), rat, perDir, hreq, rreq)
			progress(env, "RTT %s: %s: home %s s, remote %s s", rtt, name, secs(hd), secs(rd))
		}
		plain, whole := filepath.Join(base, "plain"), filepath.Join(base, "whole")
		for _, d := range []string{plain, whole} {
			if err := os.MkdirAll(filepath.Join(home, d), 0o755); err != nil {
				return nil, err
			}
		}
		step("tar -x (home)", []string{"tar", "-C", filepath.Join(home, plain), "-xf", tarball}, nil)
		if err := run(ctx, limits[0], "tar", "-C", filepath.Join(home, whole), "-xf", tarball); err != nil {
			return nil, err
		}
		lsR := func(root, d string) []string { return []string{"ls", "-laR", filepath.Join(root, d)} }
		tarC := func(root, d string) []string { return []string{"tar", "-C", filepath.Join(root, d), "-cf", "-", "."} }
		step("ls -laR, cold", lsR(home, plain), lsR(remote, plain))
		step("ls -laR, warm", lsR(home, plain), lsR(remote, plain))
		step("tar -c (reads all data), cold", tarC(home, plain), tarC(remote, plain))
		step("tar -c, warm", tarC(home, plain), tarC(remote, plain))
		wf := filepath.Join(".WholeFile", whole)
		step(".WholeFile ls -laR, cold", lsR(home, wf), lsR(remote, wf))
		step(".WholeFile ls -laR, warm", lsR(home, wf), lsR(remote, wf))
		step(".WholeFile tar -c, cold", tarC(home, wf), tarC(remote, wf))
		step("rm -rf (remote; home removes the other copy)", []string{"rm", "-rf", filepath.Join(home, whole)},
			[]string{"rm", "-rf", filepath.Join(remote, plain)})
		res.Tables = append(res.Tables, t)
	}
	return res, nil
}

// timedAt times fn and counts the requests the client of the mount at mnt
// sent meanwhile (mountinfo.StatsXattr; background ones, such as releases,
// as far as they were sent by the end).
func timedAt(mnt string, fn func() error) (time.Duration, error, string) {
	before, serr := mountinfo.Stats(mnt)
	d, err := timed(fn)
	after, aerr := mountinfo.Stats(mnt)
	if serr != nil || aerr != nil {
		return d, err, fmt.Sprintf("(%v)", errors.Join(serr, aerr))
	}
	return d, err, after.Sub(before).String()
}

// run runs a command with its output discarded through a pipe (GNU tar
// skips reading data when its output is /dev/null), within limit.
func run(ctx context.Context, limit time.Duration, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = io.Discard
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return fmt.Errorf("timed out after %s", limit)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		return fmt.Errorf("%s: %w: %s", name, err, msg)
	}
	return nil
}

func countTree(root string) (files, dirs int, err error) {
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs++
		} else if d.Type().IsRegular() {
			files++
		}
		return nil
	})
	if err == nil && files == 0 {
		err = errors.New("no files")
	}
	return files, dirs, err
}
