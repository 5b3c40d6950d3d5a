package deploy

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/transport"
)

// startRole starts a host with the given roles against the configuration
// service of cfgHost, issuing its certificate from cfgHost's CA.
func startRole(t *testing.T, ctx context.Context, cfgHost *Host, roles Roles, site string, adjust func(*Config)) *Host {
	t.Helper()
	cfg := NewConfig(t.TempDir())
	cfg.Logger = testLogger(t)
	cfg.LockTTL = 5 * time.Second
	cfg.Roles, cfg.Site, cfg.InitCA = roles, site, false
	cfg.Etcd = cfgHost.ConfigEndpoints()
	cfg.CADir = cfgHost.caDir()
	if adjust != nil {
		adjust(&cfg)
	}
	h, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start %v host: %v", roles, err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func startMemberHost(t *testing.T, ctx context.Context) *Host {
	t.Helper()
	cfg := NewConfig(t.TempDir())
	cfg.Logger = testLogger(t)
	cfg.Roles = RoleMember
	h, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start member: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestServerOnlyAndClientOnlyHosts runs the three roles on three hosts: a
// config member, a storage server without a client, and a client without a
// server that reads and writes through the server, over a shaped network.
func TestServerOnlyAndClientOnlyHosts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	member := startMemberHost(t, ctx)
	if member.Store != nil || member.Client != nil || member.Router != nil {
		t.Fatal("a member-only host runs more than a member")
	}
	net := transport.NewNetwork()
	withNet := func(c *Config) { c.Network = net }
	// The client-only host acts for the test's uid without a login.
	srv := startRole(t, ctx, member, RoleServer, "west", func(c *Config) { c.Network, c.TrustClientUIDs = net, true })
	if srv.Client != nil || srv.Server == nil || srv.Router == nil {
		t.Fatal("server-only host: wrong pieces")
	}
	cli := startRole(t, ctx, member, RoleClient, "east", withNet)
	if cli.Store != nil || cli.Server != nil || cli.Client == nil {
		t.Fatal("client-only host: wrong pieces")
	}
	if !strings.HasPrefix(cli.ServerID(), "cli-") || !strings.HasPrefix(srv.ServerID(), "srv-") {
		t.Errorf("IDs %s, %s", cli.ServerID(), srv.ServerID())
	}
	data := bytes.Repeat([]byte("through the server "), 10000)
	if _, err := cli.Client.Mkdir(ctx, root, "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cli.Client.WriteFile(ctx, root, "/d/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	other := startRole(t, ctx, member, RoleClient, "eu", withNet)
	if got, err := other.Client.ReadFile(ctx, root, "/d/f"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("second client read %d bytes, %v", len(got), err)
	}

	// Pause: the server stops answering until resumed or the deadline.
	// The file is one the reader has nothing of under a lease (a leased,
	// cached file is read without the server).
	if err := cli.Client.WriteFile(ctx, root, "/d/g", data, 0o644); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := other.Client.ReadFile(pctx, root, "/d/g")
	pcancel()
	if err == nil {
		t.Fatal("a paused server answered")
	}
	srv.Resume()
	if got, err := other.Client.ReadFile(ctx, root, "/d/f"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after resume: %d bytes, %v", len(got), err)
	}

	// Partition the client's site from the server's: calls fail.
	net.Partition("eu", "west")
	pctx, pcancel = context.WithTimeout(ctx, 2*time.Second)
	_, err = other.Client.ReadFile(pctx, root, "/d/f2")
	pcancel()
	if err == nil {
		t.Fatal("a partitioned client reached the server")
	}
	net.Heal("eu", "west")

	// A data directory of a server at another site is refused.
	srvDir := srv.cfg.DataDir
	srv.Close()
	cfg := srv.cfg
	cfg.Site = "east"
	if _, err := Start(ctx, cfg); err == nil || !strings.Contains(err.Error(), `site "west"`) {
		t.Fatalf("restart at another site: %v", err)
	}
	_ = srvDir
}

// TestCrashAndRestart checks that a crashed server's registration expires
// on its own and that Start on the same directory brings it back.
func TestCrashAndRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	member := startMemberHost(t, ctx)
	srv := startRole(t, ctx, member, RoleServer|RoleClient, "west", nil)
	if err := srv.Client.WriteFile(ctx, root, "/kept", []byte("durable"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := srv.ServerID()
	srv.Crash()
	tbl, err := member.Conf.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tbl.Servers[id]; !ok {
		t.Fatal("a crashed server's registration was revoked (Abandon must leave the lease to expire)")
	}
	h, err := Start(ctx, srv.cfg)
	if err != nil {
		t.Fatalf("restart after crash: %v", err)
	}
	defer h.Close()
	if h.ServerID() != id {
		t.Fatalf("restarted as %s, was %s", h.ServerID(), id)
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	for {
		got, err := h.Client.ReadFile(rctx, root, "/kept")
		if err == nil && string(got) == "durable" {
			break
		}
		if rctx.Err() != nil {
			t.Fatalf("read after restart: %q, %v", got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNoCredentials checks the error for a node without CA or node dir.
func TestNoCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	member := startMemberHost(t, ctx)
	cfg := NewConfig(t.TempDir())
	cfg.Logger = testLogger(t)
	cfg.Roles = RoleServer
	cfg.Etcd = member.ConfigEndpoints()
	if _, err := Start(ctx, cfg); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("start without credentials: %v", err)
	}
	cfg.Etcd = nil
	if _, err := Start(ctx, cfg); err == nil || !strings.Contains(err.Error(), "no configuration service") {
		t.Fatalf("start without endpoints: %v", err)
	}
}

// TestPreIssuedNodeDir starts a server from a node directory issued
// elsewhere, as `wheelfs ca issue --server --config` does (the member
// created the deployment with the configuration service's authentication
// on, the default): its ID is the certificate's name, and it may sign
// sessions.
func TestPreIssuedNodeDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	member := startMemberHost(t, ctx)
	ca, err := loadCA(member.caDir())
	if err != nil {
		t.Fatal(err)
	}
	nd := filepath.Join(t.TempDir(), "srv-issued")
	ca.Server = true
	if err := ca.IssueNodeDir(nd, "srv-issued", nil, nil); err != nil {
		t.Fatal(err)
	}
	if member.admin == nil {
		t.Fatal("the member that created the deployment did not turn on the configuration service's authentication")
	}
	if err := member.admin.AddNodeUser(ctx, "srv-issued", true); err != nil {
		t.Fatal(err)
	}
	h := startRole(t, ctx, member, RoleServer|RoleClient, "west", func(c *Config) { c.CADir, c.NodeDir = "", nd })
	if h.ServerID() != "srv-issued" {
		t.Fatalf("ID %s", h.ServerID())
	}
	if !h.Creds.IsServer() {
		t.Fatal("the issued server's certificate lacks the server role")
	}
	if err := h.Client.WriteFile(ctx, root, "/x", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestJoinThreeMembers forms a three-member configuration service by
// joining (MemberAdd + initial-cluster-state existing), checks Members and
// the leader, and restarts a joined member on its data directory.
func TestJoinThreeMembers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := func(dir string, join []string, caDir string) *Host {
		t.Helper()
		addr, err := embedded.FreeAddr("")
		if err != nil {
			t.Fatal(err)
		}
		peer, err := embedded.FreeAddr("")
		if err != nil {
			t.Fatal(err)
		}
		cfg := NewConfig(dir)
		cfg.Logger = testLogger(t)
		cfg.Roles, cfg.CADir = RoleMember, caDir
		cfg.Member = MemberConfig{Listen: addr, PeerListen: peer, Join: join}
		h, err := Start(ctx, cfg)
		if err != nil {
			t.Fatalf("start member in %s: %v", dir, err)
		}
		return h
	}
	d1, d2, d3 := t.TempDir(), t.TempDir(), t.TempDir()
	m1 := start(d1, nil, "")
	defer func() { m1.Close() }()
	ca := m1.caDir()
	m2 := start(d2, m1.ConfigEndpoints(), ca)
	defer func() { m2.Close() }()
	m3 := start(d3, m2.ConfigEndpoints(), ca) // join through any member
	defer func() { m3.Close() }()

	members, err := m3.Conf.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leaders := 0
	for _, m := range members {
		if m.Leader {
			leaders++
		}
		if !m.Reachable || len(m.ClientURLs) == 0 {
			t.Errorf("member %+v not serving", m)
		}
	}
	if len(members) != 3 || leaders != 1 {
		t.Fatalf("members = %+v", members)
	}
	if m1.Deployment() != m3.Deployment() {
		t.Fatal("joined member serves another deployment")
	}

	// A restart of a joined member on its data directory only restarts it.
	m2.Close()
	m2 = start(d2, m1.ConfigEndpoints(), "")
	if members, err := m2.Conf.Members(ctx); err != nil || len(members) != 3 {
		t.Fatalf("after restart: %+v, %v", members, err)
	}
	// Writes survive the loss of one member (quorum 2 of 3).
	m3.Close()
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	if _, err := m1.Conf.Deployment(cctx); err != nil {
		t.Fatalf("deployment with 2 of 3 members: %v", err)
	}
	var _ configsvc.Service = m1.Conf
}

func loadCA(dir string) (*pki.CA, error) { return pki.LoadCA(dir) }

// TestJoinConcurrently starts two joining members at once: joins are
// serialized (an unstarted member has no name for the initial cluster).
func TestJoinConcurrently(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	first := startMemberHost(t, ctx)
	errs := make(chan error, 2)
	hosts := make(chan *Host, 2)
	for range 2 {
		cfg := NewConfig(t.TempDir())
		cfg.Logger = testLogger(t)
		cfg.Roles, cfg.CADir = RoleMember, first.caDir()
		addr, err := embedded.FreeAddr("")
		if err != nil {
			t.Fatal(err)
		}
		peer, err := embedded.FreeAddr("")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Member = MemberConfig{Listen: addr, PeerListen: peer, Join: first.ConfigEndpoints()}
		go func() {
			h, err := Start(ctx, cfg)
			if err == nil {
				hosts <- h
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent join: %v", err)
		}
	}
	close(hosts)
	for h := range hosts {
		defer h.Close()
	}
	members, err := first.Conf.Members(ctx)
	if err != nil || len(members) != 3 {
		t.Fatalf("members = %+v, %v", members, err)
	}
	for _, m := range members {
		if m.Name == "" || !m.Reachable {
			t.Errorf("member %+v not started", m)
		}
	}
}
