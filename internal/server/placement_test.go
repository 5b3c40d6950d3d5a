package server

import (
	"fmt"
	"slices"
	"testing"

	"github.com/wheelfs/wheelfs/internal/configsvc"
)

// registry makes n servers at each site: "<site><i>".
func registry(n int, sites ...string) map[string]configsvc.ServerInfo {
	out := map[string]configsvc.ServerInfo{}
	for _, site := range sites {
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("%s%d", site, i)
			out[id] = configsvc.ServerInfo{ID: id, Site: site}
		}
	}
	return out
}

func sitesOf(ids []string, reg map[string]configsvc.ServerInfo) map[string]int {
	out := map[string]int{}
	for _, id := range ids {
		out[reg[id].Site]++
	}
	return out
}

func TestPlaceReplicas(t *testing.T) {
	reg := registry(3, "west", "east", "eu")
	cases := []struct {
		name      string
		p         configsvc.Policy
		keep      []string
		wantN     int
		wantSites int
		homeCount int // copies at the primary's site
	}{
		{"default spreads over sites", configsvc.Policy{RepLevel: 3}, []string{"west0"}, 3, 3, 1},
		{"RepSites=2: extra copy at the primary's site", configsvc.Policy{RepLevel: 3, RepSites: 2}, []string{"west0"}, 3, 2, 2},
		{"RepSites=1: all at home", configsvc.Policy{RepLevel: 3, RepSites: 1}, []string{"west0"}, 3, 1, 3},
		{"RepLevel=7 over 9 servers", configsvc.Policy{RepLevel: 7}, []string{"west0"}, 7, 3, 3},
		{"RepLevel above the servers", configsvc.Policy{RepLevel: 12}, []string{"west0"}, 9, 3, 3},
		{"RepLevel=1", configsvc.Policy{RepLevel: 1}, []string{"west0"}, 1, 1, 1},
		{"kept backups stay", configsvc.Policy{RepLevel: 3}, []string{"west0", "east2", "eu1"}, 3, 3, 1},
		{"site repair: two at one site become two sites", configsvc.Policy{RepLevel: 3, RepSites: 3}, []string{"west0", "west1", "west2"}, 3, 3, 1},
		{"dead backup replaced", configsvc.Policy{RepLevel: 3}, []string{"west0", "gone", "eu1"}, 3, 3, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := placeReplicas(c.p, c.keep, reg)
			if got[0] != c.keep[0] {
				t.Fatalf("primary %s, want %s", got[0], c.keep[0])
			}
			if len(got) != c.wantN {
				t.Fatalf("%d replicas %v, want %d", len(got), got, c.wantN)
			}
			seen := map[string]bool{}
			for _, id := range got {
				if seen[id] {
					t.Fatalf("duplicate %s in %v", id, got)
				}
				seen[id] = true
				if _, ok := reg[id]; !ok {
					t.Fatalf("unregistered %s chosen: %v", id, got)
				}
			}
			s := sitesOf(got, reg)
			if len(s) != c.wantSites || s["west"] != c.homeCount {
				t.Fatalf("sites %v of %v, want %d sites and %d at west", s, got, c.wantSites, c.homeCount)
			}
			for _, k := range c.keep[1:] {
				if _, ok := reg[k]; ok && c.name == "kept backups stay" && !seen[k] {
					t.Fatalf("kept backup %s dropped: %v", k, got)
				}
			}
		})
	}
}

// A dead backup is replaced at its own site when that site has another
// server, even with more sites to choose from.
func TestPlaceReplicasPrefersTheDeadBackupsSite(t *testing.T) {
	reg := registry(2, "a", "b", "c", "d", "e")
	for _, dead := range []string{"b", "c", "d", "e"} {
		got := placeReplicas(configsvc.Policy{RepLevel: 3}, []string{"a0"}, reg, dead)
		if s := sitesOf(got, reg); s[dead] != 1 || len(got) != 3 {
			t.Errorf("dead backup at %s: replacement list %v (sites %v)", dead, got, s)
		}
	}
}

// A backup leaves the replica list only when another server takes its
// place: the list never shrinks below what it had, up to RepLevel.
func TestKeepFloor(t *testing.T) {
	for _, c := range []struct {
		name           string
		want, old, out []string
		repLevel       int
	}{
		{"all peers down: keep them listed", []string{"a"}, []string{"a", "b", "c"}, []string{"a", "b", "c"}, 3},
		{"one replaced", []string{"a", "b", "d"}, []string{"a", "b", "c"}, []string{"a", "b", "d"}, 3},
		{"one down, none to replace it", []string{"a", "b"}, []string{"b", "a", "c"}, []string{"a", "b", "c"}, 3},
		{"over RepLevel: trimmed", []string{"a", "b"}, []string{"a", "b", "c"}, []string{"a", "b"}, 2},
		{"small deployment: as it was", []string{"a"}, []string{"a", "b"}, []string{"a", "b"}, 3},
		{"new list", []string{"a"}, nil, []string{"a"}, 3},
	} {
		if got := keepFloor(c.want, c.old, c.repLevel); !slices.Equal(got, c.out) {
			t.Errorf("%s: keepFloor(%v, %v, %d) = %v, want %v", c.name, c.want, c.old, c.repLevel, got, c.out)
		}
	}
}
