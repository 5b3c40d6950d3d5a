package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"path/filepath"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// RenewFraction is the part of a node certificate's lifetime left when it
// is due for renewal: renewing at two thirds leaves a node that holds the
// CA key many chances before expiry, and gives an operator of one without
// it a long warning.
const RenewFraction = 3

// RenewDue reports whether cert should be renewed at now: less than a
// RenewFraction of its lifetime is left (or it has expired).
func RenewDue(cert *x509.Certificate, now time.Time) bool {
	life := cert.NotAfter.Sub(cert.NotBefore)
	return cert.NotAfter.Sub(now) < life/RenewFraction
}

// Renew re-issues the node certificate in the node directory dir from the
// CA in caDir when RenewDue, or when its server role is not server (the
// host started or stopped running a server, or the certificate predates
// roles), and reports whether it did: a fresh key, the same name and
// subject alternative names, the server role if server (a host that no
// longer runs one loses the right to sign sessions), the CA's
// NodeValidity. A node
// directory whose certificate is from another CA is not touched (CA
// rotation is an operator's step, see docs/SECURITY.md).
func Renew(caDir, dir string, server bool, validity time.Duration, now time.Time) (bool, error) {
	leaf, _, err := readCert(filepath.Join(dir, NodeCertFile))
	if err != nil {
		return false, fmt.Errorf("pki: renew: %w", err)
	}
	role := HasServerRole(leaf)
	if !RenewDue(leaf, now) && role == server {
		return false, nil
	}
	ca, err := LoadCA(caDir)
	if err != nil {
		return false, fmt.Errorf("pki: renew %q: %w", leaf.Subject.CommonName, err)
	}
	if err := leaf.CheckSignatureFrom(ca.Cert); err != nil {
		return false, fmt.Errorf("pki: renew %q: certificate is not from the CA in %s: %w", leaf.Subject.CommonName, caDir, err)
	}
	ca.NodeValidity, ca.Server = validity, server
	if err := ca.IssueNodeDir(dir, leaf.Subject.CommonName, leaf.DNSNames, leaf.IPAddresses); err != nil {
		return false, fmt.Errorf("pki: renew: %w", err)
	}
	return true, nil
}

// Reload reads the node certificate and key in dir again (after Renew or
// a re-issue by `wheelfs ca issue`): new connections present it. It must
// name the same node and be valid under the same CA.
func (c *Credentials) Reload(dir string) error {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, NodeCertFile), filepath.Join(dir, NodeKeyFile))
	if err != nil {
		return fmt.Errorf("pki: reload %s: %w", dir, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("pki: reload %s: %w", dir, err)
		}
		pair.Leaf = leaf
	}
	if leaf.Subject.CommonName != c.Name {
		return fmt.Errorf("pki: reload %s: certificate names %q, not %q", dir, leaf.Subject.CommonName, c.Name)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.CACertPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("pki: reload %s: %w", dir, err)
	}
	c.current.Store(&pair)
	return nil
}

// Expiry returns when the node certificate in dir expires, for status
// warnings.
func Expiry(dir string) (notBefore, notAfter time.Time, err error) {
	leaf, _, err := readCert(filepath.Join(dir, NodeCertFile))
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("pki: expiry: %w", err)
	}
	return leaf.NotBefore, leaf.NotAfter, nil
}

// RenewalRequest is a node's request for a new certificate from a server
// that holds the CA key (a client-only host does not): a fresh key, kept
// here, and a certificate request for it, sent.
type RenewalRequest struct {
	CSR    []byte // DER
	keyPEM []byte
}

// NewRenewalRequest makes a fresh key and a certificate request for name.
func NewRenewalRequest(name string) (*RenewalRequest, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return nil, fmt.Errorf("pki: renewal request: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &RenewalRequest{CSR: csr, keyPEM: keyPEM}, nil
}

// Install writes the certificate a server signed for r (PEM) with r's key
// into the node directory dir, after checking that it certifies r's key
// for the same node under the CA of dir's ca.crt. Reload then presents it.
func (r *RenewalRequest) Install(dir string, certPEM []byte) error {
	pair, err := tls.X509KeyPair(certPEM, r.keyPEM)
	if err != nil {
		return fmt.Errorf("pki: install renewal: %w", err)
	}
	old, err := LoadCredentials(dir)
	if err != nil {
		return fmt.Errorf("pki: install renewal: %w", err)
	}
	leaf := pair.Leaf
	if leaf.Subject.CommonName != old.Name {
		return fmt.Errorf("pki: install renewal: certificate names %q, not %q", leaf.Subject.CommonName, old.Name)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: old.CACertPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("pki: install renewal: %w", err)
	}
	// Key before certificate, as issueTo: a present certificate implies its key.
	if err := writeFile(filepath.Join(dir, NodeKeyFile), r.keyPEM, 0o600, false); err != nil {
		return fmt.Errorf("pki: install renewal: %w", err)
	}
	if err := writeFile(filepath.Join(dir, NodeCertFile), certPEM, 0o644, false); err != nil {
		return fmt.Errorf("pki: install renewal: %w", err)
	}
	return nil
}

// SignRenewal answers a renewal request from the node whose current
// certificate is current (as its TLS handshake presented it): a
// certificate for the request's key with current's name, subject
// alternative names and role — never what the request asks for, except
// that dropServer gives the server role up (a node that no longer runs a
// server) — valid for the CA's NodeValidity. It refuses a certificate that is not from this CA
// or not yet due (RenewDue at now), and the administrator's name.
func (ca *CA) SignRenewal(current *x509.Certificate, csrDER []byte, now time.Time, dropServer bool) ([]byte, error) {
	name := current.Subject.CommonName
	if name == "" || name == ConfigRoot {
		return nil, fmt.Errorf("pki: renewal for %q refused", name)
	}
	if err := current.CheckSignatureFrom(ca.Cert); err != nil {
		return nil, fmt.Errorf("pki: renewal for %q: certificate is not from this CA: %w", name, err)
	}
	if !RenewDue(current, now) {
		return nil, fmt.Errorf("pki: renewal for %q refused: not due before %v", name,
			current.NotAfter.Add(-current.NotAfter.Sub(current.NotBefore)/RenewFraction).UTC().Format(time.RFC3339))
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("pki: renewal for %q: %w", name, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: renewal for %q: request not signed by its key: %w", name, err)
	}
	c := *ca
	c.Server = HasServerRole(current) && !dropServer
	der, err := c.signKey(csr.PublicKey, name, current.DNSNames, current.IPAddresses)
	if err != nil {
		return nil, fmt.Errorf("pki: renewal for %q: %w", name, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// PeerCertificate returns the verified certificate the peer of a gRPC call
// presented (see PeerName).
func PeerCertificate(ctx context.Context) (*x509.Certificate, error) {
	if _, err := PeerName(ctx); err != nil {
		return nil, err
	}
	p, _ := peer.FromContext(ctx)
	var state tls.ConnectionState
	switch ai := p.AuthInfo.(type) {
	case credentials.TLSInfo:
		state = ai.State
	case *credentials.TLSInfo:
		state = ai.State
	}
	return state.VerifiedChains[0][0], nil
}
