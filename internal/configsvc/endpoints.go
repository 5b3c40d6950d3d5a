package configsvc

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// endpointMonitor keeps the etcd client's endpoint list to the members that
// serve a linearizable read now.
//
// Why: the client balances requests round-robin over every endpoint and
// never moves a request off one that answers nothing. After a partition
// heals, the member that was cut off can stay unable to serve for tens of
// seconds: its raft streams to the leader ride TCP connections that were
// opened before the cut and are still in retransmission back-off (etcd's
// outgoing stream connections have no read timeout), so its proposals and
// ReadIndex requests wait while it already believes it has a leader. The
// testbed measured 13 to 24 s of "context deadline exceeded" for a server
// re-registering through its own site's member. The monitor probes each
// member through a client of its own and drops the ones that do not answer
// from the main client, so requests go to the majority as soon as it is
// reachable; a member is put back as soon as a probe succeeds again.
//
// Probes are linearizable reads through the leader, from every host to
// every member, so they are spent where they tell something: a member that
// does not serve is probed every period (to use it again soon after it
// recovers), one that serves only every idle period, or at once when a
// request of the main client fails for want of an answer.
type endpointMonitor struct {
	s       *EtcdService
	cfg     clientv3.Config // template of the probe clients
	period  time.Duration   // probes of a member not serving; least gap
	idle    time.Duration   // probes of a member serving
	timeout time.Duration

	mu      sync.Mutex
	all     []string // every member's endpoint, in the order given or listed
	probes  map[string]*probe
	serving []string // endpoints that answered their last probe (or have none yet)
	applied []string // endpoints last given to the main client
	wake    []chan struct{}
}

type probe struct {
	ep     string
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}
	now    chan struct{} // capacity 1: probe at once (a request failed)

	// Guarded by the monitor's mu.
	healthy bool
	probed  bool      // at least one probe finished
	started time.Time // when the last probe began
}

// memberSyncEvery is how often the monitor re-reads the member list (the
// client's AutoSync, which the monitor replaces).
const memberSyncEvery = time.Minute

func newEndpointMonitor(s *EtcdService, cfg clientv3.Config, period, idle time.Duration) *endpointMonitor {
	// A linearizable read crosses the WAN up to three times (client to
	// member, member to leader, leader to a quorum); two seconds also
	// covers 300 ms round trips with room to spare.
	timeout := max(2*time.Second, 2*period)
	return &endpointMonitor{s: s, cfg: cfg, period: period, idle: max(idle, period), timeout: timeout, probes: map[string]*probe{}}
}

// probeOnFailure is a unary interceptor for the main client: a call that
// ran out of time or found no member ready may have been sent to a member
// that does not serve, so every member believed serving is probed at once
// (at most once a period) rather than at its next idle probe.
func probeOnFailure(mon *atomic.Pointer[endpointMonitor]) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil {
			switch status.Code(err) {
			case codes.DeadlineExceeded, codes.Unavailable:
				if m := mon.Load(); m != nil {
					// Not here: a caller may hold endpointsMu (Members),
					// which applyLocked takes under the monitor's mu.
					go m.probeNow()
				}
			}
		}
		return err
	}
}

// probeNow wakes the probes of members believed serving whose last probe
// began at least a period ago.
func (m *endpointMonitor) probeNow() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.probes {
		if p.healthy && time.Since(p.started) >= m.period {
			select {
			case p.now <- struct{}{}:
			default:
			}
		}
	}
}

// start probes endpoints and re-reads the member list until ctx ends.
func (m *endpointMonitor) start(ctx context.Context, endpoints []string) {
	m.setEndpoints(ctx, endpoints)
	m.s.wg.Go(func() {
		t := time.NewTicker(memberSyncEvery)
		defer t.Stop()
		m.sync(ctx)
		for {
			select {
			case <-ctx.Done():
				m.stopAll()
				return
			case <-t.C:
			}
			m.sync(ctx)
		}
	})
}

// sync learns the members' client URLs, so that a node given one member
// also probes and uses the others.
func (m *endpointMonitor) sync(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, m.s.opts.RPCTimeout)
	defer cancel()
	resp, err := m.s.cli.MemberList(cctx)
	if err != nil {
		m.s.log.Debug("member list", "err", err)
		return
	}
	var eps []string
	for _, mem := range resp.Members {
		if !mem.IsLearner {
			eps = append(eps, mem.ClientURLs...)
		}
	}
	if len(eps) > 0 {
		m.setEndpoints(ctx, eps)
	}
}

// setEndpoints starts probes for new endpoints and stops those of endpoints
// no longer listed.
func (m *endpointMonitor) setEndpoints(ctx context.Context, eps []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if slices.Equal(eps, m.all) {
		return
	}
	m.all = slices.Clone(eps)
	for ep, p := range m.probes {
		if !slices.Contains(eps, ep) {
			p.cancel()
			delete(m.probes, ep)
			go func() { <-p.done; p.cli.Close() }()
		}
	}
	for _, ep := range eps {
		if _, ok := m.probes[ep]; ok {
			continue
		}
		cfg := m.cfg
		cfg.Endpoints = []string{ep}
		cli, err := clientv3.New(cfg)
		if err != nil {
			m.s.log.Warn("probe client", "endpoint", ep, "err", err)
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p := &probe{ep: ep, cli: cli, cancel: cancel, done: make(chan struct{}), now: make(chan struct{}, 1)}
		m.probes[ep] = p
		go m.run(pctx, p)
	}
	m.applyLocked()
}

func (m *endpointMonitor) stopAll() {
	m.mu.Lock()
	ps := m.probes
	m.probes = map[string]*probe{}
	m.mu.Unlock()
	for _, p := range ps {
		p.cancel()
		<-p.done
		p.cli.Close()
	}
}

// run probes one endpoint until ctx ends: every period while it does not
// serve, every idle period while it does, and when probeNow asks.
func (m *endpointMonitor) run(ctx context.Context, p *probe) {
	defer close(p.done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.now:
		}
		start := time.Now()
		m.mu.Lock()
		p.started = start
		m.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, m.timeout)
		// Linearizable: only a member in touch with a leader and a quorum
		// answers.
		_, err := p.cli.Get(cctx, m.s.deploymentKey, clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		m.report(p, err)
		select { // a wake-up that came during this probe is answered by it
		case <-p.now:
		default:
		}
		next := m.idle
		if err != nil {
			next = m.period
		}
		t.Stop()
		t.Reset(max(0, next-time.Since(start)))
	}
}

func (m *endpointMonitor) report(p *probe, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	healthy := err == nil
	if p.probed && p.healthy == healthy {
		return
	}
	if p.probed || !healthy {
		if healthy {
			m.s.log.Info("config member serves again", "endpoint", p.ep)
		} else {
			m.s.log.Warn("config member does not serve", "endpoint", p.ep, "err", err)
		}
	}
	p.healthy, p.probed = healthy, true
	m.applyLocked()
}

// applyLocked gives the main client the endpoints that serve, in the order
// of m.all; all of them while none is known to serve, since nothing is
// gained then by excluding any.
func (m *endpointMonitor) applyLocked() {
	var serving []string
	for _, ep := range m.all {
		// Not probed yet: given the benefit of the doubt, so that the
		// first probe to answer does not take the others out.
		if p := m.probes[ep]; p != nil && (p.healthy || !p.probed) {
			serving = append(serving, ep)
		}
	}
	gained := slices.ContainsFunc(serving, func(ep string) bool { return !slices.Contains(m.serving, ep) })
	m.serving = serving
	eps := serving
	if len(eps) == 0 {
		eps = m.all
	}
	if !slices.Equal(eps, m.applied) {
		m.applied = slices.Clone(eps)
		m.s.endpointsMu.Lock()
		m.s.cli.SetEndpoints(eps...)
		m.s.endpointsMu.Unlock()
		m.s.log.Debug("config endpoints", "endpoints", eps)
	}
	if gained {
		// A registration that lost its lease should not wait for its next
		// keep-alive tick. (Connections to members that were unreachable
		// retry at most 1 s apart; ClientConn.ResetConnectBackoff would
		// race inside grpc-go 1.85 with the sub-conns SetEndpoints makes.)
		for _, w := range m.wake {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
}

// subscribe returns a channel that receives (without blocking the monitor)
// whenever a member starts serving again; unsubscribe with the returned
// function.
func (m *endpointMonitor) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.wake = append(m.wake, ch)
	m.mu.Unlock()
	return ch, func() {
		m.mu.Lock()
		m.wake = slices.DeleteFunc(m.wake, func(c chan struct{}) bool { return c == ch })
		m.mu.Unlock()
	}
}

// Serving returns the members' endpoints that answered their last probe
// (or are not probed yet) and all the members' endpoints. The client sends
// requests to the first list, or to all while the first is empty.
func (s *EtcdService) Serving() (serving, all []string) {
	if s.mon == nil {
		eps := s.cli.Endpoints()
		return eps, eps
	}
	s.mon.mu.Lock()
	defer s.mon.mu.Unlock()
	return slices.Clone(s.mon.serving), slices.Clone(s.mon.all)
}
