package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/pki"
)

// member is one etcd member of the configuration service. It runs unless
// crashed (CrashConfigMember) or cut off with its site (PartitionSite).
type member struct {
	name, site, dir string
	clientAddr      string // 127.0.0.1:port
	peerAddr        string
	initial         string // InitialCluster
	tls             *embedded.TLSInfo
	log             *slog.Logger

	m       *embedded.Member // nil while stopped
	crashed bool             // stopped by CrashConfigMember
	cut     bool             // stopped because its site is partitioned
}

// newMembers lays out n members spread over sites (member i at site i mod
// len(sites)) with credentials from ca and fixed loopback ports.
func newMembers(n int, sites []string, root string, ca *pki.CA, log *slog.Logger) ([]*member, error) {
	ms := make([]*member, n)
	var cluster []string
	used := map[string]bool{}
	for i := range ms {
		m := &member{name: fmt.Sprintf("etcd-%d", i), site: sites[i%len(sites)]}
		m.dir = filepath.Join(root, m.name)
		m.log = log.With("member", m.name, "site", m.site)
		node := filepath.Join(m.dir, "node")
		if err := ca.IssueNodeDir(node, m.name, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}); err != nil {
			return nil, err
		}
		m.tls = &embedded.TLSInfo{CertFile: filepath.Join(node, pki.NodeCertFile),
			KeyFile: filepath.Join(node, pki.NodeKeyFile), CAFile: filepath.Join(node, pki.CACertFile)}
		var err error
		if m.clientAddr, err = freeAddr(used); err != nil {
			return nil, err
		}
		if m.peerAddr, err = freeAddr(used); err != nil {
			return nil, err
		}
		cluster = append(cluster, m.name+"=https://"+m.peerAddr)
		ms[i] = m
	}
	initial := strings.Join(cluster, ",")
	for _, m := range ms {
		m.initial = initial
	}
	return ms, nil
}

// freeAddr returns a free loopback address not in used, and adds it. The
// port is taken below the kernel's ephemeral range (32768 and up): a member
// restarts on the port it remembers, and a port from that range may by then
// be the local end of some outgoing connection ("address already in use").
func freeAddr(used map[string]bool) (string, error) {
	for range 1000 {
		a := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+rand.IntN(12000)))
		if used[a] {
			continue
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			continue
		}
		l.Close()
		used[a] = true
		return a, nil
	}
	return "", errors.New("no free loopback port")
}

func (m *member) config() embedded.Config {
	return embedded.Config{Name: m.name, Dir: filepath.Join(m.dir, "data"),
		ClientURL: "https://" + m.clientAddr, PeerURL: "https://" + m.peerAddr,
		InitialCluster: m.initial, NewCluster: true, TLS: m.tls, Logger: m.log}
}

// start starts a stopped member. On an existing data directory etcd
// ignores the initial cluster and recovers the member's state.
func (m *member) start(ctx context.Context) error {
	if m.m != nil {
		return nil
	}
	for {
		em, err := embedded.Start(ctx, m.config())
		if err == nil {
			m.m = em
			return nil
		}
		// The remembered port may still be held for a moment (by the
		// member's own closing listener, or by another test binary's
		// harness picking from the same range): retry within ctx.
		inUse := errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
		if !inUse || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop stops a running member (gracefully: embed offers no harder stop).
func (m *member) stop() error {
	if m.m == nil {
		return nil
	}
	err := m.m.Close()
	m.m = nil
	return err
}

// endpoint is the URL clients dial.
func (m *member) endpoint() string { return "https://" + m.clientAddr }

// startMembers starts members concurrently: none is ready before a quorum
// of them runs.
func startMembers(ctx context.Context, ms []*member) error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.start(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// leader returns the running member that leads the cluster, nil if none
// is known. svc is any client with the cluster's credentials; its Members
// orders the status calls with its endpoint monitor (a raw etcd client's
// Status races with SetEndpoints: etcd client v3.7.3 dial).
func leader(svc *configsvc.EtcdService, ms []*member) *member {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	list, err := svc.Members(ctx)
	if err != nil {
		return nil
	}
	for _, l := range list {
		if !l.Leader {
			continue
		}
		for _, m := range ms {
			if m.m != nil && m.name == l.Name {
				return m
			}
		}
	}
	return nil
}

// stopAll stops the running members: the followers together, then the
// leader, which finds no successor to hand leadership to. (Stopping the
// leader while its successor is stopping costs seconds.)
func stopAll(svc *configsvc.EtcdService, ms []*member) {
	var lead *member
	if svc != nil {
		lead = leader(svc, ms)
	}
	var wg sync.WaitGroup
	for _, m := range ms {
		if m != lead {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				m.stop()
				m.log.Info("member stopped", "took", time.Since(t0))
			}()
		}
	}
	wg.Wait()
	if lead != nil {
		t0 := time.Now()
		lead.stop()
		lead.log.Info("member stopped", "took", time.Since(t0))
	}
}
