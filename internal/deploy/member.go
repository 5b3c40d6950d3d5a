package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/pki"
)

// memberURLs remembers a member's addresses (DataDir/member.json), so that
// a restart comes back at the same peer URL the cluster knows.
type memberURLs struct {
	Client string `json:"client"`
	Peer   string `json:"peer"`
	// Joined marks a member of a multi-member cluster. A lone member's
	// automatic ports are left to package embedded, which picks others
	// if they are taken at restart.
	Joined bool `json:"joined,omitempty"`
}

func (h *Host) memberFile() string { return filepath.Join(h.cfg.DataDir, "member.json") }
func (h *Host) etcdDir() string    { return filepath.Join(h.cfg.DataDir, "etcd") }

// startMember runs the config member role: an embedded etcd member that
// starts a new cluster, joins the cluster of Member.Join on its first start,
// or restarts from its data. It returns the endpoints to dial.
func (h *Host) startMember(ctx context.Context) ([]string, error) {
	mc := h.cfg.Member
	ec := embedded.NewConfig()
	ec.Name = h.id.Server
	ec.Dir = h.etcdDir()
	ec.Logger = h.cfg.Logger
	nd := h.nodeDir()
	ec.TLS = &embedded.TLSInfo{CertFile: filepath.Join(nd, pki.NodeCertFile), KeyFile: filepath.Join(nd, pki.NodeKeyFile),
		CAFile: filepath.Join(nd, pki.CACertFile)}
	var saved memberURLs
	if b, err := os.ReadFile(h.memberFile()); err == nil {
		_ = json.Unmarshal(b, &saved)
	}
	joined := len(mc.Join) > 0 || saved.Joined
	ec.ClientURL, ec.PeerURL = mc.Listen, mc.PeerListen
	if saved.Joined {
		ec.ClientURL, ec.PeerURL = first(mc.Listen, saved.Client), first(mc.PeerListen, saved.Peer)
	}
	if ec.PeerURL == "" && ec.ClientURL != "" {
		p, err := nextPort(ec.ClientURL)
		if err != nil {
			return nil, fmt.Errorf("deploy: member listen address: %w", err)
		}
		ec.PeerURL = p
	}
	// member.json is written once the member has started: before that,
	// etcd data in the directory is the debris of a join that failed
	// (etcd creates its WAL before it validates the cluster), which would
	// otherwise restart as a new one-member cluster.
	restart := exists(h.memberFile()) && exists(filepath.Join(ec.Dir, "member"))
	if len(mc.Join) > 0 && !restart {
		if err := os.RemoveAll(ec.Dir); err != nil {
			return nil, fmt.Errorf("deploy: clear failed join: %w", err)
		}
		if ec.PeerURL == "" {
			a, err := embedded.FreeAddr("")
			if err != nil {
				return nil, err
			}
			ec.PeerURL = a
		}
		ec.PeerURL = httpsURL(ec.PeerURL)
		initial, err := h.joinCluster(ctx, mc.Join, ec.Name, ec.PeerURL)
		if err != nil {
			return nil, err
		}
		ec.InitialCluster, ec.NewCluster = initial, false
	}
	m, err := embedded.Start(ctx, ec)
	if err != nil {
		return nil, fmt.Errorf("deploy: start config member: %w", err)
	}
	h.member = m
	h.onClose(m.Close, nil)
	eps := m.ClientEndpoints()
	b, _ := json.Marshal(memberURLs{Client: eps[0], Peer: m.PeerURLs()[0], Joined: joined})
	if err := os.WriteFile(h.memberFile(), b, 0o600); err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	if err := os.WriteFile(EndpointsFile(h.cfg.DataDir), []byte(strings.Join(eps, ",")+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	return eps, nil
}

// joinCluster adds this member to the running cluster at endpoints and
// returns the initial-cluster string to start it with. It retries for up
// to ConfigWait while the cluster cannot be reached or refuses the change
// for now.
func (h *Host) joinCluster(ctx context.Context, endpoints []string, name, peerURL string) (string, error) {
	wctx, cancel := context.WithTimeout(ctx, h.cfg.ConfigWait)
	defer cancel()
	h.log.Info("joining configuration service", "endpoints", endpoints, "member", name, "peer", peerURL)
	// Adding a member is an administrator's call once etcd auth is on:
	// a host holding the CA key makes it as the administrator.
	creds := h.Creds
	if root, err := h.rootCredentials(); err != nil {
		return "", fmt.Errorf("deploy: configuration service administrator: %w", err)
	} else if root != nil {
		creds = root
	}
	for {
		conf, err := configsvc.Dial(wctx, endpoints, creds.ClientTLS(""), configsvc.Options{Logger: h.cfg.Logger, Dial: h.dialer(), OneShot: true})
		if err == nil {
			var initial string
			initial, err = conf.AddMember(wctx, name, peerURL)
			conf.Close()
			if err == nil || errors.Is(err, configsvc.ErrMemberExists) {
				if err != nil {
					return "", fmt.Errorf("deploy: join configuration service at %v: %w", endpoints, err)
				}
				return initial, nil
			}
		}
		h.log.Info("cannot join the configuration service yet; retrying", "endpoints", endpoints, "err", err)
		select {
		case <-wctx.Done():
			return "", fmt.Errorf("deploy: join configuration service at %v: not done after %v: %w", endpoints, h.cfg.ConfigWait, err)
		case <-time.After(time.Second):
		}
	}
}

// EndpointsFile is where a host with an embedded member records its
// configuration service endpoints, for `wheelfs status`.
func EndpointsFile(dataDir string) string { return filepath.Join(dataDir, "endpoints") }

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func httpsURL(addr string) string {
	if strings.Contains(addr, "://") {
		return addr
	}
	return "https://" + addr
}

// nextPort returns addr's host with port+1 ("" when the port is automatic).
func nextPort(addr string) (string, error) {
	if i := strings.Index(addr, "://"); i >= 0 {
		addr = addr[i+3:]
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("%q: bad port", addr)
	}
	if p == 0 {
		return "", nil
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1)), nil
}
