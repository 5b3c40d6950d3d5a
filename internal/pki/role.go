package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
)

// serverRole is the certificate policy that marks a node certificate as a
// server's (ServerRole). The arc is 2.25 (a UUID as an OID, X.667), so it
// needs no registration. A policy, not an extended key usage: Go parses
// EKUs into int arcs, which a UUID arc does not fit.
var serverRole = mustOID("2.25.260503524793193077563314851386335834969")

// ServerRole is the OID of the server role, as `openssl x509 -text` shows
// it under "X509v3 Certificate Policies".
var ServerRole = serverRole.String()

func mustOID(s string) x509.OID {
	o, err := x509.ParseOID(s)
	if err != nil {
		panic(err)
	}
	return o
}

// ErrNotServer means a certificate lacks the server role: it was issued
// for a client-only host, or before roles existed (docs/SECURITY.md).
var ErrNotServer = errors.New("pki: certificate does not carry the server role")

// HasServerRole reports whether cert was issued to a server: `wheelfs ca
// issue --server`, or a host holding the CA key that runs a server or a
// config member. Certificates issued before roles existed carry none.
func HasServerRole(cert *x509.Certificate) bool {
	return cert != nil && slices.ContainsFunc(cert.Policies, serverRole.Equal)
}

// IsServer reports whether the node's current certificate carries the
// server role.
func (c *Credentials) IsServer() bool {
	return HasServerRole(c.Current().Leaf)
}

// SignAsServer signs payload (which must carry its own domain tag) with
// the node's current key, for others to check with VerifyServerSignature.
// It returns the certificate to check against (DER) and the signature
// (ECDSA over SHA-256, ASN.1). A certificate without the server role
// refuses with ErrNotServer: nobody would accept its signature.
func (c *Credentials) SignAsServer(payload []byte) (cert, sig []byte, err error) {
	cur := c.Current()
	if !HasServerRole(cur.Leaf) {
		return nil, nil, fmt.Errorf("node %q: %w", c.Name, ErrNotServer)
	}
	key, ok := cur.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("pki: node %q: key of type %T cannot sign", c.Name, cur.PrivateKey)
	}
	sum := sha256.Sum256(payload)
	sig, err = key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: node %q: sign: %w", c.Name, err)
	}
	return cur.Certificate[0], sig, nil
}

// VerifyServerSignature checks that sig signs payload with the key of
// cert (DER), and that cert is valid now, chained to this node's CA pool,
// carries the server role and names a node not on the deny list. It
// returns the signer's name.
func (c *Credentials) VerifyServerSignature(cert, payload, sig []byte) (string, error) {
	leaf, err := x509.ParseCertificate(cert)
	if err != nil {
		return "", fmt.Errorf("pki: signer certificate: %w", err)
	}
	name := leaf.Subject.CommonName
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.CACertPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return "", fmt.Errorf("pki: signer %q: %w", name, err)
	}
	if !HasServerRole(leaf) {
		return "", fmt.Errorf("signer %q: %w", name, ErrNotServer)
	}
	if name == "" || name == ConfigRoot {
		return "", fmt.Errorf("pki: signer %q is not a node", name)
	}
	if c.denylist().Denied(name) {
		return "", fmt.Errorf("pki: signer %q is revoked", name)
	}
	if err := leaf.CheckSignature(x509.ECDSAWithSHA256, payload, sig); err != nil {
		return "", fmt.Errorf("pki: signature by %q does not verify: %w", name, err)
	}
	return name, nil
}

// Revoked reports whether the node name is on this node's deny list.
func (c *Credentials) Revoked(name string) bool {
	return c.denylist().Denied(name)
}
