package server

import (
	"context"
	"crypto/x509"
	"fmt"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// maxCSR bounds a certificate request (an ECDSA P-256 one is ~250 bytes).
const maxCSR = 16 << 10

// CertRenewer signs a renewed certificate for the node whose current
// certificate is current, for the key of csr, without the server role if
// dropServer (pki.CA.SignRenewal, after checking that the node is not
// revoked).
type CertRenewer interface {
	RenewCertificate(ctx context.Context, current *x509.Certificate, csr []byte, dropServer bool) (certPEM []byte, err error)
}

// RenewCertificate implements wire.StorageServer: a node without the CA
// key renews its certificate through this server, over the connection its
// current certificate authenticated (so a revoked node, refused in the
// handshake, cannot). Name and addresses are the current certificate's.
func (s *Server) RenewCertificate(ctx context.Context, req *wire.RenewCertificateRequest) (*wire.RenewCertificateResponse, error) {
	if len(req.Csr) > maxCSR {
		return nil, fmt.Errorf("certificate request of %d bytes: %w", len(req.Csr), fserr.ErrInvalid)
	}
	cur, err := pki.PeerCertificate(ctx)
	if err != nil {
		return nil, fmt.Errorf("certificate renewal without a TLS peer: %w", fserr.ErrInvalid)
	}
	if s.cfg.Certs == nil {
		return nil, fmt.Errorf("certificate renewal: this server does not hold the CA key: %w", fserr.ErrNotSupported)
	}
	cert, err := s.cfg.Certs.RenewCertificate(ctx, cur, req.Csr, req.DropServerRole)
	if err != nil {
		s.log.Warn("certificate renewal refused", "node", cur.Subject.CommonName, "err", err)
		return nil, fmt.Errorf("certificate renewal: %v: %w", err, fserr.ErrPerm)
	}
	s.log.Info("certificate renewed", "node", cur.Subject.CommonName)
	return &wire.RenewCertificateResponse{Cert: cert}, nil
}
