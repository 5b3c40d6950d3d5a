package cli

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/pki"
)

// TestCacheFlags checks how --cache-mem, --cache-disk and --cache-dir
// become the client's cache configuration.
func TestCacheFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		mem, disk int64
		dir       string
		bad       bool
	}{
		{args: nil, mem: 100 << 20, disk: 4 << 30, dir: "/d/cache"},
		{args: []string{"--cache-mem", "1GiB", "--cache-disk", "10GiB", "--cache-dir", "/c"}, mem: 1 << 30, disk: 10 << 30, dir: "/c"},
		{args: []string{"--cache-disk", "0"}, mem: 100 << 20, disk: 0, dir: ""},
		{args: []string{"--cache-mem", "0"}, bad: true},
		{args: []string{"--cache-disk", "lots"}, bad: true},
	} {
		f := &hostFlags{data: "/d"}
		cmd := &cobra.Command{}
		f.register(cmd, deploy.RoleClient)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg := deploy.NewConfig(f.data)
		err := f.cacheConfig(&cfg)
		if tc.bad {
			if err == nil {
				t.Errorf("%v: accepted", tc.args)
			}
			continue
		}
		c := cfg.Client
		if err != nil || c.CacheBytes != tc.mem || c.DiskCacheBytes != tc.disk || c.CacheDir != tc.dir {
			t.Errorf("%v: mem %d disk %d dir %q (%v), want %d %d %q", tc.args, c.CacheBytes, c.DiskCacheBytes, c.CacheDir, err, tc.mem, tc.disk, tc.dir)
		}
	}
}

// TestConfigAuthFlag: --config-auth is on by default for new deployments
// only (deploy.ConfigAuthNew); given, it turns auth on in an existing
// one; =false opts out, as does an etcd that is not WheelFS's own unless
// the flag is given.
func TestConfigAuthFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want deploy.ConfigAuthMode
	}{
		{nil, deploy.ConfigAuthNew},
		{[]string{"--config-auth"}, deploy.ConfigAuthOn},
		{[]string{"--config-auth=false"}, deploy.ConfigAuthOff},
		{[]string{"--etcd", "127.0.0.1:2379"}, deploy.ConfigAuthOff},
		{[]string{"--etcd", "127.0.0.1:2379", "--config-auth"}, deploy.ConfigAuthOn},
	} {
		f := &hostFlags{data: t.TempDir()}
		cmd := &cobra.Command{Use: "server"}
		f.register(cmd, deploy.RoleServer)
		args := tc.args
		if !slices.Contains(args, "--etcd") {
			args = append(args, "--config", "127.0.0.1:7001")
		}
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.deployConfig(&globalFlags{}, deploy.RoleServer)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if cfg.ConfigAuth != tc.want {
			t.Errorf("%v: ConfigAuth %v, want %v", tc.args, cfg.ConfigAuth, tc.want)
		}
	}
}

// TestCAIssueServerRole: `ca issue --server` gives the certificate the
// server role, a plain issue does not, and --renew keeps what it had.
func TestCAIssueServerRole(t *testing.T) {
	caDir := filepath.Join(t.TempDir(), "ca")
	run := func(args ...string) {
		t.Helper()
		root := newRoot()
		root.SetArgs(args)
		if err := root.ExecuteContext(t.Context()); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	isServer := func(dir string) bool {
		t.Helper()
		c, err := pki.LoadCredentials(dir)
		if err != nil {
			t.Fatal(err)
		}
		return c.IsServer()
	}
	run("ca", "init", caDir)
	srv, cli := filepath.Join(t.TempDir(), "srv"), filepath.Join(t.TempDir(), "cli")
	run("ca", "issue", "--ca", caDir, "--name", "srv-1", "--out", srv, "--server")
	run("ca", "issue", "--ca", caDir, "--name", "cli-1", "--out", cli)
	if !isServer(srv) || isServer(cli) {
		t.Fatalf("issued: server %v, client %v", isServer(srv), isServer(cli))
	}
	run("ca", "issue", "--ca", caDir, "--renew", "--out", srv)
	run("ca", "issue", "--ca", caDir, "--renew", "--out", cli)
	if !isServer(srv) || isServer(cli) {
		t.Fatalf("renewed: server %v, client %v", isServer(srv), isServer(cli))
	}
	run("ca", "issue", "--ca", caDir, "--renew", "--server", "--out", cli)
	if !isServer(cli) {
		t.Fatal("--renew --server did not add the role")
	}
}
