package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

func newCA(t *testing.T) (*CA, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ca")
	ca, err := InitCA(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	return ca, dir
}

func newNode(t *testing.T, caDir, name string) *Credentials {
	t.Helper()
	creds, err := EnsureNode(caDir, filepath.Join(t.TempDir(), name), name, false, []string{name + ".example"}, []net.IP{net.ParseIP("192.0.2.7")})
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestInitLoadCA(t *testing.T) {
	ca, dir := newCA(t)
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("CA dir mode %o, want 700", m)
	}
	if m := mode(t, filepath.Join(dir, CAKeyFile)); m != 0o600 {
		t.Errorf("ca.key mode %o, want 600", m)
	}
	if !ca.Cert.IsCA || ca.Cert.Subject.OrganizationalUnit[0] != "test" {
		t.Errorf("CA subject %v IsCA %v", ca.Cert.Subject, ca.Cert.IsCA)
	}
	if _, err := InitCA(dir, "again"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second InitCA: %v, want fs.ErrExist", err)
	}
	loaded, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) || string(loaded.CertPEM) != string(ca.CertPEM) {
		t.Error("LoadCA returned a different certificate")
	}
	if _, err := LoadCA(t.TempDir()); err == nil {
		t.Error("LoadCA of an empty directory succeeded")
	}
	// A key that does not belong to the certificate is refused.
	_, other := newCA(t)
	key, _ := os.ReadFile(filepath.Join(other, CAKeyFile))
	if err := os.WriteFile(filepath.Join(dir, CAKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(dir); err == nil {
		t.Error("LoadCA with a foreign key succeeded")
	}
}

func TestIssue(t *testing.T) {
	ca, _ := newCA(t)
	dir := t.TempDir()
	certFile, keyFile, err := ca.Issue(dir, "srv-1", []string{"a.example", "localhost"}, []net.IP{net.ParseIP("10.1.2.3"), net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	if certFile != filepath.Join(dir, "srv-1.crt") || keyFile != filepath.Join(dir, "srv-1.key") {
		t.Errorf("files %s %s", certFile, keyFile)
	}
	if m := mode(t, keyFile); m != 0o600 {
		t.Errorf("key mode %o", m)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	if leaf.Subject.CommonName != "srv-1" {
		t.Errorf("CN %q", leaf.Subject.CommonName)
	}
	if leaf.NotAfter.Sub(leaf.NotBefore) != DefaultNodeValidity+clockSkew {
		t.Errorf("validity %v", leaf.NotAfter.Sub(leaf.NotBefore))
	}
	for _, host := range []string{"localhost", "a.example", "srv-1", "10.1.2.3", "127.0.0.1", "::1"} {
		if err := leaf.VerifyHostname(host); err != nil {
			t.Errorf("VerifyHostname(%s): %v", host, err)
		}
	}
	if len(leaf.DNSNames) != 3 || len(leaf.IPAddresses) != 3 {
		t.Errorf("SANs not deduplicated: %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("verify usage %v: %v", u, err)
		}
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, _, err := ca.Issue(dir, bad, nil, nil); err == nil {
			t.Errorf("Issue(%q) succeeded", bad)
		}
	}
}

func TestEnsureNodeIdempotent(t *testing.T) {
	_, caDir := newCA(t)
	dir := filepath.Join(t.TempDir(), "node")
	c1, err := EnsureNode(caDir, dir, "n1", false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c1.Name != "n1" {
		t.Errorf("name %q", c1.Name)
	}
	c2, err := EnsureNode(caDir, dir, "n1", false, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c2.Cert.Leaf.Equal(c1.Cert.Leaf) {
		t.Error("EnsureNode reissued existing credentials")
	}
	if _, err := EnsureNode(caDir, dir, "n2", false, nil, nil); err == nil {
		t.Error("EnsureNode accepted credentials of another node")
	}
	// A node directory handed over without the CA works without caDir.
	if _, err := EnsureNode(filepath.Join(t.TempDir(), "missing"), dir, "n1", false, nil, nil); err != nil {
		t.Errorf("EnsureNode on complete node dir needed the CA: %v", err)
	}
	// The CA directory may double as the node directory.
	if c, err := EnsureNode(caDir, caDir, "n3", false, nil, nil); err != nil || c.Name != "n3" {
		t.Errorf("EnsureNode in CA dir: %v", err)
	}
	if _, err := LoadCA(caDir); err != nil {
		t.Errorf("CA damaged by node issue in its dir: %v", err)
	}
}

// tcpPair returns the two ends of a loopback TCP connection. (Unlike
// net.Pipe, TCP buffers, so a TLS alert sent while the other side writes
// does not deadlock.)
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	b, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// handshake runs a TLS handshake between server and client configurations
// over loopback TCP, then one echo, and returns the peer certificate's CN
// each side saw.
func handshake(t *testing.T, server, client *tls.Config) (sawClient, sawServer string, err error) {
	t.Helper()
	a, b := tcpPair(t)
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(5 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	srv := tls.Server(a, server)
	cli := tls.Client(b, client)
	type res struct {
		cn  string
		err error
	}
	done := make(chan res, 1)
	go func() {
		if err := srv.Handshake(); err != nil {
			a.Close()
			done <- res{err: err}
			return
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(srv, buf); err != nil {
			done <- res{err: err}
			return
		}
		_, err := srv.Write(buf)
		done <- res{cn: srv.ConnectionState().PeerCertificates[0].Subject.CommonName, err: err}
	}()
	cerr := cli.Handshake()
	if cerr == nil {
		if _, cerr = cli.Write([]byte("ping")); cerr == nil {
			buf := make([]byte, 4)
			_, cerr = io.ReadFull(cli, buf)
		}
	}
	if cerr != nil {
		b.Close()
	}
	r := <-done
	if cerr != nil {
		return "", "", cerr
	}
	if r.err != nil {
		return "", "", r.err
	}
	return r.cn, cli.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestMutualTLS(t *testing.T) {
	_, caDir := newCA(t)
	n1 := newNode(t, caDir, "n1")
	n2 := newNode(t, caDir, "n2")
	for _, tc := range []struct {
		srv, cli   *Credentials
		serverName string
	}{
		{n1, n2, "n1"},
		{n2, n1, "n2"},
		{n1, n2, "localhost"},
		{n2, n1, "n2.example"},
		{n1, n2, "192.0.2.7"},
	} {
		sawClient, sawServer, err := handshake(t, tc.srv.ServerTLS(), tc.cli.ClientTLS(tc.serverName))
		if err != nil {
			t.Errorf("%s→%s (%s): %v", tc.cli.Name, tc.srv.Name, tc.serverName, err)
			continue
		}
		if sawClient != tc.cli.Name || sawServer != tc.srv.Name {
			t.Errorf("server saw %q, client saw %q", sawClient, sawServer)
		}
		if v := tc.srv.ServerTLS().MinVersion; v != tls.VersionTLS13 {
			t.Errorf("MinVersion %x", v)
		}
	}
	// The wrong name is refused even with a good certificate.
	if _, _, err := handshake(t, n1.ServerTLS(), n2.ClientTLS("n2")); err == nil {
		t.Error("client accepted server n1 as n2")
	}
}

func TestForeignCARejected(t *testing.T) {
	_, caDir := newCA(t)
	_, otherDir := newCA(t)
	good := newNode(t, caDir, "good")
	good2 := newNode(t, caDir, "good2")
	evil := newNode(t, otherDir, "evil")

	if _, _, err := handshake(t, good.ServerTLS(), evil.ClientTLS("good")); err == nil {
		t.Error("server accepted a client certified by a foreign CA")
	}
	if _, _, err := handshake(t, evil.ServerTLS(), good.ClientTLS("evil")); err == nil {
		t.Error("client accepted a server certified by a foreign CA")
	}
	// A client without any certificate is refused.
	anon := good2.ClientTLS("good")
	anon.GetClientCertificate = nil
	if _, _, err := handshake(t, good.ServerTLS(), anon); err == nil {
		t.Error("server accepted a client without a certificate")
	}
	if _, _, err := handshake(t, good.ServerTLS(), good2.ClientTLS("good")); err != nil {
		t.Errorf("control handshake failed: %v", err)
	}
	// Node credentials whose certificate is not from the copied ca.crt do
	// not load.
	dir := t.TempDir()
	ca, _ := LoadCA(caDir)
	if err := ca.IssueNodeDir(dir, "x", nil, nil); err != nil {
		t.Fatal(err)
	}
	other, _ := os.ReadFile(filepath.Join(otherDir, CACertFile))
	os.WriteFile(filepath.Join(dir, CACertFile), other, 0o644)
	if _, err := LoadCredentials(dir); err == nil {
		t.Error("LoadCredentials accepted a certificate from another CA")
	}
}

func TestPeerNameGRPC(t *testing.T) {
	_, caDir := newCA(t)
	srvCreds := newNode(t, caDir, "server-1")
	cliCreds := newNode(t, caDir, "client-1")

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(srvCreds.ServerTLS())),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			name, err := PeerName(ctx)
			if err != nil {
				name = "error: " + err.Error()
			}
			select {
			case seen <- name:
			default:
			}
			return h(ctx, req)
		}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cliCreds.ClientTLS(""))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got != "client-1" {
		t.Errorf("server: PeerName = %q, want client-1", got)
	}
	if got, err := PeerName(peer.NewContext(ctx, &p)); err != nil || got != "server-1" {
		t.Errorf("client: PeerName = %q, %v, want server-1", got, err)
	}

	if _, err := PeerName(ctx); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("PeerName without peer: %v", err)
	}
	if _, err := PeerName(peer.NewContext(ctx, &peer.Peer{Addr: lis.Addr()})); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("PeerName of insecure peer: %v", err)
	}
}
