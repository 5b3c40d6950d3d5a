package e2e

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// freePort returns a loopback HOST:PORT that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startConfigService makes a deployment CA in tmp and starts three config
// members joined through --peers; it returns the CA directory and the
// members' client addresses.
func startConfigService(t *testing.T, tmp string) (ca string, members []string) {
	t.Helper()
	ca = filepath.Join(tmp, "ca")
	mustRun(t, tmp, 30*time.Second, wheelfsBin, "ca", "init", ca)
	for i := range 3 {
		data := filepath.Join(tmp, "cfg"+string(rune('1'+i)))
		addr := freePort(t)
		args := []string{"config", "--data", data, "--listen", addr, "--peer-listen", freePort(t), "--ca", ca}
		if len(members) > 0 {
			args = append(args, "--peers", strings.Join(members, ","))
		}
		startWheelfs(t, data, "", args...)
		members = append(members, addr)
	}
	return ca, members
}

// startNode starts `wheelfs node` for site with its data in tmp and a
// fresh mount point.
func startNode(t *testing.T, tmp, config, ca, site string) *upProc {
	t.Helper()
	data, mnt := filepath.Join(tmp, "node-"+site), t.TempDir()
	// The client-only mount acts for the test's uids without a login
	// (NFS-style, as before logins existed).
	return startWheelfs(t, data, mnt, "node", "--config", config, "--site", site, "--listen", "127.0.0.1:0",
		"--data", data, "--ca", ca, "--trust-client-uids", mnt)
}

// TestMultiNode runs a deployment of separate processes, as the README's
// "three sites on one machine" does: a CA, three config members joined
// through --peers, two nodes at two sites and one client-only mount. A
// file written through one mount is read through the others, and status
// --json shows the sites, servers and members.
func TestMultiNode(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for FUSE mounts")
	}
	tmp := t.TempDir()
	ca, members := startConfigService(t, tmp)
	config := strings.Join(members, ",")

	node := func(site string) *upProc { return startNode(t, tmp, config, ca, site) }
	west, east := node("west"), node("east")
	// The client-only mount gets a node directory issued for it instead
	// of the CA key.
	issued := filepath.Join(tmp, "issued-eu")
	mustRun(t, tmp, 30*time.Second, wheelfsBin, "ca", "issue", "--ca", ca, "--name", "cli-eu", "--out", issued,
		"--config", config)
	mdata, mmnt := filepath.Join(tmp, "mount-eu"), t.TempDir()
	eu := startWheelfs(t, mdata, mmnt, "mount", "--config", members[1], "--site", "eu", "--data", mdata,
		"--node-dir", issued, mmnt)

	data := bytes.Repeat([]byte("across sites\n"), 20000)
	if err := os.MkdirAll(filepath.Join(west.Mnt, "shared"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(west.Mnt, "shared", "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*upProc{east, eu} {
		got, err := os.ReadFile(filepath.Join(p.Mnt, "shared", "f"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read through %s: %d bytes, %v", p.Mnt, len(got), err)
		}
	}
	if err := os.WriteFile(filepath.Join(eu.Mnt, "from-eu"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(east.Mnt, "from-eu")); err != nil || string(got) != "hello" {
		t.Fatalf("read the client-only mount's file through east: %q, %v", got, err)
	}

	out := mustRun(t, tmp, 30*time.Second, wheelfsBin, "status", "--config", members[2], "--ca", ca, "--json")
	var st struct {
		Sites []struct {
			Name string `json:"name"`
			Up   int    `json:"up"`
		} `json:"sites"`
		Servers []struct {
			ID   string `json:"id"`
			Site string `json:"site"`
			Up   bool   `json:"up"`
		} `json:"servers"`
		Members []struct {
			Name   string `json:"name"`
			Leader bool   `json:"leader"`
		} `json:"members"`
		Slices []struct {
			Slice    uint32   `json:"slice"`
			Replicas []string `json:"replicas"`
		} `json:"slices"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	sites := map[string]int{}
	for _, s := range st.Sites {
		sites[s.Name] = s.Up
	}
	if len(st.Sites) != 2 || sites["west"] != 1 || sites["east"] != 1 {
		t.Errorf("sites = %+v, want west and east with one server up each", st.Sites)
	}
	up := 0
	for _, s := range st.Servers {
		if s.Up {
			up++
		}
	}
	if up != 2 {
		t.Errorf("servers = %+v, want 2 up", st.Servers)
	}
	leaders := 0
	for _, m := range st.Members {
		if m.Leader {
			leaders++
		}
	}
	if len(st.Members) != 3 || leaders != 1 {
		t.Errorf("members = %+v, want 3 with one leader", st.Members)
	}
	if len(st.Slices) == 0 {
		t.Errorf("no slices in status:\n%s", out)
	}
	// Placement through the kernel: .Site puts the primary at east; the
	// default (write-local) at the writer's own server; two replicas of
	// .RepLevel=2 over the two sites. Checked by the xattr, `wheelfs
	// info`, and status --json (the slice's health).
	if err := os.WriteFile(filepath.Join(west.Mnt, ".Site=east", "shared", "ineast"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(west.Mnt, ".RepLevel=2", "shared", "two"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	site := func(r any) string { m, _ := r.(map[string]any); s, _ := m["site"].(string); return s }
	x := parseInfo(t, "getfattr", []byte(mustRun(t, "/", 30*time.Second, "getfattr", "--only-values", "-n", "user.wheelfs.info",
		filepath.Join(eu.Mnt, "shared", "ineast"))))
	if site(x.Primary) != "east" {
		t.Errorf(".Site=east file: primary %v", x.Primary)
	}
	x = parseInfo(t, "wheelfs info", []byte(mustRun(t, "/", 30*time.Second, wheelfsBin, "info", filepath.Join(east.Mnt, "shared", "f"))))
	if site(x.Primary) != "west" {
		t.Errorf("write-local file written at west: primary %v", x.Primary)
	}
	var two info
	deadline := time.Now().Add(20 * time.Second)
	for {
		two = parseInfo(t, "wheelfs info", []byte(mustRun(t, "/", 30*time.Second, wheelfsBin, "info", filepath.Join(east.Mnt, "shared", "two"))))
		if len(two.Replicas) == 2 && site(two.Replicas[0]) != site(two.Replicas[1]) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(two.Replicas) != 2 || site(two.Replicas[0]) == site(two.Replicas[1]) {
		t.Errorf(".RepLevel=2 file: replicas %v, want one at each site", two.Replicas)
	}
	out = mustRun(t, tmp, 30*time.Second, wheelfsBin, "status", "--config", members[0], "--ca", ca, "--json")
	var st2 struct {
		Slices []struct {
			Slice  uint32 `json:"slice"`
			Health struct {
				Live            int  `json:"live"`
				UnderReplicated bool `json:"under_replicated"`
				Misplaced       bool `json:"misplaced"`
			} `json:"health"`
		} `json:"slices"`
	}
	if err := json.Unmarshal([]byte(out), &st2); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sl := range st2.Slices {
		if two.Slice != nil && sl.Slice == *two.Slice {
			found = true
			if sl.Health.Live != 2 || sl.Health.UnderReplicated || sl.Health.Misplaced {
				t.Errorf("status of the .RepLevel=2 slice: %+v", sl.Health)
			}
		}
	}
	if !found {
		t.Errorf("slice of the .RepLevel=2 file missing from status:\n%s", out)
	}

	table := mustRun(t, tmp, 30*time.Second, wheelfsBin, "status", "--config", config, "--ca", ca)
	for _, w := range []string{"SITE", "west", "east", "leader", "SLICE"} {
		if !strings.Contains(table, w) {
			t.Errorf("status table lacks %q:\n%s", w, table)
		}
	}
}
