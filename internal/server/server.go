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
	paused   pauseGate
}

// New returns a server over st that coordinates through conf.
func New(cfg Config, st *store.Store, conf configsvc.Service, lockTTL time.Duration) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RootMode == 0 {
		cfg.RootMode = 0o1777
	}
	return &Server{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "server", "server", cfg.ID),
		store:    st,
		conf:     conf,
		locks:    map[oid.Slice]configsvc.Lock{},
		bySlice:  map[configsvc.Policy]oid.Slice{},
		policies: map[oid.Slice]configsvc.Policy{},
		opens:    map[oid.ID]int{},
		orphans:  map[oid.ID]bool{},
		dying:    map[oid.ID]int{},
		lockTTL:  lockTTL,
		done:     make(chan struct{}),
	}
}

// Start registers the server, takes back the slices it held before a
// restart, creates the root directory of a new deployment, and starts the
// lock renewal loop. It returns when the server can serve.
func (s *Server) Start(ctx context.Context) (err error) {
	// The membership lease lives until Close, not until Start's context
	// ends: Start's context only bounds starting.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
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
	// Slices whose replica list names us as primary are ours again.
	for id, sl := range table.Slices {
		if len(sl.Replicas) > 0 && sl.Replicas[0] == s.cfg.ID {
			if err := s.acquire(ctx, id, sl.Policy); err != nil {
				return err
			}
		}
	}
	if _, ok := table.Slices[oid.RootSlice]; !ok {
		if err := s.createRoot(ctx); err != nil {
			return err
		}
	}
	if err := s.cleanOrphans(ctx); err != nil {
		return err
	}
	s.renewing.Add(1)
	go s.renewLoop(rctx)
	s.log.Info("server ready", "site", s.cfg.Site, "addr", s.cfg.Addr, "slices", len(s.locks))
	return nil
}

// Close stops renewing locks and releases them so another server can take
// over without waiting for expiry.
func (s *Server) Close() error {
	if s.cancel != nil {
		s.cancel()
		s.renewing.Wait()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.mu.Lock()
	locks := make([]configsvc.Lock, 0, len(s.locks))
	for _, l := range s.locks {
		locks = append(locks, l)
	}
	s.locks = map[oid.Slice]configsvc.Lock{}
	s.mu.Unlock()
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

// acquire takes the lock of slice id with policy p (one replica: this
// server; more replicas arrive with multi-server placement).
func (s *Server) acquire(ctx context.Context, id oid.Slice, p configsvc.Policy) error {
	l, err := s.conf.Acquire(ctx, id, s.cfg.ID, p, []string{s.cfg.ID})
	if err != nil {
		return fmt.Errorf("server: acquire slice %d: %w", id, err)
	}
	s.mu.Lock()
	s.locks[id] = l
	s.policies[id] = p
	if _, ok := s.bySlice[p]; !ok {
		s.bySlice[p] = id
	}
	s.mu.Unlock()
	return nil
}

func (s *Server) createRoot(ctx context.Context) error {
	if err := s.acquire(ctx, oid.RootSlice, s.defaultPolicy()); err != nil {
		return err
	}
	now := time.Now().UnixNano()
	return s.store.Update(ctx, func(tx *store.Tx) error {
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
		if s.paused.on.Load() {
			continue
		}
		s.mu.Lock()
		locks := make([]configsvc.Lock, 0, len(s.locks))
		for _, l := range s.locks {
			locks = append(locks, l)
		}
		s.mu.Unlock()
		for _, l := range locks {
			rctx, cancel := context.WithTimeout(ctx, max(s.lockTTL/3, time.Second))
			err := s.conf.Renew(rctx, l)
			cancel()
			if err == nil || ctx.Err() != nil {
				continue
			}
			if errors.Is(err, configsvc.ErrLockLost) {
				s.log.Error("slice lock lost; no longer primary", "slice", l.Slice, "err", err)
				s.mu.Lock()
				delete(s.locks, l.Slice)
				delete(s.policies, l.Slice)
				for p, id := range s.bySlice {
					if id == l.Slice {
						delete(s.bySlice, p)
					}
				}
				s.mu.Unlock()
				continue
			}
			s.log.Warn("slice lock renewal failed; will retry", "slice", l.Slice, "err", err)
		}
	}
}

// primary checks that this server is primary for id's slice.
func (s *Server) primary(id oid.ID) error {
	s.mu.Lock()
	_, ok := s.locks[id.Slice()]
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
