package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/poll"
)

// TestCARevoke: `wheelfs ca revoke` puts a node on the deny list the
// running host follows, --undo takes it off, and the command will not
// revoke the node whose credentials it runs with.
func TestCARevoke(t *testing.T) {
	var data string
	h := deploytest.Start(t, func(c *deploy.Config) { data = c.DataDir })
	run := func(args ...string) error {
		root := newRoot()
		root.SetArgs(args)
		return root.ExecuteContext(t.Context())
	}
	denied := func(want bool) func() error {
		return func() error {
			if h.Creds.Deny.Denied("cli-x") != want {
				return errors.New("not yet")
			}
			return nil
		}
	}
	if err := run("ca", "revoke", "cli-x", "--data", data, "--reason", "lost laptop"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the host refuses cli-x", denied(true))
	if err := run("ca", "revoke", "--list", "--data", data); err != nil {
		t.Fatal(err)
	}
	if err := run("ca", "revoke", "--undo", "cli-x", "--data", data); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the host admits cli-x again", denied(false))
	if err := run("ca", "revoke", h.Creds.Name, "--data", data); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Fatalf("revoking the command's own node: %v", err)
	}
}

// TestWarnExpiry: status warns only once a third of the certificate's
// lifetime is left.
func TestWarnExpiry(t *testing.T) {
	ca, err := pki.InitCA(filepath.Join(t.TempDir(), "ca"), "test")
	if err != nil {
		t.Fatal(err)
	}
	ca.NodeValidity = 5 * time.Hour // 6 h with the backdated hour
	dir := t.TempDir()
	if err := ca.IssueNodeDir(dir, "n1", nil, nil); err != nil {
		t.Fatal(err)
	}
	creds, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, tc := range []struct {
		at   time.Duration
		want string
	}{
		{time.Hour, ""},
		{4 * time.Hour, "expires"},
		{6 * time.Hour, "expired"},
	} {
		var b bytes.Buffer
		warnExpiry(&b, creds, now.Add(tc.at))
		if got := b.String(); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("at +%v: %q, want %q", tc.at, got, tc.want)
		}
	}
}

// TestCARevokeConfigAuth: on a new one-host deployment, where the
// configuration service's authentication is on by default, a node issued
// without --config has no etcd user and is refused by etcd; `ca issue
// --config` lets it in; `ca revoke --ca` shuts it out of etcd at once,
// and --undo lets it back.
func TestCARevokeConfigAuth(t *testing.T) {
	var data string
	deploytest.Start(t, func(c *deploy.Config) { data = c.DataDir })
	run := func(args ...string) error {
		root := newRoot()
		root.SetArgs(args)
		return root.ExecuteContext(t.Context())
	}
	b, err := os.ReadFile(deploy.EndpointsFile(data))
	if err != nil {
		t.Fatal(err)
	}
	endpoints := strings.TrimSpace(string(b))
	caDir := filepath.Join(data, "ca")
	// reads reports whether node dir's etcd client may read the service.
	reads := func(dir string) error {
		creds, err := pki.LoadCredentials(dir)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		conf, err := configsvc.Dial(ctx, splitList(endpoints), creds.ClientTLS(""), configsvc.Options{OneShot: true, RPCTimeout: 2 * time.Second})
		if err != nil {
			return err
		}
		defer conf.Close()
		_, err = conf.Table(ctx)
		return err
	}

	stray := filepath.Join(t.TempDir(), "stray")
	if err := run("ca", "issue", "--ca", caDir, "--name", "cli-stray", "--out", stray); err != nil {
		t.Fatal(err)
	}
	if err := reads(stray); err == nil {
		t.Fatal("a node without an etcd user reads the configuration service")
	}
	x := filepath.Join(t.TempDir(), "x")
	if err := run("ca", "issue", "--ca", caDir, "--name", "cli-x", "--out", x, "--config", endpoints); err != nil {
		t.Fatal(err)
	}
	if err := reads(x); err != nil {
		t.Fatalf("a node issued with --config: %v", err)
	}
	if err := run("ca", "revoke", "cli-x", "--ca", caDir, "--data", data); err != nil {
		t.Fatal(err)
	}
	if err := reads(x); err == nil || !strings.Contains(err.Error(), "user name not found") && !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("the revoked node's read: %v, want etcd's refusal", err)
	}
	if err := run("ca", "revoke", "--undo", "cli-x", "--ca", caDir, "--data", data); err != nil {
		t.Fatal(err)
	}
	if err := reads(x); err != nil {
		t.Fatalf("after --undo: %v", err)
	}
}
