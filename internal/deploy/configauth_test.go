package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/poll"
)

// BenchmarkConfigRequest measures configuration-service round trips (a
// put and a linearizable get under the prefix; a get alone) from a host's own etcd
// client over mutual TLS, with etcd's authentication off and on (a user
// per certificate name: etcd then looks the user and its role's ranges
// up for every request).
//
//	go test ./internal/deploy -run '^$' -bench ConfigRequest -benchtime 3000x -count 3
func BenchmarkConfigRequest(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "auth=off"
		if on {
			name = "auth=on"
		}
		b.Run(name, func(b *testing.B) {
			h := deploytest.Start(b, func(c *deploy.Config) {
				c.ConfigAuth = map[bool]deploy.ConfigAuthMode{false: deploy.ConfigAuthOff, true: deploy.ConfigAuthOn}[on]
			})
			cli := h.Conf.(*configsvc.EtcdService).Client()
			ctx := context.Background()
			const key = "/wheelfs/bench"
			if _, err := cli.Put(ctx, key, "v"); err != nil {
				b.Fatal(err)
			}
			b.Run("put+get", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := cli.Put(ctx, key, "v"); err != nil {
						b.Fatal(err)
					}
					if _, err := cli.Get(ctx, key); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("get", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := cli.Get(ctx, key); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// TestRenewThroughServer (issue 13): a client-only host without the CA
// key whose certificate is in its last third of life gets a new one from
// a server that holds the key, installs it and presents it.
func TestRenewThroughServer(t *testing.T) {
	var data, cliData string
	deploytest.Start(t, func(c *deploy.Config) { data = c.DataDir })
	ca, err := pki.LoadCA(filepath.Join(data, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	ca.NodeValidity = 20 * time.Minute // 1h20m with the backdated hour: due at once
	issued := t.TempDir()
	if err := ca.IssueNodeDir(issued, "cli-renew", nil, nil); err != nil {
		t.Fatal(err)
	}
	old, err := pki.LoadCredentials(issued)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := os.ReadFile(deploy.EndpointsFile(data))
	if err != nil {
		t.Fatal(err)
	}
	endpoints := strings.Split(strings.TrimSpace(string(eps)), ",")
	addNodeUser(t, ca, endpoints, "cli-renew", false)
	cli := deploytest.Start(t, func(c *deploy.Config) {
		c.Roles, c.NodeDir, cliData = deploy.RoleClient, issued, c.DataDir
		c.Etcd = endpoints
	})
	poll.Until(t, 20*time.Second, "the client host's certificate renewed", func() error {
		if na := cli.Creds.Current().Leaf.NotAfter; !na.After(old.Cert.Leaf.NotAfter.Add(24 * time.Hour)) {
			return fmt.Errorf("certificate expires %v", na)
		}
		return nil
	})
	if _, na, err := pki.Expiry(filepath.Join(cliData, "node")); err != nil || na.Before(time.Now().Add(300*24*time.Hour)) {
		t.Fatalf("node directory's certificate: expires %v, %v", na, err)
	}

}

// addNodeUser adds the node's etcd user, as `wheelfs ca issue --config`
// does.
func addNodeUser(t *testing.T, ca *pki.CA, endpoints []string, name string, server bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	root, err := ca.RootCredentials()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := configsvc.Dial(ctx, endpoints, root.ClientTLS(""), configsvc.Options{OneShot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.AddNodeUser(ctx, name, server); err != nil {
		t.Fatal(err)
	}
}

// TestConfigAuthHosts: a deployment created with auth on (the default)
// restarts with the explicit opt-out (auth stays on, the host re-adds its
// own user); a
// client host whose node has no etcd user fails to start at once, saying
// why, and starts once `ca issue --config` (AddNodeUser) gave it one.
func TestConfigAuthHosts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := deploy.NewConfig(dir)
	cfg.Logger = slog.New(slog.DiscardHandler)
	h, err := deploy.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	cfg.ConfigAuth = deploy.ConfigAuthOff
	h, err = deploy.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer h.Close()
	if _, err := h.Conf.Table(ctx); err != nil {
		t.Fatalf("after the restart: %v", err)
	}

	ca, err := pki.LoadCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	issued := t.TempDir()
	if err := ca.IssueNodeDir(issued, "cli-late", nil, nil); err != nil {
		t.Fatal(err)
	}
	eps, err := os.ReadFile(deploy.EndpointsFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	ccfg := deploy.NewConfig(t.TempDir())
	ccfg.Roles, ccfg.NodeDir, ccfg.Logger = deploy.RoleClient, issued, cfg.Logger
	ccfg.Etcd = strings.Split(strings.TrimSpace(string(eps)), ",")
	began := time.Now()
	if c, err := deploy.Start(ctx, ccfg); err == nil {
		c.Close()
		t.Fatal("a node without an etcd user started")
	} else if !errors.Is(err, configsvc.ErrNoUser) {
		t.Fatalf("start without an etcd user: %v, want ErrNoUser", err)
	}
	if took := time.Since(began); took > 5*time.Second { // not the 30 s ConfigWait

		t.Errorf("refusal took %v", took)
	}
	addNodeUser(t, ca, ccfg.Etcd, "cli-late", false)
	c, err := deploy.Start(ctx, ccfg)
	if err != nil {
		t.Fatalf("start with an etcd user: %v", err)
	}
	c.Close()
}

// TestConfigAuthDefault: the configuration service's authentication is on
// by default only in a new deployment. A deployment created without it
// (before it was the default, here with the opt-out) keeps running as it
// was when its hosts restart with the default — a client host issued
// without an etcd user still starts — until an operator turns it on
// (ConfigAuthOn, `--config-auth`).
func TestConfigAuthDefault(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	authOn := func(h *deploy.Host) bool {
		t.Helper()
		on, err := h.Conf.(*configsvc.EtcdService).AuthEnabled(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	if h := deploytest.Start(t, nil); !authOn(h) {
		t.Fatal("a new deployment with the default: authentication off")
	}

	dir := t.TempDir()
	cfg := deploy.NewConfig(dir)
	cfg.Logger, cfg.ConfigAuth = slog.New(slog.DiscardHandler), deploy.ConfigAuthOff
	h, err := deploy.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if authOn(h) {
		t.Fatal("authentication on despite the opt-out")
	}
	h.Close()
	cfg.ConfigAuth = deploy.ConfigAuthNew
	if h, err = deploy.Start(ctx, cfg); err != nil {
		t.Fatalf("restart with the default: %v", err)
	}
	if authOn(h) {
		t.Fatal("the default turned authentication on in an existing deployment")
	}
	ca, err := pki.LoadCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	issued := t.TempDir()
	if err := ca.IssueNodeDir(issued, "cli-old", nil, nil); err != nil {
		t.Fatal(err)
	}
	ccfg := deploy.NewConfig(t.TempDir())
	ccfg.Roles, ccfg.NodeDir, ccfg.Logger, ccfg.Etcd = deploy.RoleClient, issued, cfg.Logger, h.ConfigEndpoints()
	c, err := deploy.Start(ctx, ccfg)
	if err != nil {
		t.Fatalf("a client host without an etcd user in an existing deployment: %v", err)
	}
	c.Close()
	h.Close()

	cfg.ConfigAuth = deploy.ConfigAuthOn
	if h, err = deploy.Start(ctx, cfg); err != nil {
		t.Fatalf("restart with --config-auth: %v", err)
	}
	defer h.Close()
	if !authOn(h) {
		t.Fatal("--config-auth did not turn authentication on")
	}
}

// TestServerRoleUpgrade: a server host holding the CA key whose
// certificate predates roles (none) gets one with the server role at
// start, same name, so it can sign sessions.
func TestServerRoleUpgrade(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := deploy.NewConfig(dir)
	cfg.Logger = slog.New(slog.DiscardHandler)
	h, err := deploy.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	name := h.Creds.Name
	if !h.Creds.IsServer() {
		t.Fatal("a new server's certificate lacks the server role")
	}
	h.Close()
	ca, err := pki.LoadCA(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	nd := filepath.Join(dir, "node")
	old, err := pki.LoadCredentials(nd)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueNodeDir(nd, name, old.Cert.Leaf.DNSNames, old.Cert.Leaf.IPAddresses); err != nil {
		t.Fatal(err)
	}
	if legacy, err := pki.LoadCredentials(nd); err != nil || legacy.IsServer() {
		t.Fatalf("the legacy certificate: server role %v, %v", legacy != nil && legacy.IsServer(), err)
	}
	if h, err = deploy.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !h.Creds.IsServer() || h.Creds.Name != name {
		t.Fatalf("after the restart: %q, server role %v", h.Creds.Name, h.Creds.IsServer())
	}
}

// TestEnableAuthConcurrent: the hosts of a new deployment that hold the
// CA key all turn the configuration service's authentication on as they
// start, at the same moment, and one may have stopped halfway (the root
// user added, not yet its role, which etcd needs to turn auth on): each
// succeeds. The README's three members and three nodes failed so.
func TestEnableAuthConcurrent(t *testing.T) {
	var data string
	h := deploytest.Start(t, func(c *deploy.Config) { data, c.ConfigAuth = c.DataDir, deploy.ConfigAuthOff })
	ca, err := pki.LoadCA(filepath.Join(data, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	root, err := ca.RootCredentials()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	admins := make([]*configsvc.EtcdService, 3)
	for i := range admins {
		if admins[i], err = configsvc.Dial(ctx, h.ConfigEndpoints(), root.ClientTLS(""), configsvc.Options{OneShot: true}); err != nil {
			t.Fatal(err)
		}
		defer admins[i].Close()
	}
	if _, err := admins[0].Client().UserAddWithOptions(ctx, "root", "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, len(admins))
	for i, a := range admins {
		go func() { errs <- a.EnableAuth(ctx, fmt.Sprintf("srv-%d", i)) }()
	}
	for range admins {
		if err := <-errs; err != nil {
			t.Errorf("EnableAuth: %v", err)
		}
	}
	if on, err := admins[0].AuthEnabled(ctx); err != nil || !on {
		t.Fatalf("auth on: %v, %v", on, err)
	}
}
