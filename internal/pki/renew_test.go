package pki

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSignRenewal: a server holding the CA key renews a node's
// certificate for a fresh key only once it is due, keeps the name and
// addresses of the current certificate whatever the request asks, and
// refuses certificates of another CA; the node installs and loads it.
func TestSignRenewal(t *testing.T) {
	ca, err := InitCA(filepath.Join(t.TempDir(), "ca"), "test")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *CA, validity time.Duration) string {
		dir := t.TempDir()
		ca.NodeValidity = validity
		if err := ca.IssueNodeDir(dir, "cli-r", []string{"laptop.example"}, nil); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	leaf := func(dir string) *Credentials {
		c, err := LoadCredentials(dir)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// A request that asks for another name: ignored.
	req, err := NewRenewalRequest("cli-other")
	if err != nil {
		t.Fatal(err)
	}
	ca.NodeValidity = 365 * 24 * time.Hour
	fresh := leaf(issue(ca, 24*time.Hour))
	if _, err := ca.SignRenewal(fresh.Cert.Leaf, req.CSR, time.Now(), false); err == nil || !strings.Contains(err.Error(), "not due") {
		t.Fatalf("renewal of a fresh certificate: %v", err)
	}
	other, err := InitCA(filepath.Join(t.TempDir(), "ca2"), "other")
	if err != nil {
		t.Fatal(err)
	}
	foreign := leaf(issue(other, 20*time.Minute))
	ca.NodeValidity = 365 * 24 * time.Hour
	if _, err := ca.SignRenewal(foreign.Cert.Leaf, req.CSR, time.Now(), false); err == nil {
		t.Fatal("renewed a certificate of another CA")
	}

	dir := issue(ca, 20*time.Minute) // 1h20m with the backdated hour: due
	due := leaf(dir)
	ca.NodeValidity = 365 * 24 * time.Hour
	certPEM, err := ca.SignRenewal(due.Cert.Leaf, req.CSR, time.Now(), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Install(dir, certPEM); err != nil {
		t.Fatal(err)
	}
	got := leaf(dir)
	if got.Name != "cli-r" || !strings.Contains(strings.Join(got.Cert.Leaf.DNSNames, ","), "laptop.example") {
		t.Fatalf("renewed certificate: name %q, DNS names %v", got.Name, got.Cert.Leaf.DNSNames)
	}
	if !got.Cert.Leaf.NotAfter.After(due.Cert.Leaf.NotAfter.Add(300 * 24 * time.Hour)) {
		t.Fatalf("renewed certificate expires %v", got.Cert.Leaf.NotAfter)
	}
	if err := due.Reload(dir); err != nil {
		t.Fatalf("reload: %v", err)
	}
	// A certificate signed for another key does not install.
	req2, err := NewRenewalRequest("cli-r")
	if err != nil {
		t.Fatal(err)
	}
	if err := req2.Install(dir, certPEM); err == nil {
		t.Fatal("installed a certificate for another key")
	}
}
