package deploy

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/pki"
)

// TestHostLoadsReissuedCertificate: a host picks up node credentials
// re-issued into its node directory (`wheelfs ca issue --renew`) at its
// next certificate check, and presents them on new connections.
func TestHostLoadsReissuedCertificate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := NewConfig(t.TempDir())
	cfg.Logger = testLogger(t)
	cfg.CertCheckPeriod = 20 * time.Millisecond
	h, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	old := h.Creds.Current().Leaf
	ca, err := pki.LoadCA(filepath.Join(cfg.DataDir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	// As `ca issue --renew` does: the same role. (Without it the host's
	// renewal check re-issued at once to restore the server role, with
	// the usual validity: within the same second as the original, so
	// never "after" it.)
	ca.NodeValidity, ca.Server = 2*pki.DefaultNodeValidity, pki.HasServerRole(old)
	if err := ca.IssueNodeDir(h.nodeDir(), h.Creds.Name, old.DNSNames, old.IPAddresses); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-issued certificate loaded", 5*time.Second, func() bool {
		return h.Creds.Current().Leaf.NotAfter.After(old.NotAfter)
	})
	peer := t.TempDir()
	if err := ca.IssueNodeDir(peer, "peer", nil, nil); err != nil {
		t.Fatal(err)
	}
	pc, err := pki.LoadCredentials(peer)
	if err != nil {
		t.Fatal(err)
	}
	// A TLS client sees the new certificate.
	cc := pc.ClientTLS(h.Creds.Name)
	cc.NextProtos = []string{"h2"} // gRPC's server insists on ALPN
	d := tls.Dialer{Config: cc}
	c, err := d.DialContext(ctx, "tcp", h.listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := c.(*tls.Conn).ConnectionState().PeerCertificates[0]
	if !got.NotAfter.Equal(h.Creds.Current().Leaf.NotAfter) {
		t.Fatalf("the server presents a certificate until %v, want the re-issued one", got.NotAfter)
	}
}
