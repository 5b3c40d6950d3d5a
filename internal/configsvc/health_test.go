package configsvc

import (
	"slices"
	"testing"
)

func TestCheck(t *testing.T) {
	tbl := &Table{Servers: map[string]ServerInfo{
		"w1": {ID: "w1", Site: "west"}, "w2": {ID: "w2", Site: "west"},
		"e1": {ID: "e1", Site: "east"}, "u1": {ID: "u1", Site: "eu"},
	}}
	eastFull := &Table{Servers: map[string]ServerInfo{
		"w1": {ID: "w1", Site: "west"}, "e1": {ID: "e1", Site: "east", Full: true},
	}}
	one := &Table{Servers: map[string]ServerInfo{"w1": {ID: "w1", Site: "west"}}}
	tests := []struct {
		name string
		t    *Table
		s    Slice
		want Health
	}{
		{"healthy three sites", tbl, Slice{Policy: Policy{Site: "west", RepLevel: 3}, Replicas: []string{"w1", "e1", "u1"}},
			Health{Live: 3, Sites: 3, WantSites: 3}},
		{"one replica of three", tbl, Slice{Policy: Policy{Site: "west", RepLevel: 3, RepSites: 1}, Replicas: []string{"w1"}},
			Health{Live: 1, Sites: 1, WantSites: 1, UnderReplicated: true}},
		{"down replica", tbl, Slice{Policy: Policy{RepLevel: 2, RepSites: 2}, Replicas: []string{"w1", "gone"}},
			Health{Live: 1, Sites: 1, WantSites: 2, UnderReplicated: true, Misplaced: true, Down: []string{"gone"}}},
		{"primary at wrong site", tbl, Slice{Policy: Policy{Site: "east", RepLevel: 1}, Replicas: []string{"w1"}},
			Health{Live: 1, Sites: 1, WantSites: 1, Misplaced: true}},
		{"policy site full: not misplaced elsewhere", eastFull, Slice{Policy: Policy{Site: "east", RepLevel: 1}, Replicas: []string{"w1"}},
			Health{Live: 1, Sites: 1, WantSites: 1}},
		{"policy site without servers", tbl, Slice{Policy: Policy{Site: "asia", RepLevel: 1}, Replicas: []string{"w1"}},
			Health{Live: 1, Sites: 1, WantSites: 1}},
		{"too few sites", tbl, Slice{Policy: Policy{Site: "west", RepLevel: 2}, Replicas: []string{"w1", "w2"}},
			Health{Live: 2, Sites: 1, WantSites: 2, Misplaced: true}},
		{"RepSites below RepLevel", tbl, Slice{Policy: Policy{Site: "west", RepLevel: 2, RepSites: 1}, Replicas: []string{"w1", "w2"}},
			Health{Live: 2, Sites: 1, WantSites: 1}},
		{"want sites and replicas capped by registered servers", one, Slice{Policy: Policy{Site: "west", RepLevel: 3}, Replicas: []string{"w1"}},
			Health{Live: 1, Sites: 1, WantSites: 1}},
		{"primary down is not misplaced", tbl, Slice{Policy: Policy{Site: "west", RepLevel: 1}, Replicas: []string{"gone"}},
			Health{Live: 0, Sites: 0, WantSites: 1, UnderReplicated: true, Misplaced: true, Down: []string{"gone"}}},
		{"no replicas", tbl, Slice{Policy: Policy{RepLevel: 1}},
			Health{WantSites: 1, UnderReplicated: true, Misplaced: true}},
		{"empty table", &Table{}, Slice{Policy: Policy{Site: "west", RepLevel: 1}, Replicas: []string{"w1"}},
			Health{UnderReplicated: true, Down: []string{"w1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.t, tc.s)
			if got.Live != tc.want.Live || got.Sites != tc.want.Sites || got.WantSites != tc.want.WantSites ||
				got.UnderReplicated != tc.want.UnderReplicated || got.Misplaced != tc.want.Misplaced ||
				!slices.Equal(got.Down, tc.want.Down) {
				t.Errorf("Check = %+v, want %+v", got, tc.want)
			}
			if got.OK() != (!tc.want.UnderReplicated && !tc.want.Misplaced) {
				t.Errorf("OK() = %v", got.OK())
			}
		})
	}
}
