// Package transport is the one place where WheelFS dials and listens, so
// that tests can impose a wide-area topology on real TCP connections
// (DESIGN.md principle 5, "The network is a parameter").
//
// A Network names sites and shapes the connections between them: per
// site-pair round-trip time, per-site uplink bandwidth, partitions and
// isolated sites. Servers listen with Network.Listen(site, addr), which
// records which site an address belongs to (Register does the same for a
// listener made elsewhere, such as an embedded etcd member's); everything
// dials with Network.Dialer(fromSite), which fits grpc.WithContextDialer.
//
// A nil *Network is a plain pass-through to net.Listen and net.Dialer: no
// wrapping, goroutines or copies. Production code holds a nil *Network.
//
// Shaping happens entirely at the dialing end, for both directions, because
// the dialer knows both sites while the accepting end sees only an
// ephemeral address: bytes written by the dialer reach the socket rtt/2
// after the Write, and bytes arriving from the socket become readable rtt/2
// after they arrived; the far site's uplink limit is applied to the bytes
// arriving. Connections accepted from dialers that do not use the Network
// (or use a nil one) are not shaped.
//
// A shaped connection delays data on a per-connection delivery queue, so
// the delay does not cap throughput: writes are pipelined, as on a long
// link. The queue holds at most 4 MiB per direction, after which Write
// blocks (like a full socket buffer). A dial takes one RTT to connect. A
// connection of a non-nil Network that has no RTT or bandwidth limit in
// effect reads and writes the socket directly, with no goroutines or
// copies; once shaped, a direction stays on its queue so data is never
// reordered.
//
// Partition, Isolate and their inverses take effect at once: connections
// between the separated sites fail (Read and Write return a net.Error
// wrapping syscall.ENETUNREACH, the accepting end sees a reset), queued data
// is lost, and new dials fail with an error wrapping syscall.ECONNREFUSED.
//
// Drop cuts a site off as a wide-area path that loses every packet does:
// nothing fails, everything waits. Its dialed connections go silent (Write
// succeeds and the data is lost, Read waits for its deadline or Close),
// and dials wait for their context (or for Rejoin). Rejoin resets the
// silent connections so that their owners dial again — kinder than TCP,
// which would resume them only at its next retransmission (backed off to
// up to two minutes) or give up after many minutes. Only the dialing end
// is shaped: the accepting end of a silenced connection sees a reset at
// once.
package transport

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Network shapes connections between named sites. The zero Network is
// ready to use and shapes nothing until told to. A nil *Network is a plain
// pass-through for Listen and Dialer; its shaping methods must not be
// called.
type Network struct {
	log *slog.Logger           // nil means discard
	cfg atomic.Pointer[config] // current shaping (nil: none), replaced on every change

	mu      sync.Mutex        // serializes config changes; guards the fields below
	addrs   map[string]string // listener address "ip:port" → site
	ports   map[string]string // port of a wildcard listener → site
	conns   map[*conn]struct{}
	changed chan struct{} // closed and replaced by every config change

	// readWaits, when set (tests), is told each time a Read has passed its
	// checks and is about to wait for data, so a test can act on a reader
	// that is known to be blocked. It must not block or call into the conn.
	readWaits func(net.Conn)
}

// Option configures a Network.
type Option func(*Network)

// WithLogger sets the logger for topology changes (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(n *Network) {
		if l != nil {
			n.log = l
		}
	}
}

// NewNetwork returns a Network with no shaping: every site reaches every
// other with no added delay and unlimited bandwidth.
func NewNetwork(opts ...Option) *Network {
	n := &Network{}
	for _, o := range opts {
		o(n)
	}
	if n.log != nil {
		n.log = n.log.With("component", "transport")
	}
	return n
}

// emptyConfig is the configuration of a Network never changed.
var emptyConfig = &config{}

// config returns the current shaping rules.
func (n *Network) config() *config {
	if c := n.cfg.Load(); c != nil {
		return c
	}
	return emptyConfig
}

func (n *Network) logger() *slog.Logger {
	if n.log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return n.log
}

// initLocked makes the registries of a zero Network.
func (n *Network) initLocked() {
	if n.conns == nil {
		n.addrs = make(map[string]string)
		n.ports = make(map[string]string)
		n.conns = make(map[*conn]struct{})
	}
	if n.changed == nil {
		n.changed = make(chan struct{})
	}
}

// pair is an unordered pair of sites.
type pair struct{ a, b string }

func mkpair(a, b string) pair {
	if b < a {
		a, b = b, a
	}
	return pair{a, b}
}

// config is an immutable snapshot of the shaping rules. Buckets are shared
// between snapshots (they carry state) and change rate in place.
type config struct {
	rtt      map[pair]time.Duration
	uplink   map[string]*bucket
	cut      map[pair]bool
	isolated map[string]bool
	dropped  map[string]bool // isolated by Drop: silent rather than refused
}

func (c *config) clone() *config {
	d := &config{
		rtt:      make(map[pair]time.Duration, len(c.rtt)),
		uplink:   make(map[string]*bucket, len(c.uplink)),
		cut:      make(map[pair]bool, len(c.cut)),
		isolated: make(map[string]bool, len(c.isolated)),
		dropped:  make(map[string]bool, len(c.dropped)),
	}
	for k, v := range c.rtt {
		d.rtt[k] = v
	}
	for k, v := range c.uplink {
		d.uplink[k] = v
	}
	for k, v := range c.cut {
		d.cut[k] = v
	}
	for k, v := range c.isolated {
		d.isolated[k] = v
	}
	for k, v := range c.dropped {
		d.dropped[k] = v
	}
	return d
}

// blocked reports whether traffic between sites a and b is cut. A site
// always reaches itself.
func (c *config) blocked(a, b string) bool {
	if a == b {
		return false
	}
	return c.isolated[a] || c.isolated[b] || c.cut[mkpair(a, b)] || c.dropping(a, b)
}

// dropping reports whether traffic between sites a and b is lost silently
// (Drop).
func (c *config) dropping(a, b string) bool {
	return a != b && (c.dropped[a] || c.dropped[b])
}

// oneWay is the delay of data travelling between a and b.
func (c *config) oneWay(a, b string) time.Duration { return c.rtt[mkpair(a, b)] / 2 }

// uplinkFor returns the bucket limiting data from site from to site to, or
// nil if unlimited. Data that stays within a site is never limited.
func (c *config) uplinkFor(from, to string) *bucket {
	if from == to {
		return nil
	}
	return c.uplink[from]
}

// update applies f to a copy of the configuration, installs it, and fails
// or silences the connections it cuts; connections silenced earlier that
// it no longer cuts silently are reset.
func (n *Network) update(f func(c *config)) (broken int) {
	n.mu.Lock()
	n.initLocked()
	c := n.config().clone()
	f(c)
	n.cfg.Store(c)
	close(n.changed)
	n.changed = make(chan struct{})
	var victims, silenced, reset []*conn
	for cn := range n.conns {
		switch {
		case c.dropping(cn.local, cn.remote):
			silenced = append(silenced, cn) // stays registered until it heals
		case c.blocked(cn.local, cn.remote):
			victims = append(victims, cn)
			delete(n.conns, cn)
		case cn.isSilent():
			reset = append(reset, cn)
			delete(n.conns, cn)
		}
	}
	n.mu.Unlock()
	for _, cn := range victims {
		cn.fail(syscall.ENETUNREACH)
	}
	for _, cn := range silenced {
		cn.silence()
	}
	for _, cn := range reset {
		cn.fail(syscall.ECONNRESET)
	}
	return len(victims) + len(silenced)
}

// SetRTT sets the round-trip time between siteA and siteB (symmetric; siteA
// may equal siteB for delay within a site). Each direction is delayed by
// rtt/2, applied to the data itself, and a dial takes one rtt to connect.
// It affects existing connections for data written from now on.
func (n *Network) SetRTT(siteA, siteB string, rtt time.Duration) {
	rtt = max(rtt, 0)
	n.update(func(c *config) {
		if rtt == 0 {
			delete(c.rtt, mkpair(siteA, siteB))
		} else {
			c.rtt[mkpair(siteA, siteB)] = rtt
		}
	})
	n.logger().Info("rtt set", "a", siteA, "b", siteB, "rtt", rtt)
}

// SetBandwidth limits the uplink of site, shared by all data leaving it for
// other sites, to bytesPerSec; 0 (or less) removes the limit.
func (n *Network) SetBandwidth(site string, bytesPerSec int64) {
	n.update(func(c *config) {
		if bytesPerSec <= 0 {
			delete(c.uplink, site)
		} else if b := c.uplink[site]; b != nil {
			b.setRate(bytesPerSec)
		} else {
			c.uplink[site] = newBucket(bytesPerSec)
		}
	})
	n.logger().Info("bandwidth set", "site", site, "bytes_per_sec", bytesPerSec)
}

// Partition cuts siteA from siteB: their connections fail and new dials
// between them are refused until Heal.
func (n *Network) Partition(siteA, siteB string) {
	broken := n.update(func(c *config) { c.cut[mkpair(siteA, siteB)] = true })
	n.logger().Info("partition", "a", siteA, "b", siteB, "broken_conns", broken)
}

// Heal undoes Partition(siteA, siteB). Connections broken by the partition
// stay broken; new dials succeed.
func (n *Network) Heal(siteA, siteB string) {
	n.update(func(c *config) { delete(c.cut, mkpair(siteA, siteB)) })
	n.logger().Info("heal", "a", siteA, "b", siteB)
}

// Isolate cuts site from every other site, including addresses not
// registered with Listen.
func (n *Network) Isolate(site string) {
	broken := n.update(func(c *config) { c.isolated[site] = true })
	n.logger().Info("isolate", "site", site, "broken_conns", broken)
}

// Drop cuts site from every other site as a path that loses every packet
// (see the package comment): connections go silent, dials wait.
func (n *Network) Drop(site string) {
	silenced := n.update(func(c *config) { c.dropped[site] = true })
	n.logger().Info("drop", "site", site, "silenced_conns", silenced)
}

// Rejoin undoes Isolate(site) and Drop(site). Partitions set with
// Partition remain.
func (n *Network) Rejoin(site string) {
	n.update(func(c *config) {
		delete(c.isolated, site)
		delete(c.dropped, site)
	})
	n.logger().Info("rejoin", "site", site)
}

// Listen listens on TCP address addr (such as "127.0.0.1:0") and registers
// its actual address as belonging to site until the listener is closed.
func (n *Network) Listen(site, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil || n == nil {
		return l, err
	}
	ta, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return l, nil
	}
	sl := &listener{Listener: l, n: n}
	n.mu.Lock()
	n.initLocked()
	if ta.IP.IsUnspecified() {
		sl.port = strconv.Itoa(ta.Port)
		n.ports[sl.port] = site
	} else {
		sl.addr = ta.String()
		n.addrs[sl.addr] = site
	}
	n.mu.Unlock()
	return sl, nil
}

// listener unregisters its address on Close. Accepted connections are not
// wrapped (see the package comment).
type listener struct {
	net.Listener
	n          *Network
	addr, port string
	once       sync.Once
}

func (l *listener) Close() error {
	l.once.Do(func() {
		l.n.mu.Lock()
		if l.addr != "" {
			delete(l.n.addrs, l.addr)
		} else {
			delete(l.n.ports, l.port)
		}
		l.n.mu.Unlock()
	})
	return l.Listener.Close()
}

// Register records that the TCP address addr ("ip:port" or
// "localhost:port") belongs to site, for listeners the Network does not
// create itself (such as an embedded etcd member's client port): dials to
// it through Dialer are then shaped and partitioned like dials to a
// Network listener. Registering an address again moves it to the new site.
// Only connections dialed through Dialer are affected; whatever the
// listener's owner dials itself (etcd's peer traffic, for one) is not.
func (n *Network) Register(site, addr string) error {
	key, err := canonicalAddr(addr)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.initLocked()
	n.addrs[key] = site
	n.mu.Unlock()
	n.logger().Debug("address registered", "site", site, "addr", key)
	return nil
}

// Unregister forgets an address given to Register. Existing connections
// keep the site they were dialed with.
func (n *Network) Unregister(addr string) {
	key, err := canonicalAddr(addr)
	if err != nil {
		return
	}
	n.mu.Lock()
	delete(n.addrs, key)
	n.mu.Unlock()
}

// SiteOf returns the site an address was registered with by Listen or
// Register.
// A nil Network knows no sites.
func (n *Network) SiteOf(addr string) (site string, ok bool) {
	if n == nil {
		return "", false
	}
	return n.siteOf(addr)
}

// canonicalAddr turns addr into the "ip:port" form the registry keys on;
// "localhost" and an empty host mean 127.0.0.1.
func canonicalAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if host == "" || strings.EqualFold(host, "localhost") {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return "", &net.AddrError{Err: "not an IP address or localhost", Addr: addr}
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// siteOf returns the site of a registered listener address.
func (n *Network) siteOf(addr string) (string, bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	candidates := []string{addr}
	if ip := net.ParseIP(host); ip != nil {
		candidates = append(candidates, net.JoinHostPort(ip.String(), port))
	} else if strings.EqualFold(host, "localhost") || host == "" {
		candidates = append(candidates, net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port))
	}
	for _, c := range candidates {
		if s, ok := n.addrs[c]; ok {
			return s, true
		}
	}
	s, ok := n.ports[port]
	return s, ok
}

// Dialer returns a dial function for connections from fromSite, suitable
// for grpc.WithContextDialer. The destination's site is the one its address
// was registered with by Listen; other destinations belong to the unnamed
// site "".
func (n *Network) Dialer(fromSite string) func(ctx context.Context, addr string) (net.Conn, error) {
	if n == nil {
		var d net.Dialer
		return func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return n.dial(ctx, fromSite, addr)
	}
}

func (n *Network) dial(ctx context.Context, from, addr string) (net.Conn, error) {
	to, known := n.siteOf(addr)
	if known {
		if err := n.waitDropped(ctx, from, to); err != nil {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: strAddr(addr), Err: err}
		}
	}
	if known && n.config().blocked(from, to) {
		return nil, refused(addr)
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if !known {
		to, _ = n.siteOf(raw.RemoteAddr().String())
	}
	cfg := n.config()
	if cfg.blocked(from, to) {
		abort(raw)
		return nil, refused(addr)
	}
	// Connecting takes a round trip (SYN, SYN-ACK) before data can flow.
	if rtt := cfg.rtt[mkpair(from, to)]; rtt > 0 {
		t := time.NewTimer(rtt)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			abort(raw)
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: raw.RemoteAddr(), Err: ctx.Err()}
		}
	}
	c := newConn(n, raw, from, to)
	n.mu.Lock()
	cfg = n.config()
	if cfg.blocked(from, to) && !cfg.dropping(from, to) { // partitioned meanwhile
		n.mu.Unlock()
		abort(raw)
		return nil, refused(addr)
	}
	n.initLocked()
	n.conns[c] = struct{}{}
	n.mu.Unlock()
	if cfg.dropping(from, to) { // dropped meanwhile
		c.silence()
	}
	return c, nil
}

// waitDropped waits while traffic between from and to is dropped, as a
// SYN that gets no answer: until the path heals or ctx ends.
func (n *Network) waitDropped(ctx context.Context, from, to string) error {
	for {
		n.mu.Lock()
		n.initLocked()
		changed := n.changed
		n.mu.Unlock()
		if !n.config().dropping(from, to) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (n *Network) forget(c *conn) {
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
}

// refused is the error of a dial across a partition.
func refused(addr string) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: strAddr(addr), Err: syscall.ECONNREFUSED}
}

// abort closes a TCP connection with a reset, as a broken path would look
// to the far end, rather than an orderly end of stream.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

type strAddr string

func (a strAddr) Network() string { return "tcp" }
func (a strAddr) String() string  { return string(a) }

// bucket is a token bucket limiting a site's uplink. Reservations may drive
// it into debt, so concurrent senders share the rate in arrival order.
type bucket struct {
	mu     sync.Mutex
	rate   float64 // bytes per second
	tokens float64
	last   time.Time
}

// bucketBurst is the most a bucket lets through at once after idling.
const bucketBurst = chunkSize

func newBucket(rate int64) *bucket {
	return &bucket{rate: float64(rate), tokens: bucketBurst, last: time.Now()}
}

func (b *bucket) refillLocked(now time.Time) {
	b.tokens = min(bucketBurst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
}

func (b *bucket) setRate(rate int64) {
	b.mu.Lock()
	b.refillLocked(time.Now())
	b.rate = float64(rate)
	b.mu.Unlock()
}

// reserve takes n bytes from the bucket and returns when they may be sent.
func (b *bucket) reserve(n int) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.refillLocked(now)
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return now
	}
	return now.Add(time.Duration(-b.tokens / b.rate * float64(time.Second)))
}
