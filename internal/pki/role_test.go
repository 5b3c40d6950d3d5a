package pki

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestServerRole: only certificates issued for servers carry the role
// (EnsureNode, IssueNodeDir with CA.Server), the administrator's never;
// a renewal keeps it, whether the CA's holder renews (Renew, which also
// adds it to a server's certificate issued before roles) or a server
// signs a node's request (SignRenewal, from the presented certificate).
func TestServerRole(t *testing.T) {
	ca, caDir := newCA(t)
	srvDir, cliDir := filepath.Join(t.TempDir(), "srv"), filepath.Join(t.TempDir(), "cli")
	srv, err := EnsureNode(caDir, srvDir, "srv", true, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := EnsureNode(caDir, cliDir, "cli", false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	root, err := ca.RootCredentials()
	if err != nil {
		t.Fatal(err)
	}
	if !srv.IsServer() || cli.IsServer() || root.IsServer() {
		t.Fatalf("server role: server %v, client %v, root %v", srv.IsServer(), cli.IsServer(), root.IsServer())
	}

	// The CA's holder renews: the role follows what the host runs now —
	// a host that stopped running a server loses it at once, one that
	// started gets it at once, a due renewal keeps it.
	now := time.Now()
	for _, tc := range []struct {
		dir    string
		server bool
		at     time.Time
		did    bool
		want   bool
	}{
		{srvDir, true, now.Add(300 * 24 * time.Hour), true, true},
		{srvDir, false, now, true, false},
		{cliDir, false, now.Add(300 * 24 * time.Hour), true, false},
		{cliDir, true, now, true, true},
		{cliDir, true, now, false, true},
	} {
		did, err := Renew(caDir, tc.dir, tc.server, 0, tc.at)
		if err != nil || did != tc.did {
			t.Fatalf("Renew(%s, server=%v): %v, %v; want %v", tc.dir, tc.server, did, err, tc.did)
		}
		c, err := LoadCredentials(tc.dir)
		if err != nil {
			t.Fatal(err)
		}
		if c.IsServer() != tc.want {
			t.Errorf("after Renew(%s, server=%v): server role %v, want %v", tc.dir, tc.server, c.IsServer(), tc.want)
		}
	}

	// A server renews a node's certificate: the role comes from the
	// presented certificate, and the request can give it up, never add it.
	ca.NodeValidity = 20 * time.Minute
	for _, tc := range []struct{ server, drop bool }{{false, false}, {true, false}, {true, true}, {false, true}} {
		server := tc.server
		dir := t.TempDir()
		c := *ca
		c.Server = server
		if err := c.IssueNodeDir(dir, "n", nil, nil); err != nil {
			t.Fatal(err)
		}
		cur, err := LoadCredentials(dir)
		if err != nil {
			t.Fatal(err)
		}
		req, err := NewRenewalRequest("n")
		if err != nil {
			t.Fatal(err)
		}
		signer := *ca
		signer.Server = !server // the signing CA's setting is not used
		certPEM, err := signer.SignRenewal(cur.Cert.Leaf, req.CSR, time.Now(), tc.drop)
		if err != nil {
			t.Fatal(err)
		}
		if err := req.Install(dir, certPEM); err != nil {
			t.Fatal(err)
		}
		renewed, err := LoadCredentials(dir)
		if err != nil {
			t.Fatal(err)
		}
		if want := server && !tc.drop; renewed.IsServer() != want {
			t.Errorf("SignRenewal of a certificate with server role %v, dropping it %v: role %v, want %v",
				server, tc.drop, renewed.IsServer(), want)
		}
	}
}

// TestServerSignature: a server's signature verifies at another node of
// the deployment; a client's certificate cannot sign, a foreign CA's
// server, a revoked server, another payload and a mangled signature do
// not verify.
func TestServerSignature(t *testing.T) {
	_, caDir := newCA(t)
	_, otherDir := newCA(t)
	srv, err := EnsureNode(caDir, filepath.Join(t.TempDir(), "srv"), "srv", true, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := EnsureNode(caDir, filepath.Join(t.TempDir(), "v"), "v", false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := EnsureNode(otherDir, filepath.Join(t.TempDir(), "f"), "srv", true, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte("test-v1\x00payload")
	cert, sig, err := srv.SignAsServer(payload)
	if err != nil {
		t.Fatal(err)
	}
	if name, err := verifier.VerifyServerSignature(cert, payload, sig); err != nil || name != "srv" {
		t.Fatalf("a server's signature: %q, %v", name, err)
	}
	cli := newNode(t, caDir, "cli")
	if _, _, err := cli.SignAsServer(payload); !errors.Is(err, ErrNotServer) {
		t.Errorf("a client certificate signs: %v", err)
	}
	fcert, fsig, err := foreign.SignAsServer(payload)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte{}, sig...)
	bad[len(bad)-1] ^= 1
	for what, c := range map[string]struct{ cert, payload, sig []byte }{
		"another CA's server": {fcert, payload, fsig},
		"another payload":     {cert, []byte("test-v1\x00other"), sig},
		"a mangled signature": {cert, payload, bad},
		"no certificate":      {nil, payload, sig},
	} {
		if _, err := verifier.VerifyServerSignature(c.cert, c.payload, c.sig); err == nil {
			t.Errorf("%s verifies", what)
		}
	}
	verifier.Deny.Set([]string{"srv"})
	if _, err := verifier.VerifyServerSignature(cert, payload, sig); err == nil {
		t.Error("a revoked server's signature verifies")
	}
}
