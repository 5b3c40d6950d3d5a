package pki

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/poll"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestDenylistTLS: a denied node is refused by both sides of the
// handshake, and taking it off the list admits it again.
func TestDenylistTLS(t *testing.T) {
	_, caDir := newCA(t)
	srv := newNode(t, caDir, "srv")
	cli := newNode(t, caDir, "cli")
	if _, _, err := handshake(t, srv.ServerTLS(), cli.ClientTLS("srv")); err != nil {
		t.Fatalf("control handshake: %v", err)
	}
	srv.Deny.Set([]string{"cli"})
	if _, _, err := handshake(t, srv.ServerTLS(), cli.ClientTLS("srv")); err == nil {
		t.Error("server accepted a denied client")
	}
	srv.Deny.Set(nil)
	cli.Deny.Set([]string{"srv"})
	if _, _, err := handshake(t, srv.ServerTLS(), cli.ClientTLS("srv")); !errors.Is(err, ErrRevoked) {
		t.Errorf("client's handshake with a denied server: %v, want ErrRevoked", err)
	}
	if added := cli.Deny.Set([]string{"srv", "x"}); len(added) != 1 || added[0] != "x" {
		t.Errorf("Set added %v, want [x]", added)
	}
	cli.Deny.Set(nil)
	if _, _, err := handshake(t, srv.ServerTLS(), cli.ClientTLS("srv")); err != nil {
		t.Errorf("handshake after undeny: %v", err)
	}
}

// TestDenylistClosesConnections: a gRPC connection made before the
// denial is closed when it comes, and calls over it fail.
func TestDenylistClosesConnections(t *testing.T) {
	_, caDir := newCA(t)
	srvCreds := newNode(t, caDir, "srv")
	cliCreds := newNode(t, caDir, "cli")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(srvCreds.ServerCredentials()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(cliCreds.ClientCredentials("srv")))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	call := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	if n := srvCreds.Deny.Conns("cli"); n != 1 {
		t.Fatalf("server tracks %d connections from cli, want 1", n)
	}
	if n := cliCreds.Deny.Conns("srv"); n != 1 {
		t.Fatalf("client tracks %d connections to srv, want 1", n)
	}
	srvCreds.Deny.Set([]string{"cli"})
	if n := srvCreds.Deny.Conns("cli"); n != 0 {
		t.Errorf("server still tracks %d connections from the denied client", n)
	}
	// gRPC reconnects at once, and the new handshake is refused.
	if err := call(); err == nil {
		t.Fatal("call from a denied client succeeded")
	}
	srvCreds.Deny.Set(nil)
	poll.Until(t, 10*time.Second, "calls after undeny", call)
}

// TestRenew: a certificate is renewed only once less than a third of its
// lifetime is left; the new one keeps the name and addresses, and
// Credentials.Reload makes new handshakes present it.
func TestRenew(t *testing.T) {
	ca, caDir := newCA(t)
	now := time.Now()
	for _, tc := range []struct {
		left, life time.Duration
		due        bool
	}{
		{90 * time.Hour, 100 * time.Hour, false},
		{34 * time.Hour, 100 * time.Hour, false},
		{32 * time.Hour, 100 * time.Hour, true},
		{-time.Hour, 100 * time.Hour, true},
	} {
		c := ca.Cert
		c2 := *c
		c2.NotAfter = now.Add(tc.left)
		c2.NotBefore = c2.NotAfter.Add(-tc.life)
		if got := RenewDue(&c2, now); got != tc.due {
			t.Errorf("RenewDue(%v left of %v) = %v", tc.left, tc.life, got)
		}
	}

	ca.NodeValidity = 8 * time.Hour // plus an hour of clock skew: 9 h
	dir := t.TempDir()
	if err := ca.IssueNodeDir(dir, "n1", []string{"n1.example"}, []net.IP{net.ParseIP("192.0.2.9")}); err != nil {
		t.Fatal(err)
	}
	creds, err := LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := creds.Cert.Leaf
	if life := old.NotAfter.Sub(old.NotBefore); life != 9*time.Hour {
		t.Fatalf("lifetime %v, want 9h", life)
	}
	if did, err := Renew(caDir, dir, false, 8*time.Hour, now.Add(time.Hour)); err != nil || did {
		t.Fatalf("Renew early: %v, %v", did, err)
	}
	if did, err := Renew(caDir, dir, false, 30*time.Hour, now.Add(6*time.Hour)); err != nil || !did {
		t.Fatalf("Renew when due: %v, %v", did, err)
	}
	if err := creds.Reload(dir); err != nil {
		t.Fatal(err)
	}
	cur := creds.Current().Leaf
	if cur.SerialNumber.Cmp(old.SerialNumber) == 0 || cur.Subject.CommonName != "n1" {
		t.Fatalf("renewed certificate %v %q", cur.SerialNumber, cur.Subject.CommonName)
	}
	if !cur.NotAfter.After(old.NotAfter.Add(20*time.Hour)) || len(cur.IPAddresses) != len(old.IPAddresses) || len(cur.DNSNames) != len(old.DNSNames) {
		t.Fatalf("renewed certificate: until %v, names %v %v", cur.NotAfter, cur.DNSNames, cur.IPAddresses)
	}
	peer := newNode(t, caDir, "peer")
	if _, sawServer, err := handshake(t, creds.ServerTLS(), peer.ClientTLS("n1")); err != nil || sawServer != "n1" {
		t.Fatalf("handshake with the renewed certificate: %q, %v", sawServer, err)
	}
	// Another node's certificate is not loaded in its place.
	other := t.TempDir()
	if err := ca.IssueNodeDir(other, "n2", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := creds.Reload(other); err == nil {
		t.Fatal("Reload accepted another node's certificate")
	}
	// A certificate of another CA is not renewed by this one.
	_, otherCA := newCA(t)
	if _, err := Renew(otherCA, dir, false, time.Hour, now.Add(100*time.Hour)); err == nil {
		t.Fatal("Renew from a foreign CA succeeded")
	}
}

// TestCABundleRotation: while ca.crt bundles the old and the new CA,
// nodes certified by either accept each other; a re-issue from the new CA
// keeps the bundle; a node that trusts only the new CA refuses the old.
func TestCABundleRotation(t *testing.T) {
	oldCA, _ := newCA(t)
	newCA_, _ := newCA(t)
	bundle := append(append([]byte{}, oldCA.CertPEM...), newCA_.CertPEM...)
	a0 := t.TempDir()
	if err := oldCA.IssueNodeDir(a0, "a", nil, nil); err != nil {
		t.Fatal(err)
	}
	a, err := LoadCredentials(a0)
	if err != nil {
		t.Fatal(err)
	}
	bDir := filepath.Join(t.TempDir(), "b")
	if err := newCA_.IssueNodeDir(bDir, "b", nil, nil); err != nil {
		t.Fatal(err)
	}
	onlyNew, err := LoadCredentials(bDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := handshake(t, onlyNew.ServerTLS(), a.ClientTLS("b")); err == nil {
		t.Fatal("a node trusting only the new CA accepted the old CA's node")
	}
	if err := os.WriteFile(filepath.Join(bDir, CACertFile), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	// a gets the bundle and a certificate from the new CA.
	aDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(aDir, CACertFile), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := oldCA.IssueNodeDir(aDir, "a", nil, nil); err != nil {
		t.Fatal(err)
	}
	aOld, err := LoadCredentials(aDir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadCredentials(bDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := handshake(t, b.ServerTLS(), aOld.ClientTLS("b")); err != nil {
		t.Fatalf("old-CA node to new-CA node, both with the bundle: %v", err)
	}
	if _, _, err := handshake(t, aOld.ServerTLS(), b.ClientTLS("a")); err != nil {
		t.Fatalf("new-CA node to old-CA node, both with the bundle: %v", err)
	}
	if err := newCA_.IssueNodeDir(aDir, "a", nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(aDir, CACertFile)); !bytes.Equal(got, bundle) {
		t.Fatal("re-issue from the new CA replaced the bundle")
	}
}
