// Package client is the WheelFS client core: path resolution with cues,
// write-back file buffering, the block cache and every call to storage
// servers. It knows nothing of FUSE; the FUSE adapter and tests drive it
// through this Go API, and errors come back as wrapped fserr sentinels.
package client

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wheelfs/wheelfs/internal/blockcache"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// BlockSize is the size of a file block (DESIGN.md: 64 KiB).
const BlockSize = 64 << 10

// DefaultTimeout bounds every operation that has no .MaxTime cue, so that an
// unreachable server can never hang a mount.
const DefaultTimeout = 30 * time.Second

// DefaultStagedFor is Config.StagedFor's default: well inside the ten
// minutes (store.PendingTTL) a server keeps uploaded blocks for a commit.
const DefaultStagedFor = 2 * time.Minute

// Router finds the servers that keep a slice.
type Router interface {
	// Primary returns the current primary of slice s.
	Primary(ctx context.Context, s oid.Slice) (Conn, error)
	// Replicas returns every server keeping a copy of slice s, the
	// primary first (.EventualConsistency falls back to the others).
	Replicas(ctx context.Context, s oid.Slice) ([]Conn, error)
	// Describe reports the slice's primary and replicas, with their sites.
	Describe(ctx context.Context, s oid.Slice) (SliceInfo, error)
}

// Conn is a connection to one storage server.
type Conn struct {
	ID   string // the server's ID (its certificate name)
	Site string
	// InProcess is set for the server in this very process: its blocks
	// are on this host's disk already.
	InProcess bool
	wire.StorageClient
}

// BlocksInto is what the storage client of a server in this process
// (server.LocalClient) adds: ReadBlocks straight into the caller's buffer,
// the blocks back to back (dst is as long as they are together).
type BlocksInto interface {
	ReadBlocksInto(ctx context.Context, in *wire.ReadBlocksRequest, dst []byte) error
}

// ServerRef names a server and its site.
type ServerRef struct {
	Server string `json:"server"`
	Site   string `json:"site"`
}

// SliceInfo is the placement of one slice.
type SliceInfo struct {
	Primary  ServerRef   `json:"primary"`
	Replicas []ServerRef `json:"replicas"`
	Epoch    int64       `json:"epoch"`
}

// Config configures a client core.
type Config struct {
	Logger *slog.Logger
	// Site is the client's own site (for write-local placement).
	Site string
	// Origin is the server on the client's own host, if any: new objects
	// are placed there by default (write-local, paper §4.3).
	Origin string
	// CacheBytes bounds the in-memory block cache (default 100 MiB, the
	// paper's figure).
	CacheBytes int64
	// CacheDir holds the on-disk block cache, which survives restarts;
	// empty means memory only.
	CacheDir string
	// DiskCacheBytes bounds the on-disk block cache (default 4 GiB).
	DiskCacheBytes int64
	// DirtyBytes is how much written data a file buffers before uploading
	// full blocks ahead of close (they are committed on close/fsync, or
	// after StagedFor).
	DirtyBytes int64
	// StagedFor bounds how long blocks uploaded ahead of close wait for
	// their commit (default DefaultStagedFor): a server keeps a block no
	// commit names for store.PendingTTL only, so a file written for
	// longer is committed on the way, as fsync would.
	StagedFor time.Duration
	// Timeout bounds operations without a .MaxTime cue.
	Timeout time.Duration
	// LoginRequired: this host runs no server, so servers act for its
	// uids only while they have a session, unless they trust client uids:
	// cached meta-data and data are served only to uids with a session or
	// that a server acted for since (FS.mayServe).
	LoginRequired bool
	// NoLeases turns the meta-data cache off: every operation asks the
	// primary (benchmarks compare against it).
	NoLeases bool
	// Node is this host's ID: it names this client as a holder of cached
	// blocks (.Hotspot).
	Node string
	// Coord is this host's network coordinate (nil: none; holders are
	// then not ranked for this client).
	Coord *netcoord.Node
	// ReportEvery is how often blocks cached by .Hotspot reads are
	// reported to their files' primaries (default DefaultReportEvery).
	ReportEvery time.Duration
	// Peers configures serving this client's cache to other clients and
	// fetching from theirs (.Hotspot); see PeerConfig.
	Peers PeerConfig
}

// NewConfig returns a Config with defaults filled in.
func NewConfig() Config {
	return Config{
		Logger:         slog.Default(),
		CacheBytes:     100 << 20,
		DiskCacheBytes: 4 << 30,
		DirtyBytes:     4 << 20,
		StagedFor:      DefaultStagedFor,
		Timeout:        DefaultTimeout,
	}
}

// User is the local user on whose behalf an operation runs.
type User struct {
	Uid, Gid uint32
	Groups   []uint32
	Pid      uint32
	// handle is the open a handle's operations go through: the
	// primary checks what that open was granted instead of the mode.
	handle handleRef
}

// handleRef names one open of a file at the servers: this client's
// session and a handle number; zero for none.
type handleRef struct{ session, id uint64 }

func (u User) caller() *wire.Caller {
	return &wire.Caller{Uid: u.Uid, Gid: u.Gid, Groups: u.Groups, Pid: u.Pid, Handle: u.handle.wire()}
}

func (r handleRef) wire() *wire.HandleRef {
	if r.id == 0 {
		return nil
	}
	return &wire.HandleRef{Session: r.session, Id: r.id}
}

// FS is one client's view of a WheelFS deployment.
type FS struct {
	cfg    Config
	log    *slog.Logger
	router Router
	cache  *blockcache.Cache

	mu    sync.Mutex
	files map[oid.ID]*fileState // open files
	held  map[*Handle]bool      // handles a primary counts (hold)

	fetchMu  sync.Mutex
	inflight map[[32]byte]chan struct{} // blocks being fetched
	queued   map[[32]byte]*hotQueue     // claimed blocks a .Hotspot prefetch has not started

	leases  *leases
	rpcs    *rpcCounts // requests sent, by method (Stats)
	reports *holdReports

	regMu sync.Mutex
	regs  map[oid.ID]*registration // opens served from the cache, being registered at the primary
	// unlinking counts this client's removes and renames in flight: opens
	// meanwhile are not served from the cache (unlinkGate).
	unlinking atomic.Int32
	// suspects are primaries that recently did not answer in time.
	suspectMu sync.Mutex
	suspects  map[string]time.Time
	// silent are slices whose primary did not answer a whole call
	// (primarySilence).
	silent silence

	handles atomic.Uint64 // numbers this client's opens (handleRef.id)
	ops     *opSeq        // numbers its mutations (exactly-once retries)

	logins *logins // users' sessions at this client (login.go)

	peer peerState  // .Hotspot peer serving and fetching (peer.go)
	near nearGrants // grants for replicas at this site (nearreplica.go)

	listMu  sync.Mutex
	listing map[oid.ID]chan struct{} // listings a .WholeFile prefetch is fetching
}

// New returns a client core that reaches servers through router.
func New(cfg Config, router Router) *FS {
	def := NewConfig()
	if cfg.Logger == nil {
		cfg.Logger = def.Logger
	}
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = def.CacheBytes
	}
	if cfg.DiskCacheBytes <= 0 {
		cfg.DiskCacheBytes = def.DiskCacheBytes
	}
	if cfg.DirtyBytes <= 0 {
		cfg.DirtyBytes = def.DirtyBytes
	}
	if cfg.StagedFor <= 0 {
		cfg.StagedFor = DefaultStagedFor
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = def.Timeout
	}
	if cfg.ReportEvery <= 0 {
		cfg.ReportEvery = DefaultReportEvery
	}
	log := cfg.Logger.With("component", "client")
	cache := blockcache.New(cfg.CacheBytes)
	if cfg.CacheDir != "" {
		c, err := blockcache.Open(cfg.CacheBytes, cfg.CacheDir, cfg.DiskCacheBytes, cfg.Logger)
		if err != nil {
			// A cache is an optimisation: run without it rather than not at all.
			log.Warn("on-disk block cache unusable; caching in memory only", "dir", cfg.CacheDir, "err", err)
		} else {
			cache = c
		}
	}
	rpcs := newRPCCounts()
	f := &FS{
		cfg:      cfg,
		log:      log,
		router:   countingRouter{Router: router, counts: rpcs},
		rpcs:     rpcs,
		cache:    cache,
		files:    make(map[oid.ID]*fileState),
		held:     map[*Handle]bool{},
		inflight: make(map[[32]byte]chan struct{}),
		queued:   make(map[[32]byte]*hotQueue),
		regs:     map[oid.ID]*registration{},
		reports:  newHoldReports(),
		logins:   newLogins(),
		listing:  map[oid.ID]chan struct{}{},
		ops:      newOpSeq(),
	}
	f.leases = newLeases(f)
	go f.leases.keepHolding()
	f.peer.init(cfg.Peers)
	return f
}

// Close stops the lease back channels and writes the blocks queued for
// the on-disk cache. The FS must not be used afterwards.
func (f *FS) Close() error {
	f.reports.close()
	f.leases.close()
	f.logins.close()
	return f.cache.Close()
}

// OnRevoke sets the function told which objects' leases were revoked,
// or what was cached of them dropped after a change of this client (the
// FUSE adapter invalidates the kernel's caches with it). ctx is that
// change's context (values included) when it succeeded, else a
// background one, as for a revocation. It runs before the revocation
// is acknowledged; it must not wait on this client's operations.
func (f *FS) OnRevoke(fn func(ctx context.Context, ids []oid.ID)) {
	f.leases.mu.Lock()
	f.leases.onRevoke = fn
	f.leases.mu.Unlock()
}

// LeaseLeft is how long this client may still use id's cached meta-data
// without asking its primary (0: it may not).
func (f *FS) LeaseLeft(id oid.ID) time.Duration { return f.leases.left(id) }

// RevocationMark numbers the revocations this client has seen so far.
func (f *FS) RevocationMark() uint64 { return f.leases.revocationMark() }

// LeaseLeftSince is LeaseLeft for what a request that began at mark (a
// RevocationMark) learnt: 0 when id was revoked after mark, as that
// request's answer may predate the revocation.
func (f *FS) LeaseLeftSince(id oid.ID, mark uint64) time.Duration {
	return f.leases.leftSince(id, mark)
}

// CacheStats reports the block cache's memory tier (hits, misses, bytes)
// and its disk tier.
func (f *FS) CacheStats() (hits, misses uint64, used int64, disk blockcache.DiskStats) {
	hits, misses, used = f.cache.Stats()
	return hits, misses, used, f.cache.DiskStats()
}

// Root returns the ID of the root directory.
func (f *FS) Root() oid.ID { return oid.Root }

// bound applies the operation's time limit: .MaxTime when given, one second
// under .EventualConsistency, the default otherwise. The whole operation, every remote step included, must finish
// within it (paper §4.5).
func (f *FS) bound(ctx context.Context, cues cue.Set) (context.Context, context.CancelFunc) {
	d := f.cfg.Timeout
	switch {
	case cues.MaxTime > 0:
		d = cues.MaxTime
	case cues.EventualConsistency:
		d = EventualTimeout
	}
	if start, ok := ctx.Value(startKey{}).(time.Time); ok {
		// One step of a larger system call: the limit is the call's.
		return context.WithDeadline(ctx, start.Add(d))
	}
	return context.WithTimeout(ctx, d)
}

type startKey struct{}

// WithStart marks ctx as one step of a system call that began at start
// (open(2) is several lookups and an open): the operation's time limit
// counts from start, so the whole call stays within .MaxTime.
func WithStart(ctx context.Context, start time.Time) context.Context {
	return context.WithValue(ctx, startKey{}, start)
}

func syncLevel(c cue.Set) uint32 {
	if c.SyncLevel > 0 {
		return uint32(c.SyncLevel)
	}
	return 0
}

// wireCues converts the persistent part of a cue set for a new object.
func wireCues(c cue.Set, typ wire.Type) *wire.Cues {
	p := c.Persistent()
	if p.IsZero() {
		return nil
	}
	return &wire.Cues{
		Site:         p.Site,
		KeepTogether: p.KeepTogether,
		RepSites:     int32(p.RepSites),
		RepLevel:     int32(p.RepLevel),
		Eventual:     p.EventualConsistency && typ == wire.Type_TYPE_DIR,
	}
}

// NoCues is the empty cue set.
var NoCues cue.Set
