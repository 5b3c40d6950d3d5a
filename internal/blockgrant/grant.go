// Package blockgrant signs and checks the short-lived permissions with which a
// file's primary lets one client fetch some blocks of a file from other
// clients' caches or from the slice's replicas (.Hotspot, paper §5.6).
//
// A grant is signed with the primary's own TLS key: every node already
// holds a certificate chained to the deployment CA, so every node can check
// a grant offline, and no further secret has to be distributed or rotated
// (an HMAC key in the configuration service would be readable by every
// node holding etcd credentials, clients included, who could then forge
// grants). The verifier additionally asks its caller whether the signer
// may speak for the file (a server of the file's slice), since clients hold
// certificates from the same CA.
package blockgrant

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/wire"
)

// DefaultTTL is how long a grant is valid: long enough for one chunk of
// blocks to be fetched from a few holders, short enough that a revoked
// permission stops being honoured soon.
const DefaultTTL = 30 * time.Second

var (
	// ErrInvalid means the grant is malformed, badly signed or signed by
	// a certificate the deployment CA did not issue.
	ErrInvalid = errors.New("blockgrant: invalid")
	// ErrExpired means the grant's time is up.
	ErrExpired = errors.New("blockgrant: expired")
)

// Signer signs grants with a node's TLS key.
type Signer struct {
	key  crypto.Signer
	cert []byte
	name string
}

// NewSigner returns a signer for the node whose certificate is c (name is
// its CommonName).
func NewSigner(c tls.Certificate, name string) (*Signer, error) {
	key, ok := c.PrivateKey.(crypto.Signer)
	if !ok || len(c.Certificate) == 0 {
		return nil, fmt.Errorf("blockgrant: certificate of %s has no signing key", name)
	}
	return &Signer{key: key, cert: c.Certificate[0], name: name}, nil
}

// Name is the signing node's ID.
func (s *Signer) Name() string { return s.name }

// CertSum is the SHA-256 of the certificate Sign puts in grants: a
// reader that shows it already holds that certificate gets grants
// without it (it puts it back before it shows them).
func (s *Signer) CertSum() [32]byte { return sha256.Sum256(s.cert) }

// Sign fills in b's signer and signs it.
func (s *Signer) Sign(b *wire.GrantBody) (*wire.Grant, error) {
	b.Signer = s.name
	body, err := proto.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("blockgrant: %w", err)
	}
	sum := sha256.Sum256(body)
	sig, err := s.key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("blockgrant: sign: %w", err)
	}
	return &wire.Grant{Body: body, Sig: sig, Cert: s.cert}, nil
}

// maxCerts bounds the verifier's cache of checked certificates (one per
// server that signs grants).
const maxCerts = 1024

// Verifier checks grants against the deployment CA.
type Verifier struct {
	roots *x509.CertPool
	mu    sync.Mutex
	certs map[[32]byte]*x509.Certificate // chain already verified
}

// NewVerifier returns a verifier trusting certificates issued by roots.
func NewVerifier(roots *x509.CertPool) *Verifier {
	return &Verifier{roots: roots, certs: map[[32]byte]*x509.Certificate{}}
}

// Check verifies g's certificate chain and signature and that it has not
// expired at now, and returns its body.
func (v *Verifier) Check(g *wire.Grant, now time.Time) (*wire.GrantBody, error) {
	if g == nil {
		return nil, fmt.Errorf("%w: none given", ErrInvalid)
	}
	cert, err := v.cert(g.Cert)
	if err != nil {
		return nil, err
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%w: signer key is not ECDSA", ErrInvalid)
	}
	sum := sha256.Sum256(g.Body)
	if !ecdsa.VerifyASN1(pub, sum[:], g.Sig) {
		return nil, fmt.Errorf("%w: bad signature", ErrInvalid)
	}
	b := &wire.GrantBody{}
	if err := proto.Unmarshal(g.Body, b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if b.Signer != cert.Subject.CommonName {
		return nil, fmt.Errorf("%w: signed by %q for %q", ErrInvalid, cert.Subject.CommonName, b.Signer)
	}
	if now.UnixMilli() > b.ExpiresUnixMs {
		return nil, fmt.Errorf("%w: at %v", ErrExpired, time.UnixMilli(b.ExpiresUnixMs))
	}
	return b, nil
}

func (v *Verifier) cert(der []byte) (*x509.Certificate, error) {
	key := sha256.Sum256(der)
	v.mu.Lock()
	c, ok := v.certs[key]
	v.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: v.roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	v.mu.Lock()
	if len(v.certs) >= maxCerts {
		clear(v.certs)
	}
	v.certs[key] = c
	v.mu.Unlock()
	return c, nil
}

// Hashes returns b's block hashes as a set.
func Hashes(b *wire.GrantBody) map[[32]byte]bool {
	out := make(map[[32]byte]bool, len(b.Hashes))
	for _, h := range b.Hashes {
		if len(h) == 32 {
			out[[32]byte(h)] = true
		}
	}
	return out
}

// Body returns g's body without checking it: for the asker a server sent
// g to, which shows it to others and only needs to know what it names.
func Body(g *wire.Grant) (*wire.GrantBody, error) {
	b := &wire.GrantBody{}
	if err := proto.Unmarshal(g.GetBody(), b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return b, nil
}
