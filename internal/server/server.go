// Package server is a WheelFS storage server: it holds slice locks from the
// configuration service, stores the objects of the slices it is primary for
// in a crash-safe local store, enforces UNIX permissions on the calling user,
// and answers clients over gRPC.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// DefaultRepLevel is the replication level of objects without a .RepLevel cue.
const DefaultRepLevel = 3

// Config configures a storage server.
type Config struct {
	ID     string // stable server ID (its certificate name)
	Site   string
	Addr   string // address clients dial
	Logger *slog.Logger
	// RootMode is the mode of the root directory of a new deployment.
	RootMode uint32
	// RootUID and RootGID own the root directory of a new deployment.
	RootUID, RootGID uint32
	// Peers returns a client for another server's Peer service.
	Peers func(ctx context.Context, id string) (wire.PeerClient, error)
	// PeerTimeout bounds one call to a peer (default 10 s).
	PeerTimeout time.Duration
	// ProbeTimeout bounds asking a backup for its position while taking
	// a slice over (default 3 s): an unresponsive one is left behind.
	ProbeTimeout time.Duration
	// InstallTimeout bounds one snapshot chunk sent to a backup, blocks
	// included (default 5 minutes).
	InstallTimeout time.Duration
	// MaintainPeriod is how often replicas check on each other and the
	// slice table (default 1 s).
	MaintainPeriod time.Duration
	// LeaseTTL is the length of meta-data leases granted to clients
	// (default DefaultLeaseTTL; negative: no leases).
	LeaseTTL time.Duration
	// DeadAfter is how long a backup may fail before it is replaced
	// (default 5 × MaintainPeriod). A backup whose membership lease
	// expired is replaced at once.
	DeadAfter time.Duration
	// AfterRenameLink, for fault tests, runs in a rename between servers
	// after the destination added the name and before the source removes
	// it; an error stops the rename there.
	AfterRenameLink func(ctx context.Context) error
}

// Server implements wire.StorageServer.
type Server struct {
	wire.UnimplementedStorageServer

	cfg   Config
	log   *slog.Logger
	store *store.Store
	conf  configsvc.Service

	mu       sync.Mutex
	locks    map[oid.Slice]configsvc.Lock
	bySlice  map[configsvc.Policy]oid.Slice // where new objects of a policy go
	policies map[oid.Slice]configsvc.Policy // the policy of each slice held
	opens    map[oid.ID]int                 // open handles, to keep unlinked files alive
	orphans  map[oid.ID]bool                // unlinked while open: delete on last release
	dying    map[oid.ID]int                 // deletions decided but not yet committed
	cancel   context.CancelFunc
	done     chan struct{}
	lockTTL  time.Duration
	renewing sync.WaitGroup
	paused   atomic.Bool // Freeze: a stopped process (fault tests)
	// reconciling: a round of pushing eventual changes is running.
	reconciling atomic.Bool

	bg    context.Context // background work; ends with Close or Halt
	table atomic.Pointer[configsvc.Table]
	// sizeCache is deploymentSize of the current table.
	sizeCache atomic.Pointer[sizeOf]
	tableC    chan struct{} // a new table arrived (maintenance wakes up)
	repls     map[oid.Slice]*sliceRepl
	valid     map[oid.Slice]time.Time // lock believed held until
	// lastRenew is when the last successful renewal of the session began.
	lastRenew time.Time
	moving    map[oid.Slice]bool // being handed to another server
	// freeSince is when maintenance first saw an unlocked slice.
	freeSince map[oid.Slice]time.Time
	// suspects are servers that recently failed to answer (placement
	// avoids them even while their membership lease lasts).
	suspects map[string]time.Time
	// handed records when this server handed a slice to its home site.
	handed map[oid.Slice]time.Time
	// tending marks slices whose maintenance is running; maintSem bounds
	// how many run at once.
	tending  map[oid.Slice]bool
	maintSem chan struct{}
	tendWG   sync.WaitGroup

	leases *leases
	names  nameLocks
}

// New returns a server over st that coordinates through conf.
func New(cfg Config, st *store.Store, conf configsvc.Service, lockTTL time.Duration) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RootMode == 0 {
		cfg.RootMode = 0o1777
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = 10 * time.Second
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 3 * time.Second
	}
	if cfg.InstallTimeout <= 0 {
		cfg.InstallTimeout = 5 * time.Minute
	}
	if cfg.MaintainPeriod <= 0 {
		cfg.MaintainPeriod = time.Second
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = 5 * cfg.MaintainPeriod
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "server", "server", cfg.ID),
		store:     st,
		conf:      conf,
		locks:     map[oid.Slice]configsvc.Lock{},
		bySlice:   map[configsvc.Policy]oid.Slice{},
		policies:  map[oid.Slice]configsvc.Policy{},
		opens:     map[oid.ID]int{},
		orphans:   map[oid.ID]bool{},
		dying:     map[oid.ID]int{},
		lockTTL:   lockTTL,
		done:      make(chan struct{}),
		bg:        context.Background(),
		tableC:    make(chan struct{}, 1),
		repls:     map[oid.Slice]*sliceRepl{},
		valid:     map[oid.Slice]time.Time{},
		moving:    map[oid.Slice]bool{},
		freeSince: map[oid.Slice]time.Time{},
		suspects:  map[string]time.Time{},
		handed:    map[oid.Slice]time.Time{},
		tending:   map[oid.Slice]bool{},
		maintSem:  make(chan struct{}, 8),
	}
	s.leases = newLeases(cfg.LeaseTTL, s.lockValidity)
	return s
}

// lockValidity is until when this server may serve slice sl as primary
// (zero when it may not): no lease it grants lasts longer, so a primary
// that takes over never meets a lease of its predecessor.
func (s *Server) lockValidity(sl oid.Slice) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.locks[sl]; !ok || s.moving[sl] {
		return time.Time{}
	}
	return s.valid[sl]
}

// Start registers the server, takes back the slices it held before a
// restart, creates the root directory of a new deployment, and starts the
// lock renewal loop. It returns when the server can serve.
func (s *Server) Start(ctx context.Context) (err error) {
	// The membership lease lives until Close, not until Start's context
	// ends: Start's context only bounds starting.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	s.bg = rctx
	defer func() {
		if err != nil {
			cancel()
		}
	}()
	if err := s.conf.Register(rctx, configsvc.ServerInfo{ID: s.cfg.ID, Site: s.cfg.Site, Addr: s.cfg.Addr}); err != nil {
		return fmt.Errorf("server: register: %w", err)
	}
	table, err := s.conf.Table(ctx)
	if err != nil {
		return fmt.Errorf("server: read slice table: %w", err)
	}
	s.table.Store(table)
	// Slices whose replica list names us as primary are ours again (after
	// collecting anything newer from their backups).
	for _, sl := range table.Slices {
		if len(sl.Replicas) > 0 && sl.Replicas[0] == s.cfg.ID {
			if err := s.takeOver(ctx, sl); err != nil && !errors.Is(err, configsvc.ErrLocked) {
				s.log.Warn("could not take back a slice; maintenance will retry", "slice", sl.ID, "err", err)
			}
		}
	}
	if _, ok := table.Slices[oid.RootSlice]; !ok {
		if err := s.createRoot(ctx); err != nil {
			return err
		}
	}
	// Every server holds at least one slice: membership is the union of
	// the replica lists (paper §5.2.1).
	if len(s.Slices()) == 0 {
		if _, err := s.sliceFor(ctx, s.defaultPolicy()); err != nil {
			return err
		}
	}
	if err := s.cleanOrphans(ctx); err != nil {
		return err
	}
	s.renewing.Add(3)
	go s.renewLoop(rctx)
	go s.watchTable(rctx)
	go s.maintainLoop(rctx)
	s.log.Info("server ready", "site", s.cfg.Site, "addr", s.cfg.Addr, "slices", len(s.locks))
	return nil
}

// stop ends background work and replication and forgets the locks held,
// which it returns.
func (s *Server) stop() []configsvc.Lock {
	if s.cancel != nil {
		s.cancel()
		s.renewing.Wait()
	}
	s.mu.Lock()
	locks := make([]configsvc.Lock, 0, len(s.locks))
	for _, l := range s.locks {
		locks = append(locks, l)
	}
	s.locks = map[oid.Slice]configsvc.Lock{}
	repls := s.repls
	s.repls = map[oid.Slice]*sliceRepl{}
	s.mu.Unlock()
	for _, r := range repls {
		r.close()
	}
	return locks
}

// Close stops renewing locks and releases them so another server can take
// over without waiting for expiry.
func (s *Server) Close() error {
	locks := s.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, l := range locks {
		if err := s.conf.Release(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Server) defaultPolicy() configsvc.Policy {
	return configsvc.Policy{Site: s.cfg.Site, RepLevel: DefaultRepLevel}
}

// acquire takes the lock of a new slice id with policy p and replicas
// chosen by placement.
func (s *Server) acquire(ctx context.Context, id oid.Slice, p configsvc.Policy) error {
	replicas := s.chooseReplicas(p, []string{s.cfg.ID})
	start := time.Now()
	l, err := s.conf.Acquire(ctx, id, s.cfg.ID, p, replicas)
	if err != nil {
		return fmt.Errorf("server: acquire slice %d: %w", id, err)
	}
	var at pos
	if err := s.store.Update(ctx, func(tx *store.Tx) error {
		at = readPos(tx, id)
		at.epoch = l.Epoch
		return writePos(tx, id, at)
	}); err != nil {
		return err
	}
	s.serve(l, p, replicas, at.seq, start)
	s.log.Info("new slice", "slice", id, "policy", p, "replicas", replicas, "epoch", l.Epoch)
	return nil
}

// serve starts acting as primary of a slice whose lock l this server
// holds, with replicas[1:] as backups.
func (s *Server) serve(l configsvc.Lock, p configsvc.Policy, replicas []string, seq uint64, locked time.Time) {
	r := newSliceRepl(s, l.Slice, l.Epoch, p.RepLevel, seq)
	s.mu.Lock()
	if old := s.repls[l.Slice]; old != nil {
		defer old.close()
	}
	s.locks[l.Slice] = l
	// The lock shares the session lease, which may have been renewed
	// last before this acquisition: count from the earlier of the two.
	from := locked
	if !s.lastRenew.IsZero() && s.lastRenew.Before(from) {
		from = s.lastRenew
	}
	s.valid[l.Slice] = from.Add(s.lockTTL)
	s.policies[l.Slice] = p
	s.repls[l.Slice] = r
	delete(s.moving, l.Slice)
	if _, ok := s.bySlice[p]; !ok && !p.KeepTogether {
		s.bySlice[p] = l.Slice
	}
	s.mu.Unlock()
	r.setFollowers(replicas)
}

// lostSlice stops acting as primary of slice sl (if still at epoch).
func (s *Server) lostSlice(sl oid.Slice, epoch int64, why string) {
	s.mu.Lock()
	l, ok := s.locks[sl]
	if !ok || l.Epoch != epoch {
		s.mu.Unlock()
		return
	}
	delete(s.locks, sl)
	delete(s.policies, sl)
	delete(s.valid, sl)
	for p, id := range s.bySlice {
		if id == sl {
			delete(s.bySlice, p)
		}
	}
	r := s.repls[sl]
	delete(s.repls, sl)
	s.mu.Unlock()
	s.log.Warn("no longer primary of slice", "slice", sl, "epoch", epoch, "why", why)
	if r != nil {
		go r.close() // may be called from one of r's own goroutines
	}
}

func (s *Server) createRoot(ctx context.Context) error {
	if err := s.acquire(ctx, oid.RootSlice, s.defaultPolicy()); errors.Is(err, configsvc.ErrLocked) {
		return nil // another server of a new deployment was first
	} else if err != nil {
		return err
	}
	now := time.Now().UnixNano()
	return s.update(ctx, 1, func(tx *store.Tx) error {
		if _, err := tx.Meta(oid.Root); err == nil {
			return nil
		}
		if err := tx.SetCounterFloor(oid.RootSlice, oid.Root.Counter()+1); err != nil {
			return err
		}
		return tx.PutMeta(&wire.Meta{
			Id: uint64(oid.Root), Type: wire.Type_TYPE_DIR, Mode: s.cfg.RootMode,
			Uid: s.cfg.RootUID, Gid: s.cfg.RootGID, Nlink: 2, Version: 1,
			AtimeNs: now, MtimeNs: now, CtimeNs: now, BtimeNs: now,
			Parent: uint64(oid.Root), BlockSize: blockSize,
		})
	})
}

// renewLoop renews every held lock at a third of its length. A lock that
// cannot be renewed is dropped: this server stops acting as its primary.
func (s *Server) renewLoop(ctx context.Context) {
	defer s.renewing.Done()
	t := time.NewTicker(max(s.lockTTL/3, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.paused.Load() {
			continue
		}
		s.mu.Lock()
		locks := make([]configsvc.Lock, 0, len(s.locks))
		for _, l := range s.locks {
			locks = append(locks, l)
		}
		s.mu.Unlock()
		s.renewAll(ctx, locks)
	}
}

// renewAll extends every held lock (one keep-alive of the server's session
// lease) and records until when each is believed held.
func (s *Server) renewAll(ctx context.Context, locks []configsvc.Lock) {
	if len(locks) == 0 {
		return
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, max(s.lockTTL/3, time.Second))
	lost, err := s.conf.RenewAll(rctx, locks)
	cancel()
	gone := map[oid.Slice]bool{}
	for _, l := range lost {
		gone[l.Slice] = true
		s.lostSlice(l.Slice, l.Epoch, "lock lost")
	}
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("slice lock renewal failed; will retry", "locks", len(locks), "err", err)
		}
		return
	}
	s.mu.Lock()
	s.lastRenew = start
	for _, l := range locks {
		if cur, ok := s.locks[l.Slice]; ok && cur.Epoch == l.Epoch && !gone[l.Slice] {
			s.valid[l.Slice] = start.Add(s.lockTTL)
		}
	}
	s.mu.Unlock()
}

// primary checks that this server is primary for id's slice: it holds
// the lock, the lock's lease has not run out by the local clock (a paused
// primary must not answer after its lock may have passed to another
// server), and the slice is not being handed over.
func (s *Server) primary(id oid.ID) error {
	sl := id.Slice()
	s.mu.Lock()
	_, ok := s.locks[sl]
	ok = ok && time.Now().Before(s.valid[sl]) && !s.moving[sl]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("object %v: %w", id, fserr.ErrNotPrimary)
	}
	return nil
}

// sliceFor returns a slice this server is primary for whose policy is p,
// acquiring a new one if needed (paper §5.2.2).
func (s *Server) sliceFor(ctx context.Context, p configsvc.Policy) (oid.Slice, error) {
	s.mu.Lock()
	id, ok := s.bySlice[p]
	if !ok { // a slice of that policy taken over from another server
		for sl, q := range s.policies {
			if q == p && !s.moving[sl] {
				id, ok = sl, true
				s.bySlice[p] = sl
				break
			}
		}
	}
	s.mu.Unlock()
	if ok {
		return id, nil
	}
	for attempt := 0; attempt < 8; attempt++ {
		id := oid.Slice(rand.Uint32N(uint32(oid.MaxSlice-oid.RootSlice))) + oid.RootSlice + 1
		err := s.acquire(ctx, id, p)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, configsvc.ErrLocked) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("server: no free slice for policy %+v: %w", p, fserr.ErrNoSpace)
}

// Slices returns the slices this server is primary for.
func (s *Server) Slices() []oid.Slice {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]oid.Slice, 0, len(s.locks))
	for id := range s.locks {
		out = append(out, id)
	}
	return out
}
