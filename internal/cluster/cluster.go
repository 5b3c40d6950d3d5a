// Package cluster runs a multi-site WheelFS deployment inside one test
// process (DESIGN.md, "Testing layers", layer 2): N sites × M storage
// servers, a configuration service of 1, 3 or 5 embedded etcd members
// spread over the sites, and a client at every site, all talking over one
// shaped transport.Network with a per-site-pair RTT matrix and per-site
// uplink bandwidth. Tests partition a site (its connections refused, or
// with DropSite silently dropped as on a dark link) or a single link, crash
// and restart servers and configuration members, and pause servers; Start
// registers everything to stop when the test ends.
//
//	c := cluster.Start(t, cluster.Options{Sites: []string{"west", "east", "eu"},
//		ServersPerSite: 2, RTT: cluster.UniformRTT(100 * time.Millisecond)})
//	err := c.Client("west").WriteFile(ctx, cluster.Owner(), "/f", data, 0o644)
//	c.PartitionSite("west")
//	c.WaitFor(10*time.Second, "east reads /f", func() error { ... })
//
// Topology. Every node (server host or client host) belongs to a site and
// listens and dials through the Network at that site, its etcd client too.
// Configuration member i lives at site i mod len(Sites); its client port is
// registered with the Network at that site, so servers reach it through
// the shaped, partitionable path. Traffic between etcd members (raft) is
// not shaped: etcd dials its peers itself. To keep partitions meaningful
// anyway, PartitionSite also stops the members at the partitioned site
// (from the majority's side, a member cut off is indistinguishable from a
// stopped one) and HealSite starts them again, so the partitioned site's
// servers lose the configuration majority and, after LockTTL, their slice
// locks. (They see refused connections to their own site's member rather
// than a member that answers nothing.) PartitionLink cuts only the link
// between two sites' servers and clients; the configuration members keep
// talking to each other across it.
//
// Faults. Crash is kill -9 (deploy.Host.Crash: locks and membership expire
// on their own); Restart starts the node on the same directory and
// identity, and needs the configuration majority reachable from its site.
// Pause blocks the server's incoming calls and lock renewals. Configuration
// members stop gracefully (embedded etcd has no harder stop). Slice locks
// last Options.LockTTL; server membership leases keep deploy's default.
//
// All nodes and members share one deployment CA, created once per cluster.
// Logs go to stderr under -v; otherwise a failed test shows their tail.
//
// Tests must not sleep and hope: wait for a condition with WaitFor.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/poll"
	"github.com/wheelfs/wheelfs/internal/transport"
)

// Options describe a cluster. Zero fields take the defaults given.
type Options struct {
	// Sites names the sites (default "west", "east", "eu").
	Sites []string
	// ServersPerSite is the number of storage servers at each site (default 1).
	ServersPerSite int
	// ConfigMembers is the number of etcd members (default 3, at most 5 is
	// sensible); member i is at site i mod len(Sites).
	ConfigMembers int
	// LockTTL is the slice lock length L (default 2 s; etcd rounds it up to
	// whole seconds).
	LockTTL time.Duration
	// RTT gives the round-trip time between two sites (nil: no delay).
	RTT RTT
	// Bandwidth limits sites' uplinks in bytes per second (absent: unlimited).
	Bandwidth map[string]int64
	// ClientTimeout bounds client operations without a .MaxTime cue
	// (default client.DefaultTimeout).
	ClientTimeout time.Duration
	// Logger receives every component's logs (default: stderr under -v;
	// otherwise the last lines at info level and above are kept and shown
	// if the test fails).
	Logger *slog.Logger
	// Adjust, if set, changes a node's host configuration before each start.
	Adjust func(n *Node, cfg *deploy.Config)
	// Logins makes the servers refuse a client host's uids without a
	// session (wheelfs login, issue 13); by default they trust them
	// (--trust-client-uids), as the tests that predate logins expect.
	Logins bool
	// UsersPeriod is how often servers check the users file (default 1 s).
	UsersPeriod time.Duration
	// ConfigAuth turns on the configuration service's authentication
	// (etcd auth, a user per node; docs/SECURITY.md) before any host
	// starts; the hosts, which hold the CA key, add their own users.
	ConfigAuth bool
	// DefaultConfigAuth leaves that authentication to the hosts' default
	// (deploy.ConfigAuthNew: the first server, which creates the
	// deployment, turns it on); the observer's user is added before.
	// Without either, hosts never turn it on: the observer and the
	// tests' own etcd clients have no users.
	DefaultConfigAuth bool
}

// RTT returns the round-trip time between sites a and b (a may equal b).
type RTT func(a, b string) time.Duration

// UniformRTT is d between any two different sites and 0 within a site.
func UniformRTT(d time.Duration) RTT {
	return func(a, b string) time.Duration {
		if a == b {
			return 0
		}
		return d
	}
}

// MatrixRTT takes round-trip times from m, keyed by site pairs in either
// order; pairs not in m have no delay.
func MatrixRTT(m map[[2]string]time.Duration) RTT {
	return func(a, b string) time.Duration {
		if d, ok := m[[2]string{a, b}]; ok {
			return d
		}
		return m[[2]string{b, a}]
	}
}

func (o Options) withDefaults() Options {
	if len(o.Sites) == 0 {
		o.Sites = []string{"west", "east", "eu"}
	}
	if o.ServersPerSite <= 0 {
		o.ServersPerSite = 1
	}
	if o.ConfigMembers <= 0 {
		o.ConfigMembers = 3
	}
	if o.LockTTL <= 0 {
		o.LockTTL = 2 * time.Second
	}
	if o.ClientTimeout <= 0 {
		o.ClientTimeout = client.DefaultTimeout
	}
	return o
}

// logTailLines is how many log lines a failed test shows when it ran
// without -v.
const logTailLines = 300

// Cluster is a running in-process deployment.
type Cluster struct {
	// Network carries every node's traffic; tests may shape it further.
	Network *transport.Network
	// Conf is an unshaped view of the configuration service for
	// assertions (slice table, lock holders). It reaches any running
	// member, whatever the partitions.
	Conf configsvc.Service

	etcd *configsvc.EtcdService // = Conf
	// locks hears every server's slice lock events; a takeover before
	// the previous holder's lock could expire fails the test.
	locks *lockWatch

	t     testing.TB
	opts  Options
	log   *slog.Logger
	dir   string
	caDir string

	mu       sync.Mutex // serializes topology changes; guards the fields below
	members  []*member
	nodes    []*Node
	clients  map[string]*Node // a client host per site
	isolated map[string]bool
	closed   bool
}

// Node is one host of the cluster: a storage server (with its own client
// core) or a client.
type Node struct {
	// Name is "site-i" for the i-th server of a site, "site-client" for
	// the site's client host.
	Name string
	Site string
	// Dir is the node's data directory; it survives Crash and Restart.
	Dir    string
	server bool

	c      *Cluster
	id     string       // server ID, stable across restarts
	host   *deploy.Host // nil while crashed
	paused bool
}

// ID returns the node's server ID (stable across restarts).
func (n *Node) ID() string { return n.id }

// Host returns the node's running host, nil while it is crashed.
func (n *Node) Host() *deploy.Host {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return n.host
}

// Up reports whether the node runs (it may be paused).
func (n *Node) Up() bool { return n.Host() != nil }

// Client returns the node's client core (nil while crashed).
func (n *Node) Client() *client.FS {
	if h := n.Host(); h != nil {
		return h.Client
	}
	return nil
}

func (n *Node) String() string { return n.Name + "(" + n.id + ")" }

// Owner is the user that owns the root directory: the user running the
// test.
func Owner() client.User {
	return client.User{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
}

// startTimeout bounds starting the cluster and restarting a node or member.
const startTimeout = time.Minute

// Start brings a cluster up and returns when every node serves. It fails
// the test if it cannot; the cluster stops when the test ends.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	o = o.withDefaults()
	var tail *logTail
	if o.Logger == nil {
		if testing.Verbose() {
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		} else {
			tail = newLogTail(logTailLines)
			o.Logger = slog.New(slog.NewTextHandler(tail, nil))
			t.Cleanup(func() {
				if t.Failed() {
					tail.dump(t)
				}
			})
		}
	}
	began := time.Now()
	c := &Cluster{t: t, opts: o, log: o.Logger.With("component", "cluster"), dir: t.TempDir(),
		clients: map[string]*Node{}, isolated: map[string]bool{}}
	c.Network = transport.NewNetwork(transport.WithLogger(o.Logger))
	c.locks = newLockWatch()
	t.Cleanup(c.close)
	t.Cleanup(func() { // before close: stopping releases locks
		for _, v := range c.locks.violations() {
			t.Errorf("early takeover: %s", v)
		}
		c.log.Info("slice locks checked", "takeovers", c.locks.takeovers())
	})
	if err := c.start(); err != nil {
		t.Fatalf("cluster: start: %v", err)
	}
	c.settleRoot()
	c.log.Info("cluster up", "sites", o.Sites, "servers_per_site", o.ServersPerSite,
		"config_members", o.ConfigMembers, "took", time.Since(began))
	return c
}

// settleRoot waits (at most rootSettle) until the root's slice has the
// replicas its policy asks for: until then a write there waits for the
// copy maintenance has yet to add, and a test's first call, bounded by
// its client timeout, could run out under load (CI saw it). It only logs
// when the bound passes: some tests start clusters that cannot get there.
func (c *Cluster) settleRoot() {
	want := min(3, len(c.Servers("")))
	deadline := time.Now().Add(rootSettle)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		t, err := c.Conf.Table(ctx)
		cancel()
		if err == nil && len(t.Slices[oid.Root.Slice()].Replicas) >= want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.log.Info("the root's slice is not fully replicated yet", "want", want)
}

// rootSettle bounds settleRoot.
const rootSettle = 10 * time.Second

func (c *Cluster) start() error {
	o := c.opts
	for i, a := range o.Sites {
		if a == "" || slices.Contains(o.Sites[:i], a) {
			return fmt.Errorf("site names must be distinct and non-empty: %q", o.Sites)
		}
		if o.RTT != nil {
			for _, b := range o.Sites[i:] {
				if d := o.RTT(a, b); d > 0 {
					c.Network.SetRTT(a, b, d)
				}
			}
		}
	}
	for site, bw := range o.Bandwidth {
		c.Network.SetBandwidth(site, bw)
	}
	c.caDir = filepath.Join(c.dir, "ca")
	ca, err := pki.InitCA(c.caDir, "wheelfs-cluster-test")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()

	ms, err := newMembers(o.ConfigMembers, o.Sites, filepath.Join(c.dir, "etcd"), ca, o.Logger)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.members = ms
	c.mu.Unlock()
	for _, m := range ms {
		if err := c.Network.Register(m.site, m.clientAddr); err != nil {
			return err
		}
	}
	if err := startMembers(ctx, ms); err != nil {
		return err
	}

	obs := filepath.Join(c.dir, "observer")
	if err := ca.IssueNodeDir(obs, "observer", nil, nil); err != nil {
		return err
	}
	if o.ConfigAuth || o.DefaultConfigAuth {
		if err := enableConfigAuth(ctx, c.endpoints(), ca, o.ConfigAuth, "observer"); err != nil {
			return err
		}
	}
	creds, err := pki.LoadCredentials(obs)
	if err != nil {
		return err
	}
	conf, err := configsvc.Dial(ctx, c.endpoints(), creds.ClientTLS(""),
		configsvc.Options{LockTTL: o.LockTTL, Logger: o.Logger.With("node", "observer")})
	if err != nil {
		return err
	}
	c.Conf, c.etcd = conf, conf

	var nodes []*Node
	for _, site := range o.Sites {
		for i := range o.ServersPerSite {
			nodes = append(nodes, &Node{Name: fmt.Sprintf("%s-%d", site, i), Site: site, server: true, c: c})
		}
	}
	for _, site := range o.Sites {
		nodes = append(nodes, &Node{Name: site + "-client", Site: site, c: c})
	}
	for _, n := range nodes {
		n.Dir = filepath.Join(c.dir, "nodes", n.Name)
	}
	c.mu.Lock()
	c.nodes = nodes
	for _, n := range nodes {
		if !n.server {
			c.clients[n.Site] = n
		}
	}
	c.mu.Unlock()
	// The first server creates the root directory; the others start
	// together once it exists.
	if err := c.startNode(ctx, nodes[0]); err != nil {
		return err
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.startNode(ctx, n)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// enableConfigAuth adds server users for nodes, as the administrator, and
// turns etcd auth on if on.
func enableConfigAuth(ctx context.Context, endpoints []string, ca *pki.CA, on bool, nodes ...string) error {
	root, err := ca.RootCredentials()
	if err != nil {
		return err
	}
	admin, err := configsvc.Dial(ctx, endpoints, root.ClientTLS(""), configsvc.Options{OneShot: true})
	if err != nil {
		return err
	}
	defer admin.Close()
	if !on {
		for _, n := range nodes {
			if err := admin.AddNodeUser(ctx, n, true); err != nil {
				return err
			}
		}
		return nil
	}
	return admin.EnableAuth(ctx, nodes...)
}

// endpoints are the client URLs of all configuration members.
func (c *Cluster) endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.endpoint())
	}
	return eps
}

// hostConfig is the deploy configuration of n.
func (c *Cluster) hostConfig(n *Node) deploy.Config {
	cfg := deploy.NewConfig(n.Dir)
	cfg.Site = n.Site
	cfg.Etcd = c.endpoints()
	cfg.LockTTL = c.opts.LockTTL
	cfg.Logger = c.opts.Logger.With("node", n.Name)
	cfg.Client.Timeout = c.opts.ClientTimeout
	cfg.TrustClientUIDs = !c.opts.Logins
	cfg.UsersPeriod = c.opts.UsersPeriod
	if !c.opts.ConfigAuth && !c.opts.DefaultConfigAuth {
		cfg.ConfigAuth = deploy.ConfigAuthOff
	}
	applyHooks(c, n, &cfg)
	if c.opts.Adjust != nil {
		c.opts.Adjust(n, &cfg)
	}
	return cfg
}

// startNode starts n's host and records it.
func (c *Cluster) startNode(ctx context.Context, n *Node) error {
	h, err := deploy.Start(ctx, c.hostConfig(n))
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	c.mu.Lock()
	n.host, n.id, n.paused = h, h.ServerID(), false
	c.mu.Unlock()
	return nil
}

// Sites returns the site names.
func (c *Cluster) Sites() []string { return slices.Clone(c.opts.Sites) }

// Options returns the options the cluster runs with, defaults filled in.
func (c *Cluster) Options() Options { return c.opts }

// Servers returns the server nodes at site, or at every site if site is "".
func (c *Cluster) Servers(site string) []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Node
	for _, n := range c.nodes {
		if n.server && (site == "" || n.Site == site) {
			out = append(out, n)
		}
	}
	return out
}

// Node returns the node with the given server ID or name, nil if none.
func (c *Cluster) Node(idOrName string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.id == idOrName || n.Name == idOrName {
			return n
		}
	}
	return nil
}

// ClientNode returns the client node of site.
func (c *Cluster) ClientNode(site string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.clients[site]
	if n == nil {
		c.t.Fatalf("cluster: no site %q", site)
	}
	return n
}

// Client returns the client core at site: a client host of its own, which
// no server crash takes down.
func (c *Cluster) Client(site string) *client.FS {
	fs := c.ClientNode(site).Client()
	if fs == nil {
		c.t.Fatalf("cluster: the client of site %q is down", site)
	}
	return fs
}

// Primary returns the node that is primary of slice s according to the
// configuration service (the lock holder, else the first replica), nil if
// none is known.
func (c *Cluster) Primary(ctx context.Context, s oid.Slice) (*Node, error) {
	t, err := c.Conf.Table(ctx)
	if err != nil {
		return nil, err
	}
	sl, ok := t.Slices[s]
	if !ok {
		return nil, fmt.Errorf("cluster: slice %d: %w", s, configsvc.ErrNotFound)
	}
	id := sl.Holder
	if id == "" && len(sl.Replicas) > 0 {
		id = sl.Replicas[0]
	}
	if n := c.Node(id); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("cluster: slice %d has no known primary (holder %q, replicas %v)", s, sl.Holder, sl.Replicas)
}

// PrimaryOf returns the primary of the object at path, resolved by fs.
func (c *Cluster) PrimaryOf(ctx context.Context, fs *client.FS, path string) (*Node, error) {
	r, err := fs.Resolve(ctx, Owner(), path)
	if err != nil {
		return nil, err
	}
	if r.Meta == nil {
		return nil, fmt.Errorf("cluster: %s does not exist", path)
	}
	return c.Primary(ctx, oid.ID(r.Meta.Id).Slice())
}

// Crash stops n as kill -9 would: nothing is released, its slice locks and
// membership expire on their own. Restart brings it back.
func (c *Cluster) Crash(n *Node) {
	c.t.Helper()
	crashHost(c.takeHost(n, "crash"))
	c.log.Info("node crashed", "node", n.Name, "id", n.id)
}

// takeHost marks n down and returns its running host, for a fault that
// stops it; it fails the test if n is not running.
func (c *Cluster) takeHost(n *Node, fault string) *deploy.Host {
	c.t.Helper()
	c.mu.Lock()
	h := n.host
	n.host, n.paused = nil, false
	c.mu.Unlock()
	if h == nil {
		c.t.Fatalf("cluster: %s %s: not running", fault, n)
	}
	return h
}

// Stop stops n as SIGTERM would: it releases its slice locks and
// membership before it exits. Restart brings it back.
func (c *Cluster) Stop(n *Node) {
	c.t.Helper()
	stopHost(c.takeHost(n, "stop"), true)
	c.log.Info("node stopped", "node", n.Name, "id", n.id)
}

// StopAll stops nodes at once, as SIGTERM to every process would.
func (c *Cluster) StopAll(nodes ...*Node) {
	c.t.Helper()
	var wg sync.WaitGroup
	for _, n := range nodes {
		h := c.takeHost(n, "stop")
		wg.Go(func() { stopHost(h, true) })
	}
	wg.Wait()
	c.log.Info("nodes stopped at once", "nodes", len(nodes))
}

// Restart starts a crashed node again on the same data directory, with the
// same identity; it returns when the node serves.
func (c *Cluster) Restart(n *Node) {
	c.t.Helper()
	if n.Up() {
		c.t.Fatalf("cluster: restart %s: already running", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := c.startNode(ctx, n); err != nil {
		c.t.Fatalf("cluster: restart: %v", err)
	}
	c.log.Info("node restarted", "node", n.Name, "id", n.id)
}

// Pause makes n stop answering and stop renewing its locks, as a process
// stopped with SIGSTOP; Resume continues it.
func (c *Cluster) Pause(n *Node) {
	c.t.Helper()
	c.mu.Lock()
	h := n.host
	if h == nil || n.paused {
		c.mu.Unlock()
		c.t.Fatalf("cluster: pause %s: not running or already paused", n)
	}
	n.paused = true
	c.mu.Unlock()
	pauseHost(h)
	c.log.Info("node paused", "node", n.Name)
}

// Resume undoes Pause.
func (c *Cluster) Resume(n *Node) {
	c.t.Helper()
	c.mu.Lock()
	h := n.host
	if h == nil || !n.paused {
		c.mu.Unlock()
		c.t.Fatalf("cluster: resume %s: not paused", n)
	}
	n.paused = false
	c.mu.Unlock()
	resumeHost(h)
	c.log.Info("node resumed", "node", n.Name)
}

// PartitionSite cuts site off from every other site, and stops the
// configuration members at site (see the package comment).
func (c *Cluster) PartitionSite(site string) {
	c.t.Helper()
	c.cutSite(site, c.Network.Isolate)
}

// DropSite is PartitionSite on a path that loses every packet instead of
// refusing (transport.Network.Drop): calls between the site and the others
// wait for their deadlines rather than fail at once, as on a real wide-area
// link that goes dark. HealSite undoes it.
func (c *Cluster) DropSite(site string) {
	c.t.Helper()
	c.cutSite(site, c.Network.Drop)
}

func (c *Cluster) cutSite(site string, cut func(site string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.isolated[site] = true
	cut(site)
	for _, m := range c.members {
		if m.site == site && !m.cut {
			m.cut = true
			if err := m.stop(); err != nil {
				c.log.Warn("stop member", "member", m.name, "err", err)
			}
		}
	}
	c.log.Info("site partitioned", "site", site)
}

// HealSite undoes PartitionSite and DropSite; it returns when the site's configuration
// members (unless crashed) have rejoined.
func (c *Cluster) HealSite(site string) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.isolated, site)
	c.Network.Rejoin(site)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, m := range c.members {
		if m.site == site && m.cut {
			m.cut = false
			if !m.crashed {
				if err := m.start(ctx); err != nil {
					c.t.Fatalf("cluster: heal %s: restart member %s: %v", site, m.name, err)
				}
			}
		}
	}
	c.log.Info("site healed", "site", site)
}

// PartitionLink cuts the link between sites a and b (servers and clients;
// see the package comment about configuration members).
func (c *Cluster) PartitionLink(a, b string) { c.Network.Partition(a, b) }

// HealLink undoes PartitionLink.
func (c *Cluster) HealLink(a, b string) { c.Network.Heal(a, b) }

// ConfigMembers returns the number of configuration members.
func (c *Cluster) ConfigMembers() int { return len(c.members) }

// ConfigMemberSite returns the site of configuration member i.
func (c *Cluster) ConfigMemberSite(i int) string { return c.member(i).site }

func (c *Cluster) member(i int) *member {
	c.t.Helper()
	if i < 0 || i >= len(c.members) {
		c.t.Fatalf("cluster: no configuration member %d", i)
	}
	return c.members[i]
}

// ConfigLeader returns the index of the configuration member that leads,
// -1 if none does at the moment.
func (c *Cluster) ConfigLeader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := leader(c.etcd, c.members); m != nil {
		return slices.Index(c.members, m)
	}
	return -1
}

// LeadConfigAwayFrom moves the configuration service's leadership to a
// member away from site if one there leads: a test that cuts a site off
// to time something else then does not also wait for an election.
func (c *Cluster) LeadConfigAwayFrom(site string) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var lead, other *member
	for _, m := range c.members {
		switch {
		case m.m == nil:
		case m.m.Leads():
			lead = m
		case m.site != site && other == nil:
			other = m
		}
	}
	if lead == nil || lead.site != site || other == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lead.m.HandLeadershipTo(ctx, other.m); err != nil {
		c.t.Fatalf("cluster: move configuration leadership from %s to %s: %v", lead.name, other.name, err)
	}
	c.log.Info("config leadership moved", "from", lead.name, "to", other.name)
}

// CrashConfigMember stops configuration member i.
func (c *Cluster) CrashConfigMember(i int) {
	c.t.Helper()
	m := c.member(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	m.crashed = true
	if err := m.stop(); err != nil {
		c.log.Warn("stop member", "member", m.name, "err", err)
	}
	c.log.Info("config member crashed", "member", m.name)
}

// RestartConfigMember starts configuration member i again on its data and
// returns when it has rejoined (unless its site is partitioned: then it
// starts when the site heals).
func (c *Cluster) RestartConfigMember(i int) {
	c.t.Helper()
	m := c.member(i)
	c.mu.Lock()
	defer c.mu.Unlock()
	m.crashed = false
	if m.cut {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := m.start(ctx); err != nil {
		c.t.Fatalf("cluster: restart member %s: %v", m.name, err)
	}
	c.log.Info("config member restarted", "member", m.name)
}

// WaitFor polls cond every 20 ms (then less often) until it returns nil,
// and fails the test with cond's last error if timeout passes first.
func (c *Cluster) WaitFor(timeout time.Duration, what string, cond func() error) {
	c.t.Helper()
	WaitFor(c.t, timeout, what, cond)
}

// WaitFor polls cond until it returns nil, and fails t with cond's last
// error if timeout passes first.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	poll.Until(t, timeout, "cluster: "+what, cond)
}

// close stops everything: the network heals first so that hosts can
// release their locks promptly, then hosts stop in parallel, then members.
func (c *Cluster) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for site := range c.isolated {
		c.Network.Rejoin(site)
	}
	var hosts []*deploy.Host
	for _, n := range c.nodes {
		if n.host != nil {
			if n.paused {
				resumeHost(n.host)
			}
			hosts = append(hosts, n.host)
			n.host = nil
		}
	}
	members := c.members
	up := 0
	for _, m := range members {
		if m.m != nil {
			up++
		}
	}
	quorum := up > len(members)/2
	c.mu.Unlock()
	began := time.Now()
	var wg sync.WaitGroup
	for _, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stopHost(h, quorum)
		}()
	}
	wg.Wait()
	hostsDone := time.Now()
	stopAll(c.etcd, members)
	if c.etcd != nil {
		c.etcd.Close()
	}
	c.log.Info("cluster stopped", "hosts", hostsDone.Sub(began), "members", time.Since(hostsDone))
}

// Deny puts a node on the configuration service's deny list (as `wheelfs
// ca revoke` does). Its slice locks are deleted at once, by design, so the
// lock check does not hold its takeovers against it.
func (c *Cluster) Deny(ctx context.Context, name, reason string) error {
	c.locks.deny(name)
	return c.Conf.(configsvc.Denials).Deny(ctx, configsvc.Denial{Name: name, Reason: reason})
}

// AdminCredentials returns in-memory credentials of the deployment's
// administrator, as the CA key's holder makes them (wheelfs fsck --ca).
func (c *Cluster) AdminCredentials() (*pki.Credentials, error) {
	ca, err := pki.LoadCA(c.caDir)
	if err != nil {
		return nil, err
	}
	return ca.RootCredentials()
}
