package configsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// Memory is an in-process configuration service with the semantics of
// EtcdService (locks with fencing epochs on shared holder sessions,
// membership tied to Register's context, coalescing watches), for unit
// tests that should not need etcd. Each Client is one Service; clients of
// one Memory with the same Options.Prefix share a deployment.
type Memory struct {
	mu     sync.Mutex
	spaces map[string]*memSpace
}

// NewMemory returns an empty in-memory configuration service.
func NewMemory() *Memory { return &Memory{spaces: map[string]*memSpace{}} }

// Client returns a Service over m; Close ends its registrations and
// watches only.
func (m *Memory) Client(o Options) Service {
	o = o.withDefaults()
	m.mu.Lock()
	defer m.mu.Unlock()
	sp := m.spaces[o.Prefix]
	if sp == nil {
		sp = &memSpace{
			servers:  map[string]memServer{},
			slices:   map[oid.Slice]*Slice{},
			sessions: map[string]*memSession{},
			watchers: map[chan struct{}]bool{},
		}
		m.spaces[o.Prefix] = sp
	}
	return &memClient{sp: sp, opts: o, done: make(chan struct{})}
}

// memSpace is the state of one deployment (one key prefix).
type memSpace struct {
	mu         sync.Mutex
	rev        int64
	servers    map[string]memServer
	slices     map[oid.Slice]*Slice
	sessions   map[string]*memSession // by holder
	deployment string
	watchers   map[chan struct{}]bool
	coords     map[string]memCoord // PublishCoord
	logins     map[string]Login    // user sessions (Logins), by key
	denied     map[string]Denial   // the deny list (Denials), by name
}

type memServer struct {
	info ServerInfo
	reg  *int // identifies one registration
}

// memSession is a holder's lock lease, shared by all its locks.
type memSession struct{ expires time.Time }

// changedLocked bumps the revision and wakes every watcher.
func (sp *memSpace) changedLocked() {
	sp.rev++
	for w := range sp.watchers {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// expireLocked unlocks the slices whose holder's session ran out.
func (sp *memSpace) expireLocked(now time.Time) {
	changed := false
	for h, ses := range sp.sessions {
		if now.Before(ses.expires) {
			continue
		}
		delete(sp.sessions, h)
		for _, s := range sp.slices {
			if s.Holder == h {
				s.Holder, s.Epoch = "", 0
				changed = true
			}
		}
	}
	if changed {
		sp.changedLocked()
	}
}

// heldLocked reports whether l is still the live lock of its slice.
func (sp *memSpace) heldLocked(l Lock) bool {
	sp.expireLocked(time.Now())
	s := sp.slices[l.Slice]
	return s != nil && s.Holder == l.Holder && s.Epoch == l.Epoch && l.Epoch != 0
}

func (sp *memSpace) tableLocked() *Table {
	sp.expireLocked(time.Now())
	t := &Table{Revision: sp.rev, Slices: map[oid.Slice]Slice{}, Servers: map[string]ServerInfo{}}
	for id, s := range sp.slices {
		c := *s
		c.Replicas = slices.Clone(s.Replicas)
		t.Slices[id] = c
	}
	for id, s := range sp.servers {
		if _, denied := sp.denied[id]; !denied {
			t.Servers[id] = s.info
		}
	}
	return t
}

type memClient struct {
	sp   *memSpace
	opts Options
	once sync.Once
	done chan struct{}
	// published: the coordinates this client published (guarded by sp.mu).
	published map[string]bool
}

func (c *memClient) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *memClient) Register(ctx context.Context, info ServerInfo) error {
	if c.closed() {
		return ErrClosed
	}
	reg := new(int)
	sp := c.sp
	sp.mu.Lock()
	sp.servers[info.ID] = memServer{info: info, reg: reg}
	sp.changedLocked()
	sp.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-c.done:
		}
		sp.mu.Lock()
		defer sp.mu.Unlock()
		if sp.servers[info.ID].reg == reg {
			delete(sp.servers, info.ID)
			sp.changedLocked()
		}
	}()
	return nil
}

func (c *memClient) UpdateServer(ctx context.Context, info ServerInfo) error {
	if c.closed() {
		return ErrClosed
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	cur, ok := sp.servers[info.ID]
	if !ok {
		return fmt.Errorf("configsvc: update server %s: %w", info.ID, ErrNotFound)
	}
	sp.servers[info.ID] = memServer{info: info, reg: cur.reg}
	sp.changedLocked()
	return nil
}

func (c *memClient) Table(ctx context.Context) (*Table, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	c.sp.mu.Lock()
	defer c.sp.mu.Unlock()
	return c.sp.tableLocked(), nil
}

// Watch sends the table after every change; lock expiry is noticed at
// least every LockTTL/4.
func (c *memClient) Watch(ctx context.Context) <-chan *Table {
	out := make(chan *Table, 1)
	kick := make(chan struct{}, 1)
	sp := c.sp
	sp.mu.Lock()
	sp.watchers[kick] = true
	sp.mu.Unlock()
	kick <- struct{}{}
	go func() {
		defer close(out)
		defer func() {
			sp.mu.Lock()
			delete(sp.watchers, kick)
			sp.mu.Unlock()
		}()
		tick := time.NewTicker(max(c.opts.LockTTL/4, 10*time.Millisecond))
		defer tick.Stop()
		last := int64(-1)
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.done:
				return
			case <-kick:
			case <-tick.C:
			}
			sp.mu.Lock()
			t := sp.tableLocked()
			sp.mu.Unlock()
			if t.Revision != last {
				last = t.Revision
				sendLatest(out, t)
			}
		}
	}()
	return out
}

func (c *memClient) Acquire(ctx context.Context, sl oid.Slice, holder string, p Policy, replicas []string) (Lock, error) {
	if c.closed() {
		return Lock{}, ErrClosed
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.expireLocked(time.Now())
	if _, denied := sp.denied[holder]; denied {
		return Lock{}, fmt.Errorf("acquire slice %d for %s: %w", sl, holder, ErrDenied)
	}
	s := sp.slices[sl]
	if s != nil && s.Holder != "" && s.Holder != holder {
		return Lock{}, fmt.Errorf("acquire slice %d: held by %s: %w", sl, s.Holder, ErrLocked)
	}
	if s == nil {
		s = &Slice{ID: sl}
		sp.slices[sl] = s
	}
	ses := sp.sessions[holder]
	if ses == nil {
		ses = &memSession{}
		sp.sessions[holder] = ses
	}
	now := time.Now()
	ses.expires = now.Add(c.opts.LockTTL)
	s.Policy, s.Replicas = p, slices.Clone(replicas)
	sp.changedLocked()
	if s.Holder == "" {
		s.Holder, s.Epoch = holder, sp.rev
	}
	return Lock{Slice: sl, Holder: holder, Epoch: s.Epoch, Since: now}, nil
}

func (c *memClient) Renew(ctx context.Context, l Lock) error {
	lost, err := c.RenewAll(ctx, []Lock{l})
	if err == nil && len(lost) > 0 {
		return fmt.Errorf("renew slice %d: %w", l.Slice, ErrLockLost)
	}
	return err
}

func (c *memClient) RenewAll(ctx context.Context, locks []Lock) (lost []Lock, err error) {
	if c.closed() {
		return nil, ErrClosed
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, l := range locks {
		if !sp.heldLocked(l) {
			lost = append(lost, l)
			continue
		}
		sp.sessions[l.Holder].expires = time.Now().Add(c.opts.LockTTL)
	}
	return lost, nil
}

func (c *memClient) UpdateReplicas(ctx context.Context, l Lock, replicas []string) error {
	return c.whileHeld(l, "update replicas of", func(s *Slice) { s.Replicas = slices.Clone(replicas) })
}

func (c *memClient) Release(ctx context.Context, l Lock) error {
	return c.whileHeld(l, "release", func(s *Slice) { s.Holder, s.Epoch = "", 0 })
}

// whileHeld changes l's slice record with fn if l is still held.
func (c *memClient) whileHeld(l Lock, what string, fn func(*Slice)) error {
	if c.closed() {
		return ErrClosed
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.heldLocked(l) {
		return fmt.Errorf("%s slice %d: %w", what, l.Slice, ErrLockLost)
	}
	fn(sp.slices[l.Slice])
	sp.changedLocked()
	return nil
}

func (c *memClient) Deployment(ctx context.Context) (string, error) {
	if c.closed() {
		return "", ErrClosed
	}
	sp := c.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.deployment == "" {
		var b [16]byte
		rand.Read(b[:])
		sp.deployment = hex.EncodeToString(b[:])
	}
	return sp.deployment, nil
}

func (c *memClient) Members(ctx context.Context) ([]Member, error) {
	return []Member{{Name: "memory", Leader: true, Reachable: true}}, nil
}

func (c *memClient) Close() error {
	c.once.Do(func() {
		close(c.done)
		c.sp.mu.Lock()
		for id := range c.published {
			delete(c.sp.coords, id)
		}
		c.sp.mu.Unlock()
	})
	return nil
}

// watchMemory sends read(sp), taken under the space's lock, now and after
// every change of the space, until ctx ends or the client closes.
func watchMemory[T any](ctx context.Context, c *memClient, read func(sp *memSpace) T) <-chan T {
	out := make(chan T, 1)
	kick := make(chan struct{}, 1)
	sp := c.sp
	sp.mu.Lock()
	sp.watchers[kick] = true
	sp.mu.Unlock()
	kick <- struct{}{}
	go func() {
		defer close(out)
		defer func() {
			sp.mu.Lock()
			delete(sp.watchers, kick)
			sp.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.done:
				return
			case <-kick:
			}
			sp.mu.Lock()
			v := read(sp)
			sp.mu.Unlock()
			sendLatest(out, v)
		}
	}()
	return out
}
