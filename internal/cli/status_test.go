package cli

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/hashicorp/serf/coordinate"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
)

func statusTable() (*configsvc.Table, []configsvc.Member) {
	t := &configsvc.Table{Revision: 42,
		Servers: map[string]configsvc.ServerInfo{
			"srv-w": {ID: "srv-w", Site: "west", Addr: "10.0.0.1:7000"},
			"srv-e": {ID: "srv-e", Site: "east", Addr: "10.0.1.1:7000", Free: 1 << 20, Total: 64 << 20, Full: true},
		},
		Slices: map[oid.Slice]configsvc.Slice{
			1: {ID: 1, Policy: configsvc.Policy{Site: "west", RepLevel: 1}, Replicas: []string{"srv-w"}, Holder: "srv-w", Epoch: 7},
			2: {ID: 2, Policy: configsvc.Policy{Site: "west", RepLevel: 2, RepSites: 2},
				Replicas: []string{"srv-e", "srv-gone"}, Holder: "srv-e", Epoch: 9},
		},
	}
	members := []configsvc.Member{
		{Name: "cfg-a", ClientURLs: []string{"https://10.0.0.9:2379"}, PeerURLs: []string{"https://10.0.0.9:2380"}, Leader: true, Reachable: true},
		{Name: "cfg-b", ClientURLs: []string{"https://10.0.1.9:2379"}, PeerURLs: []string{"https://10.0.1.9:2380"}, Reachable: true},
	}
	return t, members
}

func TestBuildStatus(t *testing.T) {
	tbl, members := statusTable()
	s := buildStatus(tbl, members, nil)
	if len(s.Sites) != 2 || s.Sites[0] != (siteStatus{Name: "east", Servers: 1, Up: 1}) {
		t.Errorf("sites = %+v", s.Sites)
	}
	want := []serverStatus{
		{ID: "srv-gone", Up: false, Backup: 1},
		{ID: "srv-e", Site: "east", Addr: "10.0.1.1:7000", Up: true, Primary: 1, Free: 1 << 20, Total: 64 << 20, Full: true},
		{ID: "srv-w", Site: "west", Addr: "10.0.0.1:7000", Up: true, Primary: 1},
	}
	if len(s.Servers) != len(want) {
		t.Fatalf("servers = %+v", s.Servers)
	}
	for i := range want {
		if s.Servers[i] != want[i] {
			t.Errorf("server %d = %+v, want %+v", i, s.Servers[i], want[i])
		}
	}
	if got := strings.Join(s.Slices[0].State, ","); got != "ok" {
		t.Errorf("slice 1 state = %s", got)
	}
	if got := strings.Join(s.Slices[1].State, ","); got != "under-replicated,misplaced" {
		t.Errorf("slice 2 state = %s", got)
	}
}

func TestRenderStatusTable(t *testing.T) {
	tbl, members := statusTable()
	var b bytes.Buffer
	if err := renderStatus(&b, buildStatus(tbl, members, nil)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, line := range []string{
		"SITE  SERVERS  UP",
		"east  1        1",
		"srv-gone  -     -              down   -               0        1",
		"srv-e     east  10.0.1.1:7000  full   1.0MiB/64.0MiB  1        0",
		"srv-w     west  10.0.0.1:7000  up     -               1        0",
		"cfg-a   https://10.0.0.9:2379  https://10.0.0.9:2380  leader",
		"cfg-b   https://10.0.1.9:2379  https://10.0.1.9:2380  follower",
		"1      west  1         0         srv-w           1/1   srv-w   7      ok",
		"2      west  2         2         srv-e,srv-gone  1/2   srv-e   9      under-replicated,misplaced",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("missing line %q in\n%s", line, out)
		}
	}
}

func TestStatusJSON(t *testing.T) {
	tbl, members := statusTable()
	data, err := json.Marshal(buildStatus(tbl, members, nil))
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Sites   []map[string]any `json:"sites"`
		Servers []struct {
			ID    string `json:"id"`
			Up    bool   `json:"up"`
			Free  int64  `json:"free_bytes"`
			Total int64  `json:"total_bytes"`
			Full  bool   `json:"full"`
		} `json:"servers"`
		Members []struct {
			Name   string `json:"name"`
			Leader bool   `json:"leader"`
		} `json:"members"`
		Slices []struct {
			Slice  uint32 `json:"slice"`
			Health struct {
				Live            int      `json:"live"`
				UnderReplicated bool     `json:"under_replicated"`
				Misplaced       bool     `json:"misplaced"`
				Down            []string `json:"down"`
			} `json:"health"`
			State []string `json:"state"`
		} `json:"slices"`
	}
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Sites) != 2 || len(back.Servers) != 3 || back.Servers[0].Up || !back.Members[0].Leader {
		t.Errorf("decoded %+v", back)
	}
	if e := back.Servers[1]; e.ID != "srv-e" || e.Free != 1<<20 || e.Total != 64<<20 || !e.Full {
		t.Errorf("free space of srv-e = %+v", e)
	}
	h := back.Slices[1].Health
	if back.Slices[1].Slice != 2 || h.Live != 1 || !h.UnderReplicated || !h.Misplaced || len(h.Down) != 1 || h.Down[0] != "srv-gone" {
		t.Errorf("slice 2 = %+v", back.Slices[1])
	}
	empty, _ := json.Marshal(buildStatus(&configsvc.Table{}, nil, nil))
	if string(empty) != `{"revision":0,"sites":[],"servers":[],"members":[],"slices":[]}` {
		t.Errorf("empty status = %s", empty)
	}
}

func TestStatusPolicyUnmet(t *testing.T) {
	tbl, members := statusTable()
	tbl.Slices[3] = configsvc.Slice{ID: 3, Policy: configsvc.Policy{RepLevel: 3, RepSites: 3},
		Replicas: []string{"srv-w", "srv-e"}, Holder: "srv-w", Epoch: 1}
	s := buildStatus(tbl, members, nil)
	for _, sl := range s.Slices {
		state := strings.Join(sl.State, ",")
		if sl.Slice == 3 {
			if !strings.Contains(state, "policy-unmet(RepLevel 3 > 2 servers)") || !strings.Contains(state, "policy-unmet(RepSites 3 > 2 sites)") {
				t.Errorf("RepLevel 3 slice on 2 servers: state %q", state)
			}
		} else if strings.Contains(state, "policy-unmet") {
			t.Errorf("slice %d: state %q", sl.Slice, state)
		}
	}
}

func TestStatusKnownServerDown(t *testing.T) {
	tbl, members := statusTable()
	known := map[string]configsvc.ServerInfo{
		"srv-w":    {ID: "srv-w", Site: "west", Addr: "10.0.0.1:7000"},
		"srv-stop": {ID: "srv-stop", Site: "eu", Addr: "10.0.2.1:7000"}, // stopped cleanly, in no replica list
	}
	s := buildStatus(tbl, members, known)
	var found bool
	for _, sv := range s.Servers {
		if sv.ID == "srv-stop" {
			found = true
			if sv.Up || sv.Site != "eu" {
				t.Errorf("stopped server = %+v, want down at eu", sv)
			}
		}
	}
	if !found {
		t.Errorf("stopped server missing: %+v", s.Servers)
	}
	var buf bytes.Buffer
	if err := renderStatus(&buf, s); err != nil || !strings.Contains(buf.String(), "srv-stop") {
		t.Errorf("table: %v\n%s", err, buf.String())
	}
}

func TestStatusCoords(t *testing.T) {
	at := func(site string, server bool, ms float64) configsvc.NodeCoord {
		c := coordinate.NewCoordinate(coordinate.DefaultConfig())
		c.Vec[0], c.Height, c.Error = ms/1000, 0, 0.2
		return configsvc.NodeCoord{Site: site, Server: server, Coord: c, Samples: 5}
	}
	coords := map[string]configsvc.NodeCoord{
		"w1": at("west", true, 0), "w2": at("west", false, 2),
		"e1": at("east", true, 100), "e2": at("east", false, 104),
	}
	tbl, members := statusTable()
	s := buildStatus(tbl, members, nil)
	addCoords(&s, coords)
	if len(s.Coords) != 4 || s.Coords[0].ID != "e1" || s.Coords[0].Role != "server" || s.Coords[1].Role != "client" || s.Coords[0].Error != 0.2 {
		t.Errorf("coords %+v", s.Coords)
	}
	// east-west pairs: 100, 104, 98, 102 ms: median 101.
	want := []siteRTT{{A: "east", B: "east", MedianMs: 4, Pairs: 1}, {A: "east", B: "west", MedianMs: 101, Pairs: 4},
		{A: "west", B: "west", MedianMs: 2, Pairs: 1}}
	if len(s.RTT) != len(want) {
		t.Fatalf("rtt %+v", s.RTT)
	}
	for i := range want {
		if got := s.RTT[i]; got.A != want[i].A || got.B != want[i].B || got.Pairs != want[i].Pairs || math.Abs(got.MedianMs-want[i].MedianMs) > 0.01 {
			t.Errorf("rtt[%d] = %+v, want %+v", i, got, want[i])
		}
	}
	var b bytes.Buffer
	if err := renderStatus(&b, s); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"NODE  SITE  ROLE    COORD ERROR  SAMPLES", "w2    west  client  0.20         5",
		"EST. RTT ms  east   west", "east         4.0    101.0", "west         101.0  2.0"} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, b.String())
		}
	}
}
