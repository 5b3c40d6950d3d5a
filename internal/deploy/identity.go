package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/pki"
)

// identity is what a host remembers about itself (DataDir/identity.json).
type identity struct {
	Server     string `json:"server"`
	Site       string `json:"site"`
	Deployment string `json:"deployment,omitempty"`
}

func (h *Host) identityPath() string { return filepath.Join(h.cfg.DataDir, "identity.json") }

// idPrefix names a new host's ID by its main role.
func (h *Host) idPrefix() string {
	switch r := h.cfg.Roles; {
	case r&RoleServer != 0:
		return "srv-"
	case r&RoleMember != 0:
		return "cfg-"
	default:
		return "cli-"
	}
}

func (h *Host) loadIdentity() error {
	data, err := os.ReadFile(h.identityPath())
	if errors.Is(err, os.ErrNotExist) {
		h.id = identity{Site: h.cfg.Site}
		switch {
		case h.cfg.NodeDir != "":
			// A pre-issued node directory fixes the ID.
			creds, err := pki.LoadCredentials(h.cfg.NodeDir)
			if err != nil {
				return fmt.Errorf("deploy: node directory: %w", err)
			}
			h.id.Server = creds.Name
		default:
			var b [6]byte
			rand.Read(b[:])
			h.id.Server = h.idPrefix() + hex.EncodeToString(b[:])
		}
		return nil // saved once the host has credentials
	}
	if err != nil {
		return fmt.Errorf("deploy: read identity: %w", err)
	}
	if err := json.Unmarshal(data, &h.id); err != nil {
		return fmt.Errorf("deploy: %s is corrupt: %w", h.identityPath(), err)
	}
	if h.cfg.Roles&RoleServer != 0 && h.id.Site != h.cfg.Site {
		return fmt.Errorf("deploy: %s holds a server at site %q, not %q (use --site %s, or another data directory)",
			h.cfg.DataDir, h.id.Site, h.cfg.Site, h.id.Site)
	}
	return nil
}

func (h *Host) saveIdentity() error {
	data, _ := json.MarshalIndent(h.id, "", "  ")
	// Unchanged (every restart): not written, so that a host whose disk
	// is full still starts.
	if old, err := os.ReadFile(h.identityPath()); err == nil && bytes.Equal(old, data) {
		return nil
	}
	tmp := h.identityPath() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("deploy: write identity: %w", err)
	}
	if err := os.Rename(tmp, h.identityPath()); err != nil {
		return fmt.Errorf("deploy: write identity: %w", err)
	}
	return nil
}

// caDir holds a CA created by `wheelfs up`; nodeDir the host's own credentials.
func (h *Host) caDir() string   { return filepath.Join(h.cfg.DataDir, "ca") }
func (h *Host) nodeDir() string { return filepath.Join(h.cfg.DataDir, "node") }

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// ensureCredentials finds or makes this host's credentials, in this order:
// a pre-issued NodeDir (copied into DataDir/node), credentials already in
// DataDir/node, a certificate issued from CADir, from a CA that `wheelfs up`
// created in DataDir/ca, or (InitCA, new configuration service only) a new
// CA in DataDir/ca.
func (h *Host) ensureCredentials() error {
	nd := h.nodeDir()
	have := exists(filepath.Join(nd, pki.NodeCertFile))
	caDir := h.cfg.CADir
	switch {
	case h.cfg.NodeDir != "" && !have:
		if err := copyNodeDir(h.cfg.NodeDir, nd); err != nil {
			return fmt.Errorf("deploy: %w", err)
		}
	case have && h.cfg.CADir != "" && !trustsCA(filepath.Join(nd, pki.CACertFile), filepath.Join(h.cfg.CADir, pki.CACertFile)):
		stored, given := caName(filepath.Join(nd, pki.CACertFile)), caName(filepath.Join(h.cfg.CADir, pki.CACertFile))
		if h.id.Deployment != "" {
			return fmt.Errorf("%w: %s holds credentials issued by CA %s (deployment %s), but --ca %s is CA %s; "+
				"drop --ca to run with the stored credentials, or use another --data for the deployment of --ca",
				ErrForeignData, h.cfg.DataDir, stored, h.id.Deployment, h.cfg.CADir, given)
		}
		// Never accepted by a deployment (an earlier start with another
		// --ca failed): issue afresh from the --ca given now.
		h.log.Info("re-issuing credentials never accepted by a deployment from --ca",
			"stored_ca", stored, "ca", h.cfg.CADir, "ca_name", given)
		if err := os.RemoveAll(nd); err != nil {
			return fmt.Errorf("deploy: remove unaccepted credentials: %w", err)
		}
	case have:
		caDir = nd // nothing to issue; EnsureNode only checks
	case caDir != "":
	case exists(filepath.Join(h.caDir(), pki.CACertFile)):
		caDir = h.caDir()
	case h.cfg.InitCA && h.cfg.Roles&RoleMember != 0 && len(h.cfg.Member.Join) == 0:
		if _, err := pki.InitCA(h.caDir(), "wheelfs"); err != nil {
			return fmt.Errorf("deploy: create CA: %w", err)
		}
		caDir = h.caDir()
	default:
		return fmt.Errorf("%w in %s: give the deployment's CA directory (--ca, from `wheelfs ca init`) or a node directory issued by `wheelfs ca issue` (--node-dir)",
			ErrNoCredentials, h.cfg.DataDir)
	}
	dns, ips := h.altNames()
	creds, err := pki.EnsureNode(caDir, nd, h.id.Server, h.serverRole(), dns, ips)
	if err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	h.Creds = creds
	return h.saveIdentity()
}

// altNames are the names and addresses others use to reach this host, for
// its certificate: the hosts of its listen addresses and its host name.
func (h *Host) altNames() (dns []string, ips []net.IP) {
	if hn, err := os.Hostname(); err == nil && hn != "" {
		dns = append(dns, hn)
	}
	for _, a := range []string{h.cfg.Listen, h.cfg.Member.Listen, h.cfg.Member.PeerListen} {
		if i := strings.Index(a, "://"); i >= 0 {
			a = a[i+3:]
		}
		host, _, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			if !ip.IsUnspecified() {
				ips = append(ips, ip)
			}
		} else {
			dns = append(dns, host)
		}
	}
	return dns, ips
}

// trustsCA reports whether the node's ca.crt (bundle) holds the CA
// certificate in caFile: the same file, or a rotation bundle with it.
func trustsCA(bundle, caFile string) bool {
	db, errB := os.ReadFile(bundle)
	dc, errC := os.ReadFile(caFile)
	return errB == nil && errC == nil && len(dc) > 0 && bytes.Contains(db, bytes.TrimSpace(dc))
}

// caName names a CA certificate for error messages: its subject and the
// start of its SHA-256 fingerprint.
func caName(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return path
	}
	if b, _ := pem.Decode(data); b != nil {
		data = b.Bytes
	}
	cert, err := x509.ParseCertificate(data)
	if err != nil {
		return path
	}
	sum := sha256.Sum256(cert.Raw)
	return fmt.Sprintf("%q (sha256 %s)", cert.Subject.CommonName, hex.EncodeToString(sum[:8]))
}

// copyNodeDir copies a pre-issued node directory's three files.
func copyNodeDir(from, to string) error {
	if _, err := pki.LoadCredentials(from); err != nil {
		return fmt.Errorf("node directory: %w", err)
	}
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	for _, f := range []string{pki.CACertFile, pki.NodeKeyFile, pki.NodeCertFile} { // certificate last
		data, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, f), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// probeTLS shakes hands with the first endpoint and returns the error
// when the two sides' certificates come from different CAs: then the data
// directory belongs to another deployment. It returns nil for any other
// outcome (unreachable, fine), which the caller reports as it is.
func probeTLS(ctx context.Context, endpoints []string, cfg *tls.Config) error {
	if len(endpoints) == 0 {
		return nil
	}
	host := endpoints[0]
	if strings.Contains(host, "://") {
		u, err := url.Parse(host)
		if err != nil || u.Host == "" {
			return nil
		}
		host = u.Host
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: cfg}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := d.DialContext(pctx, "tcp", host)
	if err == nil {
		conn.Close()
		return nil
	}
	var unknown x509.UnknownAuthorityError
	var alert tls.AlertError
	if errors.As(err, &unknown) || errors.As(err, &alert) {
		return err
	}
	return nil
}

// checkDeployment binds the data directory to the configuration service's
// deployment on first start and refuses a mismatch afterwards.
func (h *Host) checkDeployment(ctx context.Context, conf configsvc.Service) error {
	dep, err := conf.Deployment(ctx)
	if err != nil {
		return fmt.Errorf("deploy: read deployment ID: %w", err)
	}
	if h.id.Deployment == "" {
		h.id.Deployment = dep
		return h.saveIdentity()
	}
	if h.id.Deployment != dep {
		return fmt.Errorf("%w: %s is part of deployment %s, the configuration service serves %s",
			ErrForeignData, h.cfg.DataDir, h.id.Deployment, dep)
	}
	return nil
}
