package pki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"time"
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
// CA in caDir when RenewDue (a fresh key, the same name and subject
// alternative names, the CA's NodeValidity) and reports whether it did.
// A node directory whose certificate is from another CA is not touched
// (CA rotation is an operator's step, see docs/SECURITY.md).
func Renew(caDir, dir string, validity time.Duration, now time.Time) (bool, error) {
	leaf, _, err := readCert(filepath.Join(dir, NodeCertFile))
	if err != nil {
		return false, fmt.Errorf("pki: renew: %w", err)
	}
	if !RenewDue(leaf, now) {
		return false, nil
	}
	ca, err := LoadCA(caDir)
	if err != nil {
		return false, fmt.Errorf("pki: renew %q: %w", leaf.Subject.CommonName, err)
	}
	if err := leaf.CheckSignatureFrom(ca.Cert); err != nil {
		return false, fmt.Errorf("pki: renew %q: certificate is not from the CA in %s: %w", leaf.Subject.CommonName, caDir, err)
	}
	ca.NodeValidity = validity
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
