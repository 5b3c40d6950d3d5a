package server

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// placementServer is a bare server (no store, no config service) that
// sees the given table, for placement rules.
func placementServer(servers ...configsvc.ServerInfo) *Server {
	s := &Server{cfg: Config{ID: "s1", Site: "west", DeadAfter: time.Second}, log: slog.New(slog.DiscardHandler),
		maint: newMaintState(), owned: newOwnership()}
	t := &configsvc.Table{Servers: map[string]configsvc.ServerInfo{}}
	for _, si := range servers {
		t.Servers[si.ID] = si
	}
	s.table.Store(t)
	return s
}

func fullDiskTable() []configsvc.ServerInfo {
	return []configsvc.ServerInfo{
		{ID: "s1", Site: "west"}, {ID: "w2", Site: "west", Full: true},
		{ID: "e1", Site: "east"}, {ID: "e2", Site: "east", Full: true},
		{ID: "u1", Site: "eu", Full: true},
	}
}

func TestFullServersGetNoNewData(t *testing.T) {
	s := placementServer(fullDiskTable()...)
	if got := s.siteServers("east", "x"); !slices.Equal(got, []string{"e1"}) {
		t.Errorf("siteServers(east) = %v, want [e1]", got)
	}
	if got := s.siteServers("eu", "x"); len(got) != 0 {
		t.Errorf("siteServers(eu) = %v, want none: its only server is full", got)
	}
	p := configsvc.Policy{Site: "west", RepLevel: 3}
	if got := s.chooseReplicas(p, []string{"s1"}); !slices.Equal(got, []string{"s1", "e1"}) {
		t.Errorf("new replicas = %v, want [s1 e1]: no full server", got)
	}
	if got := s.chooseReplicas(p, []string{"s1", "u1"}); !slices.Contains(got, "u1") {
		t.Errorf("replicas keeping u1 = %v: a full backup that holds the data stays", got)
	}
	// .Site=eu, all of it full: here for now (home later).
	req := &wire.CreateRequest{Name: "f", Cues: &wire.Cues{Site: "eu"}}
	if pol, id := s.place(req, oid.Root); id != "s1" || pol.Site != "eu" {
		t.Errorf("place .Site=eu = %v at %s, want s1 with home eu", pol, id)
	}
	if pol, id := s.place(&wire.CreateRequest{Name: "f", Cues: &wire.Cues{Site: cue.SiteRandom}}, oid.Root); id == "w2" || id == "e2" || id == "u1" {
		t.Errorf(".Site=random placed at a full server: %v at %s", pol, id)
	}
	// This server full too: a server with room elsewhere, the home kept.
	s.space.cur.Full = true
	if got := s.withRoom("x"); got != "e1" {
		t.Errorf("withRoom while full = %s, want e1 (west has no room)", got)
	}
	if pol, id := s.place(&wire.CreateRequest{Name: "f"}, oid.Root); id != "e1" || pol.Site != "west" {
		t.Errorf("write-local place while full = %v at %s, want e1 with home west", pol, id)
	}
}

func TestNoRoomFailsEarly(t *testing.T) {
	s := placementServer(fullDiskTable()...)
	r := &sliceRepl{s: s, slice: 7, followers: map[string]*follower{"e1": {id: "e1"}}}
	if err := s.noRoom(r, 3); !errors.Is(err, fserr.ErrNoSpace) {
		t.Errorf("3 copies with one backup and every other server full: %v, want ENOSPC", err)
	}
	if err := s.noRoom(r, 2); err != nil {
		t.Errorf("2 copies with one backup listed: %v", err)
	}
	// Nobody full: short of backups for another reason, so wait (and
	// time out) as before.
	none := placementServer(configsvc.ServerInfo{ID: "s1", Site: "west"}, configsvc.ServerInfo{ID: "e1", Site: "east"})
	r.s = none
	if err := none.noRoom(r, 3); err != nil {
		t.Errorf("short of servers, none full: %v, want nil", err)
	}
}

// TestUncommittedBatchGivesItsNumberBack: a batch numbered by assign that
// does not commit (its function fails after, or the disk is full) takes
// its number back, so the next committed batch follows the last one.
func TestUncommittedBatchGivesItsNumberBack(t *testing.T) {
	s, ctx := newTestServer(t)
	r := s.owned.repl(oid.RootSlice)
	r.mu.Lock()
	before := r.seq
	r.mu.Unlock()
	boom := errors.New("fails after numbering")
	err := s.store.Update(ctx, func(tx *store.Tx) error {
		if _, err := r.assign(tx, nil, nil); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("update = %v", err)
	}
	r.mu.Lock()
	after := r.seq
	r.mu.Unlock()
	if after != before {
		t.Fatalf("seq %d after a failed batch, want %d", after, before)
	}
	create(t, s, ctx, oid.Root, "d", wire.Type_TYPE_DIR)
	var at pos
	if err := s.store.View(func(tx *store.Tx) error { at = readPos(tx, oid.RootSlice); return nil }); err != nil {
		t.Fatal(err)
	}
	if at.seq != before+1 {
		t.Errorf("stream position %d after the next commit, want %d", at.seq, before+1)
	}
}
