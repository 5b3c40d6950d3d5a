package configsvc

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/wheelfs/wheelfs/internal/configsvc/internal/zapslog"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// Options configure an EtcdService. Zero fields take the defaults below.
type Options struct {
	// Prefix is prepended to every key (default "/wheelfs/"; a missing
	// trailing slash is added).
	Prefix string
	// LockTTL is the slice lock lease length L (default 2 minutes, paper
	// §5.3). etcd leases have whole-second TTLs, so it is rounded up to a
	// whole second (minimum 1 s); etcd may raise very short TTLs to its own
	// minimum (1.5 × election timeout).
	LockTTL time.Duration
	// MemberTTL is the server membership lease length (default 10 s),
	// rounded up like LockTTL. Keep-alives are sent every MemberTTL/3. A
	// server cut off for longer drops out of the table (its replicas count
	// as down and are repaired elsewhere) until it reaches a serving
	// member again, when it re-registers at once.
	MemberTTL time.Duration
	// ProbePeriod is how often a client made by Dial checks that a
	// member not serving now serves a linearizable read again, and the
	// least time between two probes of one member (default 1 s; see
	// endpointMonitor).
	ProbePeriod time.Duration
	// IdleProbePeriod is how often a member that serves is checked
	// (default 5 s, at least ProbePeriod). A request that fails for want
	// of an answer checks every member at once.
	IdleProbePeriod time.Duration
	// OneShot marks a short-lived client (wheelfs status): it keeps the
	// endpoints it was given and runs no endpoint monitor, whose probes
	// and warnings only serve long-running hosts.
	OneShot bool
	// RPCTimeout bounds every etcd call (default 5 s); a shorter deadline on
	// the caller's context wins.
	RPCTimeout time.Duration
	// Logger receives the service's and etcd client's logs (nil = discard).
	Logger *slog.Logger
	// Dial, when set, opens every connection of the etcd client (Dial only;
	// the shaped transport of the in-process tests). It is passed to gRPC
	// as grpc.WithContextDialer.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
}

func (o Options) withDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = "/wheelfs/"
	}
	if !strings.HasSuffix(o.Prefix, "/") {
		o.Prefix += "/"
	}
	if o.LockTTL <= 0 {
		o.LockTTL = 2 * time.Minute
	}
	if o.MemberTTL <= 0 {
		o.MemberTTL = 10 * time.Second
	}
	if o.RPCTimeout <= 0 {
		o.RPCTimeout = 5 * time.Second
	}
	if o.ProbePeriod <= 0 {
		o.ProbePeriod = time.Second
	}
	if o.IdleProbePeriod <= 0 {
		o.IdleProbePeriod = DefaultIdleProbePeriod
	}
	o.IdleProbePeriod = max(o.IdleProbePeriod, o.ProbePeriod)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// DefaultIdleProbePeriod is how often a member that serves is probed. Every
// probe is a linearizable read through the leader, from every host to every
// member: at 250 hosts and 5 members, a 500 ms period made 2 500 such reads
// a second, most of the configuration service's idle load.
const DefaultIdleProbePeriod = 5 * time.Second

// ttlSeconds rounds d up to whole seconds, at least 1.
func ttlSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// EtcdService implements Service on etcd.
type EtcdService struct {
	cli *clientv3.Client
	// endpointsMu orders the endpoint monitor's SetEndpoints (writer)
	// after calls that dial one member (Status, readers): etcd's
	// Client.Dial reads the client's endpoint list without its lock
	// (client/v3 v3.7.3, client.go dial), a data race otherwise.
	endpointsMu sync.RWMutex
	ownsClient  bool
	opts        Options
	log         *slog.Logger
	lockTTL     int64 // seconds
	memberTTL   int64 // seconds

	serversPfx, slicesPfx, locksPfx, deploymentKey string

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // registration and watch goroutines

	mu        sync.Mutex
	closed    bool
	abandoned atomic.Bool // Abandon: leases are left to expire
	regs      map[string]*registration
	mon       *endpointMonitor // nil unless made by Dial
	// sessions holds, per lock holder, the one lease all its slice locks
	// are attached to (a Chubby session): renewing a server's locks costs
	// one keep-alive however many slices it holds, and they all expire
	// together when it stops.
	sessions map[string]lockSession
	// coords holds, per node, the lease its published coordinate is
	// attached to and what was written last (PublishCoord).
	coords map[string]publishedCoord
}

type registration struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	val   []byte           // the server's value (UpdateServer changes it)
	lease clientv3.LeaseID // current membership lease (NoLease while lost)
}

var _ Service = (*EtcdService)(nil)

// NewEtcd returns a Service using cli. The caller keeps ownership of cli:
// Close does not close it.
func NewEtcd(cli *clientv3.Client, opts Options) (*EtcdService, error) {
	if cli == nil {
		return nil, errors.New("configsvc: nil etcd client")
	}
	opts = opts.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &EtcdService{
		cli:           cli,
		opts:          opts,
		log:           opts.Logger.With("component", "configsvc"),
		lockTTL:       ttlSeconds(opts.LockTTL),
		memberTTL:     ttlSeconds(opts.MemberTTL),
		serversPfx:    opts.Prefix + "servers/",
		slicesPfx:     opts.Prefix + "slices/",
		locksPfx:      opts.Prefix + "locks/",
		deploymentKey: opts.Prefix + "deployment",
		ctx:           ctx,
		cancel:        cancel,
		regs:          make(map[string]*registration),
	}
	return s, nil
}

// Dial connects to the etcd cluster at endpoints (tlsConfig may be nil for
// plain connections), checks that an endpoint answers within ctx and
// RPCTimeout, and returns a Service that owns the client.
func Dial(ctx context.Context, endpoints []string, tlsConfig *tls.Config, opts Options) (*EtcdService, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("configsvc: no etcd endpoints")
	}
	opts = opts.withDefaults()
	if err := allRefused(ctx, endpoints, opts.Dial); err != nil {
		return nil, err
	}
	// The etcd client's own logs (retries, balancer errors, "context
	// canceled" on every clean stop) are at debug level: the service
	// reports what fails through its errors.
	clientLog, quiet := zapslog.NewQuietable(opts.Logger.With("component", "etcd-client"), zapcore.DebugLevel)
	quiet()
	dialOpts := []grpc.DialOption{
		// gRPC's defaults (back-off to 2 minutes, 20 s per attempt) kept
		// a member unused for many seconds after a partition healed: an
		// attempt begun during the cut waits for the kernel's next SYN
		// retransmission (1, 3, 7, 15 s...). Short attempts, retried
		// within a second, reconnect about a second after the heal.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: connectTimeout,
		}),
	}
	if opts.Dial != nil {
		dialOpts = append(dialOpts, grpc.WithContextDialer(opts.Dial))
	}
	// The main client's failures wake the endpoint monitor (made below);
	// its probe clients' do not.
	var mon atomic.Pointer[endpointMonitor]
	mainOpts := append(slices.Clone(dialOpts), grpc.WithChainUnaryInterceptor(probeOnFailure(&mon)))
	cfg := clientv3.Config{
		DialOptions: mainOpts,
		Endpoints:   endpoints,
		TLS:         tlsConfig,
		DialTimeout: opts.RPCTimeout,
		// A ping unanswered for 3 s closes a connection that a cut left
		// hanging. Not more often than every 6 s: etcd's servers refuse
		// pings closer than 5 s apart (GRPCKeepAliveMinTime).
		DialKeepAliveTime:    6 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               clientLog,
		// No AutoSyncInterval: the endpoint monitor learns the members
		// and owns the endpoint list.
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("configsvc: etcd client for %v: %w", endpoints, err)
	}
	pctx, cancel := context.WithTimeout(ctx, opts.RPCTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, opts.Prefix+"deployment", clientv3.WithSerializable(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		if authRefused(err) {
			return nil, fmt.Errorf("%w (etcd at %v: %v)", ErrNoUser, endpoints, err)
		}
		return nil, fmt.Errorf("configsvc: cannot reach etcd at %v: %w", endpoints, err)
	}
	s, err := NewEtcd(cli, opts)
	if err != nil {
		cli.Close()
		return nil, err
	}
	s.ownsClient = true
	if opts.OneShot {
		return s, nil
	}
	cfg.DialTimeout = 0 // probe clients connect in the background
	cfg.DialOptions = dialOpts
	s.mon = newEndpointMonitor(s, cfg, opts.ProbePeriod, opts.IdleProbePeriod)
	mon.Store(s.mon)
	s.mon.start(s.ctx, endpoints)
	return s, nil
}

// connectTimeout bounds one connection attempt to a member (TCP and TLS
// handshakes: three round trips).
const connectTimeout = 2 * time.Second

// Client returns the underlying etcd client.
func (s *EtcdService) Client() *clientv3.Client { return s.cli }

func (s *EtcdService) rpcCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.RPCTimeout)
}

func (s *EtcdService) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *EtcdService) sliceKey(sl oid.Slice) string {
	return fmt.Sprintf("%s%08x", s.slicesPfx, uint32(sl))
}
func (s *EtcdService) lockKey(sl oid.Slice) string {
	return fmt.Sprintf("%s%08x", s.locksPfx, uint32(sl))
}

// sliceRecord is the persistent value under slices/.
type sliceRecord struct {
	Policy   Policy   `json:"policy"`
	Replicas []string `json:"replicas"`
}

// lockRecord is the value under locks/.
type lockRecord struct {
	Holder string `json:"holder"`
}

func lockValue(holder string) string {
	b, _ := json.Marshal(lockRecord{Holder: holder})
	return string(b)
}

func parseHolder(v []byte) (string, error) {
	var r lockRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return "", err
	}
	return r.Holder, nil
}

func parseSlice(suffix string) (oid.Slice, error) {
	n, err := strconv.ParseUint(suffix, 16, 32)
	if err != nil {
		return 0, err
	}
	return oid.Slice(n), nil
}

// ---- membership ----

// Register implements Service.
func (s *EtcdService) Register(ctx context.Context, info ServerInfo) error {
	if info.ID == "" {
		return errors.New("configsvc: register: empty server ID")
	}
	val, err := json.Marshal(info)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	old := s.regs[info.ID]
	delete(s.regs, info.ID)
	s.mu.Unlock()
	if old != nil {
		old.cancel()
		<-old.done
	}

	lease, err := s.putServer(ctx, info.ID, val)
	if err != nil {
		return fmt.Errorf("configsvc: register %s: %w", info.ID, err)
	}

	rctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	reg := &registration{cancel: cancel, done: make(chan struct{}), val: val, lease: lease}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		stop()
		cancel()
		s.revoke(lease)
		return ErrClosed
	}
	if prev := s.regs[info.ID]; prev != nil { // concurrent Register of the same ID
		prev.cancel()
	}
	s.regs[info.ID] = reg
	s.wg.Add(1)
	s.mu.Unlock()

	go func() {
		defer s.wg.Done()
		defer close(reg.done)
		defer stop()
		defer cancel()
		s.keepMember(rctx, info.ID, reg)
		s.mu.Lock()
		if s.regs[info.ID] == reg {
			delete(s.regs, info.ID)
		}
		s.mu.Unlock()
	}()
	s.log.Info("server registered", "server", info.ID, "site", info.Site, "addr", info.Addr, "lease", fmt.Sprintf("%x", int64(lease)))
	return nil
}

// errRegistrationRaced means the server's key changed between granting a
// lease and writing the key under it.
var errRegistrationRaced = errors.New("server key changed during registration")

// putServer grants a membership lease and writes the server's key under it.
//
// The write only succeeds if the key has not changed since the grant: an
// earlier attempt whose write timed out here may still be applied later
// (it waited in a member that had lost touch with the leader), and it must
// not replace a newer registration with a lease that nobody renews.
func (s *EtcdService) putServer(ctx context.Context, id string, val []byte) (clientv3.LeaseID, error) {
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	g, err := s.cli.Grant(cctx, s.memberTTL)
	if err != nil {
		return 0, err
	}
	key := s.serversPfx + id
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "<", g.ResponseHeader.GetRevision()+1)).
		Then(
			clientv3.OpPut(key, string(val), clientv3.WithLease(g.ID)),
			clientv3.OpPut(s.knownKey(id), string(val)), // outlives the lease: status shows the server as down
		).Commit()
	if err == nil && !resp.Succeeded {
		err = errRegistrationRaced
	}
	if err != nil {
		go s.revoke(g.ID) // its own deadline; the caller retries meanwhile
		return 0, err
	}
	return g.ID, nil
}

func (s *EtcdService) knownKey(id string) string {
	return strings.TrimSuffix(s.serversPfx, "servers/") + "known-servers/" + id
}

// KnownServers returns every server that ever registered, registered now
// or not, with what it last registered: `wheelfs status` shows the ones
// that are not registered as down.
func (s *EtcdService) KnownServers(ctx context.Context) (map[string]ServerInfo, error) {
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	pfx := s.knownKey("")
	resp, err := s.cli.Get(cctx, pfx, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("configsvc: read known servers: %w", err)
	}
	out := make(map[string]ServerInfo, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var info ServerInfo
		if err := json.Unmarshal(kv.Value, &info); err != nil {
			continue
		}
		out[strings.TrimPrefix(string(kv.Key), pfx)] = info
	}
	return out, nil
}

// revoke revokes lease, best effort, with its own deadline.
func (s *EtcdService) revoke(lease clientv3.LeaseID) {
	if lease == clientv3.NoLease || s.abandoned.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RPCTimeout)
	defer cancel()
	if _, err := s.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.log.Debug("revoke lease", "lease", fmt.Sprintf("%x", int64(lease)), "err", err)
	}
}

// keepMember keeps the membership lease alive with deadline-bounded
// KeepAliveOnce calls every MemberTTL/3 until ctx ends, re-registering if
// the lease is lost, and revokes the lease on exit.
//
// After a partition: a member that starts serving again (the endpoint
// monitor) triggers a round at once and abandons a round in flight, whose
// calls may be waiting on a member that is not serving yet; a failed
// re-registration is retried after ProbePeriod. So a server cut off for
// longer than MemberTTL is back in the table about a probe period after its
// site reaches the configuration majority again.
func (s *EtcdService) keepMember(ctx context.Context, id string, reg *registration) {
	defer func() {
		reg.mu.Lock()
		lease := reg.lease
		reg.lease = clientv3.NoLease
		reg.mu.Unlock()
		s.revoke(lease)
	}()
	interval := time.Duration(s.memberTTL) * time.Second / 3
	var served <-chan struct{} // nil without a monitor: never ready
	if s.mon != nil {
		var unsubscribe func()
		served, unsubscribe = s.mon.subscribe()
		defer unsubscribe()
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-served:
		case <-retry:
		}
		retry = nil
		for ctx.Err() == nil {
			rctx, cancel := context.WithCancel(ctx)
			done, exited := make(chan struct{}), make(chan struct{})
			interrupted := false
			go func() {
				defer close(exited)
				select {
				case <-served:
					interrupted = true
					cancel()
				case <-done:
				}
			}()
			ok := s.memberRound(rctx, id, reg)
			close(done)
			<-exited
			cancel()
			if interrupted {
				continue // a member serves again: start over through it
			}
			if !ok && ctx.Err() == nil {
				retry = time.After(min(interval, s.opts.ProbePeriod))
			}
			break
		}
	}
}

// memberRound renews *lease, or registers anew if it was lost; ok is false
// if a re-registration failed.
func (s *EtcdService) memberRound(ctx context.Context, id string, reg *registration) (ok bool) {
	reg.mu.Lock()
	lease := reg.lease
	reg.mu.Unlock()
	if lease != clientv3.NoLease {
		cctx, cancel := s.rpcCtx(ctx)
		resp, err := s.cli.KeepAliveOnce(cctx, lease)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			return true
		case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.log.Warn("membership lease lost; re-registering", "server", id)
			reg.mu.Lock()
			if reg.lease == lease {
				reg.lease = clientv3.NoLease
			}
			reg.mu.Unlock()
		default:
			if ctx.Err() == nil {
				s.log.Warn("membership keep-alive failed", "server", id, "err", err)
			}
			return true // the lease may still be alive: renew it next tick
		}
	}
	reg.mu.Lock()
	val := reg.val
	reg.mu.Unlock()
	l, err := s.putServer(ctx, id, val)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("re-register failed", "server", id, "err", err)
		}
		return false
	}
	reg.mu.Lock()
	reg.lease = l
	reg.mu.Unlock()
	s.log.Info("server re-registered", "server", id)
	return true
}

// UpdateServer implements Service.
func (s *EtcdService) UpdateServer(ctx context.Context, info ServerInfo) error {
	val, err := json.Marshal(info)
	if err != nil {
		return err
	}
	s.mu.Lock()
	reg := s.regs[info.ID]
	s.mu.Unlock()
	if reg == nil {
		return fmt.Errorf("configsvc: update server %s: %w", info.ID, ErrNotFound)
	}
	reg.mu.Lock()
	reg.val = val
	lease := reg.lease
	reg.mu.Unlock()
	// Only under the live lease: a write must not bring back a key whose
	// lease expired. While the server re-registers the caller is told to
	// try again (the re-registration may have read the older value).
	errRetry := fmt.Errorf("configsvc: update server %s: re-registering; try again", info.ID)
	if lease == clientv3.NoLease {
		return errRetry
	}
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	key := s.serversPfx + info.ID
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
		Then(
			clientv3.OpPut(key, string(val), clientv3.WithLease(lease)),
			clientv3.OpPut(s.knownKey(info.ID), string(val)),
		).Commit()
	if err != nil {
		return fmt.Errorf("configsvc: update server %s: %w", info.ID, err)
	}
	if !resp.Succeeded {
		return errRetry
	}
	return nil
}

// ---- table ----

// Table implements Service.
func (s *EtcdService) Table(ctx context.Context) (*Table, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	// A read-only transaction: all three ranges at one revision.
	resp, err := s.cli.Txn(cctx).Then(
		clientv3.OpGet(s.serversPfx, clientv3.WithPrefix()),
		clientv3.OpGet(s.slicesPfx, clientv3.WithPrefix()),
		clientv3.OpGet(s.locksPfx, clientv3.WithPrefix()),
		clientv3.OpGet(deniedKey(s.opts.Prefix, ""), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("configsvc: read table: %w", err)
	}
	// A denied server is not registered, whatever its lease still says.
	denied := map[string]bool{}
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		denied[strings.TrimPrefix(string(kv.Key), deniedKey(s.opts.Prefix, ""))] = true
	}
	t := &Table{
		Revision: resp.Header.Revision,
		Slices:   make(map[oid.Slice]Slice),
		Servers:  make(map[string]ServerInfo),
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		id := strings.TrimPrefix(string(kv.Key), s.serversPfx)
		var si ServerInfo
		if err := json.Unmarshal(kv.Value, &si); err != nil {
			s.log.Warn("bad server record", "key", string(kv.Key), "err", err)
			continue
		}
		if si.ID == "" {
			si.ID = id
		}
		if !denied[id] {
			t.Servers[id] = si
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		sl, err := parseSlice(strings.TrimPrefix(string(kv.Key), s.slicesPfx))
		var rec sliceRecord
		if err == nil {
			err = json.Unmarshal(kv.Value, &rec)
		}
		if err != nil {
			s.log.Warn("bad slice record", "key", string(kv.Key), "err", err)
			continue
		}
		t.Slices[sl] = Slice{ID: sl, Policy: rec.Policy, Replicas: rec.Replicas}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		sl, err := parseSlice(strings.TrimPrefix(string(kv.Key), s.locksPfx))
		var holder string
		if err == nil {
			holder, err = parseHolder(kv.Value)
		}
		if err != nil {
			s.log.Warn("bad lock record", "key", string(kv.Key), "err", err)
			continue
		}
		e := t.Slices[sl]
		e.ID = sl
		e.Holder = holder
		e.Epoch = kv.CreateRevision
		t.Slices[sl] = e
	}
	return t, nil
}

// Watch implements Service.
func (s *EtcdService) Watch(ctx context.Context) <-chan *Table {
	ch := make(chan *Table, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		close(ch)
		return ch
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(ch)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(s.ctx, cancel)
		defer stop()
		s.watchLoop(wctx, ch)
	}()
	return ch
}

// sendLatest puts t in ch (capacity 1), replacing an unreceived older table.
// Only one goroutine sends on ch, so it never blocks.
// sendLatest puts v on ch (capacity 1), replacing an older value not
// taken yet: a watcher only ever wants the newest state.
func sendLatest[T any](ch chan T, t T) {
	select {
	case ch <- t:
		return
	default:
	}
	select {
	case <-ch:
	default:
	}
	ch <- t
}

func (s *EtcdService) relevant(evs []*clientv3.Event) bool {
	for _, ev := range evs {
		k := string(ev.Kv.Key)
		if strings.HasPrefix(k, s.serversPfx) || strings.HasPrefix(k, s.slicesPfx) || strings.HasPrefix(k, s.locksPfx) ||
			strings.HasPrefix(k, deniedKey(s.opts.Prefix, "")) {
			return true
		}
	}
	return false
}

func (s *EtcdService) watchLoop(ctx context.Context, ch chan *Table) {
	const maxBackoff = 5 * time.Second
	backoff := 100 * time.Millisecond
	sleep := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
		return true
	}
	for ctx.Err() == nil {
		t, err := s.Table(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			s.log.Warn("watch: table read failed", "err", err)
			if !sleep() {
				return
			}
			continue
		}
		sendLatest(ch, t)
		backoff = 100 * time.Millisecond

		// Watch from just after the snapshot, so no change is missed.
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		err = s.follow(ctx, s.watchTable(wctx, t.Revision+1), ch)
		wcancel()
		if ctx.Err() != nil {
			return
		}
		s.log.Debug("watch restarting", "err", err)
		if !sleep() {
			return
		}
	}
}

// watchTable watches the keys the table is made of from rev on, one watch
// per prefix on one stream, merged into one channel that closes when ctx
// ends or any watch ends. Not the whole prefix: coordinates and logins
// change all the time, and every watcher would receive each change (at 250
// hosts publishing every 30 s, some 2 000 events a second).
func (s *EtcdService) watchTable(ctx context.Context, rev int64) clientv3.WatchChan {
	pfxs := []string{s.serversPfx, s.slicesPfx, s.locksPfx, deniedKey(s.opts.Prefix, "")}
	out := make(chan clientv3.WatchResponse)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, pfx := range pfxs {
		wch := s.cli.Watch(ctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(rev))
		wg.Go(func() {
			defer cancel() // one ends: end them all, and so the merge
			for wr := range wch {
				select {
				case out <- wr:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() {
		wg.Wait()
		cancel()
		close(out)
	}()
	return out
}

// follow re-reads and delivers the table after relevant watch events until
// the watch fails or ctx ends.
func (s *EtcdService) follow(ctx context.Context, wch clientv3.WatchChan, ch chan *Table) error {
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok = <-wch:
		}
		if !ok {
			return errors.New("watch channel closed")
		}
		if err := wr.Err(); err != nil {
			return err
		}
		changed := s.relevant(wr.Events)
		// Coalesce a burst: drain whatever else is already pending.
	drain:
		for {
			select {
			case more, ok := <-wch:
				if !ok {
					return errors.New("watch channel closed")
				}
				if err := more.Err(); err != nil {
					return err
				}
				changed = changed || s.relevant(more.Events)
			default:
				break drain
			}
		}
		if !changed {
			continue
		}
		t, err := s.Table(ctx)
		if err != nil {
			return err
		}
		sendLatest(ch, t)
	}
}

// ---- locks ----

const maxTxnAttempts = 5

// Acquire implements Service.
func (s *EtcdService) Acquire(ctx context.Context, sl oid.Slice, holder string, p Policy, replicas []string) (Lock, error) {
	if holder == "" {
		return Lock{}, errors.New("configsvc: acquire: empty holder")
	}
	if s.isClosed() {
		return Lock{}, ErrClosed
	}
	rec, err := json.Marshal(sliceRecord{Policy: p, Replicas: replicas})
	if err != nil {
		return Lock{}, err
	}
	lk, sk, lv := s.lockKey(sl), s.sliceKey(sl), lockValue(holder)
	for range maxTxnAttempts {
		l, retry, err := s.tryAcquire(ctx, sl, holder, lk, sk, lv, string(rec))
		if !retry {
			if err == nil {
				s.log.Debug("lock acquired", "slice", fmt.Sprintf("%x", uint32(sl)), "holder", holder, "epoch", l.Epoch)
			}
			return l, err
		}
	}
	return Lock{}, fmt.Errorf("configsvc: acquire slice %x: lock kept changing", uint32(sl))
}

func (s *EtcdService) tryAcquire(ctx context.Context, sl oid.Slice, holder, lk, sk, lv, rec string) (_ Lock, retry bool, _ error) {
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	lease, since, err := s.session(cctx, holder)
	if err != nil {
		return Lock{}, false, err
	}
	dk := deniedKey(s.opts.Prefix, holder)
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(lk), "=", 0), clientv3.Compare(clientv3.CreateRevision(dk), "=", 0)).
		Then(clientv3.OpPut(lk, lv, clientv3.WithLease(lease)), clientv3.OpPut(sk, rec)).
		Else(clientv3.OpGet(lk), clientv3.OpGet(dk, clientv3.WithCountOnly())).
		Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.dropSession(holder, lease) // expired: a new session next time
		return Lock{}, true, nil
	}
	if err != nil {
		return Lock{}, false, fmt.Errorf("configsvc: acquire: %w", err)
	}
	if resp.Succeeded {
		return Lock{Slice: sl, Holder: holder, Epoch: resp.Header.Revision, Since: since}, false, nil
	}
	if resp.Responses[1].GetResponseRange().Count > 0 {
		return Lock{}, false, fmt.Errorf("configsvc: acquire slice %x for %q: %w", uint32(sl), holder, ErrDenied)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Lock{}, true, nil // expired in between; try again
	}
	cur, err := parseHolder(kvs[0].Value)
	if err != nil {
		return Lock{}, false, fmt.Errorf("configsvc: acquire: bad lock record: %w", err)
	}
	if cur != holder {
		return Lock{}, false, fmt.Errorf("%w (slice %x held by %q)", ErrLocked, uint32(sl), cur)
	}
	// Our own live lock: keep its epoch, update the record, renew the lease.
	epoch := kvs[0].CreateRevision
	up, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(lk), "=", epoch)).
		Then(clientv3.OpPut(sk, rec)).
		Commit()
	if err != nil {
		return Lock{}, false, fmt.Errorf("configsvc: acquire: %w", err)
	}
	if !up.Succeeded {
		return Lock{}, true, nil
	}
	renewed := time.Now()
	ka, err := s.cli.KeepAliveOnce(cctx, clientv3.LeaseID(kvs[0].Lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && ka.TTL <= 0) {
		return Lock{}, true, nil
	}
	if err != nil {
		return Lock{}, false, fmt.Errorf("configsvc: acquire: renew: %w", err)
	}
	s.sessionRenewed(clientv3.LeaseID(kvs[0].Lease), renewed)
	return Lock{Slice: sl, Holder: holder, Epoch: epoch, Since: renewed}, false, nil
}

// lockSession is a holder's lease and when it last started running (the
// moment its grant or latest keep-alive was sent).
type lockSession struct {
	id    clientv3.LeaseID
	since time.Time
}

// session returns holder's session lease, granting one if it has none, and
// since when it runs.
func (s *EtcdService) session(ctx context.Context, holder string) (clientv3.LeaseID, time.Time, error) {
	s.mu.Lock()
	cur, ok := s.sessions[holder]
	s.mu.Unlock()
	if ok {
		return cur.id, cur.since, nil
	}
	granted := time.Now()
	g, err := s.cli.Grant(ctx, s.lockTTL)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("configsvc: acquire: grant lease: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions == nil {
		s.sessions = map[string]lockSession{}
	}
	if cur, ok := s.sessions[holder]; ok { // a concurrent Acquire won
		go s.revoke(g.ID)
		return cur.id, cur.since, nil
	}
	s.sessions[holder] = lockSession{id: g.ID, since: granted}
	return g.ID, granted, nil
}

// sessionRenewed records a keep-alive of lease id sent at t.
func (s *EtcdService) sessionRenewed(id clientv3.LeaseID, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, ses := range s.sessions {
		if ses.id == id && t.After(ses.since) {
			ses.since = t
			s.sessions[h] = ses
		}
	}
}

// dropSession forgets holder's session lease if it is still id.
func (s *EtcdService) dropSession(holder string, id clientv3.LeaseID) {
	s.mu.Lock()
	if s.sessions[holder].id == id {
		delete(s.sessions, holder)
	}
	s.mu.Unlock()
}

// RenewAll implements Service: one keep-alive per session lease and one
// read of the lock keys, however many locks.
func (s *EtcdService) RenewAll(ctx context.Context, locks []Lock) (lost []Lock, err error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	if len(locks) == 0 {
		return nil, nil
	}
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.locksPfx, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("configsvc: renew: %w", err)
	}
	byKey := make(map[string]*mvccpb.KeyValue, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		byKey[string(kv.Key)] = kv
	}
	leases := map[clientv3.LeaseID][]Lock{}
	for _, l := range locks {
		kv := byKey[s.lockKey(l.Slice)]
		if kv == nil || !s.checkLock([]*mvccpb.KeyValue{kv}, l) {
			lost = append(lost, l)
			continue
		}
		leases[clientv3.LeaseID(kv.Lease)] = append(leases[clientv3.LeaseID(kv.Lease)], l)
	}
	for id, ls := range leases {
		sent := time.Now()
		ka, err := s.cli.KeepAliveOnce(cctx, id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && ka.TTL <= 0) {
			lost = append(lost, ls...)
			s.dropSession(ls[0].Holder, id)
			continue
		}
		if err != nil {
			return lost, fmt.Errorf("configsvc: renew: %w", err)
		}
		s.sessionRenewed(id, sent)
	}
	return lost, nil
}

// checkLock reports whether the lock key's current value (kvs from a read
// of it) is still lock l.
func (s *EtcdService) checkLock(kvs []*mvccpb.KeyValue, l Lock) bool {
	if len(kvs) == 0 || kvs[0].CreateRevision != l.Epoch {
		return false
	}
	h, err := parseHolder(kvs[0].Value)
	return err == nil && h == l.Holder
}

// Renew implements Service.
func (s *EtcdService) Renew(ctx context.Context, l Lock) error {
	if s.isClosed() {
		return ErrClosed
	}
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.Get(cctx, s.lockKey(l.Slice))
	if err != nil {
		return fmt.Errorf("configsvc: renew: %w", err)
	}
	if !s.checkLock(resp.Kvs, l) {
		return ErrLockLost
	}
	sent := time.Now()
	ka, err := s.cli.KeepAliveOnce(cctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && ka.TTL <= 0) {
		return ErrLockLost
	}
	if err != nil {
		return fmt.Errorf("configsvc: renew: %w", err)
	}
	s.sessionRenewed(clientv3.LeaseID(resp.Kvs[0].Lease), sent)
	return nil
}

// UpdateReplicas implements Service.
func (s *EtcdService) UpdateReplicas(ctx context.Context, l Lock, replicas []string) error {
	if s.isClosed() {
		return ErrClosed
	}
	lk, sk := s.lockKey(l.Slice), s.sliceKey(l.Slice)
	for range maxTxnAttempts {
		done, err := s.tryUpdateReplicas(ctx, l, lk, sk, replicas)
		if done {
			return err
		}
	}
	return fmt.Errorf("configsvc: update replicas of slice %x: record kept changing", uint32(l.Slice))
}

func (s *EtcdService) tryUpdateReplicas(ctx context.Context, l Lock, lk, sk string, replicas []string) (done bool, _ error) {
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	rd, err := s.cli.Txn(cctx).Then(clientv3.OpGet(lk), clientv3.OpGet(sk)).Commit()
	if err != nil {
		return true, fmt.Errorf("configsvc: update replicas: %w", err)
	}
	if !s.checkLock(rd.Responses[0].GetResponseRange().Kvs, l) {
		return true, ErrLockLost
	}
	skv := rd.Responses[1].GetResponseRange().Kvs
	if len(skv) == 0 {
		return true, fmt.Errorf("%w: slice %x", ErrNotFound, uint32(l.Slice))
	}
	var rec sliceRecord
	if err := json.Unmarshal(skv[0].Value, &rec); err != nil {
		return true, fmt.Errorf("configsvc: update replicas: bad slice record: %w", err)
	}
	rec.Replicas = replicas
	val, err := json.Marshal(rec)
	if err != nil {
		return true, err
	}
	resp, err := s.cli.Txn(cctx).
		If(
			clientv3.Compare(clientv3.CreateRevision(lk), "=", l.Epoch),
			clientv3.Compare(clientv3.Value(lk), "=", lockValue(l.Holder)),
			clientv3.Compare(clientv3.ModRevision(sk), "=", skv[0].ModRevision),
		).
		Then(clientv3.OpPut(sk, string(val))).
		Commit()
	if err != nil {
		return true, fmt.Errorf("configsvc: update replicas: %w", err)
	}
	return resp.Succeeded, nil // on failure, re-read: lock lost or record changed
}

// Release implements Service.
func (s *EtcdService) Release(ctx context.Context, l Lock) error {
	if s.isClosed() {
		return ErrClosed
	}
	lk := s.lockKey(l.Slice)
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(cctx).
		If(
			clientv3.Compare(clientv3.CreateRevision(lk), "=", l.Epoch),
			clientv3.Compare(clientv3.Value(lk), "=", lockValue(l.Holder)),
		).
		Then(clientv3.OpGet(lk), clientv3.OpDelete(lk)).
		Commit()
	if err != nil {
		return fmt.Errorf("configsvc: release: %w", err)
	}
	if !resp.Succeeded {
		return ErrLockLost
	}
	// The session lease stays: the holder's other locks are attached to it.
	return nil
}

// ---- deployment ----

// DeploymentCreated reports whether the deployment ID exists, which the
// first host to reach a new configuration service creates (Deployment).
func (s *EtcdService) DeploymentCreated(ctx context.Context) (bool, error) {
	if s.isClosed() {
		return false, ErrClosed
	}
	ctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	got, err := s.cli.Get(ctx, s.deploymentKey, clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("configsvc: deployment: %w", err)
	}
	return got.Count > 0, nil
}

// Deployment implements Service.
func (s *EtcdService) Deployment(ctx context.Context) (string, error) {
	if s.isClosed() {
		return "", ErrClosed
	}
	// A read first: most callers find the ID, and a client host (which
	// may not write the key once etcd auth is on) must not need the
	// transaction below, whose every branch etcd checks.
	gctx, gcancel := s.rpcCtx(ctx)
	got, err := s.cli.Get(gctx, s.deploymentKey)
	gcancel()
	if err != nil {
		return "", fmt.Errorf("configsvc: deployment: %w", err)
	}
	if len(got.Kvs) > 0 {
		return string(got.Kvs[0].Value), nil
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b[:])
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(s.deploymentKey), "=", 0)).
		Then(clientv3.OpPut(s.deploymentKey, id)).
		Else(clientv3.OpGet(s.deploymentKey)).
		Commit()
	if err != nil {
		return "", fmt.Errorf("configsvc: deployment: %w", err)
	}
	if resp.Succeeded {
		s.log.Info("created deployment", "deployment", id)
		return id, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return "", fmt.Errorf("configsvc: deployment: key vanished")
	}
	return string(kvs[0].Value), nil
}

// ---- close ----

// Close implements Service. It is idempotent.
func (s *EtcdService) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	// Session leases are not revoked: locks not released explicitly stay
	// until L runs out, so a quick restart keeps its slices and epochs.
	s.cancel() // stops registrations (which revoke their leases) and watches
	s.wg.Wait()
	s.withdrawCoords()
	if s.ownsClient {
		return s.cli.Close()
	}
	return nil
}

// Abandon stops the Service as a crash of its process would: registrations
// and watches end, but no lease is revoked, so the server's membership and
// its slice locks expire on their own after their TTLs (fault tests). The
// etcd client is closed if the Service created it.
func (s *EtcdService) Abandon() error {
	s.abandoned.Store(true)
	return s.Close()
}
