package server

import (
	"context"
	"errors"
	"fmt"
	"github.com/wheelfs/wheelfs/internal/auth"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wheelfs/wheelfs/internal/blockgrant"
	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/holders"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// DefaultRepLevel is the replication level of objects without a .RepLevel cue.
const DefaultRepLevel = 3

// ConfigService is what a server needs from the configuration service:
// configsvc.Service, or a configsvc.Memory client in tests.
type ConfigService interface {
	membership
	sliceLocks
}

// membership registers this server and follows the slice table.
type membership interface {
	Register(ctx context.Context, s configsvc.ServerInfo) error
	UpdateServer(ctx context.Context, s configsvc.ServerInfo) error
	Table(ctx context.Context) (*configsvc.Table, error)
	Watch(ctx context.Context) <-chan *configsvc.Table
}

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
	// (default DefaultLeaseTTL; negative: no leases). It must be shorter
	// than the clients' call bound (deploy checks it): a write may have to
	// wait a lease out.
	LeaseTTL time.Duration
	// DeadAfter is how long a backup may fail before it is replaced
	// (default 5 × MaintainPeriod). A backup whose membership lease
	// expired is replaced at once.
	DeadAfter time.Duration
	// StallAfter is how long a replication call may go unanswered (beyond
	// the time its data takes over the link) before the primary pings the
	// backup; one that does not answer the ping either is replaced at
	// once, so writes waiting for it stall seconds, not DeadAfter plus a
	// peer timeout (default 500 ms; negative: never).
	StallAfter time.Duration
	// AfterRenameLink, for fault tests, runs in a rename between servers
	// after the destination added the name and before the source removes
	// it; an error stops the rename there.
	AfterRenameLink func(ctx context.Context) error
	// Holders bounds the soft state of which clients cache which blocks
	// (.Hotspot); zero values take holders' defaults.
	Holders holders.Options
	// Origin paces the blocks this server hands .Hotspot readers at other
	// sites (zero values take holders' defaults).
	Origin holders.OriginOptions
	// Users, when set, admits a client's request only for a uid with a
	// valid session at that client (issue 13); nil trusts the uids every
	// client sends (NFS-style, --trust-client-uids). Servers and this
	// process are trusted either way (see clientNode).
	Users *auth.Guard
	// Grants signs the grants .Hotspot readers show holders and replicas
	// (nil: no grants are issued); GrantCheck verifies them when a reader
	// asks this server as a replica that is not the primary.
	Grants     *blockgrant.Signer
	GrantCheck *blockgrant.Verifier
	// RateLimit bounds each client node's request rate (ratelimit.go).
	RateLimit RateLimit
	// Certs, when set, renews the certificates of nodes that ask
	// (RenewCertificate): the host holds the CA key. Nil: refused.
	Certs CertRenewer
	// AfterApply, for fault tests, runs after a Storage request's handler
	// succeeded; an error replaces the answer by codes.Unavailable, as a
	// connection that broke after the change was applied.
	AfterApply func(method string, req any) error
	// AfterCommit, for fault tests, runs in an update of a Storage
	// request (method, its full name) once the change committed here,
	// before the wait for backups; an error fails the request there, as
	// losing the slice while replicating does.
	AfterCommit func(method string) error
	// DiskReserve is the free space of the data directory's file system
	// below which this server counts as full: placement puts no new data
	// on it (space.go). Zero means min(2% of the file system, 512 MiB);
	// negative, never full.
	DiskReserve int64
	// HolderIdle is how long an open handle of an unlinked file (an
	// orphan's holder) outlives the last sign of its client session at
	// the primary — an attached back channel, a request — and how long a
	// new primary waits for holders to show themselves (default
	// DefaultHolderIdle; at most ownerIdle). A crashed client leaks no
	// orphan beyond it; a client cut off from the primary longer loses
	// its unlinked open files.
	HolderIdle time.Duration
	// RenameGrace is how long a file replaced by a rename over its name
	// stays openable by id after the rename (default DefaultRenameGrace):
	// a reader that resolved the old name and opens it a moment later
	// gets the old file, as on a local file system, not ENOENT.
	RenameGrace time.Duration
	// OnLock, for fault tests, hears of every slice lock this server
	// takes, renews or gives up, with until when it counts the lock held:
	// a takeover before that is a safety violation (lockevent.go).
	OnLock func(LockEvent)
}

// Server implements wire.StorageServer.
type Server struct {
	wire.UnimplementedStorageServer

	cfg   Config
	log   *slog.Logger
	store *store.Store
	conf  ConfigService

	owned    ownership // the slices this server is primary for
	files    openFiles // open handles and orphans
	outcomes outcomeIndex
	maint    maintState
	cancel   context.CancelFunc
	done     chan struct{}
	lockTTL  time.Duration
	renewing sync.WaitGroup
	paused   atomic.Bool // Freeze: a stopped process (fault tests)
	// reconciling: a round of pushing eventual changes is running.
	reconciling atomic.Bool

	bg    context.Context // background work; ends with Close or Halt
	table atomic.Pointer[configsvc.Table]
	// unknownPeers limits fresh table reads for servers not in table yet.
	unknownPeers peerChecks
	// sizeCache is deploymentSize of the current table.
	sizeCache atomic.Pointer[sizeOf]
	sizeCheck sizeCheck     // deploymentSize confirmed at the config service
	tableC    chan struct{} // a new table arrived (maintenance wakes up)
	// maintSem bounds how many slices' maintenance runs at once.
	maintSem chan struct{}
	tendWG   sync.WaitGroup
	// blockBytes counts block bytes sent to clients (ReadBlocks).
	blockBytes atomic.Int64

	leases *leases
	owners *sessionOwners // which node each client session is (sessions.go)
	names  nameLocks
	// holders: which clients cache which blocks of this primary's files.
	holders *holders.Table
	// origin paces the blocks handed to far .Hotspot readers (hotspot.go).
	origin *holders.Origin
	// xfer sizes block-carrying calls to each peer by its link's rate.
	xfer   *transfers
	limits *rateLimits  // client nodes' token buckets (edge.go)
	panics atomic.Int64 // handler panics recovered at the edge
	space  spaceState   // free space, measured and published (space.go)
	// boot names this process: the holder of orphans opened without a
	// handle (orphans.go), which die with it.
	boot uint64
}

// New returns a server over st that coordinates through conf.
func New(cfg Config, st *store.Store, conf ConfigService, lockTTL time.Duration) *Server {
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
	if cfg.StallAfter == 0 {
		cfg.StallAfter = 500 * time.Millisecond
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = 5 * cfg.MaintainPeriod
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.RenameGrace <= 0 {
		cfg.RenameGrace = DefaultRenameGrace
	}
	if cfg.HolderIdle <= 0 {
		cfg.HolderIdle = DefaultHolderIdle
	}
	// A binding forgotten (ownerIdle) must mean a holder gone.
	cfg.HolderIdle = min(cfg.HolderIdle, ownerIdle)
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "server", "server", cfg.ID),
		store:    st,
		conf:     conf,
		owned:    newOwnership(),
		files:    newOpenFiles(),
		maint:    newMaintState(),
		lockTTL:  lockTTL,
		done:     make(chan struct{}),
		bg:       context.Background(),
		tableC:   make(chan struct{}, 1),
		maintSem: make(chan struct{}, 8),
		boot:     rand.Uint64() | 1,
	}
	s.leases = newLeases(cfg.LeaseTTL, s.lockValidity)
	s.owners = newSessionOwners(s.heldSessions)
	s.holders = holders.New(cfg.Holders)
	s.origin = holders.NewOrigin(cfg.Origin)
	s.xfer = newTransfers(cfg.PeerTimeout)
	s.limits = newRateLimits(cfg.RateLimit, s.log)
	return s
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
	if err := s.conf.Register(rctx, s.measureSpace()); err != nil {
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
	if err := s.dropLegacyOrphans(ctx); err != nil {
		return err
	}
	s.renewing.Add(3)
	go s.renewLoop(rctx)
	go s.watchTable(rctx)
	go s.maintainLoop(rctx)
	s.log.Info("server ready", "site", s.cfg.Site, "addr", s.cfg.Addr, "slices", len(s.owned.heldLocks()))
	return nil
}

// stop ends background work and replication and forgets the locks held,
// which it returns.
func (s *Server) stop() []configsvc.Lock {
	if s.cancel != nil {
		s.cancel()
		s.renewing.Wait()
	}
	locks, repls := s.owned.dropAll()
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
		if err := s.release(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
