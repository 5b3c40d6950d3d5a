package configsvc_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// connector returns a new client of one deployment (closed at the end of
// the test).
type connector func(o configsvc.Options) configsvc.Service

// testService is the conformance suite every Service implementation
// passes; newDeployment starts an empty deployment.
func testService(t *testing.T, newDeployment func(t *testing.T) connector) {
	for _, tc := range []struct {
		name string
		run  func(*testing.T, connector)
	}{
		{"RegisterTableAndCloseRemoves", testRegisterTableAndCloseRemoves},
		{"RegisterEndsWithContext", testRegisterEndsWithContext},
		{"UpdateServer", testUpdateServer},
		{"LockLifecycle", testLockLifecycle},
		{"EpochIncreasesAcrossExpiry", testEpochIncreasesAcrossExpiry},
		{"SinceBoundsExpiry", testSinceBoundsExpiry},
		{"ConcurrentAcquireOneWinner", testConcurrentAcquireOneWinner},
		{"Watch", testWatch},
		{"WatchEndsOnClose", testWatchEndsOnClose},
		{"DeploymentIdempotent", testDeploymentIdempotent},
		{"RenewAllSession", testRenewAllSession},
		{"Coords", testCoords},
		{"Logins", testLogins},
		{"Denials", testDenials},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, newDeployment(t))
		})
	}
}

// TestMemory runs the Service conformance suite against Memory.
func TestMemory(t *testing.T) {
	testService(t, func(t *testing.T) connector {
		m := configsvc.NewMemory()
		return func(o configsvc.Options) configsvc.Service {
			s := m.Client(o)
			t.Cleanup(func() { s.Close() })
			return s
		}
	})
}

func testRegisterTableAndCloseRemoves(t *testing.T, connect connector) {
	a := connect(configsvc.Options{})
	b := connect(configsvc.Options{})
	ctx := tctx(t)

	info := configsvc.ServerInfo{ID: "srv-a", Site: "mit", Addr: "10.0.0.1:7000"}
	if err := a.Register(ctx, info); err != nil {
		t.Fatal(err)
	}
	tb, err := b.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := tb.Servers["srv-a"]; got != info {
		t.Fatalf("table server = %+v, want %+v", got, info)
	}
	if tb.Revision <= 0 {
		t.Fatalf("revision %d", tb.Revision)
	}
	// ctx lives on; closing the service revokes the membership lease.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Register(ctx, info); !errors.Is(err, configsvc.ErrClosed) {
		t.Fatalf("register after close: %v", err)
	}
	waitFor(t, b, 5*time.Second, "server to vanish after Close", func(tb *configsvc.Table) bool {
		_, ok := tb.Servers["srv-a"]
		return !ok
	})
}

// testUpdateServer: a registered server's published value changes in
// place (the key stays under its lease: it still vanishes at Close), and
// only a server registered through the Service can be updated.
func testUpdateServer(t *testing.T, connect connector) {
	a := connect(configsvc.Options{})
	b := connect(configsvc.Options{})
	ctx := tctx(t)
	info := configsvc.ServerInfo{ID: "srv-u", Site: "mit", Addr: "10.0.0.1:7000"}
	if err := b.UpdateServer(ctx, info); !errors.Is(err, configsvc.ErrNotFound) {
		t.Fatalf("update of a server not registered here: %v, want ErrNotFound", err)
	}
	if err := a.Register(ctx, info); err != nil {
		t.Fatal(err)
	}
	full := info
	full.Free, full.Total, full.Full = 1<<20, 64<<20, true
	if err := a.UpdateServer(ctx, full); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, 5*time.Second, "updated server value", func(tb *configsvc.Table) bool { return tb.Servers["srv-u"] == full })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, 5*time.Second, "server to vanish after Close", func(tb *configsvc.Table) bool {
		_, ok := tb.Servers["srv-u"]
		return !ok
	})
}

func testRegisterEndsWithContext(t *testing.T, connect connector) {
	s := connect(configsvc.Options{})
	rctx, cancel := context.WithCancel(context.Background())
	if err := s.Register(rctx, configsvc.ServerInfo{ID: "x", Site: "s"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, time.Second, "server present", func(tb *configsvc.Table) bool { _, ok := tb.Servers["x"]; return ok })
	cancel()
	waitFor(t, s, 5*time.Second, "server gone after ctx end", func(tb *configsvc.Table) bool { _, ok := tb.Servers["x"]; return !ok })
}

func testLockLifecycle(t *testing.T, connect connector) {
	a := connect(configsvc.Options{})
	b := connect(configsvc.Options{})
	ctx := tctx(t)
	const sl = oid.Slice(0x42)
	pol := configsvc.Policy{Site: "mit", RepLevel: 3, RepSites: 2, KeepTogether: true}

	la, err := a.Acquire(ctx, sl, "A", pol, []string{"A", "B", "C"})
	if err != nil {
		t.Fatal(err)
	}
	if la.Epoch <= 0 || la.Holder != "A" || la.Slice != sl {
		t.Fatalf("lock %+v", la)
	}
	tb, err := b.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := tb.Slices[sl]
	if got.ID != sl || got.Holder != "A" || got.Epoch != la.Epoch || got.Policy != pol || !slices.Equal(got.Replicas, []string{"A", "B", "C"}) {
		t.Fatalf("table slice = %+v", got)
	}

	if _, err := b.Acquire(ctx, sl, "B", pol, []string{"B"}); !errors.Is(err, configsvc.ErrLocked) {
		t.Fatalf("acquire by B while A holds: %v", err)
	}
	// Re-acquiring one's own live lock keeps the epoch.
	again, err := a.Acquire(ctx, sl, "A", pol, []string{"A", "C"})
	if err != nil || again.Epoch != la.Epoch || again.Holder != "A" || again.Since.Before(la.Since) {
		t.Fatalf("re-acquire: %+v %v (want %+v, renewed)", again, err, la)
	}
	if err := a.Renew(ctx, la); err != nil {
		t.Fatalf("renew: %v", err)
	}
	// Only the holder's lock works.
	if err := b.Renew(ctx, configsvc.Lock{Slice: sl, Holder: "B", Epoch: la.Epoch}); !errors.Is(err, configsvc.ErrLockLost) {
		t.Fatalf("renew by non-holder: %v", err)
	}
	if err := a.UpdateReplicas(ctx, la, []string{"A", "D"}); err != nil {
		t.Fatal(err)
	}
	tb, _ = b.Table(ctx)
	if got := tb.Slices[sl]; !slices.Equal(got.Replicas, []string{"A", "D"}) || got.Policy != pol {
		t.Fatalf("after update: %+v", got)
	}

	if err := a.Release(ctx, la); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, la); !errors.Is(err, configsvc.ErrLockLost) {
		t.Fatalf("double release: %v", err)
	}
	if err := a.Renew(ctx, la); !errors.Is(err, configsvc.ErrLockLost) {
		t.Fatalf("renew after release: %v", err)
	}
	tb, _ = b.Table(ctx)
	if got := tb.Slices[sl]; got.Holder != "" || got.Epoch != 0 || !slices.Equal(got.Replicas, []string{"A", "D"}) {
		t.Fatalf("after release the record must persist unlocked: %+v", got)
	}
	lb, err := b.Acquire(ctx, sl, "B", pol, []string{"B", "A"})
	if err != nil {
		t.Fatal(err)
	}
	if lb.Epoch <= la.Epoch {
		t.Fatalf("epoch did not increase: %d then %d", la.Epoch, lb.Epoch)
	}
	if err := a.UpdateReplicas(ctx, la, []string{"A"}); !errors.Is(err, configsvc.ErrLockLost) {
		t.Fatalf("update with stale lock: %v", err)
	}
}

func testEpochIncreasesAcrossExpiry(t *testing.T, connect connector) {
	o := configsvc.Options{LockTTL: time.Second}
	a := connect(o)
	b := connect(o)
	ctx := tctx(t)
	const sl = oid.Slice(7)
	pol := configsvc.Policy{Site: "s1", RepLevel: 2, RepSites: 1}

	la, err := a.Acquire(ctx, sl, "A", pol, []string{"A", "B"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, sl, "B", pol, []string{"B", "A"}); !errors.Is(err, configsvc.ErrLocked) {
		t.Fatalf("want ErrLocked, got %v", err)
	}
	// A stops renewing; its lock must expire.
	waitFor(t, b, 10*time.Second, "lock expiry", func(tb *configsvc.Table) bool {
		s, ok := tb.Slices[sl]
		return ok && s.Holder == "" && s.Epoch == 0
	})
	lb, err := b.Acquire(ctx, sl, "B", pol, []string{"B", "A"})
	if err != nil {
		t.Fatal(err)
	}
	if lb.Epoch <= la.Epoch {
		t.Fatalf("epoch %d after expiry not above %d", lb.Epoch, la.Epoch)
	}
	if err := a.Renew(ctx, la); !errors.Is(err, configsvc.ErrLockLost) {
		t.Fatalf("renew expired lock: %v", err)
	}
	if err := a.UpdateReplicas(ctx, la, []string{"A", "C"}); !errors.Is(err, configsvc.ErrLockLost) {
		t.Fatalf("update replicas with stale lock: %v", err)
	}
	if err := a.Release(ctx, la); !errors.Is(err, configsvc.ErrLockLost) {
		t.Fatalf("release stale lock: %v", err)
	}
	if err := b.UpdateReplicas(ctx, lb, []string{"B", "C"}); err != nil {
		t.Fatal(err)
	}
	tb, err := a.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := tb.Slices[sl]; got.Holder != "B" || got.Epoch != lb.Epoch || !slices.Equal(got.Replicas, []string{"B", "C"}) || got.Policy != pol {
		t.Fatalf("table: %+v", got)
	}
	// Renewing keeps the lock past its TTL.
	for range 4 {
		time.Sleep(500 * time.Millisecond)
		if err := b.Renew(ctx, lb); err != nil {
			t.Fatalf("renew: %v", err)
		}
	}
}

// testSinceBoundsExpiry: a lock taken on its holder's existing lease runs
// from that lease's last renewal (Lock.Since), which may be well before the
// Acquire. It never expires before Since + LockTTL; a holder that counted
// from its Acquire instead could outlive its lock.
func testSinceBoundsExpiry(t *testing.T, connect connector) {
	o := configsvc.Options{LockTTL: time.Second}
	a, b := connect(o), connect(o)
	ctx := tctx(t)
	pol := configsvc.Policy{Site: "s1", RepLevel: 1}
	if _, err := a.Acquire(ctx, 1, "A", pol, []string{"A"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // the shared lease ages
	asked := time.Now()
	l, err := a.Acquire(ctx, 2, "A", pol, []string{"A"})
	if err != nil {
		t.Fatal(err)
	}
	if l.Since.IsZero() || l.Since.After(time.Now()) {
		t.Fatalf("Since %v: want the time the lease last started running", l.Since)
	}
	var taken time.Time
	waitFor(t, b, 10*time.Second, "slice 2 free", func(*configsvc.Table) bool {
		_, err := b.Acquire(ctx, 2, "B", pol, []string{"B"})
		taken = time.Now()
		return err == nil
	})
	if early := l.Since.Add(o.LockTTL).Sub(taken); early > 0 {
		t.Fatalf("lock taken by another %v before Since + LockTTL", early)
	}
	t.Logf("Since %v before the Acquire; taken over %v after the Acquire", asked.Sub(l.Since).Round(time.Millisecond), taken.Sub(asked).Round(time.Millisecond))
}

func testConcurrentAcquireOneWinner(t *testing.T, connect connector) {
	s := connect(configsvc.Options{})
	ctx := tctx(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := string(rune('a' + i))
			_, errs[i] = s.Acquire(ctx, 99, h, configsvc.Policy{Site: h}, []string{h})
		}()
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, configsvc.ErrLocked):
			t.Fatalf("unexpected error %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d winners", wins)
	}
	tb, _ := s.Table(ctx)
	got := tb.Slices[99]
	if got.Policy.Site != got.Holder || !slices.Equal(got.Replicas, []string{got.Holder}) {
		t.Fatalf("slice record not from the winner: %+v", got)
	}
}

func testWatch(t *testing.T, connect connector) {
	s := connect(configsvc.Options{})
	w := connect(configsvc.Options{})
	ctx := tctx(t)
	wctx, cancel := context.WithCancel(ctx)
	ch := w.Watch(wctx)

	recv := func(what string, cond func(*configsvc.Table) bool) *configsvc.Table {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case tb, ok := <-ch:
				if !ok {
					t.Fatalf("watch closed while waiting for %s", what)
				}
				if cond(tb) {
					return tb
				}
			case <-timeout:
				t.Fatalf("no table with %s", what)
			}
		}
	}
	first := recv("first table", func(*configsvc.Table) bool { return true })
	if len(first.Slices) != 0 {
		t.Fatalf("first table %+v", first)
	}
	l, err := s.Acquire(ctx, 5, "A", configsvc.Policy{Site: "x"}, []string{"A"})
	if err != nil {
		t.Fatal(err)
	}
	tb := recv("acquired slice", func(tb *configsvc.Table) bool { return tb.Slices[5].Holder == "A" })
	if tb.Slices[5].Epoch != l.Epoch || tb.Revision < l.Epoch {
		t.Fatalf("watched table %+v, lock %+v", tb, l)
	}
	// A burst of changes with nobody receiving: the watcher must not block
	// and must end up delivering the newest state.
	for i := range 20 {
		if err := s.UpdateReplicas(ctx, l, []string{"A", string(rune('a' + i))}); err != nil {
			t.Fatal(err)
		}
	}
	recv("last update", func(tb *configsvc.Table) bool {
		return slices.Equal(tb.Slices[5].Replicas, []string{"A", "t"})
	})
	if err := s.Register(ctx, configsvc.ServerInfo{ID: "srv", Site: "x"}); err != nil {
		t.Fatal(err)
	}
	recv("registered server", func(tb *configsvc.Table) bool { _, ok := tb.Servers["srv"]; return ok })

	cancel()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("watch channel not closed after ctx end")
		}
	}
}

func testWatchEndsOnClose(t *testing.T, connect connector) {
	s := connect(configsvc.Options{})
	ch := s.Watch(context.Background())
	<-ch
	done := make(chan struct{})
	go func() {
		for range ch {
		}
		close(done)
	}()
	s.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watch not closed by Close")
	}
}

func testDeploymentIdempotent(t *testing.T, connect connector) {
	a := connect(configsvc.Options{})
	b := connect(configsvc.Options{})
	other := connect(configsvc.Options{Prefix: "/other"})
	ctx := tctx(t)

	ids := make([]string, 6)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if i%2 == 1 {
				s = b
			}
			id, err := s.Deployment(ctx)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	if len(ids[0]) != 32 {
		t.Fatalf("deployment id %q", ids[0])
	}
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("ids differ: %v", ids)
		}
	}
	o, err := other.Deployment(ctx)
	if err != nil || o == ids[0] {
		t.Fatalf("separate prefix must be a separate deployment: %q %v", o, err)
	}
}

// A holder's locks share one session lease: RenewAll keeps them all with
// one keep-alive, reports released or stolen ones as lost, and when the
// holder stops renewing they all expire together; a later Acquire starts
// a new session.
func testRenewAllSession(t *testing.T, connect connector) {
	o := configsvc.Options{LockTTL: time.Second}
	a := connect(o)
	ctx := tctx(t)
	pol := configsvc.Policy{Site: "s1", RepLevel: 1}
	var locks []configsvc.Lock
	for sl := oid.Slice(10); sl < 13; sl++ {
		l, err := a.Acquire(ctx, sl, "A", pol, []string{"A"})
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	for range 4 { // past the TTL
		time.Sleep(500 * time.Millisecond)
		lost, err := a.RenewAll(ctx, locks)
		if err != nil || len(lost) != 0 {
			t.Fatalf("RenewAll: lost %v, %v", lost, err)
		}
	}
	if err := a.Release(ctx, locks[0]); err != nil {
		t.Fatal(err)
	}
	lost, err := a.RenewAll(ctx, locks)
	if err != nil || len(lost) != 1 || lost[0] != locks[0] {
		t.Fatalf("after releasing one: lost %v, %v", lost, err)
	}
	// Stop renewing: both remaining locks expire.
	waitFor(t, a, 10*time.Second, "session expiry", func(tb *configsvc.Table) bool {
		return tb.Slices[11].Holder == "" && tb.Slices[12].Holder == ""
	})
	if lost, err := a.RenewAll(ctx, locks[1:]); err != nil || len(lost) != 2 {
		t.Fatalf("after expiry: lost %v, %v", lost, err)
	}
	l, err := a.Acquire(ctx, 11, "A", pol, []string{"A"})
	if err != nil {
		t.Fatalf("acquire after the session expired: %v", err)
	}
	if lost, err := a.RenewAll(ctx, []configsvc.Lock{l}); err != nil || len(lost) != 0 {
		t.Fatalf("new session: lost %v, %v", lost, err)
	}
}

// coordStore is what EtcdService and Memory clients offer beside Service.
type coordStore interface {
	PublishCoord(ctx context.Context, c configsvc.NodeCoord, ttl time.Duration) error
	Coords(ctx context.Context) (map[string]configsvc.NodeCoord, error)
}

func testCoords(t *testing.T, connect connector) {
	a := connect(configsvc.Options{}).(coordStore)
	b := connect(configsvc.Options{}).(coordStore)
	ctx := tctx(t)
	c := coordinate.NewCoordinate(coordinate.DefaultConfig())
	c.Vec[0] = 0.05
	if err := a.PublishCoord(ctx, configsvc.NodeCoord{ID: "n1", Site: "west", Coord: c, Samples: 7}, time.Minute); err != nil {
		t.Fatal(err)
	}
	c.Vec[0] = 0.06 // a second publish replaces the first (and renews its lease)
	if err := a.PublishCoord(ctx, configsvc.NodeCoord{ID: "n1", Site: "west", Coord: c, Samples: 9}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.PublishCoord(ctx, configsvc.NodeCoord{ID: "n2", Site: "east", Server: true, Coord: c}, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := b.Coords(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["n1"].Site != "west" || got["n1"].Samples != 9 || got["n1"].Coord.Vec[0] != 0.06 || !got["n2"].Server {
		t.Fatalf("coords %+v", got)
	}
	// Close withdraws what a client published.
	a.(configsvc.Service).Close()
	got, err = b.Coords(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got["n1"]; ok || len(got) != 1 {
		t.Errorf("after close: %+v, want only n2", got)
	}
}

// testLogins: a session put by one client is seen by another's watch,
// replaced in place, and gone after delete.
func testLogins(t *testing.T, connect connector) {
	a := connect(configsvc.Options{}).(configsvc.Logins)
	b := connect(configsvc.Options{}).(configsvc.Logins)
	ctx := tctx(t)
	ch := b.WatchLogins(ctx)
	recv := func(what string, cond func([]configsvc.Login) bool) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case ls, ok := <-ch:
				if !ok {
					t.Fatalf("watch closed while waiting for %s", what)
				}
				if cond(ls) {
					return
				}
			case <-timeout:
				t.Fatalf("no session list with %s", what)
			}
		}
	}
	recv("the empty list", func(ls []configsvc.Login) bool { return len(ls) == 0 })
	exp := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	l := configsvc.Login{Node: "cli-1", UID: 1001, User: "alice", Key: "SHA256:x", Expires: exp}
	if err := a.PutLogin(ctx, l); err != nil {
		t.Fatal(err)
	}
	recv("alice", func(ls []configsvc.Login) bool {
		return len(ls) == 1 && ls[0].User == "alice" && ls[0].Expires.Equal(exp)
	})
	l.Expires = exp.Add(time.Hour)
	if err := a.PutLogin(ctx, l); err != nil {
		t.Fatal(err)
	}
	recv("the renewed session", func(ls []configsvc.Login) bool { return len(ls) == 1 && ls[0].Expires.Equal(l.Expires) })
	if err := a.PutLogin(ctx, configsvc.Login{Node: "cli-2", UID: 1001, User: "alice", Expires: exp}); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteLogin(ctx, "cli-1", 1001); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.GetLogin(ctx, "cli-1", 1001); err != nil || ok {
		t.Fatalf("GetLogin of a deleted session: ok %v, err %v", ok, err)
	}
	if got, ok, err := b.GetLogin(ctx, "cli-2", 1001); err != nil || !ok || got.User != "alice" {
		t.Fatalf("GetLogin(cli-2) = %+v, %v, %v", got, ok, err)
	}
	recv("only cli-2", func(ls []configsvc.Login) bool { return len(ls) == 1 && ls[0].Node == "cli-2" })
}

// testDenials: a denied server leaves the table's registrations at once
// (though its registration is still alive), loses its slice lock, may not
// take a lock again, and the deny list reaches another client's watch;
// after Undeny it may lock again.
func testDenials(t *testing.T, connect connector) {
	a := connect(configsvc.Options{})
	b := connect(configsvc.Options{})
	ctx := tctx(t)
	const sl = oid.Slice(0x77)
	pol := configsvc.Policy{Site: "mit", RepLevel: 2, RepSites: 1}
	if err := a.Register(ctx, configsvc.ServerInfo{ID: "bad", Site: "mit", Addr: "x:1"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Register(ctx, configsvc.ServerInfo{ID: "good", Site: "mit", Addr: "y:1"}); err != nil {
		t.Fatal(err)
	}
	lock, err := a.Acquire(ctx, sl, "bad", pol, []string{"bad", "good"})
	if err != nil {
		t.Fatal(err)
	}
	ch := b.(configsvc.Denials).WatchDenied(ctx)
	recv := func(what string, cond func([]configsvc.Denial) bool) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case ds, ok := <-ch:
				if !ok {
					t.Fatalf("watch closed while waiting for %s", what)
				}
				if cond(ds) {
					return
				}
			case <-timeout:
				t.Fatalf("no deny list with %s", what)
			}
		}
	}
	recv("the empty list", func(ds []configsvc.Denial) bool { return len(ds) == 0 })

	if err := b.(configsvc.Denials).Deny(ctx, configsvc.Denial{Name: "bad", Reason: "stolen laptop"}); err != nil {
		t.Fatal(err)
	}
	recv("bad", func(ds []configsvc.Denial) bool {
		return len(ds) == 1 && ds[0].Name == "bad" && ds[0].Reason == "stolen laptop" && !ds[0].At.IsZero()
	})
	tb, err := b.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tb.Servers["bad"]; ok {
		t.Fatalf("denied server still registered: %v", tb.Servers)
	}
	if _, ok := tb.Servers["good"]; !ok {
		t.Fatalf("good server lost: %v", tb.Servers)
	}
	if got := tb.Slices[sl]; got.Holder != "" || !slices.Equal(got.Replicas, []string{"bad", "good"}) {
		t.Fatalf("slice after deny = %+v, want unlocked with its replica list kept", got)
	}
	if lost, err := a.RenewAll(ctx, []configsvc.Lock{lock}); err != nil || len(lost) != 1 {
		t.Fatalf("RenewAll of the denied holder's lock: lost %v, err %v", lost, err)
	}
	if _, err := a.Acquire(ctx, sl, "bad", pol, []string{"bad"}); !errors.Is(err, configsvc.ErrDenied) {
		t.Fatalf("acquire by a denied holder: %v, want ErrDenied", err)
	}
	nl, err := b.Acquire(ctx, sl, "good", pol, []string{"good"})
	if err != nil {
		t.Fatal(err)
	}
	if nl.Epoch <= lock.Epoch {
		t.Fatalf("epoch after deny %d, not above the denied holder's %d", nl.Epoch, lock.Epoch)
	}
	if err := b.(configsvc.Denials).Deny(ctx, configsvc.Denial{Name: "a/b"}); err == nil {
		t.Fatal("deny of a name with a slash succeeded")
	}

	if err := a.(configsvc.Denials).Undeny(ctx, "bad"); err != nil {
		t.Fatal(err)
	}
	recv("the empty list again", func(ds []configsvc.Denial) bool { return len(ds) == 0 })
	if _, err := a.Acquire(ctx, sl+1, "bad", pol, []string{"bad"}); err != nil {
		t.Fatalf("acquire after undeny: %v", err)
	}
}
