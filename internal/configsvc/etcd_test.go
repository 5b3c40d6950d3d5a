package configsvc_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/oid"
)

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// startMember starts a single-member embedded etcd in t.TempDir().
func startMember(t *testing.T) *embedded.Member {
	t.Helper()
	c := embedded.NewConfig()
	c.Dir = t.TempDir()
	c.Logger = testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := embedded.Start(ctx, c)
	if err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func dial(t *testing.T, m *embedded.Member, o configsvc.Options) *configsvc.EtcdService {
	t.Helper()
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := configsvc.Dial(ctx, m.ClientEndpoints(), nil, o)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls the table until cond holds or the deadline passes.
func waitFor(t *testing.T, s configsvc.Service, within time.Duration, what string, cond func(*configsvc.Table) bool) *configsvc.Table {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		tb, err := s.Table(context.Background())
		if err == nil && cond(tb) {
			return tb
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last err %v)", within, what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRegisterTableAndCloseRemoves(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	a := dial(t, m, configsvc.Options{})
	b := dial(t, m, configsvc.Options{})
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

func TestRegisterEndsWithContext(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	s := dial(t, m, configsvc.Options{})
	rctx, cancel := context.WithCancel(context.Background())
	if err := s.Register(rctx, configsvc.ServerInfo{ID: "x", Site: "s"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, time.Second, "server present", func(tb *configsvc.Table) bool { _, ok := tb.Servers["x"]; return ok })
	cancel()
	waitFor(t, s, 5*time.Second, "server gone after ctx end", func(tb *configsvc.Table) bool { _, ok := tb.Servers["x"]; return !ok })
}

// A crashed server (no revoke) disappears when its membership lease expires.
func TestMemberLeaseExpiresAfterCrash(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	obs := dial(t, m, configsvc.Options{})
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.ClientEndpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := configsvc.NewEtcd(cli, configsvc.Options{MemberTTL: time.Second, RPCTimeout: time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Register(tctx(t), configsvc.ServerInfo{ID: "crashy", Site: "s"}); err != nil {
		t.Fatal(err)
	}
	// Outlive several TTLs while keep-alives run.
	time.Sleep(2 * time.Second)
	if tb, err := obs.Table(tctx(t)); err != nil || tb.Servers["crashy"].ID != "crashy" {
		t.Fatalf("server not kept alive: %v %+v", err, tb)
	}
	cli.Close() // "crash": the keep-alives stop, nothing is revoked
	start := time.Now()
	waitFor(t, obs, 10*time.Second, "crashed server to expire", func(tb *configsvc.Table) bool {
		_, ok := tb.Servers["crashy"]
		return !ok
	})
	t.Logf("expired after %v", time.Since(start))
}

// A server whose lease is lost (revoked behind its back) registers again.
func TestMemberReRegistersAfterLeaseLoss(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	s := dial(t, m, configsvc.Options{MemberTTL: 3 * time.Second})
	ctx := tctx(t)
	if err := s.Register(ctx, configsvc.ServerInfo{ID: "phoenix", Site: "s"}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Client().Get(ctx, "/wheelfs/servers/phoenix")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get: %v %v", err, resp)
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	if _, err := s.Client().Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, 10*time.Second, "re-registration", func(tb *configsvc.Table) bool {
		_, ok := tb.Servers["phoenix"]
		return ok
	})
	resp, err = s.Client().Get(ctx, "/wheelfs/servers/phoenix")
	if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) == lease {
		t.Fatalf("not re-registered under a new lease: %v %v", err, resp)
	}
}

func TestLockLifecycle(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	a := dial(t, m, configsvc.Options{})
	b := dial(t, m, configsvc.Options{})
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
	if err != nil || again != la {
		t.Fatalf("re-acquire: %+v %v (want %+v)", again, err, la)
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

func TestEpochIncreasesAcrossExpiry(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	o := configsvc.Options{LockTTL: time.Second}
	a := dial(t, m, o)
	b := dial(t, m, o)
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

func TestConcurrentAcquireOneWinner(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	s := dial(t, m, configsvc.Options{})
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

func TestWatch(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	s := dial(t, m, configsvc.Options{})
	w := dial(t, m, configsvc.Options{})
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

func TestWatchEndsOnClose(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	s := dial(t, m, configsvc.Options{})
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

func TestDeploymentIdempotent(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	a := dial(t, m, configsvc.Options{})
	b := dial(t, m, configsvc.Options{})
	other := dial(t, m, configsvc.Options{Prefix: "/other"})
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
func TestRenewAllSession(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	o := configsvc.Options{LockTTL: time.Second}
	a := dial(t, m, o)
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

// TestDialRefusedFailsFast checks that Dial answers at once, with
// ErrRefused and the endpoints, when nothing listens at any endpoint.
func TestDialRefusedFailsFast(t *testing.T) {
	var eps []string
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, l.Addr().String())
		l.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := configsvc.Dial(ctx, eps, nil, configsvc.Options{RPCTimeout: 10 * time.Second})
	if !errors.Is(err, configsvc.ErrRefused) || !strings.Contains(err.Error(), eps[0]+","+eps[1]) {
		t.Fatalf("Dial of refused endpoints: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Dial of refused endpoints took %v", d)
	}
}
