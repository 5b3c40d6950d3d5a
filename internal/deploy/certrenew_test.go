package deploy

import (
	"context"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/pki"
)

// TestCertRenewerRefusesRevoked: a server signs a due renewal, but not
// for a node on its deny list (its handshake is refused too; this covers
// a call that raced with the revocation).
func TestCertRenewerRefusesRevoked(t *testing.T) {
	h := startHost(t, t.TempDir())
	defer h.Close()
	ca, err := pki.LoadCA(h.caKeyDir())
	if err != nil {
		t.Fatal(err)
	}
	ca.NodeValidity = 20 * time.Minute // due at once
	dir := t.TempDir()
	if err := ca.IssueNodeDir(dir, "cli-x", nil, nil); err != nil {
		t.Fatal(err)
	}
	creds, err := pki.LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	req, err := pki.NewRenewalRequest("cli-x")
	if err != nil {
		t.Fatal(err)
	}
	r := certRenewer{h}
	h.Creds.Deny.Set([]string{"cli-x"})
	if _, err := r.RenewCertificate(context.Background(), creds.Cert.Leaf, req.CSR, false); err == nil {
		t.Fatal("renewed a revoked node's certificate")
	}
	h.Creds.Deny.Set(nil)
	cert, err := r.RenewCertificate(context.Background(), creds.Cert.Leaf, req.CSR, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.Install(dir, cert); err != nil {
		t.Fatal(err)
	}
	if _, na, err := pki.Expiry(dir); err != nil || na.Before(time.Now().Add(300*24*time.Hour)) {
		t.Fatalf("renewed certificate expires %v, %v", na, err)
	}
}
