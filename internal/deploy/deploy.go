// Package deploy assembles the components of one WheelFS host: a member of
// the configuration service (embedded etcd, or an existing etcd), a storage
// server, and a client core. `wheelfs up`, the in-process tests and the
// benchmarks all start WheelFS through it.
package deploy

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/dirlock"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/route"
	"github.com/wheelfs/wheelfs/internal/server"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Config describes one host.
type Config struct {
	// DataDir holds everything the host keeps: identity, keys, etcd data,
	// the object store.
	DataDir string
	// Site is the host's site name.
	Site string
	// Etcd lists the endpoints of an existing etcd; empty runs an embedded member.
	Etcd []string
	// Listen is the storage server's gRPC address (default 127.0.0.1:0).
	Listen string
	// LockTTL is the slice lock length L.
	LockTTL time.Duration
	Logger  *slog.Logger
	// Client configures the client core; zero values take defaults.
	Client client.Config
}

// NewConfig returns defaults for a one-host deployment in dataDir.
func NewConfig(dataDir string) Config {
	return Config{DataDir: dataDir, Site: "local", Listen: "127.0.0.1:0", LockTTL: 2 * time.Minute,
		Logger: slog.Default(), Client: client.NewConfig()}
}

// ErrForeignData means the data directory belongs to another deployment.
var ErrForeignData = errors.New("deploy: data directory belongs to another deployment")

// identity is what a host remembers about itself (DataDir/identity.json).
type identity struct {
	Server     string `json:"server"`
	Site       string `json:"site"`
	Deployment string `json:"deployment,omitempty"`
}

// Host is a running WheelFS host.
type Host struct {
	cfg      Config
	log      *slog.Logger
	id       identity
	member   *embedded.Member
	Conf     configsvc.Service
	Store    *store.Store
	Server   *server.Server
	grpc     *grpc.Server
	listener net.Listener
	Router   *route.Router
	Client   *client.FS
	Creds    *pki.Credentials
	closers  []func() error
}

// Start brings a host up. It returns when the client can be used.
func Start(ctx context.Context, cfg Config) (h *Host, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Site == "" {
		cfg.Site = "local"
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	h = &Host{cfg: cfg, log: cfg.Logger.With("component", "deploy")}
	started := h // the error returns below set h to nil
	defer func() {
		if err != nil {
			started.Close()
		}
	}()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("deploy: data directory: %w", err)
	}
	// Fail at once if another process runs on this directory: etcd's own
	// lock would block forever.
	lock, err := dirlock.Lock(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	h.closers = append(h.closers, lock.Close)
	if err := h.loadIdentity(); err != nil {
		return nil, err
	}
	if err := h.ensureCredentials(); err != nil {
		return nil, err
	}
	endpoints := cfg.Etcd
	if len(endpoints) == 0 {
		if endpoints, err = h.startEtcd(ctx); err != nil {
			return nil, err
		}
	}
	conf, err := configsvc.Dial(ctx, endpoints, h.Creds.ClientTLS(""), configsvc.Options{
		LockTTL: cfg.LockTTL, Logger: cfg.Logger})
	if err != nil {
		if perr := probeTLS(ctx, endpoints, h.Creds.ClientTLS("")); perr != nil {
			return nil, fmt.Errorf("%w: the configuration service at %v does not accept the credentials in %s (%v)",
				ErrForeignData, endpoints, cfg.DataDir, perr)
		}
		return nil, fmt.Errorf("deploy: config service at %v: %w", endpoints, err)
	}
	h.Conf = conf
	h.closers = append(h.closers, conf.Close)
	if err := h.checkDeployment(ctx); err != nil {
		return nil, err
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, "store"), store.Options{Logger: cfg.Logger.With("component", "store")})
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	h.Store = st
	h.closers = append(h.closers, st.Close)

	if h.listener, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("deploy: listen %s: %w", cfg.Listen, err)
	}
	scfg := server.Config{ID: h.id.Server, Site: cfg.Site, Addr: h.listener.Addr().String(),
		Logger: cfg.Logger, RootUID: uint32(os.Getuid()), RootGID: uint32(os.Getgid())}
	scfg.Peers = func(ctx context.Context, id string) (wire.PeerClient, error) { return h.Router.Peer(ctx, id) }
	h.Server = server.New(scfg, st, conf, cfg.LockTTL)
	h.grpc = grpc.NewServer(grpc.Creds(credentials.NewTLS(h.Creds.ServerTLS())),
		grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20))
	wire.RegisterStorageServer(h.grpc, h.Server)
	wire.RegisterPeerServer(h.grpc, h.Server.PeerService())
	go h.grpc.Serve(h.listener)
	h.closers = append(h.closers, func() error { h.grpc.Stop(); return nil })
	h.Router, err = route.New(ctx, conf, route.Options{Logger: cfg.Logger, TLS: h.Creds.ClientTLS,
		LocalID: h.id.Server, Local: server.LocalClient(h.Server)})
	if err != nil {
		return nil, err
	}
	h.closers = append(h.closers, h.Router.Close)
	if err := h.Server.Start(ctx); err != nil {
		return nil, err
	}
	h.closers = append(h.closers, h.Server.Close)

	ccfg := cfg.Client
	ccfg.Logger = cfg.Logger
	ccfg.Site = cfg.Site
	ccfg.Origin = h.id.Server
	h.Client = client.New(ccfg, h.Router)
	return h, nil
}

// ServerID returns the host's server ID.
func (h *Host) ServerID() string { return h.id.Server }

// Deployment returns the deployment ID.
func (h *Host) Deployment() string { return h.id.Deployment }

// ConfigEndpoints returns the endpoints of the configuration service.
func (h *Host) ConfigEndpoints() []string {
	if h.member != nil {
		return h.member.ClientEndpoints()
	}
	return h.cfg.Etcd
}

// Close stops the host in reverse order of starting. Every acknowledged
// write is already durable; Close only releases resources and locks.
func (h *Host) Close() error {
	var errs []error
	for i := len(h.closers) - 1; i >= 0; i-- {
		if err := h.closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	h.closers = nil
	if h.listener != nil {
		h.listener.Close()
	}
	return errors.Join(errs...)
}

func (h *Host) identityPath() string { return filepath.Join(h.cfg.DataDir, "identity.json") }

func (h *Host) loadIdentity() error {
	data, err := os.ReadFile(h.identityPath())
	if errors.Is(err, os.ErrNotExist) {
		var b [6]byte
		rand.Read(b[:])
		h.id = identity{Server: "srv-" + hex.EncodeToString(b[:]), Site: h.cfg.Site}
		return h.saveIdentity()
	}
	if err != nil {
		return fmt.Errorf("deploy: read identity: %w", err)
	}
	if err := json.Unmarshal(data, &h.id); err != nil {
		return fmt.Errorf("deploy: %s is corrupt: %w", h.identityPath(), err)
	}
	if h.id.Site != h.cfg.Site {
		return fmt.Errorf("deploy: %s was a server at site %q, not %q", h.cfg.DataDir, h.id.Site, h.cfg.Site)
	}
	return nil
}

func (h *Host) saveIdentity() error {
	data, _ := json.MarshalIndent(h.id, "", "  ")
	tmp := h.identityPath() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("deploy: write identity: %w", err)
	}
	if err := os.Rename(tmp, h.identityPath()); err != nil {
		return fmt.Errorf("deploy: write identity: %w", err)
	}
	return nil
}

// caDir holds the deployment CA; nodeDir the host's own credentials.
func (h *Host) caDir() string   { return filepath.Join(h.cfg.DataDir, "ca") }
func (h *Host) nodeDir() string { return filepath.Join(h.cfg.DataDir, "node") }

// ensureCredentials creates the deployment CA on the first start of an
// embedded deployment, and this host's certificate from it.
func (h *Host) ensureCredentials() error {
	if _, err := os.Stat(filepath.Join(h.nodeDir(), pki.NodeCertFile)); err != nil {
		if _, err := os.Stat(filepath.Join(h.caDir(), pki.CACertFile)); err != nil {
			if len(h.cfg.Etcd) > 0 {
				return fmt.Errorf("deploy: no credentials in %s: copy the deployment's CA directory to %s", h.nodeDir(), h.caDir())
			}
			if _, err := pki.InitCA(h.caDir(), "wheelfs"); err != nil {
				return fmt.Errorf("deploy: create CA: %w", err)
			}
		}
	}
	creds, err := pki.EnsureNode(h.caDir(), h.nodeDir(), h.id.Server, []string{"localhost"}, nil)
	if err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	h.Creds = creds
	return nil
}

func (h *Host) startEtcd(ctx context.Context) ([]string, error) {
	ec := embedded.NewConfig()
	ec.Name = h.id.Server
	ec.Dir = filepath.Join(h.cfg.DataDir, "etcd")
	ec.Logger = h.cfg.Logger
	nd := h.nodeDir()
	ec.TLS = &embedded.TLSInfo{CertFile: filepath.Join(nd, pki.NodeCertFile), KeyFile: filepath.Join(nd, pki.NodeKeyFile),
		CAFile: filepath.Join(nd, pki.CACertFile)}
	m, err := embedded.Start(ctx, ec)
	if err != nil {
		return nil, fmt.Errorf("deploy: start embedded etcd: %w", err)
	}
	h.member = m
	h.closers = append(h.closers, m.Close)
	eps := m.ClientEndpoints()
	if err := os.WriteFile(EndpointsFile(h.cfg.DataDir), []byte(strings.Join(eps, ",")+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	return eps, nil
}

// EndpointsFile is where a host with an embedded member records its
// configuration service endpoints, for `wheelfs status`.
func EndpointsFile(dataDir string) string { return filepath.Join(dataDir, "endpoints") }

// probeTLS shakes hands with the first endpoint and returns the error
// when the two sides' certificates come from different CAs: then the data
// directory belongs to another deployment. It returns nil for any other
// outcome (unreachable, fine), which the caller reports as it is.
func probeTLS(ctx context.Context, endpoints []string, cfg *tls.Config) error {
	if len(endpoints) == 0 {
		return nil
	}
	u, err := url.Parse(endpoints[0])
	if err != nil || u.Host == "" {
		return nil
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: cfg}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := d.DialContext(pctx, "tcp", u.Host)
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
func (h *Host) checkDeployment(ctx context.Context) error {
	dep, err := h.Conf.Deployment(ctx)
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
