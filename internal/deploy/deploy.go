// Package deploy assembles the components of one WheelFS host from three
// roles, each built from the same pieces:
//
//   - the config member role: an embedded etcd member of the configuration
//     service (starting a new cluster, or joining a running one);
//   - the server role: the object store, the gRPC listener and server.Server;
//   - the client role: the client core (client.FS) over a route.Router.
//
// `wheelfs up` runs all three; `wheelfs config`, `server`, `mount` and
// `node` run one or two of them. The in-process tests and the benchmarks
// start WheelFS through it too, optionally over a shaped transport.Network.
package deploy

import (
	"context"
	"errors"
	"fmt"
	"github.com/wheelfs/wheelfs/internal/auth"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/dirlock"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/route"
	"github.com/wheelfs/wheelfs/internal/server"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/transport"
)

// Roles selects what a host runs.
type Roles uint8

const (
	// RoleMember runs an embedded configuration-service (etcd) member.
	RoleMember Roles = 1 << iota
	// RoleServer runs a storage server.
	RoleServer
	// RoleClient runs a client core (Host.Client).
	RoleClient
	// RolesUp is everything: the one-host deployment of `wheelfs up`.
	RolesUp = RoleMember | RoleServer | RoleClient
)

// Config describes one host.
type Config struct {
	// DataDir holds everything the host keeps: identity, keys, etcd data,
	// the object store.
	DataDir string
	// Site is the host's site name.
	Site string
	// Roles selects the roles. Zero means RoleServer|RoleClient, plus
	// RoleMember when Etcd is empty (the behaviour of `wheelfs up`).
	Roles Roles
	// Etcd lists the endpoints of the configuration service (an existing
	// etcd, or config members started elsewhere). Required without
	// RoleMember; with it, ignored.
	Etcd []string
	// Listen is the storage server's gRPC address (default 127.0.0.1:0).
	Listen string
	// Member configures the RoleMember role.
	Member MemberConfig
	// CADir is the deployment CA (ca.crt, ca.key) from which the host
	// issues its own certificate on first start.
	CADir string
	// NodeDir is a node directory (ca.crt, node.crt, node.key) issued
	// elsewhere (`wheelfs ca issue`); the node's ID is its certificate's
	// name. It is copied into DataDir on first start.
	NodeDir string
	// CertValidity is the lifetime of node certificates this host renews
	// from the CA key it holds (0: pki.DefaultNodeValidity).
	CertValidity time.Duration
	// CertCheckPeriod is how often the host checks its certificate's
	// expiry (0: an hour): it renews when a third of the lifetime is left
	// and it holds the CA key, and warns otherwise.
	CertCheckPeriod time.Duration
	// InitCA lets a host that starts a new configuration service (RoleMember
	// without Member.Join) create the deployment CA in DataDir/ca when it
	// has no credentials yet: the zero-configuration `wheelfs up`.
	InitCA bool
	// Network, when non-nil, carries every connection: the server listens
	// with Network.Listen(Site, Listen) and every dial (router, etcd client)
	// goes through Network.Dialer(Site). The embedded etcd member listens
	// on its own.
	Network *transport.Network
	// LockTTL is the slice lock length L.
	LockTTL time.Duration
	// MemberTTL is the server's membership lease (0: configsvc's default,
	// 10 s). A server cut off from the configuration majority for longer
	// drops out of the server table: its replicas count as down and the
	// maintenance loop replaces them at once, and clients stop routing to
	// it; it re-registers as soon as it reaches the majority again. Shorter
	// detects dead servers sooner but turns shorter outages into repairs.
	// When set it must be at least 3 s and 3 maintenance periods (keep-
	// alives go every MemberTTL/3), and at most LockTTL (a server that
	// still holds its slices should not look gone).
	MemberTTL time.Duration
	// ConfigWait bounds the wait for the configuration service to answer
	// at start (default 30 s; a shorter ctx deadline wins).
	ConfigWait time.Duration
	Logger     *slog.Logger
	// Client configures the client core; zero values take defaults.
	Client client.Config
	// Server tunes the storage server (maintenance period, peer timeouts);
	// identity fields are filled in by Start.
	Server server.Config
	// TrustClientUIDs makes the server act for whatever uid a client
	// sends (NFS AUTH_SYS style). Without it, a client node that runs no
	// server needs a session per uid (`wheelfs login`, issue 13).
	TrustClientUIDs bool
	// ConfigAuth says when the host turns on the configuration service's
	// own authentication (etcd auth, one etcd user per node certificate
	// name; see docs/SECURITY.md): by default (ConfigAuthNew) when it
	// holds the CA key and creates the deployment. Once on, hosts holding
	// the CA key add their own user, and other nodes need theirs added by
	// `wheelfs ca issue --config`.
	ConfigAuth ConfigAuthMode
	// UnsignedSessions admits session records no server signed (written
	// before records were signed, or by a server whose certificate lacks
	// the server role), as before: any node that can write to the
	// configuration service can then give itself a session. An explicit
	// opt-out for a rolling upgrade (docs/SECURITY.md); off by default.
	UnsignedSessions bool
	// SessionTTL is how long a login lasts unless renewed (default
	// auth.DefaultSessionTTL).
	SessionTTL time.Duration
	// UsersPeriod is how often the server checks the users file's version
	// (default 1 s; a check is answered from the lease cache).
	UsersPeriod time.Duration
	// Store tunes the server's object store (segment size, background
	// reclamation of freed blocks); zero values take defaults and the
	// logger is filled in by Start.
	Store store.Options
	// Coord tunes the host's network coordinate; zero values take
	// defaults.
	Coord CoordConfig
	// Peer configures serving the client's cache to other clients
	// (.Hotspot); NewConfig listens on 127.0.0.1:0.
	Peer PeerConfig
}

// MemberConfig configures an embedded configuration-service member.
type MemberConfig struct {
	// Listen is the client address (host:port; empty or port 0 picks a
	// free loopback port, remembered in the data directory).
	Listen string
	// PeerListen is the peer address; empty means Listen's host with port+1
	// (or a free port when Listen's port is automatic).
	PeerListen string
	// Join lists client endpoints of running members. On first start the
	// member is added to their cluster (MemberAdd) and started with
	// initial-cluster-state existing; empty starts a new cluster. A restart
	// on the same DataDir ignores it.
	Join []string
}

// NewConfig returns defaults for a one-host deployment in dataDir.
func NewConfig(dataDir string) Config {
	return Config{DataDir: dataDir, Site: "local", Listen: "127.0.0.1:0", LockTTL: 2 * time.Minute, InitCA: true,
		Logger: slog.Default(), Client: client.NewConfig(), Peer: PeerConfig{Listen: "127.0.0.1:0"}}
}

var (
	// ErrForeignData means the data directory belongs to another deployment.
	ErrForeignData = errors.New("deploy: data directory belongs to another deployment")
	// ErrNoCredentials means the host has no certificate and no CA to
	// issue one from.
	ErrNoCredentials = errors.New("deploy: no credentials")
)

// Host is a running WheelFS host. Fields of roles that are not running are nil.
type Host struct {
	cfg    Config
	log    *slog.Logger
	id     identity
	member *embedded.Member
	etcd   *configsvc.EtcdService
	// admin is the configuration service's administrator client, kept
	// by a host that holds the CA key while etcd auth is on (configauth.go).
	admin    *configsvc.EtcdService
	Conf     configsvc.Service
	Store    *store.Store
	Server   *server.Server
	grpc     *grpc.Server
	gate     gate
	listener net.Listener
	Router   *route.Router
	Client   *client.FS
	Creds    *pki.Credentials
	// Coord is the host's network coordinate (server and client roles).
	Coord   *netcoord.Node
	closers []closer
	guard   *auth.Guard  // users and sessions (nil: client uids trusted)
	peerLn  net.Listener // the client's PeerCache service (nil: none)
}

// closer stops one piece; crash, when set, replaces close in Crash.
type closer struct {
	close func() error
	crash func() error
}

func (h *Host) onClose(close, crash func() error) {
	h.closers = append(h.closers, closer{close: close, crash: crash})
}

func (c *Config) withDefaults() {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Site == "" {
		c.Site = "local"
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.Roles == 0 {
		c.Roles = RoleServer | RoleClient
		if len(c.Etcd) == 0 {
			c.Roles |= RoleMember
		}
	}
	if c.ConfigWait <= 0 {
		c.ConfigWait = 30 * time.Second
	}
	if c.Client.Timeout <= 0 {
		c.Client.Timeout = client.DefaultTimeout
	}
	if c.Server.LeaseTTL == 0 {
		c.Server.LeaseTTL = min(server.DefaultLeaseTTL, c.Client.Timeout/3)
	}
}

// Validate reports configuration errors that need no I/O.
func (c *Config) Validate() error {
	if c.DataDir == "" {
		return errors.New("deploy: no data directory")
	}
	if c.Roles&RoleMember == 0 && len(c.Etcd) == 0 {
		return errors.New("deploy: no configuration service endpoints (--config or --etcd)")
	}
	if c.Roles&RolesUp == 0 {
		return errors.New("deploy: no role selected")
	}
	if bound := c.Client.Timeout; bound > 0 && c.Server.LeaseTTL >= bound {
		// Every node's clients use the same bound (client.DefaultTimeout
		// unless a test sets another).
		return fmt.Errorf("deploy: lease %v must be shorter than the clients' call bound %v "+
			"(a write waits out the lease of a client it cannot call back, within its own call; "+
			"default a third of the bound)", c.Server.LeaseTTL, bound)
	}
	if v := c.CertValidity; v != 0 && v < time.Hour {
		// Certificates are backdated an hour, so a shorter one would be
		// due for renewal at every check.
		return fmt.Errorf("deploy: certificate validity %s is below an hour", v)
	}
	if t := c.MemberTTL; t != 0 {
		maint := c.Server.MaintainPeriod
		if maint <= 0 {
			maint = time.Second // the server's default
		}
		switch {
		case t < minMemberTTL:
			return fmt.Errorf("deploy: member TTL %s is below %s", t, minMemberTTL)
		case t < 3*maint:
			return fmt.Errorf("deploy: member TTL %s is below 3 maintenance periods (%s)", t, 3*maint)
		case c.LockTTL > 0 && t > c.LockTTL:
			return fmt.Errorf("deploy: member TTL %s exceeds the lock TTL %s", t, c.LockTTL)
		}
	}
	return nil
}

// minMemberTTL is the shortest membership lease: keep-alives every second,
// and above etcd's own minimum lease (1.5 election timeouts, rounded up).
const minMemberTTL = 3 * time.Second

// Start brings a host up. It returns when every role is ready (the client
// can be used).
func Start(ctx context.Context, cfg Config) (h *Host, err error) {
	cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h = &Host{cfg: cfg, log: cfg.Logger.With("component", "deploy")}
	started := h // the error returns below set h to nil
	// A start that fails on a new (missing or empty) data directory leaves
	// nothing behind: a retry with other flags (another --ca, --site)
	// starts afresh instead of tripping over half-made credentials.
	_, statErr := os.Stat(cfg.DataDir)
	existed, fresh := statErr == nil, emptyOrMissing(cfg.DataDir)
	defer func() {
		if err != nil {
			started.Close()
			if fresh {
				removeContents(cfg.DataDir, !existed, started.log)
			}
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
	h.onClose(lock.Close, nil)
	if err := h.loadIdentity(); err != nil {
		return nil, err
	}
	if err := h.ensureCredentials(); err != nil {
		return nil, err
	}
	endpoints := cfg.Etcd
	if cfg.Roles&RoleMember != 0 {
		if endpoints, err = h.startMember(ctx); err != nil {
			return nil, err
		}
	}
	if err := h.dialConfig(ctx, endpoints); err != nil {
		return nil, err
	}
	h.followDenied(ctx)
	h.renewCerts()
	if cfg.Roles&RoleMember == 0 {
		// `wheelfs status --data DIR` finds the service through it, as it
		// does a member's own endpoints.
		if err := os.WriteFile(EndpointsFile(cfg.DataDir), []byte(strings.Join(endpoints, ",")+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("deploy: %w", err)
		}
	}
	if cfg.Roles&(RoleServer|RoleClient) == 0 {
		return h, nil
	}
	// The router comes first: it only needs the configuration service,
	// and the server may use it to reach its peers.
	var local *lateLocal
	h.Coord = netcoord.New(h.id.Server, netcoord.Options{SampleEvery: cfg.Coord.SampleEvery})
	ropts := route.Options{Logger: cfg.Logger, Creds: h.Creds.ClientCredentials, Dial: h.dialer(),
		Coord: h.Coord, ProbeEvery: cfg.Coord.ProbeEvery}
	if cfg.Roles&RoleServer != 0 {
		local = &lateLocal{}
		ropts.LocalID, ropts.Local = h.id.Server, local
	}
	if err := h.retry(ctx, "read the slice table", func(ctx context.Context) (err error) {
		h.Router, err = route.New(ctx, h.Conf, ropts)
		return err
	}); err != nil {
		return nil, err
	}
	h.onClose(h.Router.Close, nil)
	if cfg.Roles&RoleServer != 0 && !cfg.TrustClientUIDs {
		h.newGuard()
	}
	if cfg.Roles&RoleServer != 0 {
		if err := h.grantKeys(); err != nil {
			return nil, err
		}
		if err := h.startServer(ctx, local); err != nil {
			return nil, err
		}
	}
	if cfg.Roles&RoleClient != 0 {
		ccfg := cfg.Client
		ccfg.Logger = cfg.Logger
		ccfg.Site = cfg.Site
		if cfg.Roles&RoleServer != 0 {
			ccfg.Origin = h.id.Server // write-local placement
		} else {
			// Without a server here the servers want a login per uid,
			// unless this deployment says they trust client uids.
			ccfg.LoginRequired = !cfg.TrustClientUIDs
		}
		ccfg.Node, ccfg.Coord = h.id.Server, h.Coord
		if err := h.peerSide(&ccfg); err != nil {
			return nil, err
		}
		h.Client = client.New(ccfg, h.Router)
		h.onClose(h.Client.Close, h.Client.Close)
		h.servePeer()
	}
	h.publishCoord(ctx)
	if h.guard != nil {
		h.followUsers()
	}
	return h, nil
}

// emptyOrMissing reports whether dir does not exist or holds nothing.
func emptyOrMissing(dir string) bool {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	return err == nil && len(entries) == 0
}

// removeContents removes what a failed first start put in dir, and dir
// itself when the start created it.
func removeContents(dir string, created bool, log *slog.Logger) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			log.Warn("could not remove what a failed start created", "path", filepath.Join(dir, e.Name()), "err", err)
		}
	}
	if created {
		os.Remove(dir)
	}
}

// dialer returns the dial function of the shaped network, nil without one.
func (h *Host) dialer() func(ctx context.Context, addr string) (net.Conn, error) {
	if h.cfg.Network == nil {
		return nil
	}
	return h.cfg.Network.Dialer(h.cfg.Site)
}

// dialConfig connects to the configuration service and reads the
// deployment ID (a linearizable read, so a quorum answers), retrying for up
// to ConfigWait: members may still be starting or joining.
func (h *Host) dialConfig(ctx context.Context, endpoints []string) error {
	wctx, cancel := context.WithTimeout(ctx, h.cfg.ConfigWait)
	defer cancel()
	opts := configsvc.Options{LockTTL: h.cfg.LockTTL, MemberTTL: h.cfg.MemberTTL, Logger: h.cfg.Logger, Dial: h.dialer(),
		// Members are probed every maintenance period, so that a site
		// back from a partition re-registers and is routed to within
		// about one (not more often than twice a second: probes are reads
		// through the leader).
		ProbePeriod: max(h.cfg.Server.MaintainPeriod, 500*time.Millisecond)}
	// Members started at the same moment as this host may not listen yet;
	// if nothing listens for refusedGrace, nothing is coming.
	var refusedSince time.Time
	refusedGrace := min(h.cfg.ConfigWait, 3*time.Second)
	lastErr := ""
	usersReady := false
	for {
		var conf *configsvc.EtcdService
		var err error
		if !usersReady {
			// Before the host's own client needs its etcd user.
			if err = h.ensureConfigUser(wctx, endpoints, opts); err == nil {
				usersReady = true
			}
		}
		if err == nil {
			conf, err = configsvc.Dial(wctx, endpoints, h.Creds.ClientTLS(""), opts)
		}
		if errors.Is(err, configsvc.ErrNoUser) && h.admin == nil {
			return fmt.Errorf("deploy: node %q: %w", h.Creds.Name, err)
		}
		// This host added its own user a moment ago: the member that
		// answered the probe (a serializable read) may not have it yet.
		if errors.Is(err, configsvc.ErrRefused) {
			if refusedSince.IsZero() {
				refusedSince = time.Now()
			}
			if time.Since(refusedSince) >= refusedGrace {
				return err
			}
		} else {
			refusedSince = time.Time{}
		}
		if err == nil {
			if err = h.checkDeployment(wctx, conf); err == nil {
				h.etcd, h.Conf = conf, conf
				h.onClose(conf.Close, conf.Abandon)
				return nil
			}
			conf.Close()
			if errors.Is(err, ErrForeignData) {
				return err
			}
		}
		if perr := probeTLS(wctx, endpoints, h.Creds.ClientTLS("")); perr != nil {
			return fmt.Errorf("%w: the configuration service at %v does not accept the credentials in %s, issued by CA %s (%v); "+
				"give the deployment's CA with --ca (or its node directory with --node-dir)",
				ErrForeignData, endpoints, h.cfg.DataDir, caName(filepath.Join(h.nodeDir(), pki.CACertFile)), perr)
		}
		lvl := slog.LevelDebug
		if err != nil && err.Error() != lastErr { // once per distinct error
			lvl, lastErr = slog.LevelInfo, err.Error()
		}
		h.log.Log(wctx, lvl, "configuration service not ready yet; retrying", "endpoints", endpoints, "err", err)
		select {
		case <-wctx.Done():
			return fmt.Errorf("deploy: configuration service at %v not ready after %v: %w",
				endpoints, h.cfg.ConfigWait, err)
		case <-time.After(time.Second):
		}
	}
}

// retry runs f until it succeeds, for up to ConfigWait: while members
// join, the configuration service may lose its quorum for a few seconds.
func (h *Host) retry(ctx context.Context, what string, f func(context.Context) error) error {
	wctx, cancel := context.WithTimeout(ctx, h.cfg.ConfigWait)
	defer cancel()
	for {
		err := f(wctx)
		if err == nil {
			return nil
		}
		h.log.Info("configuration service not ready; retrying", "op", what, "err", err)
		select {
		case <-wctx.Done():
			return fmt.Errorf("deploy: %s: %w", what, err)
		case <-time.After(time.Second):
		}
	}
}

// ServerID returns the host's ID (its certificate name; the server ID if it
// runs a server).
func (h *Host) ServerID() string { return h.id.Server }

// Deployment returns the deployment ID.
func (h *Host) Deployment() string { return h.id.Deployment }

// Addr returns the storage server's listen address ("" without RoleServer).
func (h *Host) Addr() string {
	if h.listener == nil {
		return ""
	}
	return h.listener.Addr().String()
}

// ConfigEndpoints returns the endpoints of the configuration service.
func (h *Host) ConfigEndpoints() []string {
	if h.member != nil {
		return h.member.ClientEndpoints()
	}
	return h.cfg.Etcd
}

// Close stops the host in reverse order of starting. Every acknowledged
// write is already durable; Close only releases resources and locks.
func (h *Host) Close() error { return h.stop(false) }

// Crash stops the host as kill -9 would, for fault tests: the gRPC server
// stops abruptly, the storage server halts without releasing its slice
// locks, the configuration-service client is abandoned without revoking
// its leases (membership and locks expire on their own), and the store is
// closed. A later Start on the same DataDir restarts the host.
func (h *Host) Crash() { h.stop(true) }

func (h *Host) stop(crash bool) error {
	h.gate.open() // let paused calls fail fast
	var errs []error
	for i := len(h.closers) - 1; i >= 0; i-- {
		c := h.closers[i]
		f := c.close
		if crash && c.crash != nil {
			f = c.crash
		}
		if err := f(); err != nil && !crash {
			errs = append(errs, err)
		}
	}
	h.closers = nil
	if h.listener != nil {
		h.listener.Close()
	}
	return errors.Join(errs...)
}
