package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// readmeScript returns the shell block of README.md's "Three sites on one
// machine" section, without its `go build` line (TestMain built the binary).
func readmeScript(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## Three sites on one machine")
	if i < 0 {
		t.Fatal(`README.md has no "## Three sites on one machine" section`)
	}
	s = s[i:]
	start := strings.Index(s, "```sh\n")
	if start < 0 {
		t.Fatal("no ```sh block in the three-site section")
	}
	s = s[start+len("```sh\n"):]
	end := strings.Index(s, "```")
	if end < 0 {
		t.Fatal("unterminated ```sh block")
	}
	var lines []string
	for _, l := range strings.Split(s[:end], "\n") {
		if strings.HasPrefix(l, "go build ") {
			continue
		}
		lines = append(lines, l)
	}
	return lines
}

// freePortPair returns a loopback port p with p+1 free too (a config
// member's peer port is its client port + 1). The ports are below the
// kernel's ephemeral range: a port from that range, free when picked,
// may be given to a node's own "127.0.0.1:0" listener or to an outgoing
// connection before the member it was picked for binds it (CI once saw
// a member lose its port to a node's peer listener, and status then
// reached that listener).
func freePortPair(t *testing.T, taken map[int]bool) int {
	t.Helper()
	lo, hi := 10000, ephemeralLow()-2
	for range 200 {
		if hi <= lo {
			t.Fatalf("no ports below the ephemeral range (%d)", hi+2)
		}
		p := lo + rand.IntN(hi-lo)
		if taken[p] || taken[p+1] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		l.Close()
		if err != nil {
			continue
		}
		l2.Close()
		taken[p], taken[p+1] = true, true
		return p
	}
	t.Fatal("no pair of free ports")
	return 0
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if f := strings.Fields(string(b)); err == nil && len(f) == 2 {
		if n, err := strconv.Atoi(f[0]); err == nil {
			return n
		}
	}
	return 32768
}

var readmePort = regexp.MustCompile(`127\.0\.0\.1:(70[0-9][0-9]|71[0-9][0-9])\b`)

// TestReadmeThreeSites runs the README's three-site example as written
// (its commands parsed from README.md, /tmp/wfs3 and the ports replaced),
// from a fresh directory, three times in a row: the members, the nodes
// started right after them, the wait on --ready-file, the info and status
// commands and the failover after `kill %4`.
func TestReadmeThreeSites(t *testing.T) {
	lines := readmeScript(t)
	binDir := filepath.Dir(wheelfsBin)
	for round := range 3 {
		t.Run(fmt.Sprintf("round%d", round+1), func(t *testing.T) {
			// A port picked free may be taken before the script binds it
			// (an outgoing connection's ephemeral port): then again, with
			// fresh ports, twice at most.
			for attempt := 0; readmeRound(t, lines, binDir, attempt < 2); attempt++ {
				t.Logf("a port picked for the README script was taken meanwhile; again with fresh ports")
			}
		})
		if t.Failed() {
			return
		}
	}
}

// readmeRound runs the README script once; it reports instead of failing
// when mayRetry and a member could not bind a port it was given.
func readmeRound(t *testing.T, lines []string, binDir string, mayRetry bool) (portTaken bool) {
	base := filepath.Join(t.TempDir(), "wfs3")
	taken := map[int]bool{}
	ports := map[string]string{}
	script := strings.Join(lines, "\n")
	script = readmePort.ReplaceAllStringFunc(script, func(m string) string {
		if p, ok := ports[m]; ok {
			return p
		}
		p := "127.0.0.1:" + strconv.Itoa(freePortPair(t, taken))
		ports[m] = p
		return p
	})
	script = strings.ReplaceAll(script, "/tmp/wfs3", base)
	// Fail at the first failing command; the README's wait loop reports a
	// node that does not start, which must fail the round too.
	script = "set -e\n" + strings.ReplaceAll(script, `|| echo "$d did not start`, `|| { echo "$d did not start`) + "\n"
	script = strings.ReplaceAll(script, `-$d.log"`+"\n", `-$d.log"; exit 1; }`+"\n")

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = binDir // ./wheelfs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Files, not pipes: the nodes left running in the background keep the
	// script's stdout open.
	outFile, errFile := filepath.Join(filepath.Dir(base), "stdout"), filepath.Join(filepath.Dir(base), "stderr")
	var files []*os.File
	for _, name := range []string{outFile, errFile} {
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	cmd.Stdout, cmd.Stderr = files[0], files[1]
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { stopGroup(t, pgid, base) })
	err := cmd.Wait()
	stdout, stderr := readString(outFile), readString(errFile)
	logs := func() string {
		var b strings.Builder
		for _, n := range []string{"cfg1", "cfg2", "cfg3", "west", "east", "eu"} {
			data, _ := os.ReadFile(base + "-" + n + ".log")
			fmt.Fprintf(&b, "--- %s.log\n%s", n, tail(string(data), 2<<10))
		}
		return b.String()
	}
	if err != nil {
		if l := logs(); mayRetry && strings.Contains(stderr+l, "bind: address already in use") {
			return true
		}
		t.Fatalf("README script: %v\nstdout:\n%s\nstderr:\n%s\n%s", err, stdout, stderr, logs())
	}
	// A member that lost its port leaves a quorum of two, so the script
	// may succeed without it; what follows would then dial whatever took
	// the port.
	if l := logs(); strings.Contains(l, "bind: address already in use") {
		if mayRetry {
			return true
		}
		t.Fatalf("a process of the README script could not bind its port:\n%s", l)
	}
	out := stdout
	if n := strings.Count("\n"+out, "\nhello\n"); n != 2 {
		t.Errorf("README script printed hello %d times, want 2 (before and after kill %%4):\n%s", n, out)
	}
	// fsck draws its progress on stderr (documented); anything else
	// there is an error.
	var other []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if l = strings.Trim(l, "\r"); l != "" && !strings.HasPrefix(l, "fsck: ") {
			other = append(other, l)
		}
	}
	if len(other) > 0 {
		t.Errorf("README script wrote to stderr:\n%s", stderr)
	}
	// The info outputs: the JSON objects between the mount lines and the
	// status table.
	for _, w := range []string{`"primary"`, `"replicas"`, "SITE", "west", "east", "eu", "leader", "SLICE"} {
		if !strings.Contains(out, w) {
			t.Errorf("README script output lacks %q:\n%s", w, out)
		}
	}
	site := func(r any) string { m, _ := r.(map[string]any); s, _ := m["site"].(string); return s }
	x := parseInfo(t, "wheelfs info", []byte(mustRun(t, "/", 30*time.Second, wheelfsBin, "info", filepath.Join(base, "eu", "hello"))))
	if site(x.Primary) == "west" {
		// West stopped: a backup is primary now.
		t.Errorf("hello: primary still at west after kill %%4: %v", x.Primary)
	}
	x = parseInfo(t, "wheelfs info", []byte(mustRun(t, "/", 30*time.Second, wheelfsBin, "info", filepath.Join(base, "eu", "ineu"))))
	if site(x.Primary) != "eu" {
		t.Errorf("ineu: primary %v, want eu", x.Primary)
	}
	// The three sites of the first info: one replica at each.
	if i := strings.Index(out, "{"); i >= 0 {
		if j := strings.Index(out[i:], "\n}"); j >= 0 {
			first := parseInfo(t, "first info", []byte(out[i:i+j+2]))
			sites := map[string]bool{}
			for _, r := range first.Replicas {
				sites[site(r)] = true
			}
			if site(first.Primary) != "west" || len(sites) != 3 {
				t.Errorf("info of hello before kill: primary %v, replicas %v; want west and three sites", first.Primary, first.Replicas)
			}
		}
	}
	// info says "not on a WheelFS mount" only when that is so.
	if r := run(t, "/", 30*time.Second, nil, wheelfsBin, "info", filepath.Join(base, "eu", "missing")); r.err == nil ||
		strings.Contains(r.out, "WheelFS mount") || !strings.Contains(r.out, "no such file") {
		t.Errorf("info of a missing file on a mount: %v\n%s", r.err, r.out)
	}
	if r := run(t, "/", 30*time.Second, nil, wheelfsBin, "info", filepath.Dir(base)); r.err == nil ||
		!strings.Contains(r.out, "not on a WheelFS mount") {
		t.Errorf("info of a file off the mounts: %v\n%s", r.err, r.out)
	}
	// status --data of a node finds the service; the stopped west node
	// is not up.
	st := mustRun(t, "/", 30*time.Second, wheelfsBin, "status", "--data", filepath.Join(base, "node-eu"))
	for _, w := range []string{"eu", "east", "leader"} {
		if !strings.Contains(st, w) {
			t.Errorf("status --data node-eu lacks %q:\n%s", w, st)
		}
	}
	if !regexp.MustCompile(`(?m)^srv-\S+\s+west\s+\S+\s+down\s`).MatchString(st) {
		t.Errorf("status does not show the stopped west server as down:\n%s", st)
	}
	for _, d := range []string{"west", "east", "eu"} {
		if _, err := os.Stat(filepath.Join(base, d+".ready")); (err == nil) != (d != "west") {
			t.Errorf("%s.ready: %v (west stopped and must have removed it; the others run)", d, err)
		}
	}
	for _, d := range []string{"east", "eu"} {
		if !mountinfo.Mounted(filepath.Join(base, d)) {
			t.Errorf("%s is not mounted", d)
		}
	}
	if t.Failed() {
		t.Log(logs())
	}
	return false
}

// stopGroup stops what the README script started: the nodes first (SIGTERM,
// they unmount), then the config members, then anything left with SIGKILL,
// and detaches any mount left under base.
func stopGroup(t *testing.T, pgid int, base string) {
	members := func() (nodes, rest []int) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if g, err := syscall.Getpgid(pid); err != nil || g != pgid {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if strings.Contains(string(cmdline), "\x00node\x00") {
				nodes = append(nodes, pid)
			} else {
				rest = append(rest, pid)
			}
		}
		return nodes, rest
	}
	waitGone := func(pick func() []int, d time.Duration) bool {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			if len(pick()) == 0 {
				return true
			}
			time.Sleep(100 * time.Millisecond)
		}
		return false
	}
	nodes, _ := members()
	for _, p := range nodes {
		syscall.Kill(p, syscall.SIGTERM)
	}
	if !waitGone(func() []int { n, _ := members(); return n }, stopTimeout) {
		t.Errorf("nodes did not stop on SIGTERM")
	}
	syscall.Kill(-pgid, syscall.SIGTERM)
	if !waitGone(func() []int { n, r := members(); return append(n, r...) }, stopTimeout) {
		t.Errorf("config members did not stop on SIGTERM")
		syscall.Kill(-pgid, syscall.SIGKILL)
		waitGone(func() []int { n, r := members(); return append(n, r...) }, 10*time.Second)
	}
	for _, d := range []string{"west", "east", "eu"} {
		if mnt := filepath.Join(base, d); mountinfo.Mounted(mnt) {
			t.Errorf("%s still mounted after its node stopped", mnt)
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	}
}

func readString(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
