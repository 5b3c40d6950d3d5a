package configsvc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/configsvc/embedded"
	"github.com/wheelfs/wheelfs/internal/poll"
)

// startCluster starts n embedded members on loopback and returns their
// client endpoints.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	var ic []string
	for i := range n {
		a, err := embedded.FreeAddr("")
		if err != nil {
			t.Fatal(err)
		}
		ic = append(ic, fmt.Sprintf("m%d=http://%s", i, a))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	members := make([]*embedded.Member, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := embedded.NewConfig()
			c.Name, c.Dir, c.InitialCluster, c.Logger = fmt.Sprintf("m%d", i), t.TempDir(), strings.Join(ic, ","), testLogger(t)
			members[i], errs[i] = embedded.Start(ctx, c)
		})
	}
	wg.Wait()
	var eps []string
	for i, m := range members {
		if m != nil {
			t.Cleanup(func() { m.Close() })
		}
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i, errs[i])
		}
		eps = append(eps, m.ClientEndpoints()...)
	}
	return eps
}

// stallNet dials members directly but can make a member look the way a
// cut-off one does: its connections stop carrying bytes without failing
// (reads block, writes vanish), and new connections are never set up. Healing a member closes the
// stalled connections, as a resumed TCP connection or a reset soon would.
type stallNet struct {
	mu      sync.Mutex
	stalled map[string]chan struct{} // host:port → closed on heal
	conns   map[string][]*stallConn
}

func newStallNet() *stallNet {
	return &stallNet{stalled: map[string]chan struct{}{}, conns: map[string][]*stallConn{}}
}

func hostPort(ep string) string {
	u, err := url.Parse(ep)
	if err != nil {
		return ep
	}
	return u.Host
}

func (n *stallNet) stall(eps ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ep := range eps {
		a := hostPort(ep)
		if _, ok := n.stalled[a]; !ok {
			n.stalled[a] = make(chan struct{})
		}
		for _, c := range n.conns[a] {
			c.stallOnce.Do(func() { close(c.stalled) })
		}
	}
}

func (n *stallNet) heal(eps ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ep := range eps {
		a := hostPort(ep)
		if ch, ok := n.stalled[a]; ok {
			close(ch)
			delete(n.stalled, a)
		}
		for _, c := range n.conns[a] {
			select {
			case <-c.stalled:
				c.Close()
			default:
			}
		}
	}
}

func (n *stallNet) dial(ctx context.Context, addr string) (net.Conn, error) {
	n.mu.Lock()
	healed, stalled := n.stalled[addr]
	n.mu.Unlock()
	if stalled { // the SYN goes nowhere
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-healed:
		}
	}
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &stallConn{Conn: raw, stalled: make(chan struct{}), closed: make(chan struct{})}
	n.mu.Lock()
	n.conns[addr] = append(slices.DeleteFunc(n.conns[addr], func(o *stallConn) bool {
		select {
		case <-o.closed:
			return true
		default:
			return false
		}
	}), c)
	if _, ok := n.stalled[addr]; ok {
		c.stallOnce.Do(func() { close(c.stalled) })
	}
	n.mu.Unlock()
	return c, nil
}

type stallConn struct {
	net.Conn
	stallOnce, closeOnce sync.Once
	stalled, closed      chan struct{}
}

var errClosed = errors.New("stalled connection closed")

// wait blocks while the connection is stalled and reports whether it may
// carry bytes.
func (c *stallConn) wait() error {
	select {
	case <-c.stalled:
		<-c.closed
		return errClosed
	case <-c.closed:
		return errClosed
	default:
		return nil
	}
}

func (c *stallConn) Read(b []byte) (int, error) {
	if err := c.wait(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	if err == nil {
		// Bytes that arrived just as the stall began are held back too.
		if werr := c.wait(); werr != nil {
			return 0, werr
		}
	}
	return n, err
}

// Write while stalled succeeds without delivering, as a write into the
// socket buffer of a connection whose packets are dropped does.
func (c *stallConn) Write(b []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, errClosed
	case <-c.stalled:
		return len(b), nil
	default:
	}
	return c.Conn.Write(b)
}

func (c *stallConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestStalledMemberIsAvoided: a member that keeps its connections but
// answers nothing (as the cut-off member does for a while after a heal) is
// dropped from the client's endpoints within a probe or two, after which
// every request succeeds quickly; it is used again once it answers.
func TestStalledMemberIsAvoided(t *testing.T) {
	eps := startCluster(t, 3)
	sn := newStallNet()
	const probe = 200 * time.Millisecond
	s := dialEndpoints(t, eps, configsvc.Options{Dial: sn.dial, ProbePeriod: probe, IdleProbePeriod: probe, RPCTimeout: 5 * time.Second})
	poll.Until(t, 10*time.Second, "all members in use", func() error { return servingExactly(s, eps) })

	sn.stall(eps[0])
	poll.Until(t, 5*time.Second, "stalled member dropped", func() error { return servingExactly(s, eps[1:]) })
	requestsSucceed(t, s)

	sn.heal(eps[0])
	poll.Until(t, 5*time.Second, "healed member used again", func() error { return servingExactly(s, eps) })
}

// TestFailedRequestProbesAtOnce: members that serve are probed rarely (a
// minute apart here), but a request that times out on a stalled member
// probes every member at once, and the stalled one is dropped within a
// few seconds.
func TestFailedRequestProbesAtOnce(t *testing.T) {
	eps := startCluster(t, 3)
	sn := newStallNet()
	const probe = 200 * time.Millisecond
	s := dialEndpoints(t, eps, configsvc.Options{Dial: sn.dial, ProbePeriod: probe, IdleProbePeriod: time.Minute, RPCTimeout: 5 * time.Second})
	poll.Until(t, 10*time.Second, "all members in use", func() error { return servingExactly(s, eps) })

	sn.stall(eps[0])
	start := time.Now()
	failed := 0
	poll.Until(t, 15*time.Second, "stalled member dropped", func() error {
		// Round-robin sends some of these to the stalled member, where
		// they time out.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		if _, err := s.Table(ctx); err != nil {
			failed++
		}
		cancel()
		return servingExactly(s, eps[1:])
	})
	t.Logf("dropped %v after the stall, %d requests timed out", time.Since(start).Round(time.Millisecond), failed)
	requestsSucceed(t, s)
}

func requestsSucceed(t *testing.T, s *configsvc.EtcdService) {
	t.Helper()
	for i := range 12 { // round-robin would send a third of these to the stalled member
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.Acquire(ctx, 100, fmt.Sprintf("holder-%d", i), configsvc.Policy{Site: "s"}, nil)
		cancel()
		if err != nil && !errors.Is(err, configsvc.ErrLocked) {
			t.Fatalf("request %d with a member stalled: %v", i, err)
		}
	}
}

// TestReRegistersSoonAfterHeal: a server cut off from every member for
// longer than its membership lease re-registers within two probe periods
// (plus a couple of round trips) of reaching the majority again, although
// its own site's member still answers nothing, the state the testbed shows
// for tens of seconds after a real heal.
func TestReRegistersSoonAfterHeal(t *testing.T) {
	eps := startCluster(t, 3)
	sn := newStallNet()
	const probe = 500 * time.Millisecond
	srv := dialEndpoints(t, eps, configsvc.Options{Dial: sn.dial, ProbePeriod: probe, MemberTTL: 2 * time.Second})
	obs := dialEndpoints(t, eps, configsvc.Options{})
	ctx := tctx(t)
	if err := srv.Register(ctx, configsvc.ServerInfo{ID: "east-1", Site: "east", Addr: "10.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	registered := func() error {
		tb, err := obs.Table(ctx)
		if err != nil {
			return err
		}
		if _, ok := tb.Servers["east-1"]; !ok {
			return errors.New("east-1 not in the server table")
		}
		return nil
	}
	poll.Until(t, 5*time.Second, "registered", registered)

	sn.stall(eps...)
	poll.Until(t, 15*time.Second, "membership expired and no member answering during the cut", func() error {
		if registered() == nil {
			return errors.New("still registered")
		}
		return servingExactly(srv, nil)
	})
	healed := time.Now()
	sn.heal(eps[1:]...) // the majority is back; the local member eps[0] still answers nothing
	bound := 2*probe + 2*time.Second
	poll.Until(t, bound, "re-registered after the heal", registered)
	t.Logf("re-registered %v after the heal (bound %v)", time.Since(healed).Round(time.Millisecond), bound)
}

func dialEndpoints(t *testing.T, eps []string, o configsvc.Options) *configsvc.EtcdService {
	t.Helper()
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := configsvc.Dial(ctx, eps, nil, o)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func servingExactly(s *configsvc.EtcdService, want []string) error {
	using, _ := s.Serving()
	if len(using) != len(want) || slices.ContainsFunc(want, func(ep string) bool { return !slices.Contains(using, ep) }) {
		return fmt.Errorf("client uses %v, want %v", using, want)
	}
	return nil
}
