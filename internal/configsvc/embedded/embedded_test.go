package embedded_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/oid"
)

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

func dial(t *testing.T, endpoints []string, tc *tls.Config, o configsvc.Options) *configsvc.EtcdService {
	t.Helper()
	o.Logger = testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := configsvc.Dial(ctx, endpoints, tc, o)
	if err != nil {
		t.Fatalf("dial %v: %v", endpoints, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func start(t *testing.T, c embedded.Config) *embedded.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := embedded.Start(ctx, c)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestStartRequiresDir(t *testing.T) {
	t.Parallel()
	if _, err := embedded.Start(context.Background(), embedded.NewConfig()); err == nil {
		t.Fatal("Start without Dir succeeded")
	}
	c := embedded.NewConfig()
	c.Dir = t.TempDir()
	c.InitialCluster = "a=http://127.0.0.1:1"
	c.Name = "b"
	if _, err := embedded.Start(context.Background(), c); err == nil || !strings.Contains(err.Error(), "not in InitialCluster") {
		t.Fatalf("want not-in-cluster error, got %v", err)
	}
}

func TestRestartKeepsState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := embedded.NewConfig()
	c.Dir = dir
	c.Logger = testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	m1, err := embedded.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	eps := m1.ClientEndpoints()
	s1, err := configsvc.Dial(ctx, eps, nil, configsvc.Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	pol := configsvc.Policy{Site: "home", RepLevel: 2, RepSites: 1, EventualDirs: true}
	lock, err := s1.Acquire(ctx, oid.RootSlice, "A", pol, []string{"A", "B"})
	if err != nil {
		t.Fatal(err)
	}
	dep, err := s1.Deployment(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Register(ctx, configsvc.ServerInfo{ID: "A", Site: "home"}); err != nil {
		t.Fatal(err)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-m1.Err(); ok {
		t.Fatal("Err channel not closed after Close")
	}

	m2 := start(t, c)
	if !slices.Equal(m2.ClientEndpoints(), eps) {
		t.Errorf("restarted member moved from %v to %v", eps, m2.ClientEndpoints())
	}
	s2 := dial(t, m2.ClientEndpoints(), nil, configsvc.Options{})
	tb, err := s2.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := tb.Slices[oid.RootSlice]
	if !ok || got.Policy != pol || !slices.Equal(got.Replicas, []string{"A", "B"}) {
		t.Fatalf("slice after restart: %+v (ok=%v)", got, ok)
	}
	// The lock lease (2 min) survives a quick restart, with the same epoch.
	if got.Holder != "A" || got.Epoch != lock.Epoch {
		t.Fatalf("lock after restart: %+v, want %+v", got, lock)
	}
	if err := s2.Renew(ctx, lock); err != nil {
		t.Fatalf("renew after restart: %v", err)
	}
	if _, ok := tb.Servers["A"]; ok {
		t.Fatal("server revoked by Close is back")
	}
	if d, err := s2.Deployment(ctx); err != nil || d != dep {
		t.Fatalf("deployment after restart %q %v, want %q", d, err, dep)
	}
}

// leader returns the index of the member that leads the cluster (asked
// through the service, whose endpoint monitor may be changing the
// client's endpoints meanwhile).
func leader(t *testing.T, s *configsvc.EtcdService, members []*embedded.Member) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms, err := s.Members(ctx)
	if err != nil {
		t.Fatalf("members: %v", err)
	}
	for _, m := range ms {
		if !m.Leader {
			continue
		}
		for i, e := range members {
			if e.Name() == m.Name {
				return i
			}
		}
	}
	t.Fatalf("no leader among %+v", ms)
	return -1
}

func TestThreeMemberCluster(t *testing.T) {
	t.Parallel()
	const n = 3
	peers := make([]string, n)
	var ic []string
	for i := range n {
		a, err := embedded.FreeAddr("")
		if err != nil {
			t.Fatal(err)
		}
		peers[i] = "http://" + a
		ic = append(ic, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	members := make([]*embedded.Member, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := embedded.NewConfig()
			c.Name = fmt.Sprintf("m%d", i)
			c.Dir = t.TempDir()
			c.InitialCluster = strings.Join(ic, ",")
			c.Logger = testLogger(t)
			members[i], errs[i] = embedded.Start(ctx, c)
		}()
	}
	wg.Wait()
	for i, m := range members {
		if m != nil {
			t.Cleanup(func() { m.Close() })
		}
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i, errs[i])
		}
		if got := m.PeerURLs(); !slices.Equal(got, []string{peers[i]}) {
			t.Fatalf("member %d peer URLs %v, want %s", i, got, peers[i])
		}
	}

	// The service works through any single member.
	var all []string
	per := make([]*configsvc.EtcdService, n)
	for i, m := range members {
		all = append(all, m.ClientEndpoints()...)
		per[i] = dial(t, m.ClientEndpoints(), nil, configsvc.Options{})
	}
	l1, err := per[0].Acquire(ctx, 1, "A", configsvc.Policy{Site: "s"}, []string{"A"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := per[1].Acquire(ctx, 1, "B", configsvc.Policy{Site: "s"}, []string{"B"}); !errors.Is(err, configsvc.ErrLocked) {
		t.Fatalf("acquire through member 1: %v", err)
	}
	tb, err := per[2].Table(ctx)
	if err != nil || tb.Slices[1].Holder != "A" || tb.Slices[1].Epoch != l1.Epoch {
		t.Fatalf("table through member 2: %+v %v", tb, err)
	}
	d0, err := per[0].Deployment(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d2, err := per[2].Deployment(ctx); err != nil || d2 != d0 {
		t.Fatalf("deployment differs across members: %q %q %v", d0, d2, err)
	}

	// A client that knows every member survives losing one (the leader).
	svc := dial(t, all, nil, configsvc.Options{MemberTTL: 2 * time.Second})
	if err := svc.Register(ctx, configsvc.ServerInfo{ID: "srv", Site: "s"}); err != nil {
		t.Fatal(err)
	}
	wch := svc.Watch(ctx)
	<-wch
	dead := leader(t, svc, members)
	if err := members[dead].Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed leader m%d", dead)

	var l2 configsvc.Lock
	deadline := time.Now().Add(15 * time.Second)
	for {
		l2, err = svc.Acquire(ctx, 2, "C", configsvc.Policy{Site: "t"}, []string{"C"})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no acquire after losing a member: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if l2.Epoch <= l1.Epoch {
		t.Fatalf("epoch %d not above %d", l2.Epoch, l1.Epoch)
	}
	timeout := time.After(10 * time.Second)
	for seen := false; !seen; {
		select {
		case tb := <-wch:
			seen = tb.Slices[2].Holder == "C"
		case <-timeout:
			t.Fatal("watch did not deliver the change made after the failover")
		}
	}
	// Membership keep-alives continue past the 2 s member TTL.
	time.Sleep(3 * time.Second)
	tb, err = svc.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tb.Servers["srv"]; !ok {
		t.Fatal("registered server lost after failover")
	}
	if tb.Slices[1].Holder != "A" || tb.Slices[1].Epoch != l1.Epoch {
		t.Fatalf("lock lost in failover: %+v", tb.Slices[1])
	}
	survivor := per[(dead+1)%n]
	if err := survivor.Renew(ctx, l1); err != nil {
		t.Fatalf("renew through survivor: %v", err)
	}
}

// ---- TLS ----

type pki struct{ dir string }

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newPKI writes ca.pem and, for each name, name.pem/name-key.pem signed by
// the CA, valid for 127.0.0.1 and both client and server auth.
func newPKI(t *testing.T, names ...string) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", caDER)
	for i, name := range names {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
			DNSNames:     []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalPKCS8PrivateKey(key)
		writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
		writePEM(t, filepath.Join(dir, name+"-key.pem"), "PRIVATE KEY", kb)
	}
	return pki{dir}
}

func (p pki) file(n string) string { return filepath.Join(p.dir, n) }

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t, "member", "client")
	c := embedded.NewConfig()
	c.Dir = t.TempDir()
	c.Logger = testLogger(t)
	c.TLS = &embedded.TLSInfo{CertFile: p.file("member.pem"), KeyFile: p.file("member-key.pem"), CAFile: p.file("ca.pem")}
	m := start(t, c)
	for _, ep := range m.ClientEndpoints() {
		if !strings.HasPrefix(ep, "https://") {
			t.Fatalf("endpoint %s is not https", ep)
		}
	}
	tc, err := embedded.ClientTLSConfig(p.file("client.pem"), p.file("client-key.pem"), p.file("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	s := dial(t, m.ClientEndpoints(), tc, configsvc.Options{})
	if _, err := s.Deployment(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Without a client certificate the member refuses the connection.
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(p.file("ca.pem"))
	pool.AppendCertsFromPEM(caPEM)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bad, err := configsvc.Dial(ctx, m.ClientEndpoints(), &tls.Config{RootCAs: pool},
		configsvc.Options{RPCTimeout: 2 * time.Second, Logger: testLogger(t)})
	if err == nil {
		bad.Close()
		t.Fatal("dial without client certificate succeeded")
	}
}

// TestFreeAddrNeverTwice: ports handed out one after the other differ,
// even when the kernel offers a port just closed again (a member's client
// and peer URLs once got the same port).
func TestFreeAddrNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		a, err := embedded.FreeAddr("")
		if err != nil {
			t.Fatal(err)
		}
		if seen[a] {
			t.Fatalf("FreeAddr handed out %s twice", a)
		}
		seen[a] = true
	}
}
