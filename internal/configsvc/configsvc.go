// Package configsvc is the WheelFS configuration service (paper §5.2.1): a
// replicated slice table plus a Chubby-style lock interface on slices.
//
// The Service interface is what storage servers and clients use. Servers
// register under a membership lease, acquire, renew and release slice locks
// (a lock grants the exclusive right to be the slice's primary and to set its
// replica list), and everybody reads or watches the slice table. Every lock
// acquisition yields a fencing epoch that increases strictly across
// successive holders of a slice; primaries stamp it on replication messages
// and backups reject older epochs (§5.3).
//
// The implementation, EtcdService, keeps all state in etcd (client API only;
// the embedded etcd member lives in the subpackage embedded). Key layout under
// Options.Prefix:
//
//	servers/<id>        JSON ServerInfo, attached to the server's membership lease
//	slices/<%08x>       JSON policy and replica list; persists
//	locks/<%08x>        JSON holder, attached to the holder's session lease of
//	                    TTL LockTTL (one per holder, shared by all its locks);
//	                    the lock's epoch is the key's CreateRevision
//	deployment          the deployment ID (128-bit random hex)
//	logins/<node>/<uid> JSON Login, a user's session (Logins)
//	denied/<name>       JSON Denial: the node is revoked (Denials); Table
//	                    leaves it out of Servers and Acquire refuses it
package configsvc

import (
	"context"
	"errors"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// ServerInfo describes one registered storage server.
type ServerInfo struct {
	ID   string `json:"id"`
	Site string `json:"site"`
	Addr string `json:"addr"`
	// Free and Total are the bytes free and the size of the file system
	// of the server's data directory, as last published (0: unknown).
	Free  int64 `json:"free,omitempty"`
	Total int64 `json:"total,omitempty"`
	// Full means free space is below the server's reserve: placement
	// treats the server as unavailable for new data.
	Full bool `json:"full,omitempty"`
}

// Policy is a slice's replication policy (paper §5.2, §4 cues).
type Policy struct {
	Site         string `json:"site"`     // primary site
	RepLevel     int    `json:"replevel"` // number of replicas
	RepSites     int    `json:"repsites"` // distinct sites among the replicas
	KeepTogether bool   `json:"keep_together,omitempty"`
	EventualDirs bool   `json:"eventual_dirs,omitempty"`
}

// Slice is one entry of the slice table.
type Slice struct {
	ID       oid.Slice
	Policy   Policy
	Replicas []string // server IDs; [0] is the primary
	Epoch    int64    // fencing epoch of the current lock, 0 if unlocked
	Holder   string   // current lock holder server ID, "" if none
}

// Table is a consistent snapshot of the slice table and server registry.
type Table struct {
	Revision int64 // etcd revision the snapshot was read at
	Slices   map[oid.Slice]Slice
	Servers  map[string]ServerInfo
}

// Member is one member of the configuration service's replicated state
// machine (an etcd member).
type Member struct {
	Name       string   `json:"name"`
	ClientURLs []string `json:"client_urls"`
	PeerURLs   []string `json:"peer_urls"`
	Leader     bool     `json:"leader"`
	Learner    bool     `json:"learner,omitempty"`
	// Reachable is false when the member did not answer a status request.
	Reachable bool `json:"reachable"`
}

// Lock is a held slice lock.
type Lock struct {
	Slice  oid.Slice
	Holder string
	Epoch  int64
	// Since is when the lock's lease last started running, at the latest
	// (set by Acquire): the holder may count the lock held until
	// Since + LockTTL, no longer. A new lock joins its holder's shared
	// lease, which may have been renewed well before the Acquire.
	Since time.Time
}

var (
	// ErrLocked means another server holds the slice's lock.
	ErrLocked = errors.New("configsvc: slice is locked by another server")
	// ErrLockLost means the lock expired or now belongs to someone else.
	ErrLockLost = errors.New("configsvc: slice lock lost")
	// ErrNotFound means the slice has no record in the table.
	ErrNotFound = errors.New("configsvc: not found")
	// ErrClosed is returned by a Service after Close.
	ErrClosed = errors.New("configsvc: service closed")
)

// Service is what servers and clients need from the configuration service.
type Service interface {
	// Register adds the server under a membership lease kept alive until ctx
	// ends or Close; it returns when registered. If the lease is lost (for
	// instance after a long configuration-service outage) the server is
	// registered again. Registering an ID again replaces the earlier
	// registration.
	Register(ctx context.Context, s ServerInfo) error
	// UpdateServer changes the published value of a server registered
	// through this Service (free space), keeping its membership lease;
	// ErrNotFound if it is not registered here, another error (try again
	// later) while its lease is being replaced. Every watcher of the
	// table sees the change: callers bound the rate.
	UpdateServer(ctx context.Context, s ServerInfo) error
	// Table returns the current slice table and server registry.
	Table(ctx context.Context) (*Table, error)
	// Watch delivers a fresh *Table after every change (first value
	// immediately), until ctx ends or the Service is closed, then closes the
	// channel. Bursts are coalesced: a slow receiver gets the newest table.
	Watch(ctx context.Context) <-chan *Table
	// Acquire takes the lock on slice s for holder with a lease of length
	// LockTTL, creating or updating the slice's policy and replica list. It
	// fails with ErrLocked if another holder has it. The returned Epoch is
	// strictly greater than any earlier epoch of that slice. A holder
	// re-acquiring its own live lock gets the existing epoch back (the lease
	// is renewed and the policy and replicas updated).
	Acquire(ctx context.Context, s oid.Slice, holder string, p Policy, replicas []string) (Lock, error)
	// Renew extends the lock by LockTTL (ErrLockLost if it expired or is
	// held by someone else).
	Renew(ctx context.Context, l Lock) error
	// RenewAll extends every lock of locks (all of one holder) by LockTTL
	// and returns those that were lost. A holder's locks share one lease,
	// so this costs the same for one slice or a thousand.
	RenewAll(ctx context.Context, locks []Lock) (lost []Lock, err error)
	// UpdateReplicas changes the slice's replica list, only while holding
	// the lock (ErrLockLost otherwise).
	UpdateReplicas(ctx context.Context, l Lock, replicas []string) error
	// Release gives up the lock (ErrLockLost if it was no longer held).
	Release(ctx context.Context, l Lock) error
	// Deployment returns the deployment ID, creating it (random 128-bit hex)
	// atomically if absent.
	Deployment(ctx context.Context) (string, error)
	// Members lists the configuration service's own members (the etcd
	// cluster) and which one leads.
	Members(ctx context.Context) ([]Member, error)
	// Close stops registrations (revoking their leases) and watches, and
	// closes the etcd client if the Service created it.
	Close() error
}
