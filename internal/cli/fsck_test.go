package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/fsck"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
)

// TestFsckCommand runs `wheelfs fsck` against a one-host deployment:
// clean; a wrong link count reported with exit status 4 and left alone;
// --repair fixes it; clean again.
func TestFsckCommand(t *testing.T) {
	var data string
	h := deploytest.Start(t, func(c *deploy.Config) { data = c.DataDir })
	run := func(args ...string) (*fsck.Report, string, error) {
		t.Helper()
		root := newRoot()
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(append([]string{"fsck", "--data", data, "--settle", "100ms"}, args...))
		err := root.ExecuteContext(t.Context())
		if !hasArg(args, "--json") {
			return nil, out.String(), err
		}
		rep := &fsck.Report{}
		if jerr := json.Unmarshal(out.Bytes(), rep); jerr != nil {
			t.Fatalf("fsck --json printed %q: %v (stderr %q)", out.String(), jerr, errOut.String())
		}
		if !strings.Contains(errOut.String(), "fsck: scan") {
			t.Errorf("no progress on stderr: %q", errOut.String())
		}
		return rep, out.String(), err
	}
	rep, _, err := run("--json")
	if err != nil || len(rep.Findings) != 0 || rep.Servers != 1 || rep.Objects == 0 {
		t.Fatalf("fsck of a fresh deployment: %+v, %v", rep, err)
	}

	if err := h.Store.Update(t.Context(), func(tx *store.Tx) error {
		m, err := tx.Meta(oid.Root)
		if err != nil {
			return err
		}
		m.Nlink = 9
		return tx.PutMeta(m)
	}); err != nil {
		t.Fatal(err)
	}
	rep, _, err = run("--json")
	var ee exitError
	if !errors.As(err, &ee) || ee.code != fsckDamageLeft {
		t.Errorf("fsck with damage left: %v, want exit status %d", err, fsckDamageLeft)
	}
	if len(rep.Findings) != 1 || rep.Findings[0].Kind != fsck.LinkCount || rep.Findings[0].Nlink != 9 || rep.Findings[0].Repaired {
		t.Fatalf("findings %+v, want the root's link count, not repaired", rep.Findings)
	}

	_, out, err := run("--repair")
	if err != nil || !strings.Contains(out, "1 findings, all repaired") || !strings.Contains(out, "link-count") {
		t.Fatalf("fsck --repair: %v\n%s", err, out)
	}
	if _, out, err = run(); err != nil || !strings.Contains(out, "clean") {
		t.Fatalf("fsck after the repair: %v\n%s", err, out)
	}

	// A client node's credentials are refused: nothing is read, and the
	// report says so rather than "clean". The node has its etcd user (the
	// configuration service's authentication is on by default), so the
	// servers are the ones that refuse.
	ca, err := pki.LoadCA(filepath.Join(data, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	nodeDir := t.TempDir()
	if err := ca.IssueNodeDir(nodeDir, "cli-x", nil, nil); err != nil {
		t.Fatal(err)
	}
	admin, err := dialAdmin(t.Context(), &globalFlags{}, ca, h.ConfigEndpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.AddNodeUser(t.Context(), "cli-x", false); err != nil {
		t.Fatal(err)
	}
	rep, _, err = run("--json", "--node-dir", nodeDir)
	if !errors.As(err, &ee) || ee.code != fsckIncomplete || len(rep.Errors) == 0 || !strings.Contains(rep.Errors[0], "not a registered server") {
		t.Errorf("fsck as a client node: %v, errors %q; want exit status %d", err, rep.Errors, fsckIncomplete)
	}
}

func hasArg(args []string, s string) bool {
	for _, a := range args {
		if a == s {
			return true
		}
	}
	return false
}
