// Package pki holds a WheelFS deployment's certificate authority and the
// credentials of its nodes. All inter-node traffic is mutual-TLS
// authenticated and encrypted: a server joins only with a certificate signed
// by the deployment's CA (DESIGN.md, Security), and the CommonName of that
// certificate is the node's (server's) ID, which PeerName recovers on the
// receiving side of every gRPC call.
//
// `wheelfs up` creates everything itself on first start: InitCA makes the CA
// directory (ca.crt, ca.key) and EnsureNode issues the node directory
// (ca.crt, node.crt, node.key) from it.
//
// There is no join token. A further node joins a deployment in one of two
// ways:
//
//   - copy the CA directory (ca.crt and ca.key) to it once; EnsureNode then
//     issues its own node credentials on first start, or
//   - give it a node directory (ca.crt, node.crt, node.key) issued elsewhere
//     with CA.IssueNodeDir (`wheelfs ca issue`); that node never sees ca.key.
//
// Node certificates live DefaultNodeValidity (a year); a node holding the
// CA key renews its own (Renew, Credentials.Reload), others need a
// re-issue. A Denylist of revoked node names, which every host keeps equal
// to the configuration service's, is checked in every handshake and
// closes the revoked nodes' open connections (revoke.go).
//
// Keys are ECDSA P-256 and stored as unencrypted PKCS #8 PEM files readable
// only by their owner (0600) inside directories that are 0700.
package pki

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// File names inside a CA directory and a node directory.
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
)

const (
	caValidity = 20 * 365 * 24 * time.Hour
	// DefaultNodeValidity is a node certificate's lifetime unless
	// CA.NodeValidity says otherwise. Nodes that hold the CA key renew
	// theirs when a third of it is left (Renew); others need a re-issue
	// (`wheelfs ca issue`), which `wheelfs status` warns about.
	DefaultNodeValidity = 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so that nodes whose clocks lag the
	// issuer's accept fresh certificates.
	clockSkew = time.Hour
)

// ErrUnauthenticated is returned by PeerName when the peer of a call did not
// present a certificate verified against the deployment's CA.
var ErrUnauthenticated = errors.New("pki: peer not authenticated")

var errNoPeer = fmt.Errorf("%w: no peer in context", ErrUnauthenticated)

// CA is a deployment's certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte // Cert, PEM-encoded (the contents of ca.crt)
	// NodeValidity is the lifetime of the node certificates it issues
	// (DefaultNodeValidity if 0), never beyond the CA's own expiry.
	NodeValidity time.Duration
	// Server makes the node certificates it issues carry the server role
	// (ServerRole): only those may sign login sessions.
	Server bool
}

// InitCA creates dir (0700) with ca.crt and ca.key (0600) for a new
// deployment. It fails with an error wrapping fs.ErrExist if either file is
// already present, so an existing deployment is never overwritten.
// deploymentName goes into the CA's subject.
func InitCA(dir, deploymentName string) (*CA, error) {
	if deploymentName == "" {
		return nil, errors.New("pki: init CA: empty deployment name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	for _, f := range []string{CACertFile, CAKeyFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return nil, fmt.Errorf("pki: init CA in %s: %s: %w", dir, f, fs.ErrExist)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("pki: init CA: %w", err)
		}
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:         "WheelFS CA " + deploymentName,
			Organization:       []string{"WheelFS"},
			OrganizationalUnit: []string{deploymentName},
		},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})

	// The key goes first: a ca.crt without its key would look like a
	// complete CA to nothing, but block a retry of InitCA.
	keyPath := filepath.Join(dir, CAKeyFile)
	if err := writeFile(keyPath, keyPEM, 0o600, true); err != nil {
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	if err := writeFile(filepath.Join(dir, CACertFile), certPEM, 0o644, true); err != nil {
		_ = os.Remove(keyPath)
		return nil, fmt.Errorf("pki: init CA: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// LoadCA reads the CA in dir (ca.crt and ca.key) and checks that the key
// belongs to the certificate.
func LoadCA(dir string) (*CA, error) {
	cert, certPEM, err := readCert(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: load CA: %s is not a CA certificate", filepath.Join(dir, CACertFile))
	}
	key, err := readKey(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %w", err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("pki: load CA: %s does not match %s", CAKeyFile, CACertFile)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// Issue writes <dir>/<name>.crt and <dir>/<name>.key (0600), a fresh ECDSA
// P-256 key and a certificate for it signed by the CA. The certificate is
// valid for ca.NodeValidity (never beyond the CA's own expiry), usable for both
// server and client authentication, has CommonName = name (the node's ID),
// and carries as subject alternative names the given DNS names and IPs plus
// "localhost", 127.0.0.1, ::1 and, when it is a valid host name, name itself,
// so that a client may verify a server by its node ID.
//
// dir is created (0700) if needed; existing files of the same name are
// replaced atomically.
func (ca *CA) Issue(dir, name string, dnsNames []string, ips []net.IP) (certFile, keyFile string, err error) {
	if err := checkFileName(name); err != nil {
		return "", "", err
	}
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	if err := ca.issueTo(dir, certFile, keyFile, name, dnsNames, ips); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// IssueNodeDir fills dir (created 0700 if needed) with a complete node
// directory for the node name, as LoadCredentials reads it: ca.crt, node.crt
// and node.key. Existing node credentials in dir are replaced; an existing
// ca.crt that already holds the CA's certificate (a rotation bundle) is
// kept.
func (ca *CA) IssueNodeDir(dir, name string, dnsNames []string, ips []net.IP) error {
	if err := ca.issueTo(dir, filepath.Join(dir, NodeCertFile), filepath.Join(dir, NodeKeyFile), name, dnsNames, ips); err != nil {
		return err
	}
	caPath := filepath.Join(dir, CACertFile)
	if old, err := os.ReadFile(caPath); err == nil && bytes.Contains(old, ca.CertPEM) {
		// The node directory is the CA directory, or its ca.crt is a
		// bundle of the old and the new CA during a rotation: keep it.
		return nil
	}
	if err := writeFile(caPath, ca.CertPEM, 0o644, false); err != nil {
		return fmt.Errorf("pki: issue %q: %w", name, err)
	}
	return nil
}

func (ca *CA) issueTo(dir, certFile, keyFile, name string, dnsNames []string, ips []net.IP) error {
	if name == "" {
		return errors.New("pki: issue: empty name")
	}
	if name == ConfigRoot {
		return fmt.Errorf("pki: issue: %q names the configuration service's administrator, not a node", name)
	}
	der, keyPEM, err := ca.sign(name, dnsNames, ips)
	if err != nil {
		return fmt.Errorf("pki: issue %q: %w", name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: issue %q: %w", name, err)
	}
	// Key before certificate, so that a present certificate implies its key.
	if err := writeFile(keyFile, keyPEM, 0o600, false); err != nil {
		return fmt.Errorf("pki: issue %q: %w", name, err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := writeFile(certFile, certPEM, 0o644, false); err != nil {
		return fmt.Errorf("pki: issue %q: %w", name, err)
	}
	return nil
}

// sign creates a key pair for name and a certificate for it.
func (ca *CA) sign(name string, dnsNames []string, ips []net.IP) (certDER, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if certDER, err = ca.signKey(key.Public(), name, dnsNames, ips); err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return certDER, keyPEM, nil
}

// signKey certifies pub as the node name, with the server role if
// ca.Server.
func (ca *CA) signKey(pub crypto.PublicKey, name string, dnsNames []string, ips []net.IP) ([]byte, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	validity := ca.NodeValidity
	if validity <= 0 {
		validity = DefaultNodeValidity
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	dns, addrs := sans(name, dnsNames, ips)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:         name,
			Organization:       ca.Cert.Subject.Organization,
			OrganizationalUnit: ca.Cert.Subject.OrganizationalUnit,
		},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		DNSNames:              dns,
		IPAddresses:           addrs,
	}
	if ca.Server {
		tmpl.Policies = []x509.OID{serverRole}
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
}

// sans returns the deduplicated subject alternative names of a node
// certificate.
func sans(name string, dnsNames []string, ips []net.IP) ([]string, []net.IP) {
	dns := []string{"localhost"}
	if isHostName(name) && net.ParseIP(name) == nil {
		dns = append(dns, name)
	}
	for _, d := range dnsNames {
		if d != "" && !slices.ContainsFunc(dns, func(x string) bool { return strings.EqualFold(x, d) }) {
			dns = append(dns, d)
		}
	}
	addrs := []net.IP{net.IPv4(127, 0, 0, 1).To4(), net.IPv6loopback}
	for _, ip := range ips {
		if ip == nil {
			continue
		}
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		if !slices.ContainsFunc(addrs, ip.Equal) {
			addrs = append(addrs, ip)
		}
	}
	return dns, addrs
}

// isHostName reports whether s can serve as a DNS subject alternative name
// that crypto/tls will match.
func isHostName(s string) bool {
	if s == "" || len(s) > 253 || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.Contains(s, "..") {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
		default:
			return false
		}
	}
	return true
}

// Credentials are a node's TLS identity: its certificate and key and the
// deployment's CA that every peer must be certified by.
type Credentials struct {
	CACertPool *x509.CertPool
	Cert       tls.Certificate // as loaded; Current has a renewed one
	Name       string          // CommonName of Cert: the node's ID
	// Deny is the deny list of revoked nodes this node refuses (set by
	// LoadCredentials; the host keeps it up to date).
	Deny *Denylist

	current atomic.Pointer[tls.Certificate] // after Reload
}

// Current returns the node's certificate: the one loaded, or the newest
// Reload read.
func (c *Credentials) Current() *tls.Certificate {
	if cur := c.current.Load(); cur != nil {
		return cur
	}
	return &c.Cert
}

func (c *Credentials) denylist() *Denylist {
	if c.Deny != nil {
		return c.Deny
	}
	return &Denylist{}
}

// LoadCredentials reads a node directory (ca.crt, node.crt, node.key) and
// checks that the node certificate is signed by the CA and usable for both
// server and client authentication.
func LoadCredentials(dir string) (*Credentials, error) {
	if _, _, err := readCert(filepath.Join(dir, CACertFile)); err != nil {
		return nil, fmt.Errorf("pki: load credentials: %w", err)
	}
	// ca.crt may hold more than one CA while the CA is rotated
	// (docs/SECURITY.md): peers certified by any of them are accepted.
	bundle, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("pki: load credentials: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return nil, fmt.Errorf("pki: load credentials: %s: no certificate", filepath.Join(dir, CACertFile))
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, NodeCertFile), filepath.Join(dir, NodeKeyFile))
	if err != nil {
		return nil, fmt.Errorf("pki: load credentials from %s: %w", dir, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("pki: load credentials from %s: %w", dir, err)
		}
		pair.Leaf = leaf
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return nil, fmt.Errorf("pki: load credentials from %s: %s: %w", dir, NodeCertFile, err)
		}
	}
	if leaf.Subject.CommonName == "" {
		return nil, fmt.Errorf("pki: load credentials from %s: %s has no CommonName", dir, NodeCertFile)
	}
	return &Credentials{CACertPool: pool, Cert: pair, Name: leaf.Subject.CommonName, Deny: &Denylist{}}, nil
}

// EnsureNode returns the credentials in the node directory dir, first
// issuing them from the CA in caDir if dir lacks node.crt or node.key (and
// copying ca.crt next to them), with the server role if server. It is
// idempotent: existing credentials are kept, and it fails if they belong
// to a node other than name. caDir is read only when something is
// missing, and may equal dir.
func EnsureNode(caDir, dir, name string, server bool, dnsNames []string, ips []net.IP) (*Credentials, error) {
	if name == "" {
		return nil, errors.New("pki: ensure node: empty name")
	}
	have := func(f string) bool {
		_, err := os.Stat(filepath.Join(dir, f))
		return err == nil
	}
	if !have(NodeCertFile) || !have(NodeKeyFile) {
		ca, err := LoadCA(caDir)
		if err != nil {
			return nil, fmt.Errorf("pki: ensure node %q: %w", name, err)
		}
		ca.Server = server
		if err := ca.IssueNodeDir(dir, name, dnsNames, ips); err != nil {
			return nil, fmt.Errorf("pki: ensure node %q: %w", name, err)
		}
	} else if !have(CACertFile) {
		data, err := os.ReadFile(filepath.Join(caDir, CACertFile))
		if err != nil {
			return nil, fmt.Errorf("pki: ensure node %q: %w", name, err)
		}
		if err := writeFile(filepath.Join(dir, CACertFile), data, 0o644, false); err != nil {
			return nil, fmt.Errorf("pki: ensure node %q: %w", name, err)
		}
	}
	creds, err := LoadCredentials(dir)
	if err != nil {
		return nil, fmt.Errorf("pki: ensure node %q: %w", name, err)
	}
	if creds.Name != name {
		return nil, fmt.Errorf("pki: ensure node %q: %s holds credentials of node %q", name, dir, creds.Name)
	}
	return creds, nil
}

// ServerTLS returns a server configuration: TLS 1.3 at least, presenting the
// node's current certificate and requiring a client certificate signed by
// the CA whose node is not on the deny list.
func (c *Credentials) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		GetCertificate:   func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.Current(), nil },
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        c.CACertPool,
		VerifyConnection: c.denylist().check,
	}
}

// ClientTLS returns a client configuration: TLS 1.3 at least, presenting
// the node's certificate and verifying the server's against the CA and
// serverName. serverName may be a host name or IP address in the server's
// certificate or the server's node ID (see CA.Issue); if empty, the host of
// the dialed address is used (as crypto/tls and gRPC do).
//
// A server on the deny list is refused.
func (c *Credentials) ClientTLS(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.Current(), nil },
		RootCAs:              c.CACertPool,
		ServerName:           serverName,
		VerifyConnection:     c.denylist().check,
	}
}

// PeerName returns the authenticated CommonName (node ID) of the peer of a
// gRPC call, from the TLS credentials in peer.FromContext(ctx). It works on
// the server side of a call and on the client side with a context built by
// peer.NewContext from grpc.Peer. It returns an error wrapping
// ErrUnauthenticated if the peer did not present a verified certificate.
func PeerName(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p == nil {
		return "", errNoPeer // an in-process call: on every one, so not formatted
	}
	var state tls.ConnectionState
	switch ai := p.AuthInfo.(type) {
	case credentials.TLSInfo:
		state = ai.State
	case *credentials.TLSInfo:
		state = ai.State
	default:
		return "", fmt.Errorf("%w: connection from %v is not TLS", ErrUnauthenticated, p.Addr)
	}
	if len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return "", fmt.Errorf("%w: no verified certificate from %v", ErrUnauthenticated, p.Addr)
	}
	name := state.VerifiedChains[0][0].Subject.CommonName
	if name == "" {
		return "", fmt.Errorf("%w: certificate of %v has no CommonName", ErrUnauthenticated, p.Addr)
	}
	return name, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// readCert reads the first certificate of a PEM file and returns it with its
// canonical PEM encoding.
func readCert(path string) (*x509.Certificate, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, nil, fmt.Errorf("%s: no certificate", path)
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}), nil
	}
}

// readKey reads a PEM private key in PKCS #8, SEC 1 (EC) or PKCS #1 (RSA)
// form.
func readKey(path string) (crypto.Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("%s: no private key", path)
		}
		var key any
		switch block.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: unsupported key type %T", path, key)
		}
		return signer, nil
	}
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

func checkFileName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.ContainsRune(name, 0) {
		return fmt.Errorf("pki: invalid name %q", name)
	}
	return nil
}

// writeFile writes data to path with mode perm atomically: readers see
// either the old contents or all of the new. If exclusive, it fails with an
// error wrapping fs.ErrExist when path exists.
func writeFile(path string, data []byte, perm os.FileMode, exclusive bool) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if !exclusive {
		return os.Rename(tmp, path)
	}
	// A hard link fails if path exists, and never exposes partial contents.
	if err := os.Link(tmp, path); err != nil {
		return err
	}
	_ = os.Remove(tmp)
	return nil
}

// ConfigRoot is the name (CommonName) of the configuration service's
// administrator: the etcd user "root", which etcd takes from a client
// certificate's CommonName once auth is on. Only the holder of the CA key
// can present it (RootCredentials); no node may be called so.
const ConfigRoot = "root"

// rootValidity bounds an administrator certificate: it lives in memory
// for one command or one host's run of administrative calls.
const rootValidity = 24 * time.Hour

// RootCredentials returns in-memory credentials named ConfigRoot, signed
// by the CA, for administering the configuration service (etcd users and
// members). They are never written to disk.
func (ca *CA) RootCredentials() (*Credentials, error) {
	c := *ca
	c.NodeValidity, c.Server = rootValidity, false
	der, keyPEM, err := c.sign(ConfigRoot, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("pki: root credentials: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: root credentials: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &Credentials{CACertPool: pool, Cert: pair, Name: ConfigRoot, Deny: &Denylist{}}, nil
}
