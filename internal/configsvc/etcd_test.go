package configsvc_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/coordinate"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/poll"
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
	var tb *configsvc.Table
	poll.Until(t, within, what, func() (err error) {
		if tb, err = s.Table(context.Background()); err == nil && !cond(tb) {
			err = errors.New("condition not met")
		}
		return err
	})
	return tb
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

// TestEtcd runs the Service conformance suite against etcd.
func TestEtcd(t *testing.T) {
	testService(t, func(t *testing.T) connector {
		m := startMember(t)
		return func(o configsvc.Options) configsvc.Service { return dial(t, m, o) }
	})
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

// A value set by UpdateServer survives the loss of the membership lease:
// the re-registration writes it, not the one first registered.
func TestUpdateServerSurvivesLeaseLoss(t *testing.T) {
	t.Parallel()
	m := startMember(t)
	s := dial(t, m, configsvc.Options{MemberTTL: 3 * time.Second})
	ctx := tctx(t)
	if err := s.Register(ctx, configsvc.ServerInfo{ID: "full", Site: "s"}); err != nil {
		t.Fatal(err)
	}
	full := configsvc.ServerInfo{ID: "full", Site: "s", Free: 1, Total: 2, Full: true}
	if err := s.UpdateServer(ctx, full); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Client().Get(ctx, "/wheelfs/servers/full")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get: %v %v", err, resp)
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	if _, err := s.Client().Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, 10*time.Second, "re-registration under a new lease", func(*configsvc.Table) bool {
		resp, err := s.Client().Get(ctx, "/wheelfs/servers/full")
		return err == nil && len(resp.Kvs) == 1 && clientv3.LeaseID(resp.Kvs[0].Lease) != lease
	})
	tb, err := s.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := tb.Servers["full"]; got != full {
		t.Errorf("re-registered as %+v, want %+v", got, full)
	}
}

// TestCoordUnmovedOnlyRenewed: a coordinate that did not move is not
// written again (no raft proposal), but its lease is renewed, so it stays
// past its TTL; one that moved is written.
func TestCoordUnmovedOnlyRenewed(t *testing.T) {
	m := startMember(t)
	a, b := dial(t, m, configsvc.Options{}), dial(t, m, configsvc.Options{})
	ctx := tctx(t)
	c := coordinate.NewCoordinate(coordinate.DefaultConfig())
	c.Vec[0] = 0.05
	publish := func(samples uint64) {
		t.Helper()
		if err := a.PublishCoord(ctx, configsvc.NodeCoord{ID: "n1", Site: "west", Coord: c, Samples: samples}, 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	samples := func() uint64 {
		t.Helper()
		got, err := b.Coords(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n, ok := got["n1"]
		if !ok {
			t.Fatal("coordinate of n1 gone")
		}
		return n.Samples
	}
	publish(1)
	for i := range 4 { // 3 s in all, longer than the 2 s lease
		time.Sleep(750 * time.Millisecond)
		c.Vec[0] += 0.0004 // 0.4 ms each, 1.6 ms in all
		publish(uint64(2 + i))
	}
	if got := samples(); got != 1 {
		t.Errorf("unmoved coordinate written again: samples %d, want the first write's 1", got)
	}
	c.Vec[0] += 0.01 // 10 ms
	publish(9)
	if got := samples(); got != 9 {
		t.Errorf("moved coordinate: samples %d, want 9", got)
	}
}
