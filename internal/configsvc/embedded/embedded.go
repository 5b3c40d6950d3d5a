// Package embedded runs a configuration-service member (an etcd server) inside
// the wheelfs process, so that a deployment needs no separately installed
// etcd (DESIGN.md: "wheelfs up DIR" runs everything in one process). It is the
// only WheelFS package that imports the etcd server; everything else talks to
// the member through configsvc and the etcd client.
//
// A single-member deployment needs only a data directory: free loopback ports
// are chosen and remembered in the directory, so a restart on the same Dir
// comes back at the same URLs with the same state. Several members form a
// replicated cluster through InitialCluster ("name=peerURL,...").
package embedded

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"

	"github.com/wheelfs/wheelfs/internal/configsvc/internal/zapslog"
)

// TLSInfo names the PEM files for mutual TLS on the member's client and peer
// listeners. Clients and peers must present certificates signed by CAFile.
type TLSInfo struct {
	// CertFile and KeyFile are the member's certificate and key. The
	// certificate must allow both server and client authentication, since
	// it is also presented when dialing peers (unless PeerCertFile is set).
	CertFile, KeyFile string
	// CAFile is the CA bundle that client and peer certificates must chain to.
	CAFile string
	// PeerCertFile and PeerKeyFile optionally give a separate certificate
	// for the peer listener and for dialing peers; empty = CertFile/KeyFile.
	PeerCertFile, PeerKeyFile string
}

// Config describes one member.
type Config struct {
	// Name is the member's name, unique in the cluster and matching its
	// entry in InitialCluster.
	Name string
	// Dir is the etcd data directory (required). Restarting on the same Dir
	// recovers the member's state.
	Dir string
	// ClientURL is where clients connect: "host:port" or a URL whose scheme
	// matches TLS (https) or not (http). Empty or port 0 picks a free port
	// (on 127.0.0.1 if empty); a single member remembers the choice in Dir.
	ClientURL string
	// PeerURL is where other members connect, same forms as ClientURL. If
	// empty, it is taken from this member's InitialCluster entry or, for a
	// single member, a free loopback port.
	PeerURL string
	// InitialCluster lists all initial members as "name=peerURL,...";
	// empty means a single-member cluster. It only matters on first start.
	InitialCluster string
	// NewCluster is true when bootstrapping a new cluster, false when joining
	// an existing one (the member must first be added with MemberAdd).
	NewCluster bool
	// TLS enables mutual TLS for clients and peers; nil means plain
	// connections, which are only for tests.
	TLS *TLSInfo
	// Logger receives etcd's warnings and errors (nil = discard).
	Logger *slog.Logger
}

// NewConfig returns the defaults: a single new member named "wheelfs" on
// free loopback ports, without TLS. Dir must still be set.
func NewConfig() Config {
	return Config{Name: "wheelfs", NewCluster: true}
}

// Member is a running embedded etcd member.
type Member struct {
	e         *embed.Etcd
	name      string
	clientURL []string
	peerURL   []string
	closeOnce sync.Once
	quiet     func() // demotes etcd's logs once we shut it down
}

// urlsFile remembers automatically chosen URLs of a single member.
const urlsFile = "wheelfs-member-urls.json"

type savedURLs struct {
	Client string `json:"client"`
	Peer   string `json:"peer"`
}

// Start starts the member and waits until it has joined the cluster and
// serves clients, or fails, or ctx ends. For a new multi-member cluster, the
// members must be started concurrently: none is ready before a quorum runs.
func Start(ctx context.Context, c Config) (*Member, error) {
	if c.Dir == "" {
		return nil, errors.New("embedded: Config.Dir is required")
	}
	if c.Name == "" {
		c.Name = "wheelfs"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded: data dir: %w", err)
	}
	scheme := "http"
	if c.TLS != nil {
		scheme = "https"
	}
	single := c.InitialCluster == ""
	if !single && c.PeerURL == "" {
		p, err := peerFromCluster(c.InitialCluster, c.Name)
		if err != nil {
			return nil, err
		}
		c.PeerURL = p
	}
	var saved savedURLs
	if single {
		if b, err := os.ReadFile(filepath.Join(c.Dir, urlsFile)); err == nil {
			_ = json.Unmarshal(b, &saved)
		}
	}

	const attempts = 5
	for attempt := 1; ; attempt++ {
		cu, cAuto, err := resolveURL(c.ClientURL, saved.Client, scheme, attempt > 1)
		if err != nil {
			return nil, fmt.Errorf("embedded: client URL: %w", err)
		}
		pu, pAuto, err := resolveURL(c.PeerURL, saved.Peer, scheme, attempt > 1)
		if err != nil {
			return nil, fmt.Errorf("embedded: peer URL: %w", err)
		}
		m, err := start(ctx, c, cu, pu)
		if err != nil {
			if (cAuto || pAuto) && isAddrInUse(err) && attempt < attempts && ctx.Err() == nil {
				c.Logger.Warn("embedded etcd: port taken, retrying with other ports", "err", err)
				continue
			}
			return nil, err
		}
		if single && (cAuto || pAuto) {
			b, _ := json.Marshal(savedURLs{Client: cu.String(), Peer: pu.String()})
			if err := os.WriteFile(filepath.Join(c.Dir, urlsFile), b, 0o600); err != nil {
				c.Logger.Warn("embedded etcd: cannot remember URLs", "err", err)
			}
		}
		return m, nil
	}
}

func start(ctx context.Context, c Config, cu, pu *url.URL) (*Member, error) {
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	if c.InitialCluster != "" {
		cfg.InitialCluster = c.InitialCluster
	} else {
		cfg.InitialCluster = cfg.InitialClusterFromName(c.Name)
	}
	cfg.ClusterState = embed.ClusterStateFlagExisting
	if c.NewCluster {
		cfg.ClusterState = embed.ClusterStateFlagNew
	}
	cfg.InitialClusterToken = "wheelfs"
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "1h"
	cfg.SnapshotCount = 10000
	cfg.QuotaBackendBytes = 0 // etcd default (2 GiB)
	cfg.UnsafeNoFsync = false
	cfg.EnableGRPCGateway = false
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	zl, quiet := zapslog.NewQuietable(c.Logger.With("component", "etcd", "member", c.Name), zapcore.WarnLevel, benignWarnings...)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zl)
	if t := c.TLS; t != nil {
		if t.CertFile == "" || t.KeyFile == "" || t.CAFile == "" {
			return nil, errors.New("embedded: TLS needs CertFile, KeyFile and CAFile")
		}
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.CAFile, ClientCertAuth: true,
		}
		pc, pk := t.PeerCertFile, t.PeerKeyFile
		if pc == "" {
			pc, pk = t.CertFile, t.KeyFile
		}
		cfg.PeerTLSInfo = transport.TLSInfo{
			CertFile: pc, KeyFile: pk, TrustedCAFile: t.CAFile, ClientCertAuth: true,
		}
	}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded: start etcd member %q (client %s, peer %s, dir %s): %w",
			c.Name, cu, pu, c.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded: etcd member %q failed while starting: %w", c.Name, err)
	case <-e.Server.StopNotify():
		e.Close()
		return nil, fmt.Errorf("embedded: etcd member %q stopped while starting", c.Name)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("embedded: etcd member %q not ready (no quorum yet?): %w", c.Name, ctx.Err())
	}
	m := &Member{e: e, name: c.Name, quiet: quiet}
	for _, u := range cfg.AdvertiseClientUrls {
		m.clientURL = append(m.clientURL, u.String())
	}
	for _, u := range cfg.AdvertisePeerUrls {
		m.peerURL = append(m.peerURL, u.String())
	}
	return m, nil
}

// Name returns the member's name.
func (m *Member) Name() string { return m.name }

// ClientEndpoints returns the URLs clients dial (for configsvc.Dial).
func (m *Member) ClientEndpoints() []string { return append([]string(nil), m.clientURL...) }

// PeerURLs returns the URLs other members use to reach this one.
func (m *Member) PeerURLs() []string { return append([]string(nil), m.peerURL...) }

// Leads reports whether this member leads the cluster now.
func (m *Member) Leads() bool {
	return m.e.Server.Lead() == uint64(m.e.Server.MemberID())
}

// HandLeadershipTo asks this member, which leads, to hand leadership to
// the member other serves as (a planned move, without an election).
func (m *Member) HandLeadershipTo(ctx context.Context, other *Member) error {
	return m.e.Server.MoveLeader(ctx, uint64(m.e.Server.MemberID()), uint64(other.e.Server.MemberID()))
}

// Err reports fatal errors of the running member; it is closed by Close.
func (m *Member) Err() <-chan error { return m.e.Err() }

// Close stops the member gracefully. It is idempotent.
func (m *Member) Close() error {
	m.closeOnce.Do(func() {
		m.quiet()
		m.e.Close()
	})
	return nil
}

// ClientTLSConfig builds the *tls.Config a client (configsvc.Dial) uses to
// reach members started with TLS: certFile/keyFile is the client's own
// certificate, caFile the CA that signed the members' certificates.
func ClientTLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	info := transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: caFile}
	return info.ClientConfig()
}

// FreeAddr returns host:port with a port that was free on host a moment
// ago (empty host = 127.0.0.1). Useful to lay out multi-member clusters.
// It never hands out one port twice within handedFor: the kernel may give
// a port just closed to the next listener, and a member's client and peer
// URLs, picked one after the other, once got the same port.
func FreeAddr(host string) (string, error) {
	if host == "" {
		host = "127.0.0.1"
	}
	handed.mu.Lock()
	defer handed.mu.Unlock()
	now := time.Now()
	for port, at := range handed.at {
		if now.Sub(at) > handedFor {
			delete(handed.at, port)
		}
	}
	var held []net.Listener // listeners of ports handed out already, closed at the end
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 64 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", err
		}
		addr := l.Addr().(*net.TCPAddr)
		if _, again := handed.at[addr.Port]; again {
			held = append(held, l) // keep it open so the next try gets another
			continue
		}
		l.Close()
		handed.at[addr.Port] = now
		return addr.String(), nil
	}
	return "", fmt.Errorf("embedded: no free port on %s that was not handed out in the last %v", host, handedFor)
}

// handedFor is how long FreeAddr remembers a port it handed out.
const handedFor = time.Minute

var handed = struct {
	mu sync.Mutex
	at map[int]time.Time
}{at: map[int]time.Time{}}

// resolveURL turns a configured address (host:port or URL) into a URL of
// the given scheme. An empty address or port 0 picks a free port; a saved
// URL from an earlier run is preferred unless fresh is set. auto reports
// whether the port was chosen here.
func resolveURL(addr, saved, scheme string, fresh bool) (u *url.URL, auto bool, err error) {
	if addr == "" {
		if saved != "" && !fresh {
			if su, err := url.Parse(saved); err == nil && su.Scheme == scheme {
				return su, true, nil
			}
		}
		addr = "127.0.0.1:0"
	}
	host := addr
	if strings.Contains(addr, "://") {
		pu, err := url.Parse(addr)
		if err != nil {
			return nil, false, err
		}
		if pu.Scheme != scheme {
			return nil, false, fmt.Errorf("%q: scheme must be %s (TLS %s)", addr, scheme,
				map[bool]string{true: "on", false: "off"}[scheme == "https"])
		}
		host = pu.Host
	}
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		return nil, false, fmt.Errorf("%q: %w", addr, err)
	}
	if port == "0" || port == "" {
		a, err := FreeAddr(h)
		if err != nil {
			return nil, false, err
		}
		return &url.URL{Scheme: scheme, Host: a}, true, nil
	}
	return &url.URL{Scheme: scheme, Host: net.JoinHostPort(h, port)}, false, nil
}

// peerFromCluster finds name's peer URL in an InitialCluster string.
func peerFromCluster(cluster, name string) (string, error) {
	for _, ent := range strings.Split(cluster, ",") {
		n, u, ok := strings.Cut(strings.TrimSpace(ent), "=")
		if ok && n == name {
			return u, nil
		}
	}
	return "", fmt.Errorf("embedded: member %q not in InitialCluster %q", name, cluster)
}

// benignWarnings are etcd warnings (and errors) expected on every start of
// an embedded member or on a member joining; they are logged at debug level.
var benignWarnings = []string{
	// Logged on every member join while the new member's raft log has no
	// term yet; the storage version is updated on a later attempt.
	"failed to update storage version",
	"Failed to detect schema version",
	"Running http and grpc server on single port. This is not recommended for production.",
	"simple token is not cryptographically signed",
	"check file permission",
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}
