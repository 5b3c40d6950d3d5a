package deploy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// renewTimeout bounds one renewal call to a server.
const renewTimeout = 10 * time.Second

// certRenewer is a server's side of RenewCertificate at a host that holds
// the CA key: it signs for nodes that are not revoked.
type certRenewer struct{ h *Host }

func (r certRenewer) RenewCertificate(_ context.Context, current *x509.Certificate, csr []byte, dropServer bool) ([]byte, error) {
	name := current.Subject.CommonName
	if r.h.Creds.Deny.Denied(name) {
		return nil, fmt.Errorf("node %q is revoked", name)
	}
	ca, err := pki.LoadCA(r.h.caKeyDir())
	if err != nil {
		return nil, err
	}
	ca.NodeValidity = r.h.cfg.CertValidity
	return ca.SignRenewal(current, csr, time.Now(), dropServer)
}

// renewRemote asks the registered servers, in random order, for a new
// certificate until one that holds the CA key signs it, installs it in
// the node directory and presents it on new connections. A host without
// the CA key calls it once its certificate is due.
func (h *Host) renewRemote(ctx context.Context) error {
	if h.Conf == nil {
		return errors.New("no configuration service")
	}
	tctx, cancel := context.WithTimeout(ctx, renewTimeout)
	t, err := h.Conf.Table(tctx)
	cancel()
	if err != nil {
		return err
	}
	req, err := pki.NewRenewalRequest(h.Creds.Name)
	if err != nil {
		return err
	}
	servers := make([]string, 0, len(t.Servers))
	for id := range t.Servers {
		if id != h.Creds.Name {
			servers = append(servers, id)
		}
	}
	rand.Shuffle(len(servers), func(i, j int) { servers[i], servers[j] = servers[j], servers[i] })
	var errs []error
	for _, id := range servers {
		cert, err := h.renewAt(ctx, id, t.Servers[id].Addr, req.CSR)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		nd := h.nodeDir()
		if err := req.Install(nd, cert); err != nil {
			return err
		}
		if err := h.Creds.Reload(nd); err != nil {
			return err
		}
		h.log.Info("node certificate renewed by a server", "node", h.Creds.Name, "server", id)
		return nil
	}
	return fmt.Errorf("no server renewed the certificate: %w", errors.Join(errs...))
}

// renewAt asks server id at addr to sign csr.
func (h *Host) renewAt(ctx context.Context, id, addr string, csr []byte) ([]byte, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(h.Creds.ClientCredentials(id))}
	if d := h.dialer(); d != nil {
		opts = append(opts, grpc.WithContextDialer(d))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, renewTimeout)
	defer cancel()
	resp, err := wire.NewStorageClient(conn).RenewCertificate(cctx, &wire.RenewCertificateRequest{Csr: csr, DropServerRole: !h.serverRole()})
	if err != nil {
		return nil, err
	}
	return resp.Cert, nil
}
